//! The peak FLOP/s that MFU is measured against: measured on this machine, not assumed.
//!
//! `qwen-burn bench peak` times a large f32 matmul on a device (the best of several runs) and
//! caches the figure per machine and device kind in `peak.json` of the cache directory
//! (`$QWEN_BURN_CACHE_DIR`, else `$XDG_CACHE_HOME/qwen-burn`, else `~/.cache/qwen-burn`). A
//! run's peak is, in order: `logging.peak_tflops.<kind>` (an explicit figure for that device kind
//! only), the cached measurement, else (`train`, `bench train`) a measurement made at the start
//! of the run ([`peak_or_measure`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::{Device, Distribution, Tensor};
use qwen_burn_model::{BackendKind, DeviceSet};
use serde::{Deserialize, Serialize};

use crate::config::PeakTflops;
use crate::error::{Result, TrainError};

/// One cached measurement.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PeakRecord {
    /// FLOP/s of one device of the kind.
    pub flops: f64,
    /// Matmul size `n` (`[n, n] @ [n, n]`).
    pub n: usize,
    /// What was measured, for the reader.
    pub machine: String,
}

/// Where a peak figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PeakSource {
    /// `logging.peak_tflops.<kind>`.
    Configured,
    /// `qwen-burn bench peak`, cached for this machine.
    Measured,
    /// The backend's assumed figure (`BackendKind::assumed_peak_flops`).
    Assumed,
}

/// The cache file.
pub fn cache_path() -> Option<PathBuf> {
    let dir = std::env::var_os("QWEN_BURN_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("qwen-burn")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/qwen-burn")))?;
    Some(dir.join("peak.json"))
}

/// This machine, as the cache key sees it: the CPU model and the number of logical cores.
pub fn machine_id() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{model} x{cores}")
}

fn kind_key(kind: BackendKind) -> String {
    let name = match kind {
        BackendKind::Flex => "flex".to_string(),
        BackendKind::Ndarray => "ndarray".to_string(),
        BackendKind::Wgpu => "wgpu".to_string(),
        BackendKind::Cuda(i) => format!("cuda:{i}"),
    };
    format!("{name} on {}", machine_id())
}

fn read_cache(path: Option<&Path>) -> BTreeMap<String, PeakRecord> {
    path.and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// The measurement of `kind` on this machine cached in `cache` (see [`cache_path`]), if any.
/// A cached figure that is not a finite positive FLOP/s (a hand-edited or damaged cache) is
/// reported on stderr, naming the file, and not used.
pub fn cached_peak(cache: Option<&Path>, kind: BackendKind) -> Option<PeakRecord> {
    let record = read_cache(cache).remove(&kind_key(kind))?;
    if record.flops.is_finite() && record.flops > 0.0 {
        return Some(record);
    }
    eprintln!(
        "warning: the cached peak of {} in {} is {} FLOP/s, not a finite positive figure; it is \
         not used (`qwen-burn bench peak` measures it again)",
        kind_key(kind),
        cache.map_or("the cache".to_string(), |p| p.display().to_string()),
        record.flops
    );
    None
}

/// Store a measurement in `cache` (atomically: written beside, then renamed). A peak is the most
/// the machine has done: a lower measurement than the one cached (a slower moment of a shared
/// VM, which the quiet check cannot see) does not replace it.
pub fn store_peak(cache: Option<&Path>, kind: BackendKind, record: &PeakRecord) -> Result<PathBuf> {
    let path = cache.map(Path::to_path_buf).ok_or_else(|| {
        TrainError::config(
            "bench peak",
            "no cache directory: set QWEN_BURN_CACHE_DIR or HOME",
        )
    })?;
    if !(record.flops.is_finite() && record.flops > 0.0) {
        return Err(TrainError::config(
            "bench peak",
            format!(
                "measured {} FLOP/s, not a finite positive figure; nothing cached",
                record.flops
            ),
        ));
    }
    let mut all = read_cache(Some(&path));
    let key = kind_key(kind);
    if all
        .get(&key)
        .is_some_and(|old| old.flops.is_finite() && old.flops >= record.flops)
    {
        return Ok(path);
    }
    all.insert(key, record.clone());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::io("create", dir, e))?;
    }
    let text = serde_json::to_string_pretty(&all).expect("records serialise");
    crate::files::write_replacing(&path, text)?;
    Ok(path)
}

/// Time `[n, n] @ [n, n]` in f32 on `device`: one untimed run, then the best of `repeats`.
pub fn measure_peak(device: &Device, n: usize, repeats: usize) -> f64 {
    let a = Tensor::<2>::random([n, n], Distribution::Normal(0.0, 1.0), device);
    let b = Tensor::<2>::random([n, n], Distribution::Normal(0.0, 1.0), device);
    let _ = a.clone().matmul(b.clone()).sum().into_scalar::<f32>();
    let mut best = f64::MAX;
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        let c = a.clone().matmul(b.clone());
        device.sync().ok();
        let secs = start.elapsed().as_secs_f64();
        drop(c);
        best = best.min(secs);
    }
    2.0 * (n as f64).powi(3) / best
}

/// The peak FLOP/s of a run's devices for MFU and where it came from: the configured figure of
/// the devices' kind, else the cached measurement, else the assumed figure; shared by replicas
/// on one CPU, summed over distinct accelerators ([`DeviceSet::peak_flops`]).
pub fn run_peak(
    devices: &DeviceSet,
    configured: &PeakTflops,
    cache: Option<&Path>,
) -> (f64, PeakSource) {
    let kind = devices.kinds()[0];
    let (one, source) = match configured.for_kind(kind) {
        Some(flops) => (Some(flops), PeakSource::Configured),
        None => match cached_peak(cache, kind) {
            Some(record) => (Some(record.flops), PeakSource::Measured),
            None => (None, PeakSource::Assumed),
        },
    };
    (devices.peak_flops(one), source)
}

/// Busy and total CPU time of the whole machine (`/proc/stat`), and this process's own CPU
/// time (`/proc/self/stat`), in clock ticks (Linux).
fn cpu_times() -> Option<(u64, u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    let own = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name: state is the 3rd field, utime the 14th.
    let after = own.rsplit_once(')')?.1;
    let rest: Vec<&str> = after.split_whitespace().collect();
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((total - idle, total, utime + stime))
}

/// The share of the machine's CPU time that other processes used while `work` ran (0 to 1),
/// if the OS tells; and `work`'s result. A peak measured while others compute is too low.
fn with_others_share<T>(work: impl FnOnce() -> T) -> (T, Option<f64>) {
    let before = cpu_times();
    let out = work();
    let share = match (before, cpu_times()) {
        (Some((busy0, total0, own0)), Some((busy1, total1, own1))) if total1 > total0 => {
            let others = (busy1 - busy0).saturating_sub(own1 - own0);
            Some(others as f64 / (total1 - total0) as f64)
        }
        _ => None,
    };
    (out, share)
}

/// The 1-minute load average (Linux), if known.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What [`peak_or_measure`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct PeakFigure {
    /// FLOP/s of the run's devices.
    pub flops: f64,
    /// Where it came from.
    pub source: PeakSource,
    /// A line for the run's header: how it was measured now, and whether it was cached.
    pub note: Option<String>,
}

/// The run's peak as [`run_peak`] finds it, except that with neither a configured figure nor a
/// cached one, the first device is measured now (`[2048, 2048]` matmul, best of 5: about a
/// second on a 2-core CPU) instead of assuming a figure. The measurement is cached only when
/// the machine was quiet while it ran (other processes used under a quarter of its CPU time),
/// since a peak measured beside other work is too low and would inflate every later MFU.
pub fn peak_or_measure(
    devices: &DeviceSet,
    configured: &PeakTflops,
    cache: Option<&Path>,
) -> Result<PeakFigure> {
    let (flops, source) = run_peak(devices, configured, cache);
    if source != PeakSource::Assumed {
        return Ok(PeakFigure {
            flops,
            source,
            note: None,
        });
    }
    const N: usize = 2048;
    let (one, others) = with_others_share(|| measure_peak(devices.main(), N, 5));
    let record = PeakRecord {
        flops: one,
        n: N,
        machine: machine_id(),
    };
    let quiet = others.is_some_and(|share| share < 0.25);
    let stored = if quiet {
        store_peak(cache, devices.kinds()[0], &record).ok()
    } else {
        None
    };
    let busy_text = others.map_or("unknown".to_string(), |s| format!("{:.0}%", s * 100.0));
    let note = match stored {
        Some(path) => format!(
            "MFU is against this machine's peak, measured now: {:.3} TFLOP/s (other processes \
             used {busy_text} of the CPU meanwhile; cached in {})",
            one / 1e12,
            path.display()
        ),
        None => format!(
            "MFU is against this machine's peak, measured now: {:.3} TFLOP/s (other processes \
             used {busy_text} of the CPU meanwhile: not cached; `qwen-burn bench peak --device \
             {}` on a quiet machine caches it)",
            one / 1e12,
            devices.name()
        ),
    };
    Ok(PeakFigure {
        flops: devices.peak_flops(Some(one)),
        source: PeakSource::Measured,
        note: Some(note),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peak_that_is_not_finite_and_positive_is_neither_cached_nor_used() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peak.json");
        let cache = Some(path.as_path());
        for bad in [0.0, -1.0, f64::INFINITY, f64::NAN] {
            let record = PeakRecord {
                flops: bad,
                n: 1,
                machine: "test".into(),
            };
            assert!(
                store_peak(cache, BackendKind::Flex, &record).is_err(),
                "{bad}"
            );
        }
        assert!(!path.exists(), "nothing was written");
        // A cache edited (or damaged) to hold 0 is not read as a peak.
        let zero = format!(
            r#"{{"{}": {{"flops": 0.0, "n": 1, "machine": "test"}}}}"#,
            kind_key(BackendKind::Flex)
        );
        std::fs::write(&path, zero).unwrap();
        assert_eq!(cached_peak(cache, BackendKind::Flex), None);
        // A good measurement replaces it.
        let good = PeakRecord {
            flops: 1e11,
            n: 64,
            machine: "test".into(),
        };
        store_peak(cache, BackendKind::Flex, &good).unwrap();
        assert_eq!(cached_peak(cache, BackendKind::Flex), Some(good));
    }

    #[test]
    fn the_configured_peak_applies_to_its_device_kind_only() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("peak.json");
        let cache = Some(cache.as_path());
        let flex = DeviceSet::parse("flex").unwrap();
        let cuda_only = PeakTflops {
            cuda: Some(67.0),
            ..PeakTflops::default()
        };
        // A CUDA figure does not apply to a CPU run: with no cache, the assumed CPU figure.
        let (peak, source) = run_peak(&flex, &cuda_only, cache);
        assert_eq!(source, PeakSource::Assumed);
        assert_eq!(peak, BackendKind::Flex.assumed_peak_flops());
        // A measured figure is cached and then used.
        let record = PeakRecord {
            flops: 2.5e11,
            n: 2048,
            machine: machine_id(),
        };
        store_peak(cache, BackendKind::Flex, &record).unwrap();
        assert_eq!(
            run_peak(&flex, &cuda_only, cache),
            (2.5e11, PeakSource::Measured)
        );
        // ...unless the config names a figure for this kind.
        let flex_too = PeakTflops {
            flex: Some(0.3),
            ..cuda_only
        };
        assert_eq!(
            run_peak(&flex, &flex_too, cache),
            (0.3e12, PeakSource::Configured)
        );
        // A lower measurement does not replace it; a higher one does.
        let low = PeakRecord {
            flops: 1.2e11,
            ..record.clone()
        };
        store_peak(cache, BackendKind::Flex, &low).unwrap();
        assert_eq!(cached_peak(cache, BackendKind::Flex).unwrap().flops, 2.5e11);
        let high = PeakRecord {
            flops: 3.3e11,
            ..record
        };
        store_peak(cache, BackendKind::Flex, &high).unwrap();
        assert_eq!(cached_peak(cache, BackendKind::Flex).unwrap().flops, 3.3e11);
        // Other kinds have their own entries.
        assert!(cached_peak(cache, BackendKind::Ndarray).is_none());
        // A real measurement is positive and finite.
        let measured = measure_peak(&Device::flex(), 128, 2);
        assert!(measured.is_finite() && measured > 0.0);
    }
}
