//! A run's preparation, before its first step: devices and replicas, the lock, the memory
//! check, the refusals that must come before anything is written, the start (fresh, resumed or
//! branched), the data at its cursor, the `[eval]` tasks, and the run directory's files.

use qwen_burn_data::McTask;
use qwen_burn_model::{BackendKind, DeviceSet, Qwen3Config, Qwen3ForCausalLM};

use super::RunOptions;
use super::data::DataPipeline;
use super::lock::RunLock;
use super::memory::{check_training_memory, training_memory_line};
use super::prepared::{Loop, Start, task_options};
use super::refused::{Undo, only_lock};
use super::start::{branch_from, copy_generation_config, model_config_of, start_run};
use crate::config::{OptimizerKind, Precision, RunConfig};
use crate::error::{Result, TrainError};
use crate::eval::tasks::check_task;
use crate::objective::Objective;
use crate::observe::log::MetricsLog;
use crate::observe::tensorboard::EventWriter;
use crate::optim::muon::MIN_MUON_ADAPTER_RANK;
use crate::step::{Replicas, Step};

/// Everything before the first step; the loop and where it starts.
pub(super) fn prepare<'a>(
    config: &'a RunConfig,
    opts: &RunOptions,
    objective: &'a dyn Objective,
) -> Result<(Loop<'a>, Start)> {
    let devices = match &opts.device {
        Some(d) => d.clone(),
        None => DeviceSet::parse(&config.training.device)
            .map_err(|e| TrainError::config("training.device", e.to_string()))?,
    };
    if config.training.precision == Precision::Bf16
        && devices.kinds().iter().any(|k| *k != BackendKind::Flex)
    {
        return Err(TrainError::config(
            "training.precision",
            format!(
                "\"bf16\" is computed by the fused kernels of the flex device; this run's \
                 devices are {:?}: use \"f32\" there",
                devices.kinds()
            ),
        ));
    }
    // `cuda:0,cuda:1` (or `flex,flex`: two threads on one CPU) trains data-parallel.
    let replicas = Replicas::for_set(
        &devices,
        config.training.grad_accum,
        config.training.parallel,
    )?;
    let device = replicas.main().clone();
    let run_dir = &opts.run_dir;
    // Before anything in the run directory is touched: one writer at a time.
    let lock = RunLock::acquire(run_dir)?;
    let run_toml = toml::to_string_pretty(&config.table).expect("config serialises");
    let model_config = model_config_of(config)?;
    // Before anything is allocated: refuse what cannot fit, naming the config fields.
    check_training_memory(config, &model_config, devices.kinds()[0])?;
    let memory_line = training_memory_line(config, &model_config, devices.kinds()[0]);
    for notice in &config.notices {
        eprintln!("{notice}");
    }
    refuse_or_note(config, &model_config, objective)?;

    // Model, optimizer and state: fresh, or from the newest good checkpoint (a branch's is its
    // parent's, copied in first). A refused branch removes what it copied in, so the corrected
    // command can run.
    let mut undo = Undo::new(
        run_dir,
        opts.from_checkpoint.is_some() && only_lock(run_dir),
    );
    let resume = match &opts.from_checkpoint {
        Some(from) => {
            let step = branch_from(from, run_dir)?;
            eprintln!("branching from {} at step {step}", from.display());
            // The parent's schedule, from its checkpoint's config.
            let parent_toml = from.join("run.toml");
            match RunConfig::load(&parent_toml, &[]) {
                Ok(parent) => {
                    fn of(c: &RunConfig) -> crate::optim::schedule::Schedule<'_> {
                        crate::optim::schedule::Schedule {
                            max_steps: c.training.max_steps,
                            optimizer: &c.optimizer,
                            schedule: &c.schedule,
                        }
                    }
                    if let Some(w) =
                        crate::optim::schedule::branch_lr_warning(step, &of(&parent), &of(config))
                    {
                        eprintln!("{w}");
                    }
                }
                Err(e) => eprintln!(
                    "note: the parent's schedule could not be read from {} ({e}); the learning \
                     rate at the branch point is not checked",
                    parent_toml.display()
                ),
            }
            true
        }
        None => opts.resume,
    };
    let start = start_run(config, run_dir, resume, &model_config, &device)?;
    let (model, optimizer, state) = (start.model, start.optimizer, start.state);
    let resumed = start.resumed_from.is_some();
    if resumed && state.step > config.training.max_steps {
        return Err(TrainError::config(
            "training.max_steps",
            format!(
                "is {} but the checkpoint is already at step {}; give --max-steps {} or more to \
                 train on (nothing was changed)",
                config.training.max_steps, state.step, state.step
            ),
        ));
    }

    // Data, resumed at the cursor of the last consumed batch.
    let cursor = state.data_cursor.as_ref().filter(|_| resumed);
    let data = DataPipeline::new(config, cursor, model.config.vocab_size)?;
    let tasks = read_tasks(config, &model, &data)?;
    // The objective's own preparation (the preference reference), before anything trains.
    objective.prepare(&model, &data, run_dir)?;
    if let Some(tok_path) = data.tokenizer_path() {
        qwen_burn_data::tokenizer::copy_tokenizer_json(tok_path, &run_dir.join("tokenizer.json"))?;
    }
    copy_generation_config(config, run_dir)?;
    crate::files::write_replacing(&run_dir.join("run.toml"), &run_toml)?;
    model.config.save(run_dir)?;
    let token_bytes = data.tokenizer().map_or_else(Vec::new, |t| t.token_bytes());
    undo.disarm();

    let keep_until = resumed.then_some(state.step);
    let run = Loop {
        config,
        step: Step::of_run(objective, &config.training),
        device,
        replicas,
        devices,
        run_dir: run_dir.clone(),
        run_toml,
        metrics: MetricsLog::open(run_dir, "metrics.jsonl", keep_until)?,
        samples: MetricsLog::open(run_dir, "samples.jsonl", keep_until)?,
        data,
        token_bytes,
        tasks,
        memory_line,
        tensorboard: match config.logging.tensorboard {
            true => Some(EventWriter::create(run_dir)?),
            false => None,
        },
        _lock: lock,
    };
    Ok((run, (model, optimizer, state)))
}

/// The refusals and notes of a config that need its model config: an objective that does not
/// train on `data.kind`, router centring under LoRA, Muon on small adapters, router losses
/// that HF would not add.
fn refuse_or_note(
    config: &RunConfig,
    model_config: &Qwen3Config,
    objective: &dyn Objective,
) -> Result<()> {
    if !objective.data_kinds().contains(&config.data.kind) {
        let kinds: Vec<_> = objective
            .data_kinds()
            .iter()
            .map(|k| format!("\"{}\"", k.as_str()))
            .collect();
        return Err(TrainError::config(
            "data.kind",
            format!(
                "is \"{}\", but the {} objective trains on {}",
                config.data.kind.as_str(),
                objective.name(),
                kinds.join(" or ")
            ),
        ));
    }
    if config.optimizer.kind == OptimizerKind::Muon
        && let Some(lora) = &config.lora
        && lora.rank < MIN_MUON_ADAPTER_RANK
    {
        eprintln!(
            "note: optimizer.kind = \"muon\" with lora.rank = {}: adapters of rank below \
             {MIN_MUON_ADAPTER_RANK} are trained by AdamW (Muon's step diverged on them; \
             experiments/007-optimizers)",
            lora.rank,
        );
    }
    if let Some(moe) = &model_config.moe
        && moe.router_centering
        && config.lora.is_some()
    {
        return Err(TrainError::config(
            "model.router_centering",
            "router centring rewrites the router weights after every step, and under [lora] \
             they are frozen base weights; set model.router_centering = false for LoRA runs",
        ));
    }
    if let Some(moe) = &model_config.moe
        && !moe.output_router_logits
        && (moe.router_aux_loss_coef > 0.0 || moe.router_z_loss_coef > 0.0)
    {
        eprintln!(
            "note: output_router_logits = false, so (as in HF) the router losses are logged but \
             not added to the training loss; set model.output_router_logits = true to train with them"
        );
    }
    Ok(())
}

/// The `[eval]` tasks, read and checked: bad task files, too many shots or questions that
/// cannot fit fail here, before anything is written and before the first step, not at the
/// first scoring.
fn read_tasks(
    config: &RunConfig,
    model: &Qwen3ForCausalLM,
    data: &DataPipeline,
) -> Result<Vec<McTask>> {
    let e = &config.eval;
    if !e.fewshot_files.is_empty() && e.fewshot_files.len() != e.tasks.len() {
        return Err(TrainError::config(
            "eval.fewshot_files",
            format!(
                "holds {} files for {} tasks: give one per task, in the order of eval.tasks, \
                 or none",
                e.fewshot_files.len(),
                e.tasks.len()
            ),
        ));
    }
    let tasks =
        e.tasks
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let task = qwen_burn_data::read_task(p)?;
                Ok(match e.fewshot_files.get(i) {
                    Some(f) => task
                        .with_fewshot(qwen_burn_data::read_task(f)?, e.fewshot_sampler.sampler()),
                    None => task,
                })
            })
            .collect::<qwen_burn_data::Result<Vec<_>>>()?;
    if tasks.is_empty() {
        return Ok(tasks);
    }
    let Some(tok) = data.tokenizer() else {
        return Err(TrainError::config(
            "eval.tasks",
            "scoring tasks needs the run's tokenizer (data.tokenizer)",
        ));
    };
    let opts = task_options(&config.eval);
    for task in &tasks {
        check_task(model, tok, task, &opts)?;
    }
    Ok(tasks)
}
