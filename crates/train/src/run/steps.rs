//! The loop, in phases: [`Loop::begin`] (the header, the step-0 validation and tasks),
//! then per step [`Loop::take_step`] (batches, gradient, guard, update),
//! [`Loop::record_step`] (metrics and the progress line) and [`Loop::between_steps`]
//! (validation, tasks, samples, checkpoints, a requested stop), and [`Course::finish`].

use std::path::PathBuf;
use std::time::Instant;

use burn::optim::ModuleOptimizer;
use qwen_burn_model::Qwen3ForCausalLM;

use super::checkpoint::{TrainState, latest_checkpoint};
use super::guard::check_step;
use super::hooks;
use super::prepared::{Loop, Start};
use super::signals::StopSignals;
use super::{RunSummary, signals};
use crate::config::{MAX_CONSECUTIVE_SKIPS, OnNonFinite};
use crate::error::{Result, TrainError};
use crate::observe::metrics::{lora_flops_per_token, train_flops_per_token};
use crate::observe::moe::{CollapseWatch, MoeWorst};
use crate::observe::peak::{PeakFigure, cache_path, peak_or_measure};
use crate::observe::progress::Progress;
use crate::observe::records::{MetricsRecord, TrainRecord};
use crate::optim::schedule::learning_rate;
use crate::optim::{apply_update, clip_to_norm, grad_norm, trainable_params};
use crate::step::StepStats;

/// What the loop carries from step to step besides the model: the progress display, clocks,
/// counters and watches.
pub(super) struct Course {
    pub(super) progress: Progress,
    signals: StopSignals,
    flops_per_token: f64,
    peak: f64,
    pub(super) last_checkpoint: Option<PathBuf>,
    started: Instant,
    elapsed_before: f64,
    window_tokens: usize,
    window_non_padding: usize,
    window_start: Instant,
    tokens_this_process: usize,
    consecutive_skips: usize,
    collapse: CollapseWatch,
    stopped_by: Option<Option<i32>>,
}

impl Course {
    /// Training wall time so far, this process's and the resumed run's.
    pub(super) fn elapsed(&self) -> f64 {
        self.elapsed_before + self.started.elapsed().as_secs_f64()
    }

    /// The summary of the run at `state`.
    fn finish(self, state: &TrainState) -> RunSummary {
        self.progress.finish();
        let elapsed = self.started.elapsed().as_secs_f64();
        RunSummary {
            step: state.step,
            val_loss: state.val_loss,
            elapsed_secs: elapsed,
            tokens_per_sec: self.tokens_this_process as f64 / elapsed.max(1e-9),
            checkpoint: self.last_checkpoint,
            stopped: self.stopped_by.is_some(),
            stopped_by: self.stopped_by.flatten(),
        }
    }
}

/// One step taken: its statistics, learning rate, and whether the guard skipped its update.
struct Taken {
    stats: StepStats,
    lr: f64,
    skipped: bool,
}

impl Loop<'_> {
    /// Train from `start` to `training.max_steps` (or a requested stop).
    pub(super) fn run(mut self, start: Start) -> Result<RunSummary> {
        let (mut model, mut optimizer, mut state) = start;
        let mut course = self.begin(&model, &state)?;
        while state.step < self.config.training.max_steps {
            let taken;
            (model, taken) = self.take_step(model, &mut optimizer, &mut state, &mut course)?;
            self.record_step(&taken, &state, &mut course)?;
            if self.between_steps(&model, &optimizer, &mut state, &mut course)? {
                break;
            }
        }
        Ok(course.finish(&state))
    }

    /// The header lines, the peak FLOP/s the MFU divides by, the stop signals, and at step 0
    /// the starting point of the validation curve and of the tasks.
    fn begin(&mut self, model: &Qwen3ForCausalLM, state: &TrainState) -> Result<Course> {
        let cfg = self.config;
        let t = &cfg.training;
        let model_config = &model.config;
        let flops_per_token = match &cfg.lora {
            Some(_) => lora_flops_per_token(model_config, t.seq_len, trainable_params(model)),
            None => train_flops_per_token(model_config, t.seq_len),
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
        let progress = self.progress(t.max_steps, state.step)?;
        // From here SIGTERM / SIGINT stop the run at the end of the step, with a checkpoint.
        let signals = StopSignals::install()?;
        if let Some(note) = peak_note {
            progress.line(&note);
        }
        progress.line(&format!(
            "training {} ({:.2}M params, {:.2}M active/token) on {} for {} steps, batch {}x{}x{} tokens, run dir {}",
            model_config.model_type.as_str(),
            model_config.num_params() as f64 / 1e6,
            model_config.active_params_per_token() as f64 / 1e6,
            self.devices.name(),
            t.max_steps,
            t.grad_accum,
            t.batch_size,
            t.seq_len,
            self.run_dir.display()
        ));
        progress.line(&self.memory_line);
        if let Some(line) = self.data.summary() {
            progress.line(line);
        }
        if state.step > 0 {
            progress.line(&format!(
                "resumed at step {} ({} tokens seen)",
                state.step, state.tokens_seen
            ));
        }
        let course = Course {
            progress,
            signals,
            flops_per_token,
            peak,
            last_checkpoint: latest_checkpoint(&self.run_dir),
            started: Instant::now(),
            elapsed_before: state.elapsed_secs,
            window_tokens: 0,
            window_non_padding: 0,
            window_start: Instant::now(),
            tokens_this_process: 0,
            consecutive_skips: 0,
            collapse: CollapseWatch::default(),
            stopped_by: None,
        };
        if state.step == 0 && t.eval_interval > 0 {
            self.validate(model, 0, &course.progress)?;
        }
        if state.step == 0 && !self.tasks.is_empty() {
            self.score_tasks(model, 0, &course.progress)?;
        }
        Ok(course)
    }

    /// Gather the step's micro-batches, compute its gradient, and update the weights unless the
    /// guard finds a non-finite loss or gradient norm (which never reaches the weights): then
    /// the step is skipped, or the run stops, as `training.on_nonfinite` says.
    fn take_step(
        &mut self,
        mut model: Qwen3ForCausalLM,
        optimizer: &mut ModuleOptimizer,
        state: &mut TrainState,
        course: &mut Course,
    ) -> Result<(Qwen3ForCausalLM, Taken)> {
        let cfg = self.config;
        let t = &cfg.training;
        let step = state.step; // 0-based index of the step being taken
        let mut batches = Vec::with_capacity(t.grad_accum.min(64));
        let mut cursor = state.data_cursor.clone();
        if self.step.objective.wants_data(step) {
            for _ in 0..t.grad_accum {
                let (batch, c) = self.data.next_batch()?;
                batches.push(batch);
                cursor = Some(c);
            }
        }
        let batches = self.step.objective.rollout(&model, batches, step)?;
        let (mut grads, mut stats) = self.replicas.step(&self.step, &model, &batches)?;
        hooks::poison_grad(step + 1, &model, &mut grads);
        let lr = learning_rate(step, t.max_steps, &cfg.optimizer, &cfg.schedule);
        stats.grad_norm = grad_norm(&model, &grads)?;
        let skipped = match check_step(&model, &grads, &stats)? {
            None => false,
            Some(bad) => {
                let last_good = course
                    .last_checkpoint
                    .as_ref()
                    .map_or("none written yet".into(), |p| p.display().to_string());
                let skips = course.consecutive_skips;
                if t.on_nonfinite == OnNonFinite::Stop
                    || bad.weights
                    || skips + 1 >= MAX_CONSECUTIVE_SKIPS
                {
                    return Err(TrainError::NonFinite {
                        step: step + 1,
                        what: if skips > 0 {
                            format!("{} ({} steps in a row)", bad.what, skips + 1)
                        } else {
                            bad.what
                        },
                        param: bad.param,
                        action: "the update",
                        last_good,
                    });
                }
                course.progress.line(&format!(
                    "step {:>6} | skipped: non-finite {}{} (training.on_nonfinite = \"skip\")",
                    step + 1,
                    bad.what,
                    bad.param
                ));
                true
            }
        };
        if skipped {
            course.consecutive_skips += 1;
        } else {
            course.consecutive_skips = 0;
            clip_to_norm(&model, &mut grads, stats.grad_norm, cfg.optimizer.grad_clip);
            model = apply_update(model, optimizer, lr, grads, &stats);
        }
        state.step += 1;
        state.tokens_seen += stats.tokens as u64;
        if let Some(n) = state.non_padding_tokens_seen.as_mut() {
            *n += stats.non_padding_tokens as u64;
        }
        state.data_cursor = cursor;
        state.val_loss = None;
        course.window_tokens += stats.tokens;
        course.window_non_padding += stats.non_padding_tokens;
        course.tokens_this_process += stats.tokens;
        Ok((model, Taken { stats, lr, skipped }))
    }

    /// Every step's expert loads go through the collapse watch; the logged steps (every
    /// `logging.interval`, the first, the last and every skipped one) write their record and
    /// progress line.
    fn record_step(
        &mut self,
        taken: &Taken,
        state: &TrainState,
        course: &mut Course,
    ) -> Result<()> {
        let Taken { stats, lr, skipped } = taken;
        let (lr, skipped) = (*lr, *skipped);
        let s = state.step;
        let max_steps = self.config.training.max_steps;
        let moe = stats.aux_loss.is_some();
        if moe {
            for warning in course.collapse.observe(s, &stats.router_stats()) {
                course.progress.line(&warning);
            }
        }
        if s.is_multiple_of(self.config.logging.interval) || s == max_steps || s == 1 || skipped {
            let secs = course.window_start.elapsed().as_secs_f64().max(1e-9);
            let tps = course.window_tokens as f64 / secs;
            let mfu =
                course.window_non_padding as f64 / secs * course.flops_per_token / course.peak;
            let worst = moe
                .then(|| MoeWorst::of(&stats.router_stats(), stats.capped_stats().as_deref()))
                .flatten();
            let record = MetricsRecord::Train(TrainRecord {
                step: s,
                loss: stats.loss,
                lr,
                grad_norm: stats.grad_norm,
                tokens_per_sec: tps,
                mfu,
                tokens_seen: state.tokens_seen,
                non_padding_tokens_seen: state.non_padding_tokens_seen,
                elapsed_secs: course.elapsed(),
                skipped,
                figures: stats.figure_means(),
                aux_loss: stats.aux_loss,
                z_loss: stats.z_loss,
                assignment_loss: stats.assignment_loss,
                moe_router: moe.then(|| stats.router_stats()),
                moe_capped: stats.capped_stats().filter(|_| moe),
                moe_pooled: stats.pooled_router_stats().filter(|_| moe),
                moe_worst: worst,
            });
            self.log(&record, &course.progress)?;
            let mut line = format!(
                "step {s:>6}/{max_steps} | loss {:.4} | lr {lr:.2e} | gnorm {:.3} | {tps:.0} tok/s | mfu {:.2}%",
                stats.loss,
                stats.grad_norm,
                mfu * 100.0
            );
            for (name, value) in stats.figure_means() {
                line.push_str(&format!(" | {name} {value:.4}"));
            }
            if let Some(aux) = stats.aux_loss {
                line.push_str(&format!(" | aux {aux:.4}"));
                if let Some(a) = stats.assignment_loss {
                    line.push_str(&format!(" | assign {a:.4}"));
                }
                if let Some(w) = worst {
                    line.push_str(&format!(" | {}", w.describe()));
                }
            }
            course.progress.line(&line);
            course.window_tokens = 0;
            course.window_non_padding = 0;
            course.window_start = Instant::now();
        }
        course.progress.step(s, &format!("loss {:.4}", stats.loss));
        Ok(())
    }

    /// Validation, tasks, samples and checkpoints at their intervals and at the last step, and
    /// a stop requested by the dashboard's key or a signal (after a checkpoint). None of it
    /// counts against training throughput. Returns whether the run stops here.
    fn between_steps(
        &mut self,
        model: &Qwen3ForCausalLM,
        optimizer: &ModuleOptimizer,
        state: &mut TrainState,
        course: &mut Course,
    ) -> Result<bool> {
        let cfg = self.config;
        let t = &cfg.training;
        let s = state.step;
        let last = s == t.max_steps;
        let side_work = Instant::now();
        if (t.eval_interval > 0 && s.is_multiple_of(t.eval_interval)) || last {
            state.val_loss = Some(self.validate(model, s, &course.progress)?);
        }
        let task_interval = match cfg.eval.interval {
            0 => t.eval_interval,
            n => n,
        };
        if !self.tasks.is_empty()
            && ((task_interval > 0 && s.is_multiple_of(task_interval)) || last)
        {
            self.score_tasks(model, s, &course.progress)?;
        }
        if t.sample_interval > 0 && (s.is_multiple_of(t.sample_interval) || last) {
            self.sample(model, s, &course.progress)?;
        }
        let signal = course.signals.received();
        let stop = (course.progress.stop_requested() || signal.is_some()) && !last;
        if (cfg.checkpoint.interval > 0 && s.is_multiple_of(cfg.checkpoint.interval))
            || last
            || stop
        {
            let elapsed = course.elapsed();
            let dir = self.checkpoint(
                model,
                optimizer,
                state,
                elapsed,
                course.last_checkpoint.as_deref(),
            )?;
            course
                .progress
                .line(&format!("step {s:>6} | checkpoint {}", dir.display()));
            course.last_checkpoint = Some(dir);
        }
        if stop {
            let by = signal.map_or("the dashboard's stop key", signals::name);
            course.progress.line(&format!(
                "step {s:>6} | stopped by {by}; `train --resume` continues"
            ));
            course.stopped_by = Some(signal);
            return Ok(true);
        }
        course.window_start += side_work.elapsed();
        hooks::abort_after_step(s);
        hooks::pause_after_step(s);
        Ok(false)
    }
}
