use super::*;
use serde_json::{Map, json};

fn base() -> Value {
    json!({
        "model_type": "qwen3", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6,
    })
}

fn err_of(mut patch: impl FnMut(&mut Map<String, Value>)) -> String {
    let mut v = base();
    patch(v.as_object_mut().unwrap());
    Qwen3Config::from_json(&v, true).unwrap_err().to_string()
}

#[test]
fn reads_both_rope_spellings() {
    let mut v4 = base();
    v4["rope_theta"] = json!(1e6);
    v4["rope_scaling"] = json!({"type": "linear", "factor": 2.0});
    let mut v5 = base();
    v5["rope_parameters"] = json!({"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0});
    let a = Qwen3Config::from_json(&v4, true).unwrap();
    let b = Qwen3Config::from_json(&v5, true).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.rope_theta, 1e6);
    assert_eq!(a.rope_scaling, RopeScaling::Linear { factor: 2.0 });
    // What we write reads back identically, as a config.json (where HF's bookkeeping keys such
    // as `architectures` and `torch_dtype` are allowed, and ignored as transformers does).
    assert_eq!(Qwen3Config::from_json(&a.to_hf_json(), false).unwrap(), a);
}

#[test]
fn bad_configs_name_the_field() {
    let e = err_of(|m| {
        m.insert("num_key_value_heads".into(), json!(3));
    });
    assert!(
        e.contains("num_key_value_heads") && e.contains("divisible"),
        "{e}"
    );
    let e = err_of(|m| {
        m.insert("head_dim".into(), json!(7));
    });
    assert!(e.contains("head_dim") && e.contains("even"), "{e}");
    let e = err_of(|m| {
        m.insert(
            "rope_scaling".into(),
            json!({"rope_type": "wavy", "factor": 2.0}),
        );
    });
    assert!(e.contains("rope_type") && e.contains("wavy"), "{e}");
    let e = err_of(|m| {
        m.insert("hiden_size".into(), json!(3));
    });
    assert!(e.contains("unknown key `hiden_size`"), "{e}");
    let e = err_of(|m| {
        m.insert("hidden_size".into(), json!("wide"));
    });
    assert!(e.contains("hidden_size") && e.contains("usize"), "{e}");
}

#[test]
fn moe_layer_rule_matches_hf() {
    let mut v = base();
    v["model_type"] = json!("qwen3_moe");
    v["num_hidden_layers"] = json!(4);
    v["num_experts"] = json!(4);
    v["num_experts_per_tok"] = json!(2);
    v["decoder_sparse_step"] = json!(2);
    v["mlp_only_layers"] = json!([3]);
    let c = Qwen3Config::from_json(&v, true).unwrap();
    assert_eq!(c.moe_layers(), vec![1]);
}

#[test]
fn moe_keys_on_a_dense_model_are_refused_in_strict_mode() {
    const MOE_ONLY_KEYS: &[&str] = &[
        "num_experts",
        "num_local_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "norm_topk_prob",
        "router_aux_loss_coef",
        "output_router_logits",
        "decoder_sparse_step",
        "mlp_only_layers",
        "router_z_loss_coef",
        "router_bias_update_rate",
        "router_capacity_factor",
        "router_centering",
        "router_assignment_loss_coef",
        "router_aux_loss_type",
    ];
    for key in MOE_ONLY_KEYS {
        let value = match *key {
            "norm_topk_prob" | "output_router_logits" | "router_centering" => json!(true),
            "mlp_only_layers" => json!([0]),
            "router_aux_loss_type" => json!("per_layer"),
            "router_aux_loss_coef"
            | "router_z_loss_coef"
            | "router_bias_update_rate"
            | "router_assignment_loss_coef" => {
                json!(0.1)
            }
            _ => json!(1),
        };
        let e = err_of(|m| {
            m.insert(key.to_string(), value.clone());
        });
        assert!(e.contains(key) && e.contains("qwen3_moe"), "{key}: {e}");
    }
    // An HF config.json (lenient) is read as transformers reads it.
    let mut v = base();
    v["num_experts"] = json!(8);
    assert!(Qwen3Config::from_json(&v, false).unwrap().moe.is_none());
}

#[test]
fn router_loss_coefficients_need_output_router_logits_in_strict_mode() {
    let mut v = base();
    v["model_type"] = json!("qwen3_moe");
    v["num_experts"] = json!(4);
    v["num_experts_per_tok"] = json!(2);
    v["router_capacity_factor"] = json!(1.1);
    for key in [
        "router_aux_loss_coef",
        "router_z_loss_coef",
        "router_assignment_loss_coef",
    ] {
        let mut w = v.clone();
        w[key] = json!(0.01);
        let e = Qwen3Config::from_json(&w, true).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains("output_router_logits"), "{e}");
        w["output_router_logits"] = json!(true);
        Qwen3Config::from_json(&w, true).unwrap();
        // HF files with output_router_logits = false (as published Qwen3-MoE configs) load.
        w["output_router_logits"] = json!(false);
        let c = Qwen3Config::from_json(&w, false).unwrap();
        assert!(!c.moe.unwrap().output_router_logits);
    }
    // The HF default coefficient (not written) is not an error.
    Qwen3Config::from_json(&v, true).unwrap();
    // The assignment loss's target is the capped assignment: no capacity, no loss.
    v["output_router_logits"] = json!(true);
    v["router_assignment_loss_coef"] = json!(0.5);
    v["router_capacity_factor"] = json!(0);
    let e = Qwen3Config::from_json(&v, true).unwrap_err().to_string();
    assert!(
        e.contains("router_assignment_loss_coef") && e.contains("router_capacity_factor"),
        "{e}"
    );
}
