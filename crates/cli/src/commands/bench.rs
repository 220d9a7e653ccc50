//! `qwen-burn bench train|moe|generate|peak`: figures as one JSON object (or a readable line).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use qwen_burn_model::init::init_weights;
use qwen_burn_model::{DeviceSet, Qwen3ForCausalLM};
use qwen_burn_train::RunConfig;
use qwen_burn_train::config::ModelSource;
use qwen_burn_train::observe::bench::{
    bench_generate, bench_moe_layer, bench_peak_measure, bench_train,
};

use super::WeightDtype;

#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Training steps on random tokens (forward, backward, clipping, AdamW).
    Train {
        /// Run config (model and batch shape are taken from it).
        #[arg(long)]
        config: PathBuf,
        /// Override a config value (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Device, or a list for data-parallel replicas (`flex,flex`: two threads on the CPU;
        /// needs training.grad_accum a multiple of the list's length).
        #[arg(long, default_value = "flex")]
        device: DeviceSet,
        /// Timed steps.
        #[arg(long, default_value_t = 10, value_parser = super::positive)]
        steps: usize,
        /// Untimed steps first.
        #[arg(long, default_value_t = 2)]
        warmup: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// One MoE layer (forward + backward): sparse dispatch vs the naive all-experts reference vs
    /// a dense SwiGLU of the same active width.
    Moe {
        /// Run config with a qwen3_moe [model].
        #[arg(long)]
        config: PathBuf,
        #[arg(long, default_value = "flex")]
        device: DeviceSet,
        /// Tokens in the batch.
        #[arg(long, default_value_t = 2048, value_parser = super::positive)]
        tokens: usize,
        #[arg(long, default_value_t = 5, value_parser = super::positive)]
        repeats: usize,
        #[arg(long)]
        json: bool,
    },
    /// Measure the device's peak f32 FLOP/s (a timed `[n, n] @ [n, n]` matmul, best of
    /// `--repeats`) and cache it for this machine: MFU is then reported against it.
    Peak {
        #[arg(long, default_value = "flex")]
        device: DeviceSet,
        #[arg(long, default_value_t = 2048, value_parser = super::positive)]
        n: usize,
        #[arg(long, default_value_t = 10, value_parser = super::positive)]
        repeats: usize,
        #[arg(long)]
        json: bool,
    },
    /// Prompt processing and decoding with the KV cache (and without, with --no-cache-too).
    Generate {
        /// Run config whose [model] to build with random weights...
        #[arg(long, conflicts_with = "model")]
        config: Option<PathBuf>,
        /// ...or a model directory / checkpoint.
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long, default_value = "flex")]
        device: DeviceSet,
        #[arg(long, default_value_t = 128, value_parser = super::positive)]
        prompt_len: usize,
        #[arg(long, default_value_t = 64, value_parser = super::positive)]
        new_tokens: usize,
        #[arg(long, default_value_t = 3, value_parser = super::positive)]
        repeats: usize,
        /// Also time decoding without the KV cache (recomputing the prefix every token).
        #[arg(long)]
        no_cache_too: bool,
        /// Weight storage: f32, or bf16 (products in bf16 with f32 accumulation).
        #[arg(long, value_enum, default_value_t = WeightDtype::F32)]
        dtype: WeightDtype,
        #[arg(long)]
        json: bool,
    },
}

fn print(value: &serde_json::Value, json: bool) {
    if json {
        println!("{value}");
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
    }
}

pub fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Train {
            config,
            overrides,
            device,
            steps,
            warmup,
            json,
        } => {
            let run = RunConfig::load(&config, &overrides)
                .with_context(|| format!("loading {}", config.display()))?;
            let result = bench_train(&run, &device, steps, warmup)?;
            print(&result, json);
        }
        Cmd::Peak {
            device,
            n,
            repeats,
            json,
        } => print(&bench_peak_measure(&device, n, repeats)?, json),
        Cmd::Moe {
            config,
            device,
            tokens,
            repeats,
            json,
        } => {
            let run = RunConfig::load(&config, &[])
                .with_context(|| format!("loading {}", config.display()))?;
            let ModelSource::Scratch(model_config) = &run.model else {
                bail!("bench moe needs an inline [model] architecture");
            };
            let dev = device.main().clone();
            print(
                &bench_moe_layer(model_config, device.name(), &dev, tokens, repeats)?,
                json,
            );
        }
        Cmd::Generate {
            config,
            model,
            device,
            prompt_len,
            new_tokens,
            repeats,
            no_cache_too,
            dtype,
            json,
        } => {
            let dev = device.main().clone();
            let model = match (config, model) {
                (Some(config), _) => {
                    let run = RunConfig::load(&config, &[])?;
                    let ModelSource::Scratch(c) = &run.model else {
                        bail!("--config needs an inline [model]; use --model for checkpoints");
                    };
                    init_weights(Qwen3ForCausalLM::new(c, &dev), 0)
                }
                (None, Some(dir)) => qwen_burn_train::run::checkpoint::load_model_any(&dir, &dev)?,
                (None, None) => bail!("give --config FILE or --model DIR"),
            };
            let model = dtype.apply(model);
            // As `generate` runs: frozen bf16 weights packed once (`main`).
            let _packed = qwen_burn_model::keep_packed_weights();
            let mut result = bench_generate(
                &model,
                device.name(),
                &dev,
                prompt_len,
                new_tokens,
                repeats,
                no_cache_too,
            )?;
            result["dtype"] = serde_json::json!(dtype.name());
            print(&result, json);
        }
    }
    Ok(())
}
