//! The LM head and the softmax cross-entropy fused: `sum_rows CE(h @ W, y)` without a
//! `[n, vocab]` logits tensor.
//!
//! Composed, the head writes the logits (`[n, vocab]`, 64 MB for a 2048-token step at vocabulary
//! 8192, 1.2 GB for Qwen3's 151,936), the loss writes the gradient coefficient `softmax - onehot`
//! of the same size, and the backward forms their product with the incoming gradient before the
//! two head products read it again: four tensors of that size per step, each a fresh allocation
//! the kernel has to fault in and zero. Here the rows go through in chunks of a few hundred:
//! logits of the chunk (one gemm), the loss and `softmax - onehot` in place in that buffer
//! (one pass per row, [`row_loss`]), then the chunk's share of both gradients while the buffer is
//! still warm: `dH_c = C_c W^T` and `dW += H_c^T C_c`. The loss is a sum over rows with unit
//! weights, so the gradients are complete at the end of the forward; the backward only scales
//! them by the incoming scalar. Memory: one chunk buffer plus the gradients themselves.
//!
//! The weight comes in either layout: a `Linear`'s `[hidden, vocab]`, or the tied embedding
//! table `[vocab, hidden]` (`vocab_major`). Only the gradients whose inputs are tracked are
//! computed (a frozen head under LoRA costs no `dW` product).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Int, Tensor, TensorData};
use rayon::prelude::*;

use super::bf16::PackedB;
use super::cross_entropy::row_loss;
use super::mm::Threads;
use super::products::{Precision, mm_in, mm_matrix, mm_packed, packed_matrix};
use super::{Elements, dense, flex_training, int_values};

/// Backends with the fused head + cross-entropy: Flex, and Autodiff over Flex.
#[backend_extension(Flex, Autodiff)]
pub trait FusedLinearCrossEntropy: Backend {
    /// `[1]`: the summed negative log-likelihood over the rows of `h: [n, d]` of the logits
    /// `h @ w` (`w: [d, v]`), or `h @ w^T` when `vocab_major` (`w: [v, d]`), against targets
    /// `y: [n]` (negative = ignored).
    fn linear_cross_entropy(
        h: FloatTensor<Self>,
        w: FloatTensor<Self>,
        y: IntTensor<Self>,
        vocab_major: bool,
    ) -> FloatTensor<Self>;
}

impl FusedLinearCrossEntropy for Flex {
    fn linear_cross_entropy(
        h: FloatTensor<Self>,
        w: FloatTensor<Self>,
        y: IntTensor<Self>,
        vocab_major: bool,
    ) -> FloatTensor<Self> {
        run(&h, &w, &y, vocab_major, (false, false)).0
    }
}

impl<C: CheckpointStrategy> FusedLinearCrossEntropy for Autodiff<Flex, C> {
    fn linear_cross_entropy(
        h: FloatTensor<Self>,
        w: FloatTensor<Self>,
        y: IntTensor<Self>,
        vocab_major: bool,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct LinearCrossEntropyBackward;

        impl Backward<Flex, 2> for LinearCrossEntropyBackward {
            /// The gradients of the summed loss for `h` and `w`, where tracked.
            type State = (Option<FlexTensor>, Option<FlexTensor>);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node_h, node_w] = ops.parents;
                let g = dense(&grads.consume::<Flex>(&ops.node)).storage::<f32>()[0];
                let (dh, dw) = ops.state;
                for (node, grad) in [(node_h, dh), (node_w, dw)] {
                    if let (Some(node), Some(mut grad)) = (node, grad) {
                        grad.storage_mut::<f32>().iter_mut().for_each(|x| *x *= g);
                        grads.register::<Flex>(node.id, grad);
                    }
                }
            }
        }

        let want = (h.is_tracked(), w.is_tracked());
        match LinearCrossEntropyBackward
            .prepare::<C>([h.node(), w.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (loss, dh, dw) = run(h.primitive(), w.primitive(), &y, vocab_major, want);
                prep.finish((dh, dw), loss)
            }
            OpsKind::UnTracked(prep) => prep.finish(
                run(
                    h.primitive(),
                    w.primitive(),
                    &y,
                    vocab_major,
                    (false, false),
                )
                .0,
            ),
        }
    }
}

/// The fused head + cross-entropy on Flex (autodiff or not), computed in f32; `None` elsewhere,
/// for the composed path (`lm_head` then `loss::cross_entropy_sum`). `h` is f32, `w` f32 or,
/// when frozen, bf16.
///
/// # Shapes
/// - `h`: `[n, d]`, `w`: `[d, v]` (or `[v, d]` when `vocab_major`), `y`: `[n]` -> `[1]`
pub fn linear_cross_entropy(
    h: &Tensor<2>,
    w: &Tensor<2>,
    y: &Tensor<1, Int>,
    vocab_major: bool,
) -> Option<Tensor<1>> {
    let [n, d] = h.dims();
    let wd = w.dims();
    let ok = flex_training(&h.device())
        && h.dtype() == DType::F32
        && (w.dtype() == DType::F32 || (w.dtype() == DType::BF16 && !w.is_tracked()))
        && y.dims() == [n]
        && (if vocab_major { wd[1] } else { wd[0] }) == d;
    if !ok {
        return None;
    }
    Some(Tensor::from_dispatch(
        <Dispatch as FusedLinearCrossEntropy>::linear_cross_entropy(
            h.clone().into_dispatch(),
            w.clone().into_dispatch(),
            y.clone().inner().into_dispatch(),
            vocab_major,
        ),
    ))
}

/// Rows per chunk: a logits buffer of about 16 MB, but never fewer than 256 rows (thinner
/// products run far below the gemm's peak) nor more than 512 (measured in `benches/README.md`).
/// A bf16 table (a frozen LoRA base) takes 512: each chunk packs the whole table for the bf16
/// kernel, twice, so that fewer chunks pack it fewer times (the buffer of the Qwen3 vocabulary
/// then holds 311 MB instead of 156).
fn chunk_rows(v: usize, bf16_table: bool) -> usize {
    if bf16_table {
        return 512;
    }
    ((1 << 22) / v.max(1)).clamp(256, 512)
}

/// The loss `[1]` and, as asked by `want = (dh, dw)`, the gradients of the summed loss.
fn run(
    h: &FlexTensor,
    w: &FlexTensor,
    y: &FlexTensor,
    vocab_major: bool,
    want: (bool, bool),
) -> (FlexTensor, Option<FlexTensor>, Option<FlexTensor>) {
    run_chunks(h, w, y, vocab_major, want, true)
}

/// [`run`], with the table packed once for all chunks where `pack_once` allows it (the tests
/// compare both).
fn run_chunks(
    h: &FlexTensor,
    w: &FlexTensor,
    y: &FlexTensor,
    vocab_major: bool,
    want: (bool, bool),
    pack_once: bool,
) -> (FlexTensor, Option<FlexTensor>, Option<FlexTensor>) {
    let (h, w) = (dense(h), dense(w));
    let hs = h.storage::<f32>();
    // A frozen table may be bf16 (LoRA's base weights): widened a block at a time.
    let w_elements = Elements::of(&w);
    let wm = w_elements.matrix();
    let ws_shape = w.layout().shape().clone();
    let d = h.layout().shape()[1];
    let n = h.layout().shape()[0];
    let v = if vocab_major {
        ws_shape[0]
    } else {
        ws_shape[1]
    };
    let targets = int_values(y);
    let precision = crate::precision();
    let w_dims = [ws_shape[0], ws_shape[1]];

    let grads = want.0 || want.1;
    let mut dh = vec![0.0f32; if want.0 { n * d } else { 0 }];
    let mut dw = vec![0.0f32; if want.1 { d * v } else { 0 }];
    let bf16_table = matches!(wm, crate::products::Matrix::Bf16(_));
    let rows = chunk_rows(v, bf16_table).min(n.max(1));
    // At mixed precision, a table met by several chunks is packed for the bf16 kernel once, in
    // each of its two layouts, instead of in every chunk's product: with the Qwen3 vocabulary a
    // chunk of 256 rows would otherwise repack 150M elements twice. The packed copies hold a
    // quarter of the f32 table's bytes each. A bf16 table (a frozen LoRA base, whose point is
    // memory) is repacked per chunk, in chunks of 512 rows.
    let once = pack_once && precision == Precision::Bf16 && !bf16_table && n > rows;
    let fwd_packed = once
        .then(|| packed_matrix(precision, wm, w_dims, vocab_major))
        .flatten();
    let bwd_packed = (once && want.0)
        .then(|| packed_matrix(precision, wm, w_dims, !vocab_major))
        .flatten();
    // `c = a @ op(W)` for a chunk's `m` rows: from the packing made once, else packed by the
    // product.
    let table_product = |packed: Option<&PackedB>,
                         m: usize,
                         a: (&[f32], usize, usize),
                         transposed: bool,
                         c: (&mut [f32], usize)| match packed {
        Some(p) => mm_packed(m, a, p, c, false, Threads::All),
        None => mm_matrix(
            precision,
            m,
            a,
            wm,
            w_dims,
            transposed,
            c,
            false,
            Threads::All,
        ),
    };
    let mut logits = vec![0.0f32; rows * v];
    let mut row_nll = vec![0.0f32; rows];
    let mut loss = 0.0f64;
    for start in (0..n).step_by(rows) {
        let m = rows.min(n - start);
        let hc = &hs[start * d..(start + m) * d];
        let lc = &mut logits[..m * v];
        // Logits `H_c @ W` ([d, v] operand: the table transposed when vocab-major).
        table_product(fwd_packed.as_ref(), m, (hc, d, 1), vocab_major, (lc, v));
        let ys = &targets[start..start + m];
        let nll = &mut row_nll[..m];
        lc.par_chunks_mut(v)
            .zip(ys.par_iter())
            .zip(nll.par_iter_mut())
            .for_each(|((row, &t), out)| *out = row_loss(row, t, grads));
        // Summed in row order: the same bits on every run (a parallel sum's order is not fixed).
        loss += nll.iter().map(|&x| f64::from(x)).sum::<f64>();
        if want.0 {
            let dhc = &mut dh[start * d..(start + m) * d];
            // dH_c = C @ W^T ([v, d] operand: the table itself when vocab-major).
            table_product(bwd_packed.as_ref(), m, (lc, v, 1), !vocab_major, (dhc, d));
        }
        if want.1 {
            let first = start == 0;
            if vocab_major {
                // dW [v, d] += C^T [v, m] @ H_c [m, d]
                mm_in(
                    precision,
                    v,
                    d,
                    m,
                    (lc, 1, v),
                    (hc, d, 1),
                    (&mut dw, d),
                    !first,
                    Threads::All,
                );
            } else {
                // dW [d, v] += H_c^T [d, m] @ C [m, v]
                mm_in(
                    precision,
                    d,
                    v,
                    m,
                    (hc, 1, d),
                    (lc, v, 1),
                    (&mut dw, v),
                    !first,
                    Threads::All,
                );
            }
        }
    }
    let loss = FlexTensor::from_data(TensorData::new(vec![loss as f32], [1]));
    let dh = want
        .0
        .then(|| FlexTensor::from_data(TensorData::new(dh, [n, d])));
    let dw = want
        .1
        .then(|| FlexTensor::from_data(TensorData::new(dw, ws_shape)));
    (loss, dh, dw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cross_entropy::cross_entropy_sum_reference;
    use burn::tensor::{Device, Distribution};

    /// `n` targets below `v`, with row `i` ignored (-100) where `i % every == at`.
    fn targets_ignoring(n: usize, v: usize, (every, at): (i64, i64)) -> Vec<i64> {
        (0..n as i64)
            .map(|i| {
                if i % every == at {
                    -100
                } else {
                    (i * 7919) % v as i64
                }
            })
            .collect()
    }

    /// Value and both gradients against the composed head + `log_softmax` loss, both weight
    /// layouts, ignored rows, a row count that is not a multiple of the chunk.
    #[test]
    fn fused_head_loss_matches_the_composed_ops() {
        let device = Device::flex().autodiff();
        for (n, d, v, vocab_major) in [
            (7, 16, 50, false),
            (7, 16, 50, true),
            (300, 32, 8192, false),
            (130, 24, 20_000, true),
        ] {
            let normal = Distribution::Normal(0.0, 1.0);
            let h = Tensor::<2>::random([n, d], normal, &device).require_grad();
            let wshape = if vocab_major { [v, d] } else { [d, v] };
            let w = (Tensor::<2>::random(wshape, normal, &device) * 0.5).require_grad();
            let targets = targets_ignoring(n, v, (5, 3));
            let y = Tensor::<1, Int>::from_data(TensorData::new(targets.clone(), [n]), &device);
            let fused = linear_cross_entropy(&h, &w, &y, vocab_major).expect("flex kernel");
            let logits = if vocab_major {
                h.clone().matmul(w.clone().transpose())
            } else {
                h.clone().matmul(w.clone())
            };
            let y2 = Tensor::<2, Int>::from_data(TensorData::new(targets, [1, n]), &device);
            let reference = cross_entropy_sum_reference(logits.reshape([1, n, v]), y2);
            let (a, b) = (
                fused.clone().into_scalar::<f32>(),
                reference.clone().into_scalar::<f32>(),
            );
            assert!(
                (a - b).abs() <= 2e-5 * b.abs(),
                "{n}x{d}x{v}: loss {a} vs {b}"
            );
            let ga = (fused * 0.25).backward();
            let gb = (reference * 0.25).backward();
            for (name, x) in [("h", &h), ("w", &w)] {
                let (gx, gy) = (x.grad(&ga).unwrap(), x.grad(&gb).unwrap());
                let scale = gy.clone().abs().max().into_scalar::<f32>();
                let diff = (gx - gy).abs().max().into_scalar::<f32>();
                assert!(
                    diff <= 1e-5 * scale.max(1e-3),
                    "{n}x{d}x{v} {name}: gradients differ by {diff} (scale {scale})"
                );
            }
        }
    }

    /// At bf16 precision the table packed once for all chunks gives the bits of packing it in
    /// every chunk's product: loss and both gradients, both layouts, three chunks.
    #[test]
    fn a_table_packed_once_gives_the_bits_of_packing_every_chunk() {
        use crate::{Precision, bf16_path, with_precision};
        let (n, d, v) = (600, 40, 16_384);
        assert!(n > chunk_rows(v, false), "several chunks");
        let values = |len: usize, seed: u64| -> Vec<f32> {
            (0..len as u64)
                .map(|i| (((i * 2_654_435_761 + seed) % 2001) as f32 - 1000.0) * 1e-3)
                .collect()
        };
        let h = FlexTensor::from_data(TensorData::new(values(n * d, 1), [n, d]));
        let targets = targets_ignoring(n, v, (7, 2));
        let y = FlexTensor::from_data(TensorData::new(targets, [n]));
        for vocab_major in [false, true] {
            let shape = if vocab_major { [v, d] } else { [d, v] };
            let w = FlexTensor::from_data(TensorData::new(values(d * v, 5), shape));
            let bits = |t: &FlexTensor| -> Vec<u32> {
                t.storage::<f32>().iter().map(|x| x.to_bits()).collect()
            };
            let [once, every] = [true, false].map(|pack_once| {
                let (loss, dh, dw) = with_precision(Precision::Bf16, || {
                    run_chunks(&h, &w, &y, vocab_major, (true, true), pack_once)
                });
                let (dh, dw) = (dh.expect("dh"), dw.expect("dw"));
                [bits(&loss), bits(&dh), bits(&dw)]
            });
            assert!(f32::from_bits(once[0][0]).is_finite());
            for (i, name) in ["loss", "dh", "dw"].iter().enumerate() {
                assert!(
                    once[i] == every[i],
                    "vocab-major {vocab_major}: {name} differs"
                );
            }
            let packed = crate::products::packed_matrix(
                Precision::Bf16,
                crate::products::Matrix::F32(&values(d * v, 5)),
                shape,
                vocab_major,
            );
            println!(
                "bf16 path {:?}: table packed once: {}",
                bf16_path(),
                packed.is_some()
            );
            assert_eq!(packed.is_some(), bf16_path().has_kernel());
        }
    }

    /// A frozen weight gets no gradient (and costs no product); the input's is still right.
    #[test]
    fn a_frozen_weight_gets_no_gradient() {
        let device = Device::flex().autodiff();
        let h = Tensor::<2>::random([9, 8], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let w = Tensor::<2>::random([30, 8], Distribution::Normal(0.0, 1.0), &device);
        let targets: Vec<i64> = (0..9).map(|i| i * 3).collect();
        let y = Tensor::<1, Int>::from_data(TensorData::new(targets.clone(), [9]), &device);
        let grads = linear_cross_entropy(&h, &w, &y, true).unwrap().backward();
        assert!(w.grad(&grads).is_none());
        let y2 = Tensor::<2, Int>::from_data(TensorData::new(targets, [1, 9]), &device);
        let logits = h.clone().matmul(w.clone().transpose()).reshape([1, 9, 30]);
        let gb = cross_entropy_sum_reference(logits, y2).backward();
        let diff = (h.grad(&grads).unwrap() - h.grad(&gb).unwrap())
            .abs()
            .max()
            .into_scalar::<f32>();
        assert!(diff <= 1e-5, "input gradient differs by {diff}");
    }

    /// Without autodiff: the value alone, the same as with it.
    #[test]
    fn the_value_without_autodiff_matches() {
        let device = Device::flex();
        let h = Tensor::<2>::random([70, 16], Distribution::Normal(0.0, 1.0), &device);
        let w = Tensor::<2>::random([16, 40_000], Distribution::Normal(0.0, 1.0), &device);
        let targets: Vec<i64> = (0..70).map(|i| i * 571).collect();
        let y = Tensor::<1, Int>::from_data(TensorData::new(targets.clone(), [70]), &device);
        let a = linear_cross_entropy(&h, &w, &y, false)
            .unwrap()
            .into_scalar::<f32>();
        let y2 = Tensor::<2, Int>::from_data(TensorData::new(targets, [1, 70]), &device);
        let logits = h.matmul(w).reshape([1, 70, 40_000]);
        let b = cross_entropy_sum_reference(logits, y2).into_scalar::<f32>();
        assert!((a - b).abs() <= 2e-5 * b.abs(), "loss {a} vs {b}");
    }
}
