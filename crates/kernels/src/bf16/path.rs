//! Which bf16 product this CPU runs ([`super`]): AMX, AVX512-BF16 or the emulation, detected
//! at run time and capped by `QWEN_BURN_BF16_KERNEL`.

use super::amx;

/// How a bf16 product is computed on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Path {
    /// Operands rounded into f32 copies, then the f32 product.
    Emulated,
    /// `vdpbf16ps` (AVX512-BF16).
    Avx512Bf16,
    /// `tdpbf16ps` (AMX-BF16).
    Amx,
}

impl Path {
    /// Whether the path runs a bf16 kernel (not the emulation).
    pub fn has_kernel(self) -> bool {
        self != Path::Emulated
    }

    /// The name `QWEN_BURN_BF16_KERNEL` takes for it.
    pub fn name(self) -> &'static str {
        match self {
            Path::Emulated => "emulated",
            Path::Avx512Bf16 => "avx512bf16",
            Path::Amx => "amx",
        }
    }
}

/// Whether this CPU (and, for AMX, Linux) can run `path`.
pub fn has_bf16_path(path: Path) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match path {
            Path::Emulated => true,
            Path::Avx512Bf16 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bf16")
            }
            Path::Amx => amx::available(),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        path == Path::Emulated
    }
}

/// The best path this CPU has: AMX, else AVX512-BF16, else the emulation.
pub fn detected_bf16_path() -> Path {
    [Path::Amx, Path::Avx512Bf16]
        .into_iter()
        .find(|p| has_bf16_path(*p))
        .unwrap_or(Path::Emulated)
}

/// The variable that caps the bf16 path (to compare kernels on one CPU).
pub const BF16_KERNEL_VAR: &str = "QWEN_BURN_BF16_KERNEL";

/// A `QWEN_BURN_BF16_KERNEL` that names no path, or one this CPU lacks.
#[derive(Debug, thiserror::Error)]
#[error("{BF16_KERNEL_VAR}={value:?}: expected one of {expected} (the bf16 paths this CPU has)")]
pub struct Bf16KernelError {
    value: String,
    expected: String,
}

/// The path `QWEN_BURN_BF16_KERNEL` chooses (unset or empty: [`detected_bf16_path`]), or an
/// error naming the paths this CPU has.
pub fn chosen_bf16_path() -> Result<Path, Bf16KernelError> {
    path_named(&std::env::var(BF16_KERNEL_VAR).unwrap_or_default())
}

/// The path `value` names, among those this CPU has (empty: the best).
pub(super) fn path_named(value: &str) -> Result<Path, Bf16KernelError> {
    if value.is_empty() {
        return Ok(detected_bf16_path());
    }
    let paths = [Path::Emulated, Path::Avx512Bf16, Path::Amx];
    let have = || paths.into_iter().filter(|p| has_bf16_path(*p));
    have()
        .find(|p| p.name() == value)
        .ok_or_else(|| Bf16KernelError {
            value: value.to_string(),
            expected: have().map(Path::name).collect::<Vec<_>>().join(", "),
        })
}

/// The path every bf16 product takes in this process: [`chosen_bf16_path`], or where
/// `QWEN_BURN_BF16_KERNEL` is invalid (the CLI refuses to start with it), the detected one.
pub fn bf16_path() -> Path {
    static PATH: std::sync::OnceLock<Path> = std::sync::OnceLock::new();
    *PATH.get_or_init(|| chosen_bf16_path().unwrap_or_else(|_| detected_bf16_path()))
}
