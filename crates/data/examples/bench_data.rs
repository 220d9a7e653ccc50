//! Data-pipeline figures: tokenisation throughput of `prepare` on the shipped corpus with 1 and
//! 2 threads, and batches/s of the window sampler with and without the prefetcher (B = 8,
//! T = 256), including how long a consumer that trains between batches waits for data.
//!
//! ```text
//! cargo run --release -p qwen-burn-data --example bench_data
//! ```
//!
//! Prints figures only; nothing is asserted about time. Each figure comes with the CPU time it
//! used, so runs on a busy machine can still be compared (MB per CPU-second).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use qwen_burn_data::ingest::{self, chunk_text};
use qwen_burn_data::{
    Prefetcher, PrepareOptions, SampleMode, Split, Tok, TokenStore, WindowSampler, prepare,
};
use rayon::prelude::*;

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> AnyResult<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let datasets = root.join("datasets");
    let inputs = vec![datasets.join("austen"), datasets.join("shakespeare")];
    let tokenizer = datasets.join("tokenizer.json");
    println!("load at start: {}", uptime());

    // Corpus size as text (the shipped files are gzipped).
    let files = ingest::discover(&inputs)?;
    let docs: Vec<String> = files
        .iter()
        .map(|f| ingest::load(f, "text").map(|l| l.documents))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    let mb = docs.iter().map(|d| d.len()).sum::<usize>() as f64 / 1e6;
    println!("corpus: {} files, {mb:.2} MB of text", files.len());

    println!("\n== tokenisation: `prepare` end to end (read + gunzip + encode + write) ==");
    let tmp = std::env::temp_dir().join(format!("qwen-burn-bench-{}", std::process::id()));
    let mut last_out = PathBuf::new();
    for threads in [1, 2] {
        for rep in 0..2 {
            let out = tmp.join(format!("t{threads}-{rep}"));
            let opts = PrepareOptions {
                inputs: inputs.clone(),
                tokenizer: tokenizer.clone(),
                out: out.clone(),
                val_fraction: 0.05,
                text_field: "text".into(),
                threads: Some(threads),
                progress: false,
            };
            let (t0, c0) = (Instant::now(), cpu_seconds());
            let meta = prepare(&opts)?;
            let (s, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
            let tokens = meta.train.tokens + meta.val.tokens;
            println!(
                "threads {threads} run {rep}: {s:.2} s, {:.2} MB/s, {:.2} M tokens/s; \
                 {cpu:.2} CPU-s = {:.2} MB per CPU-s, {:.2} cores busy",
                mb / s,
                tokens as f64 / 1e6 / s,
                mb / cpu,
                cpu / s
            );
            last_out = out;
        }
    }
    let t0 = Instant::now();
    let again = prepare(&PrepareOptions {
        inputs: inputs.clone(),
        tokenizer: tokenizer.clone(),
        out: last_out.clone(),
        val_fraction: 0.05,
        text_field: "text".into(),
        threads: Some(2),
        progress: false,
    })?;
    println!(
        "re-run on unchanged inputs: reused = {}, {:.1} ms",
        again.reused,
        t0.elapsed().as_secs_f64() * 1e3
    );

    println!("\n== tokenisation: encode only (text in memory, 256 KiB pieces) ==");
    for (name, path) in [
        ("default 8k BPE", tokenizer.clone()),
        (
            "Qwen3 151k BPE",
            root.join("crates/data/tests/fixtures/tokenizers/qwen3/tokenizer.json.gz"),
        ),
    ] {
        if !path.exists() {
            println!("{name}: {} not found, skipped", path.display());
            continue;
        }
        let tok = Tok::from_file(&path)?;
        let pieces: Vec<&str> = docs.iter().flat_map(|d| chunk_text(d, 256 << 10)).collect();
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()?;
            let (t0, c0) = (Instant::now(), cpu_seconds());
            let n: usize = pool.install(|| {
                pieces
                    .par_iter()
                    .map(|p| tok.encode(p).map(|ids| ids.len()))
                    .sum::<Result<usize, _>>()
            })?;
            let (s, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
            println!(
                "{name}, threads {threads}: {:.2} MB/s ({n} tokens, {s:.2} s); \
                 {:.2} MB per CPU-s, {:.2} cores busy",
                mb / s,
                mb / cpu,
                cpu / s
            );
        }
    }

    println!("\n== batches: B = 8, T = 256 from the train split ==");
    let store = Arc::new(TokenStore::open(&last_out, Split::Train, None)?);
    let (b, t) = (8, 256);
    for mode in [SampleMode::Random, SampleMode::Epochs] {
        let mut s = WindowSampler::new(store.len(), b, t, mode, 0)?;
        let n = 20_000;
        let t0 = Instant::now();
        let mut sink = 0u64;
        for _ in 0..n {
            sink += s.next_batch(&store).inputs[0] as u64;
        }
        let dt = t0.elapsed();
        println!(
            "sampler alone, {mode}: {:.0} batches/s, {:.1} us/batch (checksum {sink})",
            n as f64 / dt.as_secs_f64(),
            dt.as_secs_f64() * 1e6 / n as f64
        );
    }
    let mk = || WindowSampler::new(store.len(), b, t, SampleMode::Epochs, 0);
    let mut pf = Prefetcher::windows(store.clone(), mk()?, 8);
    let n = 20_000;
    let t0 = Instant::now();
    for _ in 0..n {
        pf.next()?;
    }
    let dt = t0.elapsed();
    println!(
        "prefetcher drained as fast as possible: {:.0} batches/s ({:.1} us/batch)",
        n as f64 / dt.as_secs_f64(),
        dt.as_secs_f64() * 1e6 / n as f64
    );
    drop(pf);
    for step_ms in [5u64, 100] {
        let mut pf = Prefetcher::windows(store.clone(), mk()?, 4);
        pf.next()?; // warm-up: the first batch is built while the consumer waits
        let steps = if step_ms == 5 { 200 } else { 20 };
        let t0 = Instant::now();
        let before = pf.stats().clone();
        for _ in 0..steps {
            std::thread::sleep(Duration::from_millis(step_ms)); // stand-in for a training step
            pf.next()?;
        }
        let st = pf.stats();
        let waited = st.total_wait - before.total_wait;
        println!(
            "consumer with a {step_ms} ms step: {} steps in {:.2} s, data wait mean {:.1} us, \
             max {:.1} us ({:.4}% of step time)",
            steps,
            t0.elapsed().as_secs_f64(),
            waited.as_secs_f64() * 1e6 / steps as f64,
            st.max_wait.as_secs_f64() * 1e6,
            100.0 * waited.as_secs_f64() / (steps as f64 * step_ms as f64 / 1e3)
        );
    }
    println!("\nload at end: {}", uptime());
    std::fs::remove_dir_all(&tmp).ok();
    Ok(())
}

/// User + system CPU time of this process so far (from /proc; 0 where unavailable). With other
/// jobs on the machine, MB per CPU-second is the figure that does not depend on them.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    f.iter().sum::<f64>() / 100.0 // USER_HZ
}

fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
