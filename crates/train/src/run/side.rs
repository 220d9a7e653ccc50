//! The work between steps: the progress display, validation, the `[eval]` tasks, samples and
//! checkpoints (each written only when its weights are fit to be "last good").

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use qwen_burn_model::Qwen3ForCausalLM;

use super::checkpoint::{TrainState, apply_retention, save_checkpoint};
use super::guard::unfit_for_checkpoint;
use super::prepared::{Loop, task_options};
use crate::error::{Result, TrainError};
use crate::eval::sample::sample_text;
use crate::eval::tasks::evaluate_task;
use crate::eval::validation::evaluate;
use crate::observe::dashboard::Dashboard;
use crate::observe::progress::Progress;
use crate::observe::records::{MetricsRecord, SampleRecord, TaskRecord, ValRecord, read_records};

impl Loop<'_> {
    /// One record to `metrics.jsonl`, TensorBoard (when on) and the progress display.
    pub(super) fn log(&mut self, record: &MetricsRecord, progress: &Progress) -> Result<()> {
        self.metrics.write(record)?;
        if let Some(tb) = &mut self.tensorboard {
            let json =
                serde_json::to_value(record).map_err(|e| TrainError::Other(e.to_string()))?;
            tb.write(&record.tag_prefix(), record.step(), &json)?;
        }
        progress.record(record);
        Ok(())
    }

    /// Progress lines, or the dashboard when `logging.dashboard` asks for it and stdout is a
    /// terminal (its lines then go to `RUN/train.log`).
    pub(super) fn progress(&self, max_steps: usize, step: usize) -> Result<Progress> {
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
    pub(super) fn checkpoint(
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
    pub(super) fn validate(
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
            figures: self.step.objective.validate(
                &model.valid(),
                self.data.val_batches(),
                &self.device.clone().without_autodiff(),
            )?,
        });
        let mut bpb = v
            .bpb
            .map_or(String::new(), |b| format!(" | val bpb {b:.4}"));
        if let MetricsRecord::Val(r) = &record {
            for (name, value) in &r.figures {
                bpb.push_str(&format!(" | val {name} {value:.4}"));
            }
        }
        if let Some(f) = v.bias_changed_choices {
            bpb.push_str(&format!(
                " | routing bias decides {:.1}% of expert choices",
                f * 100.0
            ));
        }
        self.log(&record, progress)?;
        progress.line(&format!(
            "step {step:>6} | val loss {:.4} | val ppl {:.2}{bpb}",
            v.loss,
            v.loss.exp()
        ));
        Ok(v.loss)
    }

    /// The `[eval]` tasks at `step`, written to `metrics.jsonl` and printed.
    pub(super) fn score_tasks(
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
        let mut records = Vec::with_capacity(self.tasks.len());
        for task in &self.tasks {
            let (r, _) = evaluate_task(&valid, tok, task, &opts, &device, |_| {})?;
            progress.line(&format!(
                "step {step:>6} | {} acc {:.3} ± {:.3} | acc_norm {:.3} ± {:.3} ({} questions, chance {:.3})",
                r.task, r.acc, r.acc_stderr, r.acc_norm, r.acc_norm_stderr, r.questions, r.chance
            ));
            records.push(MetricsRecord::Task(TaskRecord::new(step, &r)));
        }
        for record in &records {
            self.log(record, progress)?;
        }
        Ok(())
    }

    pub(super) fn sample(
        &mut self,
        model: &Qwen3ForCausalLM,
        step: usize,
        progress: &Progress,
    ) -> Result<()> {
        let t = &self.config.training;
        let Some(tok) = self.data.tokenizer() else {
            return Ok(());
        };
        let rollout = self.step.objective.samples();
        if !rollout.is_empty() {
            for (prompt, text, reward) in rollout {
                progress.line(&format!(
                    "step {step:>6} | sample (reward {reward:.2}): {}",
                    text.replace('\n', " ")
                ));
                let reward = Some(reward);
                self.samples.write(&SampleRecord {
                    step,
                    prompt,
                    text,
                    reward,
                })?;
            }
            return Ok(());
        }
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
        self.samples.write(&SampleRecord {
            step,
            prompt,
            text,
            reward: None,
        })?;
        Ok(())
    }
}
