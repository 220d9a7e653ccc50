//! HF safetensors I/O: export writes what HF wrote (same keys, shapes and values), reloads to
//! identical logits, and every malformed input is an error naming the key and the shapes.

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use qwen_burn_model::{ModelError, Qwen3Config, Qwen3ForCausalLM, SafetensorsCheckpoint};
use safetensors::tensor::{Dtype, TensorView};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn logits(model: &Qwen3ForCausalLM, device: &Device) -> Vec<f32> {
    let ids =
        Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 5, 9, 33, 2, 7], [1, 6]), device);
    model
        .forward(ids, None, None)
        .logits
        .try_into_vec_as::<f32>()
        .unwrap()
}

fn copy_fixture(name: &str, to: &Path) {
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Rewrite `model.safetensors` of `dir` through `edit` (key, shape, f32 values).
fn rewrite(dir: &Path, edit: impl Fn(&mut Vec<(String, Vec<usize>, Vec<f32>)>)) {
    let ckpt = SafetensorsCheckpoint::open(dir).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = ckpt
        .keys()
        .map(|k| {
            let (shape, values) = ckpt.read_f32(k).unwrap().unwrap();
            (k.clone(), shape, values)
        })
        .collect();
    drop(ckpt);
    edit(&mut tensors);
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(k, s, v)| (k, s, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = bytes
        .iter()
        .map(|(k, s, b)| {
            (
                k.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

#[test]
fn export_writes_the_hf_tensors_back_and_reloads_identically() {
    let device = Device::flex();
    for name in ["dense", "dense_legacy_tied", "moe"] {
        let original = Qwen3ForCausalLM::from_pretrained(&fixture(name), &device).unwrap();
        let out = tempfile::tempdir().unwrap();
        original.save_pretrained(out.path()).unwrap();

        // Same tensors as the file HF wrote (tied models: no lm_head.weight either way).
        let theirs = SafetensorsCheckpoint::open(&fixture(name)).unwrap();
        let ours = SafetensorsCheckpoint::open(out.path()).unwrap();
        let mut their_keys: Vec<&String> = theirs.keys().collect();
        let mut our_keys: Vec<&String> = ours.keys().collect();
        their_keys.sort();
        our_keys.sort();
        assert_eq!(their_keys, our_keys, "{name}: exported keys differ");
        for key in their_keys {
            let a = theirs.read_f32(key).unwrap().unwrap();
            let b = ours.read_f32(key).unwrap().unwrap();
            assert_eq!(a, b, "{name}: tensor {key} differs after export");
        }
        // The written config parses to the same architecture.
        let reread = Qwen3Config::from_file(&out.path().join("config.json")).unwrap();
        assert_eq!(
            reread, original.config,
            "{name}: config differs after export"
        );
        let reloaded = Qwen3ForCausalLM::from_pretrained(out.path(), &device).unwrap();
        assert_eq!(
            logits(&original, &device),
            logits(&reloaded, &device),
            "{name}: logits differ"
        );
    }
}

fn load_err(dir: &Path) -> String {
    match Qwen3ForCausalLM::from_pretrained(dir, &Device::flex()) {
        Ok(_) => panic!("loading {} must fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    copy_fixture("dense", dir.path());
    rewrite(dir.path(), |t| {
        t.retain(|(k, _, _)| k != "model.layers.1.self_attn.k_norm.weight")
    });
    let e = load_err(dir.path());
    assert!(
        e.contains("missing tensor `model.layers.1.self_attn.k_norm.weight`") && e.contains("[24]"),
        "{e}"
    );
}

#[test]
fn wrong_shape_names_key_and_both_shapes() {
    let dir = tempfile::tempdir().unwrap();
    copy_fixture("dense", dir.path());
    rewrite(dir.path(), |t| {
        let entry = t
            .iter_mut()
            .find(|(k, _, _)| k == "model.layers.0.mlp.up_proj.weight")
            .unwrap();
        entry.1 = vec![64, 96]; // transposed: HF layout is [96, 64]
    });
    let e = load_err(dir.path());
    assert!(
        e.contains("model.layers.0.mlp.up_proj.weight")
            && e.contains("[64, 96]")
            && e.contains("[96, 64]"),
        "{e}"
    );
}

#[test]
fn unexpected_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    copy_fixture("dense", dir.path());
    rewrite(dir.path(), |t| {
        t.push((
            "model.layers.9.mystery.weight".into(),
            vec![2],
            vec![0.0, 1.0],
        ))
    });
    let e = load_err(dir.path());
    assert!(
        e.contains("unexpected") && e.contains("model.layers.9.mystery.weight [2]"),
        "{e}"
    );
}

#[test]
fn non_json_config_and_missing_weights_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), "model_type: qwen3").unwrap();
    let e = load_err(dir.path());
    assert!(
        e.contains("config.json") && e.contains("cannot parse"),
        "{e}"
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("dense").join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let e = load_err(dir.path());
    assert!(e.contains("no model.safetensors"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    copy_fixture("dense", dir.path());
    std::fs::write(
        dir.path().join("model.safetensors"),
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}",
    )
    .unwrap();
    let e = load_err(dir.path());
    assert!(
        e.contains("corrupt safetensors") && e.contains("model.safetensors"),
        "{e}"
    );
}

#[test]
fn config_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    copy_fixture("dense", dir.path());
    let path = dir.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["num_key_value_heads"] = serde_json::json!(3);
    std::fs::write(&path, v.to_string()).unwrap();
    let e = load_err(dir.path());
    assert!(
        e.contains("num_key_value_heads") && e.contains("divisible"),
        "{e}"
    );
    assert!(matches!(
        Qwen3ForCausalLM::from_pretrained(dir.path(), &Device::flex()),
        Err(ModelError::InvalidConfig { .. })
    ));
}
