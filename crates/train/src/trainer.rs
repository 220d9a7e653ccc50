//! The training loop: config-file runs on any device, MoE losses, step checkpoints with exact
//! resume, fine-tuning (full or LoRA), validation, samples and metrics.
//!
//! Written by hand rather than with burn-train's `SupervisedTraining`: that runner checkpoints
//! per epoch only, restarts the data loader at an epoch boundary, clips per tensor and keeps a
//! stateful scheduler, while a pretraining run needs step checkpoints with the data cursor,
//! global-norm clipping and bit-exact resume.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::{Module, Param};
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Tensor, TensorData};
use qwen_burn_data::Batch;
use qwen_burn_model::block::FeedForward;
use qwen_burn_model::init::init_weights;
use qwen_burn_model::loss::cross_entropy_sum;
use qwen_burn_model::{Qwen3Config, Qwen3ForCausalLM, SamplingConfig, generate};
use serde_json::json;

use crate::checkpoint::{
    FORMAT_VERSION, ModelDir, TrainState, apply_lora, apply_retention, latest_checkpoint,
    load_checkpoint_model, load_model_merged, load_state, remove_partial_checkpoints,
    resolve_model_dir, save_checkpoint,
};
use crate::config::{MAX_CONSECUTIVE_SKIPS, ModelSource, OnNonFinite, RunConfig};
use crate::data::DataPipeline;
use crate::error::{Result, TrainError};
use crate::guard::{first_non_finite_grad, first_non_finite_weight};
use crate::lock::RunLock;
use crate::metrics::{MetricsLog, Progress, default_peak_tflops, train_flops_per_token};
use crate::optim::{build_optimizer, clip_to_norm, grad_norm};
use crate::parallel::Replicas;
use crate::schedule::learning_rate;
use crate::step::read_scalar;
pub use crate::step::{
    StepStats, batch_tensors, count_targets, forward_backward, forward_backward_part,
};

/// How to launch a run (what the CLI flags say).
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Device name (overrides `training.device`).
    pub device: Option<String>,
    /// Run directory (default `runs/<config file stem>`).
    pub run_dir: PathBuf,
    /// Continue from the newest good checkpoint in `run_dir`.
    pub resume: bool,
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
}

fn git_revision() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Aux-loss-free balancing (DeepSeek-V3): after each optimizer step move each expert's routing
/// bias by `rate * sign(mean_load - load_e)`, so overloaded experts become less likely picks.
fn update_routing_biases(
    model: Qwen3ForCausalLM,
    counts: &[Vec<usize>],
    rate: f64,
) -> Qwen3ForCausalLM {
    let mut model = model;
    let mut moe_layers = model
        .model
        .layers
        .iter_mut()
        .filter_map(|l| match &mut l.mlp {
            FeedForward::Sparse(moe) => Some(moe),
            FeedForward::Dense(_) => None,
        });
    for layer_counts in counts {
        let Some(moe) = moe_layers.next() else { break };
        let Some(bias) = moe.routing_bias.take() else {
            continue;
        };
        let mean = layer_counts.iter().sum::<usize>() as f64 / layer_counts.len() as f64;
        let delta: Vec<f32> = layer_counts
            .iter()
            .map(|&c| {
                let diff = mean - c as f64;
                let sign = if diff > 0.0 {
                    1.0
                } else if diff < 0.0 {
                    -1.0
                } else {
                    0.0
                };
                (rate * sign) as f32
            })
            .collect();
        let id = bias.id;
        let value = bias.val().detach();
        let device = value.device();
        let updated = (value
            + Tensor::<1>::from_data(TensorData::new(delta, [layer_counts.len()]), &device))
        .detach()
        .set_require_grad(false);
        moe.routing_bias = Some(Param::initialized(id, updated).set_require_grad(false));
    }
    model
}

/// Validation: mean cross-entropy over the fixed validation batches.
pub fn evaluate(model: &Qwen3ForCausalLM, batches: &[Batch], device: &Device) -> Result<f64> {
    let mut total = 0.0;
    let mut count = 0;
    for batch in batches {
        let (inputs, targets, mask) = batch_tensors(batch, device);
        let out = model.forward(inputs, mask, None);
        total += read_scalar(cross_entropy_sum(out.logits, targets))?;
        count += count_targets(batch);
    }
    Ok(total / count.max(1) as f64)
}

/// Build (or restore) the model for a run.
fn build_model(config: &RunConfig, device: &Device) -> Result<Qwen3ForCausalLM> {
    let model = match &config.model {
        ModelSource::Scratch(model_config) => init_weights(
            Qwen3ForCausalLM::new(model_config, device),
            config.training.seed,
        ),
        ModelSource::Pretrained(path) => load_model_merged(path, device)?,
    };
    Ok(match &config.lora {
        Some(lora) => apply_lora(model, lora),
        None => model,
    })
}

fn model_config_of(config: &RunConfig) -> Result<Qwen3Config> {
    match &config.model {
        ModelSource::Scratch(c) => Ok((**c).clone()),
        ModelSource::Pretrained(path) => match resolve_model_dir(path) {
            Ok(dir) => Ok(Qwen3Config::from_file(&dir.config_path())?),
            Err(_) => Err(TrainError::config(
                "model.from",
                format!(
                    "{} is neither an HF model directory (config.json), a checkpoint nor a run \
                     directory with checkpoints",
                    path.display()
                ),
            )),
        },
    }
}

/// Copy `generation_config.json` of an HF source model into the run directory, so that
/// `generate` on the run uses the model's own stop tokens and sampling defaults.
fn copy_generation_config(config: &RunConfig, run_dir: &Path) -> Result<()> {
    let ModelSource::Pretrained(path) = &config.model else {
        return Ok(());
    };
    let src = match resolve_model_dir(path)? {
        ModelDir::Hf(dir) => dir.join("generation_config.json"),
        ModelDir::Checkpoint(dir) => match dir.parent().and_then(Path::parent) {
            Some(run) => run.join("generation_config.json"),
            None => return Ok(()),
        },
    };
    if src.is_file() {
        let dest = run_dir.join("generation_config.json");
        std::fs::copy(&src, &dest).map_err(|e| TrainError::io("copy", &src, e))?;
    }
    Ok(())
}

/// Run (or resume) training as the config says.
pub fn train(config: &RunConfig, opts: &RunOptions) -> Result<RunSummary> {
    let device_name = opts
        .device
        .clone()
        .unwrap_or_else(|| config.training.device.clone());
    // `cuda:0,cuda:1` (or `flex,flex`: two threads on one CPU) trains data-parallel.
    let replicas = Replicas::from_names(&device_name, config.training.grad_accum)?;
    let device = replicas.main().clone();
    let run_dir = &opts.run_dir;
    // Before anything in the run directory is touched: one writer at a time.
    let _lock = RunLock::acquire(run_dir)?;
    let run_toml = toml::to_string_pretty(&config.table).expect("config serialises");
    let model_config = model_config_of(config)?;
    for notice in &config.notices {
        eprintln!("{notice}");
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

    // 1. Model, optimizer and state: fresh, or from the newest good checkpoint.
    remove_partial_checkpoints(run_dir);
    let resume_from = if opts.resume {
        Some(
            latest_checkpoint(run_dir).ok_or_else(|| TrainError::Checkpoint {
                path: run_dir.clone(),
                reason: "--resume given but the run directory has no complete checkpoint".into(),
            })?,
        )
    } else {
        if latest_checkpoint(run_dir).is_some() {
            return Err(TrainError::Checkpoint {
                path: run_dir.clone(),
                reason:
                    "the run directory already has checkpoints; pass --resume to continue it or \
                         choose another --run-dir"
                        .into(),
            });
        }
        None
    };
    let (model, optimizer, state) = match &resume_from {
        Some(dir) => {
            for notice in crate::resume::check_resume(dir, config, &model_config)? {
                eprintln!("resume: changed since the checkpoint: {notice}");
            }
            let state = load_state(dir)?;
            let mut model = load_checkpoint_model(dir, &device)?;
            // Same architecture (checked above); the hyperparameters are this run's.
            model.config = model_config.clone();
            let optim_path = dir.join("optimizer.bpk");
            let optimizer = build_optimizer(&model, &config.optimizer)
                .load(&optim_path)
                .map_err(|e| TrainError::Checkpoint {
                    path: optim_path,
                    reason: e.to_string(),
                })?;
            (model, optimizer, state)
        }
        None => {
            let model = build_model(config, &device)?;
            let optimizer = build_optimizer(&model, &config.optimizer);
            let state = TrainState {
                format_version: FORMAT_VERSION,
                step: 0,
                tokens_seen: 0,
                data_cursor: serde_json::Value::Null,
                seed: config.training.seed,
                val_loss: None,
                elapsed_secs: 0.0,
                git_revision: git_revision(),
                lora: config.lora.clone(),
            };
            (model, optimizer, state)
        }
    };

    // 2. Data, resumed at the cursor of the last consumed batch.
    let cursor = resume_from.as_ref().map(|_| state.data_cursor.clone());
    let mut data = DataPipeline::new(config, cursor.as_ref(), model.config.vocab_size)?;
    if let Some(tok_path) = data.tokenizer_path() {
        qwen_burn_data::tokenizer::copy_tokenizer_json(tok_path, &run_dir.join("tokenizer.json"))?;
    }
    copy_generation_config(config, run_dir)?;
    std::fs::write(run_dir.join("run.toml"), &run_toml)
        .map_err(|e| TrainError::io("write", run_dir.join("run.toml"), e))?;
    model.config.save(run_dir)?;

    let keep_until = resume_from.as_ref().map(|_| state.step);
    let metrics = MetricsLog::open(run_dir, "metrics.jsonl", keep_until)?;
    let samples = MetricsLog::open(run_dir, "samples.jsonl", keep_until)?;
    let summary = Loop {
        config,
        device,
        replicas,
        device_name,
        run_dir: run_dir.clone(),
        run_toml,
        metrics,
        samples,
        data: &mut data,
    }
    .run(model, optimizer, state)?;
    Ok(summary)
}

struct Loop<'a> {
    config: &'a RunConfig,
    device: Device,
    replicas: Replicas,
    device_name: String,
    run_dir: PathBuf,
    run_toml: String,
    metrics: MetricsLog,
    samples: MetricsLog,
    data: &'a mut DataPipeline,
}

fn abort_after_step_hook(step: usize) {
    // Test hook: die without any cleanup right after step N (and its checkpoint), like `kill -9`.
    if std::env::var("QWEN_BURN_ABORT_AFTER_STEP")
        .ok()
        .and_then(|v| v.parse().ok())
        == Some(step)
    {
        eprintln!("QWEN_BURN_ABORT_AFTER_STEP: aborting after step {step}");
        std::process::abort();
    }
}

/// Test hook: stop (sleep) right after step N's records are written, so that a test can
/// SIGKILL the process between checkpoints at a known point (`QWEN_BURN_PAUSE_AFTER_STEP=N`).
fn pause_after_step_hook(step: usize) {
    if std::env::var("QWEN_BURN_PAUSE_AFTER_STEP")
        .ok()
        .and_then(|v| v.parse().ok())
        == Some(step)
    {
        eprintln!("QWEN_BURN_PAUSE_AFTER_STEP: paused after step {step}");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

/// Test hook: make the gradient of `model.norm.weight` NaN at step N
/// (`QWEN_BURN_POISON_GRAD_AT_STEP=N`), a finite loss with a non-finite gradient.
fn poison_grad_hook(step: usize, model: &Qwen3ForCausalLM, grads: &mut GradientsParams) {
    if std::env::var("QWEN_BURN_POISON_GRAD_AT_STEP")
        .ok()
        .and_then(|v| v.parse().ok())
        == Some(step)
    {
        let id = model.model.norm.weight.id;
        if let Some(g) = grads.remove::<1>(id) {
            grads.register(id, g.mul_scalar(f32::NAN));
        }
    }
}

/// What the non-finite guard found in a step.
struct NonFiniteStep {
    /// `loss (NaN)`, `gradient norm (inf)`, ...
    what: String,
    /// `, first in parameter NAME`, or empty.
    param: String,
    /// The weights themselves are no longer finite (nothing to skip back to).
    weights: bool,
}

impl Loop<'_> {
    /// The guard before the update: the loss, the router losses and the global gradient norm
    /// must be finite. On a non-finite loss the weights are checked too, since a bad earlier
    /// update, not this batch, may be the cause.
    fn non_finite(
        &self,
        model: &Qwen3ForCausalLM,
        grads: &GradientsParams,
        stats: &StepStats,
    ) -> Result<Option<NonFiniteStep>> {
        let losses = [
            ("loss", Some(stats.loss)),
            ("aux loss", stats.aux_loss),
            ("z-loss", stats.z_loss),
        ];
        if let Some((name, Some(value))) = losses
            .into_iter()
            .find(|(_, v)| v.is_some_and(|v| !v.is_finite()))
        {
            if let Some(param) = first_non_finite_weight(model)? {
                return Ok(Some(NonFiniteStep {
                    what: format!("weights (the {name} is {value})"),
                    param: format!(", first in parameter {param}"),
                    weights: true,
                }));
            }
            return Ok(Some(NonFiniteStep {
                what: format!("{name} ({value})"),
                param: String::new(),
                weights: false,
            }));
        }
        if stats.grad_norm.is_finite() {
            return Ok(None);
        }
        let param = first_non_finite_grad(model, grads)?
            .map_or(String::new(), |p| format!(", first in parameter {p}"));
        Ok(Some(NonFiniteStep {
            what: format!("gradient norm ({})", stats.grad_norm),
            param,
            weights: false,
        }))
    }

    /// Why the current weights must not become a checkpoint: `(what, param)`, or `None` when they
    /// are finite and score a finite validation loss (`val_loss` if this step measured it, else
    /// the first validation batch).
    fn unfit_for_checkpoint(
        &self,
        model: &Qwen3ForCausalLM,
        val_loss: Option<f64>,
    ) -> Result<Option<(String, String)>> {
        let valid = model.valid();
        if let Some(param) = first_non_finite_weight(&valid)? {
            return Ok(Some((
                "weights".into(),
                format!(", first in parameter {param}"),
            )));
        }
        let loss = match val_loss {
            Some(l) => l,
            None => evaluate(
                &valid,
                &self.data.val_batches()[..self.data.val_batches().len().min(1)],
                &self.device.clone().without_autodiff(),
            )?,
        };
        Ok((!loss.is_finite()).then(|| {
            (
                format!("validation loss ({loss}) of the updated weights"),
                String::new(),
            )
        }))
    }

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
        let flops_per_token = train_flops_per_token(&model_config, t.seq_len);
        // Several CPU "devices" share the same cores; several GPUs add up.
        let distinct: std::collections::BTreeSet<&str> =
            self.device_name.split(',').map(str::trim).collect();
        let first = self.device_name.split(',').next().unwrap_or("flex").trim();
        let gpus = if first.starts_with("cuda") || first == "wgpu" {
            distinct.len() as f64
        } else {
            1.0
        };
        let peak = cfg
            .logging
            .peak_tflops
            .unwrap_or_else(|| default_peak_tflops(first))
            * 1e12
            * gpus;
        let progress = Progress::new(max_steps, state.step);
        progress.line(&format!(
            "training {} ({:.2}M params, {:.2}M active/token) on {} for {} steps, batch {}x{}x{} tokens, run dir {}",
            model_config.model_type.as_str(),
            model_config.num_params() as f64 / 1e6,
            model_config.active_params_per_token() as f64 / 1e6,
            self.device_name,
            max_steps,
            t.grad_accum,
            t.batch_size,
            t.seq_len,
            self.run_dir.display()
        ));
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
        let bias_rate = model_config
            .moe
            .as_ref()
            .map_or(0.0, |m| m.router_bias_update_rate);
        let mut consecutive_skips = 0usize;

        if state.step == 0 && t.eval_interval > 0 {
            // The starting point of the validation curve.
            let val_loss = evaluate(
                &model.valid(),
                self.data.val_batches(),
                &self.device.clone().without_autodiff(),
            )?;
            self.metrics.write(
                &json!({"step": 0, "split": "val", "loss": val_loss, "perplexity": val_loss.exp()}),
            )?;
            progress.line(&format!(
                "step {:>6} | val loss {val_loss:.4} | val ppl {:.2}",
                0,
                val_loss.exp()
            ));
        }
        while state.step < max_steps {
            let step = state.step; // 0-based index of the step being taken
            let mut batches = Vec::with_capacity(t.grad_accum);
            let mut cursor = serde_json::Value::Null;
            for _ in 0..t.grad_accum {
                let (batch, c) = self.data.next_batch()?;
                batches.push(batch);
                cursor = c;
            }
            let (mut grads, mut stats) = self.replicas.step(&model, &batches)?;
            poison_grad_hook(step + 1, &model, &mut grads);
            let lr = learning_rate(step, max_steps, &cfg.optimizer, &cfg.schedule);
            // The guard runs before the update: a NaN/Inf loss or gradient norm never reaches
            // the weights.
            stats.grad_norm = grad_norm(&model, &grads)?;
            let bad = self.non_finite(&model, &grads, &stats)?;
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
                model = optimizer.step(lr, model, grads);
                if bias_rate > 0.0 {
                    model = update_routing_biases(model, &stats.expert_counts, bias_rate);
                }
            }
            state.step += 1;
            state.tokens_seen += stats.tokens as u64;
            state.data_cursor = cursor;
            state.val_loss = None;
            window_tokens += stats.tokens;
            tokens_this_process += stats.tokens;

            // Metrics.
            let s = state.step;
            let last = s == max_steps;
            if s.is_multiple_of(cfg.logging.interval) || last || s == 1 || skipped {
                let secs = window_start.elapsed().as_secs_f64().max(1e-9);
                let tps = window_tokens as f64 / secs;
                let mfu = tps * flops_per_token / peak;
                let mut record = json!({
                    "step": s, "split": "train", "loss": stats.loss, "lr": lr, "grad_norm": stats.grad_norm,
                    "tokens_per_sec": tps, "mfu": mfu, "tokens_seen": state.tokens_seen,
                    "elapsed_secs": elapsed_before + started.elapsed().as_secs_f64(),
                });
                if skipped {
                    record["skipped"] = json!(true);
                }
                if let Some(aux) = stats.aux_loss {
                    record["aux_loss"] = json!(aux);
                    record["moe"] = json!(stats.router_stats());
                    record["moe_pooled"] = json!(stats.pooled_router_stats());
                }
                if let Some(z) = stats.z_loss {
                    record["z_loss"] = json!(z);
                }
                self.metrics.write(&record)?;
                let mut line = format!(
                    "step {s:>6}/{max_steps} | loss {:.4} | lr {lr:.2e} | gnorm {:.3} | {tps:.0} tok/s | mfu {:.2}%",
                    stats.loss,
                    stats.grad_norm,
                    mfu * 100.0
                );
                if let Some(aux) = stats.aux_loss {
                    let imbalance = stats
                        .router_stats()
                        .iter()
                        .map(|r| r.max_over_mean_load)
                        .fold(0.0, f64::max);
                    line.push_str(&format!(" | aux {aux:.4} | max/mean load {imbalance:.2}"));
                }
                progress.line(&line);
                window_tokens = 0;
                window_start = Instant::now();
            }
            progress.step(s, &format!("loss {:.4}", stats.loss));

            // Evaluation, samples and checkpoints do not count against training throughput.
            let side_work = Instant::now();
            if (t.eval_interval > 0 && s.is_multiple_of(t.eval_interval)) || last {
                let valid = model.valid();
                let val_loss = evaluate(
                    &valid,
                    self.data.val_batches(),
                    &self.device.clone().without_autodiff(),
                )?;
                state.val_loss = Some(val_loss);
                self.metrics
                    .write(&json!({"step": s, "split": "val", "loss": val_loss, "perplexity": val_loss.exp()}))?;
                progress.line(&format!(
                    "step {s:>6} | val loss {val_loss:.4} | val ppl {:.2}",
                    val_loss.exp()
                ));
            }
            if t.sample_interval > 0 && (s.is_multiple_of(t.sample_interval) || last) {
                self.sample(&model, s, &progress)?;
            }
            if (cfg.checkpoint.interval > 0 && s.is_multiple_of(cfg.checkpoint.interval)) || last {
                // A checkpoint is "last good" only if its weights are finite and score a finite
                // loss: an update from finite gradients can still overflow the weights.
                if let Some(what) = self.unfit_for_checkpoint(&model, state.val_loss)? {
                    return Err(TrainError::NonFinite {
                        step: s,
                        what: what.0,
                        param: what.1,
                        action: "writing a checkpoint",
                        last_good: last_checkpoint
                            .as_ref()
                            .map_or("none written yet".into(), |p| p.display().to_string()),
                    });
                }
                state.elapsed_secs = elapsed_before + started.elapsed().as_secs_f64();
                let dir =
                    save_checkpoint(&self.run_dir, &state, &model, &optimizer, &self.run_toml)?;
                apply_retention(
                    &self.run_dir,
                    cfg.checkpoint.keep_last,
                    cfg.checkpoint.keep_best,
                )?;
                progress.line(&format!("step {s:>6} | checkpoint {}", dir.display()));
                last_checkpoint = Some(dir);
            }
            window_start += side_work.elapsed();
            abort_after_step_hook(s);
            pause_after_step_hook(s);
        }
        progress.finish();
        let elapsed = started.elapsed().as_secs_f64();
        Ok(RunSummary {
            step: state.step,
            val_loss: state.val_loss,
            elapsed_secs: elapsed,
            tokens_per_sec: tokens_this_process as f64 / elapsed.max(1e-9),
            checkpoint: last_checkpoint,
        })
    }

    fn sample(&mut self, model: &Qwen3ForCausalLM, step: usize, progress: &Progress) -> Result<()> {
        let t = &self.config.training;
        let Some(tok) = self.data.tokenizer() else {
            return Ok(());
        };
        let prompt_text = if t.sample_prompt.is_empty() {
            "\n"
        } else {
            t.sample_prompt.as_str()
        };
        let mut prompt = tok.encode(prompt_text)?;
        if prompt.is_empty() {
            prompt = tok.eos_id().into_iter().collect();
        }
        let valid = model.valid();
        let device = self.device.clone().without_autodiff();
        let cfg = SamplingConfig {
            max_new_tokens: t.sample_tokens,
            temperature: t.sample_temperature,
            top_k: Some(50),
            seed: t.seed.wrapping_add(step as u64),
            stop_tokens: tok.stop_ids(),
            ..SamplingConfig::default()
        };
        let out = generate(&valid, &prompt, &cfg, &device, |_| {})?;
        let text = tok.decode(&out.new_token_ids)?;
        progress.line(&format!(
            "step {step:>6} | sample: {}{}",
            prompt_text,
            text.replace('\n', " ")
        ));
        self.samples
            .write(&json!({"step": step, "prompt": prompt_text, "text": text}))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Module;
    use serde_json::json;

    /// The aux-loss-free update moves each expert's bias against its load: up for experts below
    /// the mean load, down above it, unchanged at the mean.
    #[test]
    fn routing_bias_update_has_the_right_sign() {
        let config = Qwen3Config::from_json(
            &json!({
                "model_type": "qwen3_moe", "vocab_size": 16, "hidden_size": 8,
                "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 4, "num_experts": 4,
                "num_experts_per_tok": 2, "router_bias_update_rate": 0.1,
            }),
            true,
        )
        .unwrap();
        let model = Qwen3ForCausalLM::new(&config, &Device::flex());
        let before = model.num_params();
        // Mean load 4: expert 0 overloaded, 1 and 3 underloaded, 2 at the mean.
        let model = update_routing_biases(model, &[vec![10, 2, 4, 0]], 0.1);
        let FeedForward::Sparse(moe) = &model.model.layers[0].mlp else {
            panic!("MoE layer")
        };
        let bias = moe.routing_bias.as_ref().unwrap().val();
        let values = bias.try_into_vec_as::<f32>().unwrap();
        assert_eq!(values, vec![-0.1, 0.1, 0.0, 0.1]);
        assert_eq!(model.num_params(), before);
    }
}
