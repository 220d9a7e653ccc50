//! The Mixture-of-Experts part of a model config: experts, routing and balancing.

/// Mixture-of-Experts settings (`qwen3_moe` only).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Number of routed experts `E`.
    pub num_experts: usize,
    /// Experts per token (top-k).
    pub num_experts_per_tok: usize,
    /// SwiGLU inner size of each expert.
    pub moe_intermediate_size: usize,
    /// Renormalise the k selected probabilities to sum to one.
    pub norm_topk_prob: bool,
    /// Weight of the load-balancing loss in the training loss.
    pub router_aux_loss_coef: f64,
    /// As in HF: the router losses (load balancing, and our z-loss) are added to the training
    /// loss only when this is true. When false they are still measured and logged.
    pub output_router_logits: bool,
    /// Layer `i` is sparse iff `(i + 1) % decoder_sparse_step == 0` and `i` is not in `mlp_only_layers`.
    pub decoder_sparse_step: usize,
    /// Layers that keep a dense MLP.
    pub mlp_only_layers: Vec<usize>,
    /// Router z-loss weight (ST-MoE); not part of HF Qwen3-MoE, 0 disables it.
    pub router_z_loss_coef: f64,
    /// Aux-loss-free balancing (DeepSeek-V3): per-expert routing bias update rate; 0 disables it.
    pub router_bias_update_rate: f64,
    /// Training-time expert capacity per sequence (not an HF key; 0 disables it): in training
    /// forwards, the token at position `t` of a row takes its best experts among those that hold
    /// fewer than `ceil(factor * (t + 1) * k / E)` of the row's earlier slots, so no expert ever
    /// takes more than `factor` times its share of a sequence (Switch / GShard's capacity, with
    /// position priority and overflow sent to the token's next choice instead of dropped). It is
    /// causal (a token's experts depend only on the tokens before it in its own row). Validation,
    /// scoring and generation route without it, as HF does. See `moe.rs`.
    pub router_capacity_factor: f64,
    /// Router centring (not an HF key; off by default): after every optimizer step the router
    /// weight is made orthogonal to the step's mean router input, so a component that every
    /// token's router input shares cannot rank the experts alike for all tokens (the collapse
    /// of experiment 005). The weight stays a plain router weight, which HF reads and routes by
    /// unchanged. See `SparseMoe::center_router`.
    pub router_centering: bool,
    /// Weight of the assignment loss (not an HF key; 0 disables it; needs a capacity): the
    /// cross-entropy of the router's probabilities against the capped assignment of its training
    /// forward, which teaches the router to choose what the capacity assigns, so that its own
    /// choice (inference's) balances too. Enters the loss with `output_router_logits`, like the
    /// other router losses. See `moe::assignment_loss`.
    pub router_assignment_loss_coef: f64,
    /// Which load-balancing loss `router_aux_loss_coef` weighs (not an HF key; `hf` when absent).
    pub router_aux_loss_type: BalanceLoss,
}

/// The load-balancing loss of a MoE model (`router_aux_loss_type`). `f_e` is the fraction of
/// tokens whose top-k includes expert `e` (so `sum_e f_e = k`) and `P_e` the mean router
/// probability of `e`; see `moe.rs` for the formulas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BalanceLoss {
    /// HF `load_balancing_loss_func`: `E * sum_e f_e * P_e` over the tokens of all MoE layers
    /// pooled together. Balanced value `k`. A layer that overloads one expert can be offset by
    /// another that overloads a different one.
    #[default]
    Hf,
    /// Switch / GShard: `E * sum_e f_e * P_e` per MoE layer, averaged over layers. Balanced `k`.
    PerLayer,
    /// DeepSeek-V3's sequence-wise loss: `sum_e f'_e * P_e` per sequence and layer with
    /// `f'_e = E / k * f_e`, averaged over sequences and layers. Balanced value `1`.
    Sequence,
    /// Qwen's global-batch loss (Qiu et al., 2025): as `per_layer`, but `f_e` counted over every
    /// micro-batch and data-parallel replica of the optimizer step. Balanced `k`.
    GlobalBatch,
}

impl BalanceLoss {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BalanceLoss::Hf => "hf",
            BalanceLoss::PerLayer => "per_layer",
            BalanceLoss::Sequence => "sequence",
            BalanceLoss::GlobalBatch => "global_batch",
        }
    }

    /// Parse the config spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [
            BalanceLoss::Hf,
            BalanceLoss::PerLayer,
            BalanceLoss::Sequence,
            BalanceLoss::GlobalBatch,
        ]
        .into_iter()
        .find(|b| b.as_str() == s)
    }

    /// The loss of a perfectly balanced router.
    pub fn balanced_value(self, top_k: usize) -> f64 {
        match self {
            BalanceLoss::Sequence => 1.0,
            _ => top_k as f64,
        }
    }
}
