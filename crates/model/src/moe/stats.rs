//! Per-layer routing statistics for logging.

use burn::tensor::Tensor;

use super::RouterOutput;

/// Per-layer routing statistics for logging.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RouterStats {
    /// Slots routed to each expert.
    pub tokens_per_expert: Vec<usize>,
    /// Largest expert load over the mean load (1 = perfectly balanced).
    pub max_over_mean_load: f64,
    /// Mean entropy of the routing distribution (nats), `ln E` at most.
    pub router_entropy: f64,
    /// Fraction of experts that received no token (`dead_expert_fraction` in older records).
    #[serde(alias = "dead_expert_fraction")]
    pub idle_expert_fraction: f64,
}

impl RouterStats {
    /// Statistics of one layer from its expert counts and mean router entropy.
    pub fn from_counts(counts: &[usize], router_entropy: f64) -> Self {
        let total: usize = counts.iter().sum();
        let mean = total as f64 / counts.len().max(1) as f64;
        let max = counts.iter().copied().max().unwrap_or(0) as f64;
        Self {
            tokens_per_expert: counts.to_vec(),
            max_over_mean_load: if mean > 0.0 { max / mean } else { 0.0 },
            router_entropy,
            idle_expert_fraction: counts.iter().filter(|&&c| c == 0).count() as f64
                / counts.len().max(1) as f64,
        }
    }

    /// Mean entropy (nats) of the routing distributions of `[n, E]` router logits (one device
    /// read).
    pub fn mean_entropy(logits: &Tensor<2>) -> f64 {
        let logp = burn::tensor::activation::log_softmax(logits.clone().detach(), 1);
        (-(logp.clone().exp() * logp).sum_dim(1).mean())
            .try_into_scalar::<f32>()
            .map(f64::from)
            .unwrap_or(f64::NAN)
    }

    /// Compute the statistics of one forward's layer.
    pub fn from_output(out: &RouterOutput) -> Self {
        Self::from_counts(&out.expert_counts, Self::mean_entropy(&out.logits))
    }
}
