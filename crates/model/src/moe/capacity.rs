//! The training-time expert capacity (`router_capacity_factor`).

/// Top-k under a per-sequence expert capacity: `scores` is `[rows * t, e]` (row-major, each
/// row of `t` tokens). A sequence is a row, or with `positions` (`[rows * t]`, the position of
/// each token inside its packed document, restarting at 0) each document of a row. Token `p`
/// of a sequence takes, best score first, the experts that hold fewer than
/// `max(1, ceil(factor * (p + 1) * k / e))` of its sequence's earlier slots; the limit never
/// stops a token from finding `k` experts when `factor >= 1` (a token short of room, possible
/// only by rounding, takes its best remaining experts). So every expert holds at most about
/// `factor` times its share of every prefix, and a token's experts depend only on the tokens
/// before it in its own sequence: causal, like the model, and a packed document is routed
/// exactly as if it were alone in its row. Returns `[rows * t, k]` expert ids, best first.
pub fn capacity_limited_topk(
    scores: &[f32],
    rows: usize,
    t: usize,
    e: usize,
    k: usize,
    factor: f64,
    positions: Option<&[u32]>,
) -> Vec<i64> {
    let mut out = Vec::with_capacity(rows * t * k);
    let mut order: Vec<usize> = Vec::with_capacity(e);
    let mut load = vec![0usize; e];
    for r in 0..rows {
        for i in 0..t {
            let p = positions.map_or(i, |pos| pos[r * t + i] as usize);
            if p == 0 {
                load.iter_mut().for_each(|l| *l = 0);
            }
            let cap = ((factor * ((p + 1) * k) as f64 / e as f64).ceil() as usize).max(1);
            let s = &scores[(r * t + i) * e..(r * t + i + 1) * e];
            order.clear();
            order.extend(0..e);
            order.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
            let start = out.len();
            for &x in &order {
                if out.len() - start == k {
                    break;
                }
                if load[x] < cap {
                    out.push(x as i64);
                }
            }
            for &x in &order {
                if out.len() - start == k {
                    break;
                }
                if !out[start..].contains(&(x as i64)) {
                    out.push(x as i64);
                }
            }
            for &x in &out[start..] {
                load[x as usize] += 1;
            }
        }
    }
    out
}
