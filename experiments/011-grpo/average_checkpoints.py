"""Average the weights of several exported checkpoints (round 5's weight-averaging test).
Usage (dev venv with safetensors and torch): python average_checkpoints.py OUT DIR1 DIR2 ...
Each DIR is an HF directory written by `qwen-burn export`; OUT gets the last one's config and
tokenizer and the element-wise mean of the weights (computed in f32, stored in the source dtype)."""
import os
import shutil
import sys

from safetensors.torch import load_file, save_file

out, sources = sys.argv[1], sys.argv[2:]
tensors = [load_file(os.path.join(s, "model.safetensors")) for s in sources]
mean = {
    k: (sum(t[k].float() for t in tensors) / len(tensors)).to(tensors[0][k].dtype)
    for k in tensors[0]
}
shutil.copytree(sources[-1], out, dirs_exist_ok=True)
save_file(mean, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
