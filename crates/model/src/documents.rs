//! Packed rows that hold several documents: each document attends only to itself (causal within
//! the document) and its RoPE positions restart at 0, so a packed document is computed exactly as
//! if it were alone in its row.
//!
//! A layout is given by per-token positions (`position_ids` of HF / Megatron's
//! `--reset-position-ids`): row `r`'s token `i` is at position `p` of its document, so that
//! document starts at `i - p`. Positions run `0, 1, 2, ...` and restart at 0 at each document
//! start; nothing else is a valid layout. From the positions come both the RoPE angles and the
//! attention's first visible key per query (the fused Flex kernel reads those, like
//! flash-attention's varlen `cu_seqlens`; every other backend gets the equivalent block-diagonal
//! causal mask).

use std::cell::OnceCell;
use std::sync::Arc;

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use crate::error::{ModelError, Result};

/// Document boundaries of a `[b, t]` batch, as positions that restart at each document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Documents {
    batch_size: usize,
    seq_len: usize,
    /// `[b, t]`: the position of each token inside its document.
    positions: Vec<u32>,
    /// `[b, t]`: the row index of the first token of each token's document.
    starts: Arc<[u32]>,
}

impl Documents {
    /// Checks and wraps per-token positions (`[b, t]`, row-major): every row starts at 0 and each
    /// next position is either the previous plus one or 0 (a new document).
    pub fn new(batch_size: usize, seq_len: usize, positions: Vec<u32>) -> Result<Self> {
        if positions.len() != batch_size * seq_len {
            return Err(ModelError::InvalidInput(format!(
                "document positions: {} values for a [{batch_size}, {seq_len}] batch",
                positions.len()
            )));
        }
        let mut starts = Vec::with_capacity(positions.len());
        for (r, row) in positions.chunks(seq_len.max(1)).enumerate() {
            for (i, &p) in row.iter().enumerate() {
                let ok = p == 0 || (i > 0 && p == row[i - 1] + 1);
                if !ok {
                    let after = if i == 0 {
                        "the row start".to_string()
                    } else {
                        row[i - 1].to_string()
                    };
                    return Err(ModelError::InvalidInput(format!(
                        "document positions: row {r}, token {i}: position {p} after {after} \
                         (positions start at 0 and either grow by one or restart at 0)"
                    )));
                }
                starts.push((i as u32) - p);
            }
        }
        Ok(Self {
            batch_size,
            seq_len,
            positions,
            starts: starts.into(),
        })
    }

    /// Rows (b).
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Tokens per row (t).
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// `[b, t]` positions inside each token's document.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// `[b, t]`: for each token, the index in its row of its document's first token (the first
    /// key it may attend to).
    pub fn starts(&self) -> &Arc<[u32]> {
        &self.starts
    }

    /// Whether every row is one document (then the layout changes nothing).
    pub fn is_single(&self) -> bool {
        self.starts.iter().all(|&s| s == 0)
    }

    /// The largest position plus one (what dynamic RoPE scaling sizes its base by, as HF does
    /// with `max(position_ids) + 1`).
    pub fn span(&self) -> usize {
        self.positions
            .iter()
            .copied()
            .max()
            .map_or(0, |p| p as usize + 1)
    }

    /// `[b, 1, t, t]`, `true` where query `i` must NOT see key `j`: `j > i` (future) or `j`
    /// before the start of `i`'s document. The composed attention's equivalent of the kernel's
    /// per-query start.
    pub fn mask(&self, device: &Device) -> Tensor<4, Bool> {
        let (b, t) = (self.batch_size, self.seq_len);
        let mut m = Vec::with_capacity(b * t * t);
        for r in 0..b {
            for i in 0..t {
                let start = self.starts[r * t + i] as usize;
                m.extend((0..t).map(|j| j < start || j > i));
            }
        }
        Tensor::from_data(TensorData::new(m, [b, 1, t, t]), device)
    }

    /// `[b, t]` positions as an Int tensor.
    pub fn position_tensor(&self, device: &Device) -> Tensor<2, Int> {
        let p: Vec<i64> = self.positions.iter().map(|&p| i64::from(p)).collect();
        Tensor::from_data(TensorData::new(p, [self.batch_size, self.seq_len]), device)
    }
}

/// What the attention layers of one forward pass need from a [`Documents`] layout: the starts
/// for the fused kernel, and the dense mask for the composed path, built at most once per forward
/// and only if some layer takes that path.
#[derive(Debug)]
pub struct DocumentMask<'a> {
    docs: &'a Documents,
    dense: OnceCell<Tensor<4, Bool>>,
}

impl<'a> DocumentMask<'a> {
    /// For one forward pass over `docs`.
    pub fn new(docs: &'a Documents) -> Self {
        Self {
            docs,
            dense: OnceCell::new(),
        }
    }

    /// The layout.
    pub fn documents(&self) -> &'a Documents {
        self.docs
    }

    /// Each token's document start, `[b, t]`.
    pub fn starts(&self) -> &Arc<[u32]> {
        self.docs.starts()
    }

    /// [`Documents::mask`], computed on first use.
    pub fn dense(&self, device: &Device) -> &Tensor<4, Bool> {
        self.dense.get_or_init(|| self.docs.mask(device))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_follow_positions_and_bad_layouts_are_refused() {
        let d = Documents::new(2, 5, vec![0, 1, 0, 1, 2, 0, 1, 2, 3, 0]).unwrap();
        assert_eq!(&d.starts()[..], &[0, 0, 2, 2, 2, 0, 0, 0, 0, 4]);
        assert!(!d.is_single());
        assert_eq!(d.span(), 4);
        assert!(Documents::new(1, 3, vec![0, 1, 2]).unwrap().is_single());
        for bad in [vec![1, 2, 3], vec![0, 2, 3], vec![0, 1, 1], vec![0, 1]] {
            let err = Documents::new(1, 3, bad.clone()).unwrap_err().to_string();
            assert!(err.contains("document positions"), "{bad:?}: {err}");
        }
    }
}
