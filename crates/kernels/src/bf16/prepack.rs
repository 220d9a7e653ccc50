//! Frozen bf16 weights packed once for the bf16 kernel ([`super`]), while a
//! [`PackedWeights`] guard lives.
//!
//! A product repacks its right operand every call: the weight read from memory, its pairs of
//! rows interleaved and written to a scratch buffer. In a 128-token prefill of the Qwen3-0.6B
//! shape each weight meets only 128 rows, and the packing takes about a sixth of the prefill
//! (`benches/README.md`). Inference commands hold a [`PackedWeights`] guard: each bf16 weight a
//! product meets is then packed on first use and the packed copy kept, keyed by the weight's
//! buffer, with a clone of the weight's tensor, until the last guard drops. The clone keeps the
//! buffer alive and shared, so no later operation can change it in place (Flex copies a shared
//! buffer before writing to it) and the key cannot come to name another weight. The cost is a
//! second copy of the weights the products meet (the 0.6B shape: 0.9 GB).
//!
//! Training never holds the guard: its bf16 bases under LoRA would double their memory, and its
//! f32 weights change every step.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use burn::backend::flex::FlexTensor;
use half::bf16;

use super::pack::{KC2, Operand, pack_all};
use super::{NR, bf16_path};
use crate::mm::Threads;

/// A right operand `[k, n]` packed for the kernel: for each reduction block `kb` (of `2 * KC2`
/// elements), at `kb * block_words()`, the panels of [`NR`] columns, each `[pairs][NR]`.
pub(crate) struct PackedB {
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) words: Vec<u32>,
}

impl PackedB {
    /// The `[k, n]` of the operand it holds.
    pub(crate) fn shape(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// Words from one reduction block to the next.
    pub(super) fn block_words(&self) -> usize {
        self.n.div_ceil(NR) * NR * KC2
    }

    /// `b: [k, n]` packed.
    pub(crate) fn pack(b: Operand<'_>, k: usize, n: usize) -> Self {
        let (rs, cs) = b.strides();
        let kc = 2 * KC2;
        let block = n.div_ceil(NR) * NR * KC2;
        let blocks = k.div_ceil(kc);
        let mut words = vec![0u32; blocks * block];
        for kb in 0..blocks {
            let (p0, len) = (kb * kc, kc.min(k - kb * kc));
            let out = &mut words[kb * block..(kb + 1) * block];
            pack_all(b, (cs, rs), (0, n), p0, len, NR, out, Threads::All);
        }
        Self { k, n, words }
    }
}

/// A weight's buffer: the address and length of its elements.
type Key = (usize, usize);

/// What a kept weight holds: its tensor (kept shared) and its packed forms, as is and
/// transposed.
struct Entry {
    _tensor: FlexTensor,
    packed: [Option<Arc<PackedB>>; 2],
}

#[derive(Default)]
struct Registry {
    guards: usize,
    entries: HashMap<Key, Entry>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<Registry>> {
    // A panic while packing leaves nothing half-written here: entries go in whole.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// While one lives, the bf16 weights the products meet are packed once and kept
/// ([`crate::keep_packed_weights`]).
#[must_use = "the packed weights are dropped with the guard"]
pub struct PackedWeights(());

impl Drop for PackedWeights {
    fn drop(&mut self) {
        let mut reg = registry();
        if let Some(r) = reg.as_mut() {
            r.guards -= 1;
            if r.guards == 0 {
                *reg = None;
            }
        }
    }
}

/// Start keeping packed bf16 weights; they are freed when the last guard drops.
pub fn keep_packed_weights() -> PackedWeights {
    registry().get_or_insert_with(Registry::default).guards += 1;
    PackedWeights(())
}

/// Keep `tensor` (a bf16 weight whose elements are `elements`) if a guard lives and the CPU has
/// the kernel, so that its products may use a packed copy ([`packed`]).
pub(crate) fn retain(tensor: &FlexTensor, elements: &[bf16]) {
    if !bf16_path().has_kernel() {
        return;
    }
    if let Some(r) = registry().as_mut() {
        let key = (elements.as_ptr() as usize, elements.len());
        r.entries.entry(key).or_insert_with(|| Entry {
            _tensor: tensor.clone(),
            packed: [None, None],
        });
    }
}

/// The packed right operand of `op(w)` for a kept bf16 weight `w: [rows, cols]` (`w^T` when
/// `transposed`), packed now if it was not yet; `None` when `w` is not kept.
pub(crate) fn packed(
    w: &[bf16],
    [rows, cols]: [usize; 2],
    transposed: bool,
) -> Option<Arc<PackedB>> {
    let key = (w.as_ptr() as usize, w.len());
    let slot = usize::from(transposed);
    // The product's `[k, n]`: a packing made for another view of the buffer is replaced.
    let (k, n) = if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let fits = |p: &PackedB| p.k == k && p.n == n;
    {
        let reg = registry();
        let entry = reg.as_ref()?.entries.get(&key)?;
        if let Some(p) = &entry.packed[slot]
            && fits(p)
        {
            return Some(p.clone());
        }
    }
    // Packed outside the lock (the packing runs on rayon's workers): another thread may pack
    // the same weight meanwhile, and the first to finish is kept.
    let (rs, cs) = if transposed { (1, cols) } else { (cols, 1) };
    let p = Arc::new(PackedB::pack(Operand::Bf16(w, rs, cs), k, n));
    let mut reg = registry();
    let entry = reg.as_mut()?.entries.get_mut(&key)?;
    match &entry.packed[slot] {
        Some(kept) if fits(kept) => Some(kept.clone()),
        _ => {
            entry.packed[slot] = Some(p.clone());
            Some(p)
        }
    }
}

/// The packed forms kept now, over all weights (tests).
#[cfg(test)]
pub(crate) fn kept_packed_forms() -> usize {
    registry().as_ref().map_or(0, |r| {
        r.entries
            .values()
            .map(|e| e.packed.iter().flatten().count())
            .sum()
    })
}
