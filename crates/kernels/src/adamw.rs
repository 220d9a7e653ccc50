//! One AdamW update of a parameter tensor in one pass: moments, bias correction, decoupled
//! weight decay and the step, in place.
//!
//! Burn's `AdamW` runs each of those as a tensor operation: about twelve passes over a
//! parameter-sized tensor (three of them allocating), per parameter, per step. Here one pass
//! reads the gradient and updates the parameter and both moments where they lie (chunks over the
//! threads). Every element goes through the same f32 operations in the same order as Burn's
//! implementation (`burn-optim` 0.22.1 `AdamW::step` with `AdaptiveMomentumW::transform`), so
//! the results are bit-identical to it (tested in the trainer's optimizer tests).

use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Tensor};
use rayon::prelude::*;

use super::flex_training;

/// The scalars of one update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    /// Learning rate.
    pub lr: f64,
    /// First and second moment decay rates.
    pub beta_1: f32,
    /// See `beta_1`.
    pub beta_2: f32,
    /// Added to the root of the second moment.
    pub epsilon: f32,
    /// Decoupled weight decay (multiplied by `lr`).
    pub weight_decay: f32,
    /// The step number after this update (1 for the first).
    pub time: usize,
}

/// Backends with the fused AdamW update (Flex).
#[backend_extension(Flex)]
pub trait FusedAdamW: Backend {
    /// `(param, moment_1, moment_2)` after one AdamW step with `grad`. At the first step
    /// (`step.time == 1`) the moments passed in are not read (Burn's state has none yet).
    fn adamw_update(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moment_1: FloatTensor<Self>,
        moment_2: FloatTensor<Self>,
        step: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

impl FusedAdamW for Flex {
    fn adamw_update(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moment_1: FloatTensor<Self>,
        moment_2: FloatTensor<Self>,
        step: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        update(param, grad, moment_1, moment_2, step)
    }
}

/// The fused AdamW update on Flex in f32 (`None` elsewhere, for Burn's `AdamW`): the new
/// parameter and moments.
///
/// # Shapes
/// - all tensors share one shape.
pub fn adamw_update<const D: usize>(
    param: Tensor<D>,
    grad: Tensor<D>,
    moments: Option<(Tensor<D>, Tensor<D>)>,
    step: AdamWStep,
) -> Result<(Tensor<D>, Tensor<D>, Tensor<D>), Box<AdamWInputs<D>>> {
    let f32s = param.dtype() == DType::F32
        && grad.dtype() == DType::F32
        && moments
            .as_ref()
            .is_none_or(|(m, v)| m.dtype() == DType::F32 && v.dtype() == DType::F32);
    let shapes = moments
        .as_ref()
        .is_none_or(|(m, v)| m.dims() == param.dims() && v.dims() == param.dims())
        && grad.dims() == param.dims();
    if !flex_training(&param.device()) || param.device().is_autodiff() || !f32s || !shapes {
        return Err(Box::new(AdamWInputs {
            param,
            grad,
            moments,
        }));
    }
    // Before the first step: fresh buffers for the moments (written before any read).
    let (m, v) = moments.unwrap_or_else(|| (param.zeros_like(), param.zeros_like()));
    let (p, m, v) = <Dispatch as FusedAdamW>::adamw_update(
        param.into_dispatch(),
        grad.into_dispatch(),
        m.into_dispatch(),
        v.into_dispatch(),
        step,
    );
    Ok((
        Tensor::from_dispatch(p),
        Tensor::from_dispatch(m),
        Tensor::from_dispatch(v),
    ))
}

/// The inputs handed back when the fused update does not apply.
pub struct AdamWInputs<const D: usize> {
    /// The parameter.
    pub param: Tensor<D>,
    /// Its gradient.
    pub grad: Tensor<D>,
    /// Its moments, if any.
    pub moments: Option<(Tensor<D>, Tensor<D>)>,
}

/// `t` contiguous from offset 0 and not shared, so that it can be written in place.
fn owned(t: FlexTensor) -> FlexTensor {
    if t.is_contiguous() && t.layout().start_offset() == 0 {
        t
    } else {
        t.to_contiguous()
    }
}

const CHUNK: usize = 16_384;

fn update(
    param: FlexTensor,
    grad: FlexTensor,
    m: FlexTensor,
    v: FlexTensor,
    s: AdamWStep,
) -> (FlexTensor, FlexTensor, FlexTensor) {
    let grad = owned(grad);
    let (mut param, mut m, mut v) = (owned(param), owned(m), owned(v));
    let first = s.time <= 1;
    // The scalars as Burn forms them: f32 factors, f32 `powi`, the decay in f64 then cast.
    let (b1, b2, eps) = (s.beta_1, s.beta_2, s.epsilon);
    let (f1, f2) = (1.0 - b1, 1.0 - b2);
    let time = s.time as i32;
    let (c1, c2) = (1f32 - b1.powi(time), 1f32 - b2.powi(time));
    let decay_rate = s.lr * f64::from(s.weight_decay);
    let keep = (1.0 - decay_rate) as f32;
    let lr = s.lr as f32;
    let gs = grad.storage::<f32>();
    let (ps, ms, vs) = (
        param.storage_mut::<f32>(),
        m.storage_mut::<f32>(),
        v.storage_mut::<f32>(),
    );
    let k = Constants {
        first,
        b1,
        b2,
        f1,
        f2,
        c1,
        c2,
        eps,
        decay: decay_rate != 0.0,
        keep,
        lr,
    };
    ps.par_chunks_mut(CHUNK)
        .zip(ms.par_chunks_mut(CHUNK))
        .zip(vs.par_chunks_mut(CHUNK))
        .enumerate()
        .for_each(|(c, ((p, m), v))| {
            let g = &gs[c * CHUNK..c * CHUNK + p.len()];
            update_chunk(p, m, v, g, &k);
        });
    (param, m, v)
}

/// The per-element scalars of one update, as Burn forms them.
struct Constants {
    first: bool,
    b1: f32,
    b2: f32,
    f1: f32,
    f2: f32,
    c1: f32,
    c2: f32,
    eps: f32,
    decay: bool,
    keep: f32,
    lr: f32,
}

simd_dispatch! {
    /// One chunk, compiled for the CPU's vector width (wider divisions and square roots; the
    /// same IEEE operations in the same order, so the same bits).
    fn update_chunk(
        p: &mut [f32],
        m: &mut [f32],
        v: &mut [f32],
        g: &[f32],
        k: &Constants,
    ) = update_chunk_generic
}

#[inline(always)]
fn update_chunk_generic(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: &Constants) {
    let n = p.len();
    let (m, v, g) = (&mut m[..n], &mut v[..n], &g[..n]);
    for j in 0..n {
        let gj = g[j];
        let (mj, vj) = if k.first {
            (gj * k.f1, (gj * gj) * k.f2)
        } else {
            (m[j] * k.b1 + gj * k.f1, v[j] * k.b2 + (gj * gj) * k.f2)
        };
        m[j] = mj;
        v[j] = vj;
        let delta = (mj / k.c1) / ((vj / k.c2).sqrt() + k.eps);
        let decayed = if k.decay { p[j] * k.keep } else { p[j] };
        p[j] = decayed - delta * k.lr;
    }
}
