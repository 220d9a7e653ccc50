//! Run-time device selection.

use burn::tensor::Device;

use crate::error::{ModelError, Result};

/// Devices this binary can run on, for help texts.
pub const DEVICE_NAMES: &str = "flex, ndarray, wgpu, cuda[:N]";

/// Resolve a device name (`flex`, `ndarray`, `wgpu`, `cuda` or `cuda:N`).
///
/// A backend that was not compiled in is an error that says how to rebuild.
pub fn device_from_name(name: &str) -> Result<Device> {
    let not_built = |feature: &str, extra: &str| {
        ModelError::InvalidInput(format!(
            "device `{name}` is not compiled into this binary; rebuild with \
             `cargo build --release --features {feature}`{extra}"
        ))
    };
    match name {
        "flex" | "cpu" => Ok(Device::flex()),
        #[allow(deprecated)] // burn-ndarray is deprecated upstream; we still offer it.
        "ndarray" => Ok(Device::ndarray()),
        "wgpu" => {
            #[cfg(feature = "wgpu")]
            {
                let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
                crate::device_probe::probe(name, &device).map_err(|why| {
                    ModelError::InvalidInput(format!(
                        "device `wgpu` cannot start: {why}. wgpu needs a Vulkan, Metal, DX12 or \
                         OpenGL driver. On a headless NVIDIA machine whose \
                         Vulkan ICD names libGLX_nvidia.so.0, point the loader at the EGL one: \
                         benches/README.md, \"GPU (wgpu)\""
                    ))
                })?;
                Ok(device)
            }
            #[cfg(not(feature = "wgpu"))]
            {
                Err(not_built("wgpu", ""))
            }
        }
        _ if name == "cuda" || name.starts_with("cuda:") => {
            let index: usize = match name.strip_prefix("cuda:") {
                None => 0,
                Some(i) => i.parse().map_err(|_| {
                    ModelError::InvalidInput(format!("bad CUDA device index in `{name}`"))
                })?,
            };
            #[cfg(feature = "cuda")]
            {
                Ok(Device::cuda(index))
            }
            #[cfg(not(feature = "cuda"))]
            {
                let _ = index;
                Err(not_built(
                    "cuda",
                    " (it downloads LLVM at build time; see the README)",
                ))
            }
        }
        other => Err(ModelError::InvalidInput(format!(
            "unknown device `{other}` (expected one of {DEVICE_NAMES})"
        ))),
    }
}

/// Which backend a device runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    /// Burn's flex CPU backend.
    Flex,
    /// Burn's ndarray CPU backend.
    Ndarray,
    /// wgpu (Vulkan / Metal / DX12; lavapipe in CI).
    Wgpu,
    /// CUDA device `n`.
    Cuda(usize),
}

impl BackendKind {
    /// Whether this runs on the host CPU (several of them share the same cores).
    pub fn is_cpu(self) -> bool {
        matches!(self, BackendKind::Flex | BackendKind::Ndarray)
    }

    /// Assumed peak f32 FLOP/s of one such device, for MFU when none is configured:
    /// CPU: cores x 2.0 GHz x 32 f32 FLOP/cycle (one AVX-512 FMA port); CUDA: 67 TFLOP/s (H100
    /// SXM f32, non-tensor-core), since training runs in f32; wgpu: 10 TFLOP/s, a mid-range
    /// discrete GPU.
    pub fn assumed_peak_flops(self) -> f64 {
        match self {
            BackendKind::Cuda(_) => 67e12,
            BackendKind::Wgpu => 10e12,
            BackendKind::Flex | BackendKind::Ndarray => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                cores as f64 * 2.0e9 * 32.0
            }
        }
    }
}

/// The devices of a run, parsed once from a device list (`flex`, `flex,flex`, `cuda:0,cuda:1`):
/// their backends and Burn devices, how many distinct accelerators they are, and their peak.
#[derive(Debug, Clone)]
pub struct DeviceSet {
    name: String,
    kinds: Vec<BackendKind>,
    devices: Vec<Device>,
}

impl DeviceSet {
    /// Parse a comma-separated device list; each name as [`device_from_name`] takes it.
    pub fn parse(names: &str) -> Result<Self> {
        let mut kinds = Vec::new();
        let mut devices = Vec::new();
        for name in names.split(',').map(str::trim) {
            devices.push(device_from_name(name)?);
            kinds.push(match name {
                "flex" | "cpu" => BackendKind::Flex,
                "ndarray" => BackendKind::Ndarray,
                "wgpu" => BackendKind::Wgpu,
                cuda => BackendKind::Cuda(
                    cuda.strip_prefix("cuda:")
                        .and_then(|i| i.parse().ok())
                        .unwrap_or(0),
                ),
            });
        }
        if kinds.iter().any(|k| k.is_cpu()) && kinds.iter().any(|k| !k.is_cpu()) {
            return Err(ModelError::InvalidInput(format!(
                "device list `{names}` mixes CPU and GPU devices; use one kind"
            )));
        }
        Ok(Self {
            name: names.to_string(),
            kinds,
            devices,
        })
    }

    /// The list as written.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Burn devices, first = main.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The backend of each device.
    pub fn kinds(&self) -> &[BackendKind] {
        &self.kinds
    }

    /// The first device (master weights, optimizer).
    pub fn main(&self) -> &Device {
        &self.devices[0]
    }

    /// How many replicas the list asks for.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Never true: a parsed list has a device.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Distinct accelerators (GPUs); 0 for CPU lists (`flex,flex` is two threads on one CPU).
    pub fn accelerators(&self) -> usize {
        let distinct: std::collections::BTreeSet<BackendKind> =
            self.kinds.iter().copied().filter(|k| !k.is_cpu()).collect();
        distinct.len()
    }

    /// Peak FLOP/s of the whole set: the CPU once however many replicas share it, or the sum
    /// over distinct accelerators. `per_device` (e.g. `logging.peak_tflops`, a measured peak)
    /// replaces the assumed per-device figure.
    pub fn peak_flops(&self, per_device: Option<f64>) -> f64 {
        let one = per_device.unwrap_or_else(|| self.kinds[0].assumed_peak_flops());
        one * self.accelerators().max(1) as f64
    }
}

impl std::str::FromStr for DeviceSet {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists_know_their_accelerators_and_peak() {
        let one = DeviceSet::parse("flex").unwrap();
        let two = DeviceSet::parse("flex, flex").unwrap();
        assert_eq!((one.len(), one.accelerators()), (1, 0));
        assert_eq!((two.len(), two.accelerators()), (2, 0));
        // Two replicas on one CPU share its peak.
        assert_eq!(one.peak_flops(None), two.peak_flops(None));
        assert_eq!(two.peak_flops(Some(259e9)), 259e9);
        assert!(DeviceSet::parse("flex,gpu").is_err());
        assert_eq!(
            BackendKind::Cuda(1).assumed_peak_flops(),
            BackendKind::Cuda(0).assumed_peak_flops()
        );
    }
}
