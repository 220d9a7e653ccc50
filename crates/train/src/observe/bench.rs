//! Benchmarks that print figures (never assert on time): training steps on random tokens and
//! generation with and without the KV cache.

use std::time::Instant;

use burn::tensor::Device;
use qwen_burn_data::Batch;
use qwen_burn_kernels::{in_pool, with_kernels};
use qwen_burn_model::init::init_weights;
use qwen_burn_model::{
    BackendKind, DeviceSet, Qwen3Config, Qwen3ForCausalLM, SamplingConfig, generate,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

use super::metrics::{lora_flops_per_token, train_flops_per_token};
use super::peak::{
    PeakRecord, PeakSource, cache_path, cached_peak, load_average, machine_id, measure_peak,
    peak_or_measure, store_peak,
};
use crate::config::{BaseDtype, PeakTflops, RunConfig};
use crate::error::Result;
use crate::optim::schedule::learning_rate;
use crate::optim::{apply_update, build_optimizer, clip_global_norm, trainable_params};
use crate::run::memory::{check_training_memory, training_memory_line};
use crate::run::start::{build_model, model_config_of};
use crate::step::{Replicas, Step};

/// Peak resident set size of this process in MB (Linux `VmHWM`; 0 elsewhere).
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn random_batch(rng: &mut ChaCha8Rng, b: usize, t: usize, vocab: usize) -> Batch {
    let inputs: Vec<u32> = (0..b * t)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect();
    let targets = (0..b * t)
        .map(|_| i64::from(rng.random_range(0..vocab as u32)))
        .collect();
    Batch {
        batch_size: b,
        seq_len: t,
        inputs,
        targets,
        attention_mask: None,
        positions: None,
        pairs: None,
    }
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        xs[n / 2]
    } else {
        0.5 * (xs[n / 2 - 1] + xs[n / 2])
    }
}

/// Time `steps` full training steps (forward, backward, clipping, the optimizer update) after
/// `warmup` ones; the update is also timed alone (`optimizer_ms_median`, `optimizer_share`).
/// `devices` may list several (`flex,flex`, `cuda:0,cuda:1`): the step's `grad_accum`
/// micro-batches are then split over data-parallel replicas, as in training.
///
/// The model is built as `train` builds it: `[model]` inline (random init) or `from` a
/// checkpoint, with the `[lora]` adapters attached when configured.
pub fn bench_train(
    config: &RunConfig,
    devices: &DeviceSet,
    steps: usize,
    warmup: usize,
) -> Result<Value> {
    let t = &config.training;
    // Preference data: `batch_size` random pairs a micro-batch (two rows each), scored against
    // a reference table given here (a run computes it before its first step).
    if config.data.kind == crate::config::DataKind::Prompts {
        return Err(crate::error::TrainError::config(
            "data.kind",
            "bench train times steps on synthetic rows; an RL step's cost is mostly its \
             generation: time `train` itself (its records give the generation's share)",
        ));
    }
    let preference = config.data.kind == crate::config::DataKind::Preference;
    let objective: Box<dyn crate::objective::Objective> = if preference {
        Box::new(crate::objective::preference::Preference::with_reference(
            config.preference.clone(),
            vec![[-100.0, -100.0]; t.batch_size],
        ))
    } else {
        crate::objective::of_run(config)?
    };
    let step = Step::of_run(objective.as_ref(), t);
    let model_config = &model_config_of(config)?;
    let replicas = Replicas::for_set(devices, t.grad_accum, t.parallel)?;
    let device = replicas.main().clone();
    check_training_memory(config, model_config, devices.kinds()[0])?;
    let memory_line = training_memory_line(config, model_config, devices.kinds()[0]);
    // Before anything is built, as `train` does (stderr: `--json` keeps stdout to the record).
    eprintln!("{memory_line}");
    let mut model = build_model(config, &device)?;
    let adapter_params = match &config.lora {
        Some(_) => trainable_params(&model),
        None => 0,
    };
    let mut optimizer = build_optimizer(&model, &config.optimizer);
    let mut rng = ChaCha8Rng::seed_from_u64(t.seed);
    let mut times = Vec::with_capacity(steps.min(1 << 16));
    let mut update_times = Vec::with_capacity(steps.min(1 << 16));
    let mut losses = Vec::new();
    for i in 0..warmup + steps {
        let batches: Vec<Batch> = (0..t.grad_accum)
            .map(|_| {
                let rows = if preference {
                    2 * t.batch_size
                } else {
                    t.batch_size
                };
                let mut b = random_batch(&mut rng, rows, t.seq_len, model_config.vocab_size);
                if preference {
                    // The first half of each row is the prompt: no loss there.
                    for row in b.targets.chunks_mut(t.seq_len) {
                        row[..t.seq_len / 2].fill(-1);
                    }
                    b.pairs = Some((0..t.batch_size as u32).collect());
                }
                b
            })
            .collect();
        let start = Instant::now();
        let current = model;
        let (next, loss, update_secs) = in_pool(|| {
            let precision = config.training.precision.kernels();
            with_kernels(config.fused_kernels(), precision, || -> Result<_> {
                let (mut grads, stats) = replicas.step(&step, &current, &batches)?;
                clip_global_norm(&current, &mut grads, config.optimizer.grad_clip)?;
                let lr = learning_rate(i, warmup + steps, &config.optimizer, &config.schedule);
                // The optimizer's share: from gradients in hand to updated weights.
                device.sync().ok();
                let update_start = Instant::now();
                let model = apply_update(current, &mut optimizer, lr, grads, &stats);
                device.sync().ok();
                Ok((model, stats.loss, update_start.elapsed().as_secs_f64()))
            })
        })?;
        model = next;
        let secs = start.elapsed().as_secs_f64();
        if i >= warmup {
            times.push(secs);
            update_times.push(update_secs);
            losses.push(loss);
        }
    }
    let rows = if preference {
        2 * t.batch_size
    } else {
        t.batch_size
    };
    let tokens = (t.grad_accum * rows * t.seq_len) as f64;
    let step_median = median(&mut times.clone());
    let update_median = median(&mut update_times.clone());
    let tps = tokens / step_median;
    let (peak, peak_source) = bench_peak(devices, &config.logging.peak_tflops)?;
    let flops = match &config.lora {
        Some(_) => lora_flops_per_token(model_config, t.seq_len, adapter_params),
        None => train_flops_per_token(model_config, t.seq_len),
    };
    // Where the products run in bf16 (mixed precision, or a bf16 LoRA base on a CPU with the
    // bf16 kernel), MFU against the f32 peak would overstate the use of the CPU: the bf16 peak
    // is measured now, and the MFU against it given beside.
    let bf16_products = config.fused_kernels()
        && devices.kinds().iter().all(|k| *k == BackendKind::Flex)
        && (t.precision == crate::config::Precision::Bf16
            || config
                .lora
                .as_ref()
                .is_some_and(|l| l.base_dtype == BaseDtype::Bf16))
        && qwen_burn_kernels::bf16_path().has_kernel();
    let bf16_peak = if bf16_products {
        in_pool(|| qwen_burn_kernels::bf16_peak_flops(2048, 3))
    } else {
        None
    };
    Ok(json!({
        "bench": "train",
        "precision": t.precision,
        "bf16_kernel": qwen_burn_kernels::bf16_path().name(),
        "bf16_peak_tflops": bf16_peak.map(|p| p / 1e12),
        "mfu_of_bf16_peak": bf16_peak.map(|p| tps * flops / p),
        "device": devices.name(),
        "replicas": replicas.len(),
        "model_type": model_config.model_type.as_str(),
        "params": model_config.num_params(),
        "active_params_per_token": model_config.active_params_per_token(),
        "lora_adapter_params": adapter_params,
        "tokens_per_step": tokens,
        "steps": steps,
        "warmup": warmup,
        "step_ms_median": step_median * 1e3,
        "step_ms_min": times.iter().copied().fold(f64::MAX, f64::min) * 1e3,
        "step_ms": times.iter().map(|t| (t * 1e4).round() / 10.0).collect::<Vec<_>>(),
        "optimizer": config.optimizer.kind.as_str(),
        "optimizer_ms_median": update_median * 1e3,
        "optimizer_share": update_median / step_median,
        "tokens_per_sec": tps,
        "train_flops_per_token": flops,
        "achieved_tflops": tps * flops / 1e12,
        "peak_tflops": peak / 1e12,
        "peak_source": peak_source,
        "fused_kernels": config.fused_kernels(),
        "mfu": tps * flops / peak,
        "peak_rss_mb": peak_rss_mb(),
        "memory_estimate": memory_line,
        "final_loss": losses.last().copied().unwrap_or(f64::NAN),
    }))
}

/// The peak of a benchmark's devices: configured, cached, or measured now (see [`peak_or_measure`]) when
/// there is neither.
fn bench_peak(devices: &DeviceSet, configured: &PeakTflops) -> Result<(f64, PeakSource)> {
    let figure = peak_or_measure(devices, configured, cache_path().as_deref())?;
    if let Some(note) = &figure.note {
        eprintln!("{note}");
    }
    Ok((figure.flops, figure.source))
}

/// `bench peak`: time a large f32 matmul on the first device of `devices` and cache it.
pub fn bench_peak_measure(devices: &DeviceSet, n: usize, repeats: usize) -> Result<Value> {
    let flops = measure_peak(devices.main(), n, repeats);
    let record = PeakRecord {
        flops,
        n,
        machine: machine_id(),
    };
    let path = store_peak(cache_path().as_deref(), devices.kinds()[0], &record)?;
    let load = load_average();
    if let Some(l) = load
        && l >= rayon_threads() as f64 / 2.0
    {
        eprintln!(
            "warning: load average {l:.2} on {} cores: other work shares the CPU, so this peak is \
             likely low and every MFU against it high; measure again on a quiet machine",
            rayon_threads()
        );
    }
    Ok(json!({
        "bench": "peak",
        "load_average": load,
        "device": devices.name(),
        "n": n,
        "repeats": repeats,
        "peak_tflops": flops / 1e12,
        "threads": rayon_threads(),
        "machine": record.machine,
        "cache": path,
        // The cache keeps the highest measurement (see `store_peak`): what MFU is against.
        "cached_peak_tflops": cached_peak(Some(&path), devices.kinds()[0]).map(|r| r.flops / 1e12),
    }))
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Prompt processing and decoding speed, with the KV cache and (optionally) without it.
pub fn bench_generate(
    model: &Qwen3ForCausalLM,
    device_name: &str,
    device: &Device,
    prompt_len: usize,
    new_tokens: usize,
    repeats: usize,
    with_no_cache: bool,
) -> Result<Value> {
    let vocab = model.config.vocab_size as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|_| rng.random_range(0..vocab))
        .collect();
    let run = |use_cache: bool| -> Result<(f64, f64)> {
        let cfg = SamplingConfig {
            max_new_tokens: new_tokens,
            use_cache,
            ..SamplingConfig::default()
        };
        let mut prefill = Vec::new();
        let mut decode = Vec::new();
        for _ in 0..repeats.max(1) + 1 {
            let out = generate(model, &prompt, &cfg, device, |_| {})?;
            prefill.push(prompt_len as f64 / out.prefill_secs);
            decode.push((out.new_token_ids.len() - 1) as f64 / out.decode_secs);
        }
        // The first repetition warms up allocators (and compiles kernels on GPUs).
        Ok((
            median(&mut prefill[1..].to_vec()),
            median(&mut decode[1..].to_vec()),
        ))
    };
    let (prefill_tps, decode_tps) = run(true)?;
    let mut result = json!({
        "bench": "generate",
        "bf16_kernel": qwen_burn_kernels::bf16_path().name(),
        "device": device_name,
        "params": model.config.num_params(),
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "prompt_tokens_per_sec": prefill_tps,
        "decode_tokens_per_sec": decode_tps,
        "tokens_per_sec": decode_tps,
    });
    if with_no_cache {
        let (_, no_cache_tps) = run(false)?;
        result["decode_tokens_per_sec_no_cache"] = json!(no_cache_tps);
        result["kv_cache_speedup"] = json!(decode_tps / no_cache_tps);
    }
    result["peak_rss_mb"] = json!(peak_rss_mb());
    Ok(result)
}

/// One MoE layer's forward + backward, three ways: sparse dispatch, the naive all-experts
/// reference, and a dense SwiGLU with the same active width (`k * moe_intermediate_size`).
pub fn bench_moe_layer(
    model_config: &Qwen3Config,
    device_name: &str,
    device: &Device,
    tokens: usize,
    repeats: usize,
) -> Result<Value> {
    use burn::tensor::{Distribution, Tensor};
    use qwen_burn_model::block::FeedForward;
    use qwen_burn_model::mlp::Mlp;
    use qwen_burn_model::moe::{Routing, naive_forward};

    let Some(moe_cfg) = &model_config.moe else {
        return Err(crate::error::TrainError::config(
            "model.model_type",
            "bench moe needs a qwen3_moe config",
        ));
    };
    let device = device.clone().autodiff();
    let model = init_weights(Qwen3ForCausalLM::new(model_config, &device), 0);
    let Some(moe) = model.model.layers.into_iter().find_map(|l| match l.mlp {
        FeedForward::Sparse(m) => Some(m),
        FeedForward::Dense(_) => None,
    }) else {
        return Err(crate::error::TrainError::config(
            "model",
            "no MoE layer in this config",
        ));
    };
    let h = model_config.hidden_size;
    let dense = Mlp::new(
        h,
        moe_cfg.num_experts_per_tok * moe_cfg.moe_intermediate_size,
        0.02,
        &device,
    );
    let x = Tensor::<3>::random([1, tokens, h], Distribution::Normal(0.0, 1.0), &device);
    let time = |f: &dyn Fn() -> Tensor<3>| -> f64 {
        let mut ts = Vec::new();
        for i in 0..repeats + 1 {
            let start = Instant::now();
            let y = f();
            let _grads = y.sum().backward();
            device.sync().ok();
            if i > 0 {
                ts.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        median(&mut ts)
    };
    let sparse_ms = time(&|| {
        moe.forward(x.clone().require_grad(), Routing::for_device(&device))
            .0
    });
    let naive_ms = time(&|| naive_forward(&moe, x.clone().require_grad()));
    let dense_ms = time(&|| dense.forward(x.clone().require_grad()));
    Ok(json!({
        "bench": "moe_layer",
        "device": device_name,
        "tokens": tokens,
        "hidden": h,
        "experts": moe_cfg.num_experts,
        "top_k": moe_cfg.num_experts_per_tok,
        "moe_intermediate_size": moe_cfg.moe_intermediate_size,
        "sparse_fwd_bwd_ms": sparse_ms,
        "naive_fwd_bwd_ms": naive_ms,
        "dense_equal_active_fwd_bwd_ms": dense_ms,
        "sparse_over_dense": sparse_ms / dense_ms,
        "naive_over_sparse": naive_ms / sparse_ms,
    }))
}
