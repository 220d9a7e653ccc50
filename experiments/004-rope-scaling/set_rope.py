"""set_rope.py CONFIG METHOD CONTEXT TRAIN_CONTEXT: write the RoPE scaling of one variant."""
import json
import sys

path, method, ctx, train_ctx = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cfg = json.load(open(path))
factor = max(ctx / train_ctx, 1.0)
cfg["rope_scaling"] = {
    "none": None,
    "linear": {"rope_type": "linear", "factor": factor},
    # Dynamic NTK grows the base once the sequence exceeds max_position_embeddings (= train_ctx).
    "dynamic": {"rope_type": "dynamic", "factor": factor},
    "yarn": {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": train_ctx},
}[method]
if method == "yarn" and factor == 1.0:
    cfg["rope_scaling"] = None  # YaRN with factor 1 is plain RoPE
json.dump(cfg, open(path, "w"), indent=2)
