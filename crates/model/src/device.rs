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
                Ok(Device::wgpu(burn::tensor::DeviceKind::DefaultDevice))
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
