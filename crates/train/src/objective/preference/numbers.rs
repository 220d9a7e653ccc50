//! The preference losses and rewards in f64, from pairs' summed log-probabilities: what
//! validation and `eval --pairs` report (training computes the same on tensors, in `mod.rs`).

use crate::config::{PreferenceConfig, PreferenceLoss};

/// One pair's numbers.
#[derive(Debug, Clone, Copy)]
pub struct PairNumbers {
    /// The model's summed log-probabilities of `[chosen, rejected]`.
    pub policy: [f64; 2],
    /// The reference's, when there is one.
    pub reference: Option<[f64; 2]>,
    /// The completions' token counts.
    pub tokens: [f64; 2],
    /// The chosen sequence's summed log-probability of all its next tokens, prompt and
    /// completion, and their count: ORPO's NLL term (TRL's `ORPOTrainer` takes the prompt too).
    pub chosen_whole: Option<[f64; 2]>,
}

impl PairNumbers {
    /// Mean per-token log-probabilities `[chosen, rejected]`.
    fn means(&self) -> [f64; 2] {
        [
            self.policy[0] / self.tokens[0].max(1.0),
            self.policy[1] / self.tokens[1].max(1.0),
        ]
    }

    /// TRL's implicit rewards `[chosen, rejected]`: `beta (logp - ref)` for the losses with a
    /// reference, `beta` times the mean per-token log-probability for `simpo` and `orpo`
    /// (TRL's CPO and ORPO trainers). None when the loss needs a reference and there is none.
    pub fn rewards(&self, config: &PreferenceConfig) -> Option<[f64; 2]> {
        let beta = config.beta;
        if config.loss.needs_reference() {
            let r = self.reference?;
            Some([
                beta * (self.policy[0] - r[0]),
                beta * (self.policy[1] - r[1]),
            ])
        } else {
            let [c, r] = self.means();
            Some([beta * c, beta * r])
        }
    }

    /// The pair's term of the loss (for `orpo`, without the NLL of the chosen tokens, which
    /// is a token mean over all pairs: see [`mean_loss`]). None when a reference is needed
    /// and missing.
    pub fn pair_loss(&self, config: &PreferenceConfig) -> Option<f64> {
        let beta = config.beta;
        let [c, r] = self.policy;
        let [ac, ar] = self.means();
        Some(match config.loss {
            PreferenceLoss::Simpo => neg_log_sigmoid(beta * (ac - ar) - config.simpo_gamma()),
            PreferenceLoss::Orpo => beta * neg_log_sigmoid(log_odds_ratio(ac, ar)),
            loss => {
                let [rc, rr] = self.reference?;
                let delta = (c - rc) - (r - rr);
                match loss {
                    PreferenceLoss::Hinge => (1.0 - beta * delta).max(0.0),
                    PreferenceLoss::Ipo => {
                        let [nc, nr] = self.tokens.map(|n| n.max(1.0));
                        ((c - rc) / nc - (r - rr) / nr - 1.0 / (2.0 * beta)).powi(2)
                    }
                    PreferenceLoss::Robust => {
                        let e = config.label_smoothing;
                        ((1.0 - e) * neg_log_sigmoid(beta * delta)
                            - e * neg_log_sigmoid(-beta * delta))
                            / (1.0 - 2.0 * e)
                    }
                    _ => neg_log_sigmoid(beta * delta),
                }
            }
        })
    }
}

/// ORPO's log-odds ratio of two mean per-token log-probabilities:
/// `log(p_c / (1 - p_c)) - log(p_r / (1 - p_r))` with `p = exp(a)`.
pub fn log_odds_ratio(ac: f64, ar: f64) -> f64 {
    (ac - ar) - ((-ac.exp()).ln_1p() - (-ar.exp()).ln_1p())
}

/// `-log sigmoid(x) = log(1 + e^-x)`, without overflow.
pub fn neg_log_sigmoid(x: f64) -> f64 {
    if x > 0.0 {
        (-x).exp().ln_1p()
    } else {
        -x + x.exp().ln_1p()
    }
}

/// The loss over `pairs`, as one batch holding them all: the mean of the pairs' terms, plus
/// for `orpo` [`chosen_nll`]. None when there are no pairs, or a number the loss needs is
/// missing (a reference, or for `orpo` the chosen sequences' whole log-probabilities).
pub fn mean_loss(config: &PreferenceConfig, pairs: &[PairNumbers]) -> Option<f64> {
    if pairs.is_empty() {
        return None;
    }
    let terms: Option<Vec<f64>> = pairs.iter().map(|p| p.pair_loss(config)).collect();
    let mut loss = terms?.iter().sum::<f64>() / pairs.len() as f64;
    if config.loss == PreferenceLoss::Orpo {
        loss += chosen_nll(pairs)?;
    }
    if config.sft_weight > 0.0 {
        loss += config.sft_weight * completion_nll(pairs);
    }
    Some(loss)
}

/// The token-mean NLL of the chosen completions (TRL DPOTrainer's `"sft"` loss, weighted by
/// `preference.sft_weight`).
pub fn completion_nll(pairs: &[PairNumbers]) -> f64 {
    let logp: f64 = pairs.iter().map(|p| p.policy[0]).sum();
    let tokens: f64 = pairs.iter().map(|p| p.tokens[0].max(1.0)).sum();
    -logp / tokens.max(1.0)
}

/// The token-mean NLL of the chosen sequences, prompt and completion (ORPO's SFT term, TRL's
/// `nll_loss`); None when a pair lacks [`PairNumbers::chosen_whole`].
pub fn chosen_nll(pairs: &[PairNumbers]) -> Option<f64> {
    let (mut logp, mut tokens) = (0.0, 0.0);
    for pair in pairs {
        let [l, n] = pair.chosen_whole?;
        logp += l;
        tokens += n;
    }
    Some(-logp / f64::max(tokens, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(policy: [f64; 2], tokens: [f64; 2]) -> PairNumbers {
        PairNumbers {
            policy,
            reference: Some([-10.0, -10.0]),
            tokens,
            chosen_whole: Some([policy[0] - 4.0, tokens[0] + 2.0]),
        }
    }

    #[test]
    fn reference_free_losses_ignore_the_reference_and_the_others_need_it() {
        let mut p = pair([-6.0, -9.0], [3.0, 3.0]);
        for loss in PreferenceLoss::ALL {
            let config = PreferenceConfig {
                loss,
                ..Default::default()
            };
            let with = p.pair_loss(&config).unwrap();
            p.reference = None;
            assert_eq!(p.pair_loss(&config).is_some(), !loss.needs_reference());
            if !loss.needs_reference() {
                assert_eq!(p.pair_loss(&config), Some(with), "{}", loss.as_str());
            }
            p.reference = Some([-10.0, -10.0]);
        }
    }

    #[test]
    fn simpo_and_orpo_by_hand() {
        // Means -2 and -3: SimPO with beta 2, gamma 0.5: -log sigmoid(2 - 0.5).
        let p = pair([-6.0, -9.0], [3.0, 3.0]);
        let simpo = PreferenceConfig {
            loss: PreferenceLoss::Simpo,
            beta: 2.0,
            ..Default::default()
        };
        let want = (1.0 + (-1.5f64).exp()).ln();
        assert!((p.pair_loss(&simpo).unwrap() - want).abs() < 1e-12);
        // ORPO: odds of e^-2 against e^-3.
        let (pc, pr) = ((-2.0f64).exp(), (-3.0f64).exp());
        let lor = (pc / (1.0 - pc)).ln() - (pr / (1.0 - pr)).ln();
        assert!((log_odds_ratio(-2.0, -3.0) - lor).abs() < 1e-12);
        let orpo = PreferenceConfig {
            loss: PreferenceLoss::Orpo,
            beta: 0.5,
            ..Default::default()
        };
        let q = pair([-4.0, -1.0], [1.0, 1.0]);
        // The chosen sequences' whole NLL: (6 + 4) + (4 + 4) over (3 + 2) + (1 + 2) tokens.
        let nll = 18.0 / 8.0;
        let terms = 0.5 * (neg_log_sigmoid(lor) + neg_log_sigmoid(log_odds_ratio(-4.0, -1.0)));
        let got = mean_loss(&orpo, &[p, q]).unwrap();
        assert!((got - (nll + terms / 2.0)).abs() < 1e-12, "{got}");
    }

    #[test]
    fn the_sft_term_is_the_chosen_completions_token_mean_nll() {
        // Chosen completions of -6 over 3 tokens and -4 over 1: (6 + 4) / 4, times 0.5.
        let (p, q) = (
            pair([-6.0, -9.0], [3.0, 3.0]),
            pair([-4.0, -1.0], [1.0, 1.0]),
        );
        let plain = PreferenceConfig::default();
        let rpo = PreferenceConfig {
            sft_weight: 0.5,
            ..Default::default()
        };
        let got = mean_loss(&rpo, &[p, q]).unwrap() - mean_loss(&plain, &[p, q]).unwrap();
        assert!((got - 0.5 * 10.0 / 4.0).abs() < 1e-12, "{got}");
    }
}
