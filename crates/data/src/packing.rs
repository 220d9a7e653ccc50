//! How several sequences share rows of a fixed capacity.
//!
//! [`Packing::BestFitDecreasing`] places the sequences longest first, each into the open row
//! whose free space is the smallest that still holds it (the first such row opened, on a tie),
//! else into a new row: TRL's `pack_dataset(strategy="bfd")`, after "Fewer Truncations Improve
//! Language Modeling" (Ding et al., 2024). [`Packing::InOrder`] appends sequences in file order
//! to the last row while they fit, then opens the next (what `qwen-burn` did before).

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

/// `data.packing`: how conversations are placed into packed rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Packing {
    /// Longest first, each into the fullest row it fits (TRL's `"bfd"`); fewest rows.
    #[default]
    BestFitDecreasing,
    /// File order, each appended to the last row while it fits.
    InOrder,
}

impl Packing {
    /// The spelling in a config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Packing::BestFitDecreasing => "best_fit_decreasing",
            Packing::InOrder => "in_order",
        }
    }

    /// Groups sequence indices into rows of at most `capacity` tokens; `lengths[i]` is the
    /// length of sequence `i` (each at most `capacity`). Every index appears in exactly one row,
    /// and rows keep their indices in placement order.
    ///
    /// Best fit decreasing returns its rows ordered by the first sequence of the file each
    /// holds, so that the first rows (what validation reads) are not the longest sequences. The
    /// rows themselves are TRL's.
    pub fn rows(self, lengths: &[usize], capacity: usize) -> Vec<Vec<usize>> {
        match self {
            Packing::BestFitDecreasing => {
                let mut rows = best_fit_decreasing(lengths, capacity);
                rows.sort_by_key(|r| r.iter().copied().min());
                rows
            }
            Packing::InOrder => in_order(lengths, capacity),
        }
    }
}

impl std::fmt::Display for Packing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Best fit decreasing in TRL's row order (rows in the order they were opened).
///
/// The longest sequences are placed first (a stable sort, so equal lengths keep file order).
/// Open rows are kept by free space; among rows with the same free space the one opened first
/// is filled first, as TRL's segment tree with a queue per free space does.
pub fn best_fit_decreasing(lengths: &[usize], capacity: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]));
    let mut rows: Vec<Vec<usize>> = Vec::new();
    // Free space -> rows with exactly that much room, oldest first (full rows are not kept).
    let mut by_space: BTreeMap<usize, VecDeque<usize>> = BTreeMap::new();
    for i in order {
        let len = lengths[i];
        let fit = by_space
            .range_mut(len..)
            .next()
            .and_then(|(&space, queue)| Some((queue.pop_front()?, space, queue.is_empty())));
        let (row, space) = match fit {
            Some((row, space, emptied)) => {
                if emptied {
                    by_space.remove(&space);
                }
                (row, space)
            }
            None => {
                rows.push(Vec::new());
                (rows.len() - 1, capacity)
            }
        };
        rows[row].push(i);
        let left = space.saturating_sub(len);
        if left > 0 {
            by_space.entry(left).or_default().push_back(row);
        }
    }
    rows
}

/// Sequences in file order, each appended to the last row while it fits.
fn in_order(lengths: &[usize], capacity: usize) -> Vec<Vec<usize>> {
    let mut rows: Vec<Vec<usize>> = Vec::new();
    let mut used = 0;
    for (i, &len) in lengths.iter().enumerate() {
        match rows.last_mut() {
            Some(row) if used + len <= capacity => {
                row.push(i);
                used += len;
            }
            _ => {
                rows.push(vec![i]);
                used = len;
            }
        }
    }
    rows
}
