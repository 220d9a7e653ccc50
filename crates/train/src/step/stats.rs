//! One step's statistics ([`StepStats`]): losses, tokens, and the MoE routing counts of every
//! micro-batch and replica, merged into the whole step's.

use qwen_burn_model::RouterStats;

use crate::objective::Figure;

/// One step's scalar results (summed over the step's micro-batches and replicas).
#[derive(Debug, Clone, Default)]
pub struct StepStats {
    /// The objective's loss over the step's units (next-token: the mean cross-entropy over its
    /// target tokens).
    pub loss: f64,
    /// The objective's further figures, summed over the step with the counts they average over
    /// (see [`StepStats::figure_means`]).
    pub figures: Vec<Figure>,
    /// Unweighted MoE load-balancing loss of the step, if MoE.
    pub aux_loss: Option<f64>,
    /// Router z-loss (mean over micro-batches), if enabled.
    pub z_loss: Option<f64>,
    /// Assignment loss (`router_assignment_loss_coef`), unweighted, over the step's tokens.
    pub assignment_loss: Option<f64>,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Tokens processed (inputs of all micro-batches, padding included).
    pub tokens: usize,
    /// Of those, the tokens that are not padding (the attention mask's ones; every input of
    /// packed or unpadded rows).
    pub non_padding_tokens: usize,
    /// Per MoE layer, slots routed to each expert over the whole step (the selection actually
    /// used, biased when aux-loss-free balancing is on).
    pub expert_counts: Vec<Vec<usize>>,
    /// Per MoE layer, the router entropy averaged over the step's micro-batches.
    pub router_entropy: Vec<f64>,
    /// Under a training-time capacity (`router_capacity_factor`), per MoE layer: the slots the
    /// router and its bias would have sent to each expert without it (empty otherwise). The
    /// routing bias learns from these, so that routing without the capacity balances too.
    pub uncapped_counts: Vec<Vec<usize>>,
    /// Under `router_centering`, per MoE layer: the sum of the router inputs over the step's
    /// tokens and their number, from which the router weights are centred after the update.
    pub router_input_sums: Vec<(Vec<f64>, usize)>,
}

impl StepStats {
    /// Add an objective's figures of one micro-batch.
    pub fn add_figures(&mut self, figures: &[Figure]) {
        for f in figures {
            match self.figures.iter_mut().find(|g| g.name == f.name) {
                Some(g) => {
                    g.sum += f.sum;
                    g.count += f.count;
                }
                None => self.figures.push(f.clone()),
            }
        }
    }

    /// The objective's figures as the step's means, by name (what `metrics.jsonl` records); a
    /// figure that covered no unit is left out.
    pub fn figure_means(&self) -> std::collections::BTreeMap<String, f64> {
        self.figures
            .iter()
            .filter(|f| f.count > 0.0)
            .map(|f| (f.name.to_string(), f.sum / f.count))
            .collect()
    }

    /// Add another part of the same step (see [`crate::step::Step::part`]).
    pub fn merge(mut self, other: StepStats) -> StepStats {
        let add = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
        self.loss += other.loss;
        self.add_figures(&other.figures);
        self.aux_loss = add(self.aux_loss, other.aux_loss);
        self.z_loss = add(self.z_loss, other.z_loss);
        self.assignment_loss = add(self.assignment_loss, other.assignment_loss);
        self.tokens += other.tokens;
        self.non_padding_tokens += other.non_padding_tokens;
        add_counts(&mut self.expert_counts, &other.expert_counts);
        add_counts(&mut self.uncapped_counts, &other.uncapped_counts);
        add_sums(&mut self.router_input_sums, &other.router_input_sums);
        if self.router_entropy.is_empty() {
            self.router_entropy = other.router_entropy;
        } else {
            for (a, b) in self.router_entropy.iter_mut().zip(&other.router_entropy) {
                *a += b;
            }
        }
        self
    }

    /// Per MoE layer, the slots of the router's own choice (probabilities plus bias, no
    /// capacity): how validation and generation route.
    pub fn router_counts(&self) -> &[Vec<usize>] {
        if self.uncapped_counts.is_empty() {
            &self.expert_counts
        } else {
            &self.uncapped_counts
        }
    }

    /// Routing statistics of each MoE layer's own choice over the whole step.
    pub fn router_stats(&self) -> Vec<RouterStats> {
        Self::stats_of(self.router_counts(), &self.router_entropy)
    }

    /// Under a training-time capacity, the statistics of the capped assignment that trained the
    /// experts; `None` without one (it is then the router's own choice).
    pub fn capped_stats(&self) -> Option<Vec<RouterStats>> {
        (!self.uncapped_counts.is_empty())
            .then(|| Self::stats_of(&self.expert_counts, &self.router_entropy))
    }

    fn stats_of(counts: &[Vec<usize>], entropy: &[f64]) -> Vec<RouterStats> {
        counts
            .iter()
            .zip(entropy)
            .map(|(counts, &entropy)| RouterStats::from_counts(counts, entropy))
            .collect()
    }

    /// The router's own statistics with all layers pooled (what HF's pooled loss sees).
    pub fn pooled_router_stats(&self) -> Option<RouterStats> {
        let counts = self.router_counts();
        let first = counts.first()?;
        let mut pooled = vec![0; first.len()];
        for layer in counts {
            pooled.iter_mut().zip(layer).for_each(|(a, b)| *a += b);
        }
        let layers = self.router_entropy.len().max(1) as f64;
        let entropy = self.router_entropy.iter().sum::<f64>() / layers;
        Some(RouterStats::from_counts(&pooled, entropy))
    }
}

pub(crate) fn add_sums(acc: &mut Vec<(Vec<f64>, usize)>, other: &[(Vec<f64>, usize)]) {
    if acc.is_empty() {
        *acc = other.to_vec();
        return;
    }
    for ((a, n), (b, m)) in acc.iter_mut().zip(other) {
        a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
        *n += m;
    }
}

pub(crate) fn add_counts(acc: &mut Vec<Vec<usize>>, other: &[Vec<usize>]) {
    if acc.is_empty() {
        *acc = other.to_vec();
        return;
    }
    for (a, b) in acc.iter_mut().zip(other) {
        a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
    }
}
