//! Packed rows keep their documents apart: every document of a packed row gets the per-token
//! losses and the gradients it gets alone in a row, through the training step's own forward and
//! backward ([`forward_backward`]), on Flex (fused attention and RoPE kernels, documents passed as
//! per-query starts) and on NdArray (composed ops, block-diagonal causal mask), dense and MoE,
//! with grouped-query attention. The layout has a one-token document, boundaries inside the
//! attention kernel's first 64-row query block, a document that crosses that block's end, and a
//! row whose trailing padding is a document of its own (as SFT rows have). MoE runs also under a
//! training-time expert capacity, which counts each document's load on its own.

mod common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use common::{tiny_config, worst_grad_diff};
use qwen_burn_data::{Batch, IGNORE_INDEX};
use qwen_burn_model::init::init_weights;
use qwen_burn_model::loss::token_nll;
use qwen_burn_model::{Documents, Qwen3ForCausalLM};
use qwen_burn_train::step::forward_backward;

const T: usize = 100;
/// Documents of each row (lengths); the last entry of row 1 is padding.
const ROWS: [&[usize]; 2] = [&[30, 1, 45, 24], &[50, 20, 30]];
const PADDED_ROW: usize = 1;

/// Deterministic tokens below 64.
fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as u32 % 64
        })
        .collect()
}

/// One document: its tokens and next-token targets (the last token has none).
struct Doc {
    row: usize,
    start: usize,
    ids: Vec<u32>,
    padding: bool,
}

impl Doc {
    fn targets(&self) -> Vec<i64> {
        let mut t: Vec<i64> = self.ids[1..].iter().map(|&x| i64::from(x)).collect();
        t.push(IGNORE_INDEX);
        t
    }
}

fn documents() -> Vec<Doc> {
    let mut docs = Vec::new();
    for (r, lens) in ROWS.iter().enumerate() {
        let mut start = 0;
        for (d, &len) in lens.iter().enumerate() {
            docs.push(Doc {
                row: r,
                start,
                ids: tokens(len, (r * 10 + d) as u64 + 1),
                padding: r == PADDED_ROW && d == lens.len() - 1,
            });
            start += len;
        }
        assert_eq!(start, T);
    }
    docs
}

/// The packed `[2, T]` batch; only document `only`'s targets count (all real ones if `None`).
/// `positions: false` packs without the document layout (what packing did before).
fn packed(docs: &[Doc], only: Option<usize>, positions: bool) -> Batch {
    let mut b = Batch {
        batch_size: ROWS.len(),
        seq_len: T,
        inputs: vec![0; ROWS.len() * T],
        targets: vec![IGNORE_INDEX; ROWS.len() * T],
        attention_mask: Some(vec![1; ROWS.len() * T]),
        positions: positions.then(|| vec![0; ROWS.len() * T]),
        pairs: None,
    };
    for (i, d) in docs.iter().enumerate() {
        let at = d.row * T + d.start;
        let n = d.ids.len();
        b.inputs[at..at + n].copy_from_slice(&d.ids);
        if let Some(p) = b.positions.as_mut() {
            p[at..at + n]
                .iter_mut()
                .enumerate()
                .for_each(|(k, x)| *x = k as u32);
        }
        if d.padding {
            b.attention_mask.as_mut().unwrap()[at..at + n].fill(0);
        } else if only.is_none_or(|o| o == i) {
            b.targets[at..at + n].copy_from_slice(&d.targets());
        }
    }
    b
}

/// Document `d` alone in a `[1, len]` row.
fn alone(d: &Doc) -> Batch {
    Batch {
        batch_size: 1,
        seq_len: d.ids.len(),
        inputs: d.ids.clone(),
        targets: d.targets(),
        attention_mask: None,
        positions: None,
        pairs: None,
    }
}

/// Per-token next-token losses of a batch through the packed forward, `[b * t]`.
fn token_losses(model: &Qwen3ForCausalLM, batch: &Batch, device: &Device) -> Vec<f32> {
    let (b, t) = (batch.batch_size, batch.seq_len);
    let ids: Vec<i64> = batch.inputs.iter().map(|&x| i64::from(x)).collect();
    let inputs = Tensor::from_data(TensorData::new(ids, [b, t]), device);
    let targets = Tensor::from_data(TensorData::new(batch.targets.clone(), [b, t]), device);
    let docs = batch
        .positions
        .as_ref()
        .map(|p| Documents::new(b, t, p.clone()).unwrap());
    let (hidden, _) = model.forward_hidden_packed(inputs, None, docs.as_ref());
    token_nll(model.lm_head(hidden), targets)
        .into_data()
        .try_into_vec_as::<f32>()
        .unwrap()
}

/// The largest absolute gradient over all parameters (the scale of the tolerance).
fn grad_scale(model: &Qwen3ForCausalLM, g: &GradientsParams) -> f32 {
    struct Max<'a>(&'a GradientsParams, f32);
    impl ModuleVisitor for Max<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(t) = self.0.get::<D>(param.id) {
                self.1 = self.1.max(t.abs().max().into_scalar::<f32>());
            }
        }
    }
    let mut m = Max(g, 0.0);
    model.visit(&mut m);
    m.1
}

fn check(device: Device, moe: bool, capacity: f64) {
    let label = format!("{device:?} moe={moe} capacity={capacity}");
    // No balancing loss: it pools the batch's tokens, which is not per document by design.
    let mut config = tiny_config(moe, None, 0.0);
    if let Some(m) = config.moe.as_mut() {
        m.router_capacity_factor = capacity;
    }
    let model = init_weights(Qwen3ForCausalLM::new(&config, &device), 11);
    let docs = documents();

    // Per-token losses of every document: packed (all targets) against alone.
    let all = token_losses(&model, &packed(&docs, None, true), &device);
    let mut worst_token = 0.0f32;
    for d in docs.iter().filter(|d| !d.padding) {
        let own = token_losses(&model, &alone(d), &device);
        let at = d.row * T + d.start;
        for (k, &l) in own.iter().enumerate() {
            worst_token = worst_token.max((all[at + k] - l).abs() / l.abs().max(1.0));
        }
    }
    assert!(
        worst_token <= 1e-5,
        "{label}: per-token losses differ by {worst_token}"
    );

    // Loss and gradients of each document's targets through the training step.
    for (i, d) in docs.iter().enumerate().filter(|(_, d)| !d.padding) {
        let (gp, sp) = forward_backward(&model, &[packed(&docs, Some(i), true)], &device).unwrap();
        let (ga, sa) = forward_backward(&model, &[alone(d)], &device).unwrap();
        let what = format!("{label}, document {i} (row {}, at {})", d.row, d.start);
        if d.ids.len() == 1 {
            // Nothing to predict: both losses are empty sums.
            assert_eq!(sp.loss, 0.0, "{what}");
            continue;
        }
        assert!(
            (sp.loss - sa.loss).abs() <= 1e-5 * sa.loss.abs(),
            "{what}: loss {} packed, {} alone",
            sp.loss,
            sa.loss
        );
        let scale = grad_scale(&model, &ga);
        let (worst, compared) = worst_grad_diff(&model, &gp, &ga);
        assert!(compared > 10, "{what}: compared {compared} parameters");
        assert!(
            worst <= 1e-5 * scale,
            "{what}: gradients differ by {worst} (largest gradient {scale})"
        );
    }

    // The same rows packed without the layout: later documents see earlier ones, so their
    // losses move (the test can tell the two apart).
    let leaky = token_losses(&model, &packed(&docs, None, false), &device);
    let d = &docs[2];
    let own = token_losses(&model, &alone(d), &device);
    let at = d.row * T + d.start;
    let moved = own
        .iter()
        .enumerate()
        .map(|(k, &l)| (leaky[at + k] - l).abs())
        .fold(0.0f32, f32::max);
    assert!(
        moved > 1e-4,
        "{label}: packing without the layout changed nothing ({moved})"
    );
}

#[test]
fn packed_documents_match_documents_alone_on_flex() {
    check(Device::flex().autodiff(), false, 0.0);
    check(Device::flex().autodiff(), true, 0.0);
    check(Device::flex().autodiff(), true, 1.1);
}

#[test]
#[allow(deprecated)] // NdArray is Burn's deprecated backend, kept here as the composed path.
fn packed_documents_match_documents_alone_on_ndarray() {
    check(Device::ndarray().autodiff(), false, 0.0);
    check(Device::ndarray().autodiff(), true, 0.0);
    check(Device::ndarray().autodiff(), true, 1.1);
}
