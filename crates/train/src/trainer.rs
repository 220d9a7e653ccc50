//! The training loop: config-file runs on any device, MoE losses, step checkpoints with exact
//! resume, fine-tuning (full or LoRA), validation, samples and metrics.
//!
//! Written by hand rather than with burn-train's `SupervisedTraining`: that runner checkpoints
//! per epoch only, restarts the data loader at an epoch boundary, clips per tensor and keeps a
//! stateful scheduler, while a pretraining run needs step checkpoints with the data cursor,
//! global-norm clipping and bit-exact resume.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use qwen_burn_model::{DeviceSet, Qwen3ForCausalLM};

use crate::checkpoint::{TrainState, apply_retention, latest_checkpoint, save_checkpoint};
use crate::config::{MAX_CONSECUTIVE_SKIPS, OnNonFinite, RunConfig};
use crate::dashboard::Dashboard;
use crate::data::DataPipeline;
use crate::error::{Result, TrainError};
use crate::eval::{evaluate, sample_text};
use qwen_burn_kernels::{in_pool, set_fused_kernels};

use crate::guard::{check_step, unfit_for_checkpoint};
use crate::hooks;
use crate::lock::RunLock;
use crate::memory::{check_training_memory, training_memory_line};
use crate::metrics::{
    CollapseWatch, MetricsLog, MoeWorst, Progress, lora_flops_per_token, train_flops_per_token,
};
use crate::optim::trainable_params;
use crate::optim::{apply_update, clip_to_norm, grad_norm};
use crate::parallel::Replicas;
use crate::peak::{PeakFigure, cache_path, peak_or_measure};
use crate::records::{
    MetricsRecord, SampleRecord, TaskRecord, TrainRecord, ValRecord, read_records,
};
use crate::resume::{copy_generation_config, model_config_of, start_run};
use crate::schedule::learning_rate;
pub use crate::step::{
    StepStats, batch_tensors, count_targets, forward_backward, forward_backward_part,
};
use crate::tasks::{TaskOptions, evaluate_task};
use qwen_burn_data::McTask;

/// How to launch a run (what the CLI flags say).
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Devices (override `training.device`).
    pub device: Option<DeviceSet>,
    /// Run directory (default `runs/<config file stem>`).
    pub run_dir: PathBuf,
    /// Continue from the newest good checkpoint in `run_dir`.
    pub resume: bool,
    /// Start `run_dir` from this checkpoint of another run (its weights, optimizer state and
    /// data cursor), with this run's config: see [`crate::resume::branch_from`].
    pub from_checkpoint: Option<PathBuf>,
}

/// Summary of a finished run.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Steps completed.
    pub step: usize,
    /// Last validation loss.
    pub val_loss: Option<f64>,
    /// Training wall time, seconds (this process).
    pub elapsed_secs: f64,
    /// Mean training tokens per second (this process).
    pub tokens_per_sec: f64,
    /// Directory of the final checkpoint.
    pub checkpoint: Option<PathBuf>,
    /// The run was stopped before `max_steps` with the dashboard's stop key or a signal (after
    /// writing the checkpoint of its last step).
    pub stopped: bool,
    /// The signal that stopped it (SIGTERM, SIGINT), if one did: `train` exits with
    /// `128 + signal`.
    pub stopped_by: Option<i32>,
}

/// Run (or resume) training as the config says.
///
/// The run executes on a thread of rayon's pool, so that the parallel kernels of each step share
/// their work with it instead of handing it off (`qwen_burn_kernels::in_pool`).
pub fn train(config: &RunConfig, opts: &RunOptions) -> Result<RunSummary> {
    set_fused_kernels(config.training.fused_kernels);
    crate::step::set_activation_checkpointing(
        config.training.activation_checkpointing == crate::config::ActivationCheckpointing::Layers,
    );
    in_pool(|| train_here(config, opts))
}

fn train_here(config: &RunConfig, opts: &RunOptions) -> Result<RunSummary> {
    let devices = match &opts.device {
        Some(d) => d.clone(),
        None => DeviceSet::parse(&config.training.device)
            .map_err(|e| TrainError::config("training.device", e.to_string()))?,
    };
    // `cuda:0,cuda:1` (or `flex,flex`: two threads on one CPU) trains data-parallel.
    let replicas = Replicas::for_set(
        &devices,
        config.training.grad_accum,
        config.training.parallel,
    )?;
    let device = replicas.main().clone();
    let run_dir = &opts.run_dir;
    // Before anything in the run directory is touched: one writer at a time.
    let _lock = RunLock::acquire(run_dir)?;
    let run_toml = toml::to_string_pretty(&config.table).expect("config serialises");
    let model_config = model_config_of(config)?;
    // Before anything is allocated: refuse what cannot fit, naming the config fields.
    check_training_memory(config, &model_config, devices.kinds()[0])?;
    let memory_line = training_memory_line(config, &model_config, devices.kinds()[0]);
    for notice in &config.notices {
        eprintln!("{notice}");
    }
    if config.optimizer.kind == crate::config::OptimizerKind::Muon
        && let Some(lora) = &config.lora
        && lora.rank < crate::muon::MIN_MUON_ADAPTER_RANK
    {
        eprintln!(
            "note: optimizer.kind = \"muon\" with lora.rank = {}: adapters of rank below {} are \
             trained by AdamW (Muon's step diverged on them; experiments/007-optimizers)",
            lora.rank,
            crate::muon::MIN_MUON_ADAPTER_RANK
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

    // 1. Model, optimizer and state: fresh, or from the newest good checkpoint (a branch's is
    //    its parent's, copied in first).
    // A refused branch removes what it copied in, so the corrected command can run.
    let mut undo = crate::refused::Undo::new(
        run_dir,
        opts.from_checkpoint.is_some() && crate::refused::only_lock(run_dir),
    );
    let resume = match &opts.from_checkpoint {
        Some(from) => {
            let step = crate::resume::branch_from(from, run_dir)?;
            eprintln!("branching from {} at step {step}", from.display());
            true
        }
        None => opts.resume,
    };
    let start = start_run(config, run_dir, resume, &model_config, &device)?;
    let (model, optimizer, state, resume_from) = (
        start.model,
        start.optimizer,
        start.state,
        start.resumed_from,
    );

    // 2. Data, resumed at the cursor of the last consumed batch.
    if resume_from.is_some() && state.step > config.training.max_steps {
        return Err(TrainError::config(
            "training.max_steps",
            format!(
                "is {} but the checkpoint is already at step {}; give --max-steps {} or more to \
                 train on (nothing was changed)",
                config.training.max_steps, state.step, state.step
            ),
        ));
    }
    let cursor = resume_from.as_ref().and(state.data_cursor.as_ref());
    let mut data = DataPipeline::new(config, cursor, model.config.vocab_size)?;
    // Bad task files, too many shots or questions that cannot fit fail here, before anything
    // is written and before the first step, not at the first scoring.
    let tasks = config
        .eval
        .tasks
        .iter()
        .map(|p| qwen_burn_data::read_task(p))
        .collect::<qwen_burn_data::Result<Vec<_>>>()?;
    if !tasks.is_empty() {
        let Some(tok) = data.tokenizer() else {
            return Err(TrainError::config(
                "eval.tasks",
                "scoring tasks needs the run's tokenizer (data.tokenizer)",
            ));
        };
        let opts = task_options(&config.eval);
        for task in &tasks {
            crate::tasks::check_task(&model, tok, task, &opts)?;
        }
    }
    if let Some(tok_path) = data.tokenizer_path() {
        qwen_burn_data::tokenizer::copy_tokenizer_json(tok_path, &run_dir.join("tokenizer.json"))?;
    }
    copy_generation_config(config, run_dir)?;
    std::fs::write(run_dir.join("run.toml"), &run_toml)
        .map_err(|e| TrainError::io("write", run_dir.join("run.toml"), e))?;
    model.config.save(run_dir)?;

    let token_bytes = data.tokenizer().map_or_else(Vec::new, |t| t.token_bytes());
    undo.disarm();

    let keep_until = resume_from.as_ref().map(|_| state.step);
    let metrics = MetricsLog::open(run_dir, "metrics.jsonl", keep_until)?;
    let samples = MetricsLog::open(run_dir, "samples.jsonl", keep_until)?;
    let summary = Loop {
        config,
        device,
        replicas,
        devices,
        run_dir: run_dir.clone(),
        run_toml,
        metrics,
        samples,
        token_bytes,
        tasks,
        memory_line,
        data: &mut data,
    }
    .run(model, optimizer, state)?;
    Ok(summary)
}

struct Loop<'a> {
    config: &'a RunConfig,
    device: Device,
    replicas: Replicas,
    devices: DeviceSet,
    run_dir: PathBuf,
    run_toml: String,
    metrics: MetricsLog,
    samples: MetricsLog,
    data: &'a mut DataPipeline,
    /// Bytes of text per token id, for bits per byte.
    token_bytes: Vec<u32>,
    /// The `[eval]` tasks, read before training starts.
    tasks: Vec<McTask>,
    /// The memory estimate, for the header.
    memory_line: String,
}

impl Loop<'_> {
    fn run(
        mut self,
        mut model: Qwen3ForCausalLM,
        mut optimizer: ModuleOptimizer,
        mut state: TrainState,
    ) -> Result<RunSummary> {
        let cfg = self.config;
        let t = &cfg.training;
        let max_steps = t.max_steps;
        let model_config = model.config.clone();
        let flops_per_token = match &cfg.lora {
            Some(_) => lora_flops_per_token(&model_config, t.seq_len, trainable_params(&model)),
            None => train_flops_per_token(&model_config, t.seq_len),
        };
        let PeakFigure {
            flops: peak,
            note: peak_note,
            ..
        } = peak_or_measure(
            &self.devices,
            &cfg.logging.peak_tflops,
            cache_path().as_deref(),
        )?;
        let progress = self.progress(max_steps, state.step)?;
        // From here SIGTERM / SIGINT stop the run at the end of the step, with a checkpoint.
        let signals = crate::signals::StopSignals::install()?;
        if let Some(note) = peak_note {
            progress.line(&note);
        }
        progress.line(&format!(
            "training {} ({:.2}M params, {:.2}M active/token) on {} for {} steps, batch {}x{}x{} tokens, run dir {}",
            model_config.model_type.as_str(),
            model_config.num_params() as f64 / 1e6,
            model_config.active_params_per_token() as f64 / 1e6,
            self.devices.name(),
            max_steps,
            t.grad_accum,
            t.batch_size,
            t.seq_len,
            self.run_dir.display()
        ));
        progress.line(&self.memory_line);
        if state.step > 0 {
            progress.line(&format!(
                "resumed at step {} ({} tokens seen)",
                state.step, state.tokens_seen
            ));
        }
        let mut last_checkpoint: Option<PathBuf> = latest_checkpoint(&self.run_dir);
        let started = Instant::now();
        let elapsed_before = state.elapsed_secs;
        let mut window_tokens = 0usize;
        let mut window_start = Instant::now();
        let mut tokens_this_process = 0usize;
        let mut consecutive_skips = 0usize;
        let mut collapse = CollapseWatch::default();
        let mut stopped = false;
        let mut stopped_by = None;

        if state.step == 0 && t.eval_interval > 0 {
            // The starting point of the validation curve.
            self.validate(&model, 0, &progress)?;
        }
        if state.step == 0 && !self.tasks.is_empty() {
            self.score_tasks(&model, 0, &progress)?;
        }
        while state.step < max_steps {
            let step = state.step; // 0-based index of the step being taken
            let mut batches = Vec::with_capacity(t.grad_accum.min(64));
            let mut cursor = None;
            for _ in 0..t.grad_accum {
                let (batch, c) = self.data.next_batch()?;
                batches.push(batch);
                cursor = Some(c);
            }
            let (mut grads, mut stats) = self.replicas.step(&model, &batches)?;
            hooks::poison_grad(step + 1, &model, &mut grads);
            let lr = learning_rate(step, max_steps, &cfg.optimizer, &cfg.schedule);
            // The guard runs before the update: a NaN/Inf loss or gradient norm never reaches
            // the weights.
            stats.grad_norm = grad_norm(&model, &grads)?;
            let bad = check_step(&model, &grads, &stats)?;
            let skipped = match bad {
                None => false,
                Some(bad) => {
                    let last_good = last_checkpoint
                        .as_ref()
                        .map_or("none written yet".into(), |p| p.display().to_string());
                    let stop = t.on_nonfinite == OnNonFinite::Stop
                        || bad.weights
                        || consecutive_skips + 1 >= MAX_CONSECUTIVE_SKIPS;
                    if stop {
                        return Err(TrainError::NonFinite {
                            step: step + 1,
                            what: if consecutive_skips > 0 {
                                format!("{} ({} steps in a row)", bad.what, consecutive_skips + 1)
                            } else {
                                bad.what
                            },
                            param: bad.param,
                            action: "the update",
                            last_good,
                        });
                    }
                    progress.line(&format!(
                        "step {:>6} | skipped: non-finite {}{} (training.on_nonfinite = \"skip\")",
                        step + 1,
                        bad.what,
                        bad.param
                    ));
                    true
                }
            };
            if skipped {
                consecutive_skips += 1;
            } else {
                consecutive_skips = 0;
                clip_to_norm(&model, &mut grads, stats.grad_norm, cfg.optimizer.grad_clip);
                model = apply_update(model, &mut optimizer, lr, grads, &stats);
            }
            state.step += 1;
            state.tokens_seen += stats.tokens as u64;
            state.data_cursor = cursor;
            state.val_loss = None;
            window_tokens += stats.tokens;
            tokens_this_process += stats.tokens;

            // Metrics. Every step's expert loads go through the collapse watch; the logged
            // steps also carry the worst layer.
            let s = state.step;
            if stats.aux_loss.is_some() {
                for warning in collapse.observe(s, &stats.router_stats()) {
                    progress.line(&warning);
                }
            }
            let last = s == max_steps;
            if s.is_multiple_of(cfg.logging.interval) || last || s == 1 || skipped {
                let secs = window_start.elapsed().as_secs_f64().max(1e-9);
                let tps = window_tokens as f64 / secs;
                let mfu = tps * flops_per_token / peak;
                let moe = stats.aux_loss.is_some();
                let record = MetricsRecord::Train(TrainRecord {
                    step: s,
                    loss: stats.loss,
                    lr,
                    grad_norm: stats.grad_norm,
                    tokens_per_sec: tps,
                    mfu,
                    tokens_seen: state.tokens_seen,
                    elapsed_secs: elapsed_before + started.elapsed().as_secs_f64(),
                    skipped,
                    aux_loss: stats.aux_loss,
                    z_loss: stats.z_loss,
                    assignment_loss: stats.assignment_loss,
                    moe_router: moe.then(|| stats.router_stats()),
                    moe_capped: stats.capped_stats().filter(|_| moe),
                    moe_pooled: stats.pooled_router_stats().filter(|_| moe),
                    moe_worst: moe
                        .then(|| {
                            MoeWorst::of(&stats.router_stats(), stats.capped_stats().as_deref())
                        })
                        .flatten(),
                });
                self.metrics.write(&record)?;
                progress.record(&record);
                let mut line = format!(
                    "step {s:>6}/{max_steps} | loss {:.4} | lr {lr:.2e} | gnorm {:.3} | {tps:.0} tok/s | mfu {:.2}%",
                    stats.loss,
                    stats.grad_norm,
                    mfu * 100.0
                );
                if let Some(aux) = stats.aux_loss {
                    line.push_str(&format!(" | aux {aux:.4}"));
                    if let Some(a) = stats.assignment_loss {
                        line.push_str(&format!(" | assign {a:.4}"));
                    }
                    let capped = stats.capped_stats();
                    if let Some(w) = MoeWorst::of(&stats.router_stats(), capped.as_deref()) {
                        line.push_str(&format!(" | {}", w.describe()));
                    }
                }
                progress.line(&line);
                window_tokens = 0;
                window_start = Instant::now();
            }
            progress.step(s, &format!("loss {:.4}", stats.loss));

            // Evaluation, samples and checkpoints do not count against training throughput.
            let side_work = Instant::now();
            if (t.eval_interval > 0 && s.is_multiple_of(t.eval_interval)) || last {
                state.val_loss = Some(self.validate(&model, s, &progress)?);
            }
            let task_interval = match cfg.eval.interval {
                0 => t.eval_interval,
                n => n,
            };
            if !self.tasks.is_empty()
                && ((task_interval > 0 && s.is_multiple_of(task_interval)) || last)
            {
                self.score_tasks(&model, s, &progress)?;
            }
            if t.sample_interval > 0 && (s.is_multiple_of(t.sample_interval) || last) {
                self.sample(&model, s, &progress)?;
            }
            let signal = signals.received();
            let stop = (progress.stop_requested() || signal.is_some()) && !last;
            if (cfg.checkpoint.interval > 0 && s.is_multiple_of(cfg.checkpoint.interval))
                || last
                || stop
            {
                let elapsed = elapsed_before + started.elapsed().as_secs_f64();
                let dir = self.checkpoint(
                    &model,
                    &optimizer,
                    &mut state,
                    elapsed,
                    last_checkpoint.as_deref(),
                )?;
                progress.line(&format!("step {s:>6} | checkpoint {}", dir.display()));
                last_checkpoint = Some(dir);
            }
            if stop {
                let by = signal.map_or("the dashboard's stop key", crate::signals::name);
                progress.line(&format!(
                    "step {s:>6} | stopped by {by}; `train --resume` continues"
                ));
                stopped = true;
                stopped_by = signal;
                break;
            }
            window_start += side_work.elapsed();
            hooks::abort_after_step(s);
            hooks::pause_after_step(s);
        }
        progress.finish();
        let elapsed = started.elapsed().as_secs_f64();
        Ok(RunSummary {
            step: state.step,
            val_loss: state.val_loss,
            elapsed_secs: elapsed,
            tokens_per_sec: tokens_this_process as f64 / elapsed.max(1e-9),
            checkpoint: last_checkpoint,
            stopped,
            stopped_by,
        })
    }

    /// Progress lines, or the dashboard when `logging.dashboard` asks for it and stdout is a
    /// terminal (its lines then go to `RUN/train.log`).
    fn progress(&self, max_steps: usize, step: usize) -> Result<Progress> {
        if !self.config.logging.dashboard {
            return Ok(Progress::new(max_steps, step));
        }
        if !Dashboard::available() {
            let progress = Progress::new(max_steps, step);
            progress.line(
                "note: the dashboard (train --tui, logging.dashboard) needs a terminal on stdout \
                 and stdin; printing progress lines instead",
            );
            return Ok(progress);
        }
        let history = read_records(&self.run_dir.join("metrics.jsonl")).unwrap_or_else(|e| {
            eprintln!("note: the dashboard's plots start empty: {e}");
            Vec::new()
        });
        let label = self.run_dir.display().to_string();
        let dashboard = Dashboard::start(&label, step, max_steps, &history);
        Progress::with_dashboard(dashboard, &self.run_dir.join("train.log"))
    }

    /// Write the checkpoint of `state.step`, if its weights are fit to be "last good" (finite,
    /// and scoring a finite validation loss: an update from finite gradients can still
    /// overflow the weights), and apply the retention rules.
    fn checkpoint(
        &mut self,
        model: &Qwen3ForCausalLM,
        optimizer: &ModuleOptimizer,
        state: &mut TrainState,
        elapsed_secs: f64,
        last_checkpoint: Option<&Path>,
    ) -> Result<PathBuf> {
        let cfg = self.config;
        if let Some(what) = unfit_for_checkpoint(
            model,
            state.val_loss,
            self.data.val_batches(),
            &self.device.clone().without_autodiff(),
        )? {
            return Err(TrainError::NonFinite {
                step: state.step,
                what: what.0,
                param: what.1,
                action: "writing a checkpoint",
                last_good: last_checkpoint
                    .map_or("none written yet".into(), |p| p.display().to_string()),
            });
        }
        state.elapsed_secs = elapsed_secs;
        let dir = save_checkpoint(&self.run_dir, state, model, optimizer, &self.run_toml)?;
        apply_retention(
            &self.run_dir,
            cfg.checkpoint.keep_last,
            cfg.checkpoint.keep_best,
        )?;
        Ok(dir)
    }

    /// Validation loss and bits per byte at `step`, written to `metrics.jsonl` and printed.
    fn validate(
        &mut self,
        model: &Qwen3ForCausalLM,
        step: usize,
        progress: &Progress,
    ) -> Result<f64> {
        let v = evaluate(
            &model.valid(),
            self.data.val_batches(),
            &self.device.clone().without_autodiff(),
            Some(&self.token_bytes),
        )?;
        let record = MetricsRecord::Val(ValRecord {
            step,
            loss: v.loss,
            perplexity: v.loss.exp(),
            bpb: v.bpb,
            moe_bias_changed_choices: v.bias_changed_choices,
        });
        self.metrics.write(&record)?;
        progress.record(&record);
        let mut bpb = v
            .bpb
            .map_or(String::new(), |b| format!(" | val bpb {b:.4}"));
        if let Some(f) = v.bias_changed_choices {
            bpb.push_str(&format!(
                " | routing bias decides {:.1}% of expert choices",
                f * 100.0
            ));
        }
        progress.line(&format!(
            "step {step:>6} | val loss {:.4} | val ppl {:.2}{bpb}",
            v.loss,
            v.loss.exp()
        ));
        Ok(v.loss)
    }

    /// The `[eval]` tasks at `step`, written to `metrics.jsonl` and printed.
    fn score_tasks(
        &mut self,
        model: &Qwen3ForCausalLM,
        step: usize,
        progress: &Progress,
    ) -> Result<()> {
        let opts = task_options(&self.config.eval);
        let valid = model.valid();
        let device = self.device.clone().without_autodiff();
        let Some(tok) = self.data.tokenizer() else {
            return Ok(());
        };
        for task in &self.tasks {
            let (r, _) = evaluate_task(&valid, tok, task, &opts, &device, |_| {})?;
            progress.line(&format!(
                "step {step:>6} | {} acc {:.3} ± {:.3} | acc_norm {:.3} ± {:.3} ({} questions, chance {:.3})",
                r.task, r.acc, r.acc_stderr, r.acc_norm, r.acc_norm_stderr, r.questions, r.chance
            ));
            let record = MetricsRecord::Task(TaskRecord::new(step, &r));
            self.metrics.write(&record)?;
            progress.record(&record);
        }
        Ok(())
    }

    fn sample(&mut self, model: &Qwen3ForCausalLM, step: usize, progress: &Progress) -> Result<()> {
        let t = &self.config.training;
        let Some(tok) = self.data.tokenizer() else {
            return Ok(());
        };
        let (prompt, text) = sample_text(
            &model.valid(),
            tok,
            &t.sample_prompt,
            t.sample_tokens,
            t.sample_temperature,
            t.seed.wrapping_add(step as u64),
            &self.device.clone().without_autodiff(),
        )?;
        progress.line(&format!(
            "step {step:>6} | sample: {prompt}{}",
            text.replace('\n', " ")
        ));
        self.samples.write(&SampleRecord { step, prompt, text })?;
        Ok(())
    }
}

/// Default run directory of a config file: `runs/<file stem>`.
pub fn default_run_dir(config_path: &Path) -> PathBuf {
    let stem = config_path
        .file_stem()
        .map_or("run".into(), |s| s.to_string_lossy().to_string());
    PathBuf::from("runs").join(stem)
}

/// How a run scores its `[eval]` tasks.
fn task_options(e: &crate::config::EvalConfig) -> TaskOptions {
    TaskOptions {
        shots: e.shots,
        limit: (e.limit > 0).then_some(e.limit),
        seed: e.seed,
        batch: crate::tasks::DEFAULT_BATCH,
    }
}
