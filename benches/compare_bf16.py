"""bf16 arithmetic side by side (issue 41): qwen-burn against PyTorch in bf16, alternating.

Jobs (`--jobs`, comma list; default all):
- `train`: mixed-precision training on each `--configs` (default configs/bench-dense.toml,
  configs/bench-moe.toml), random tokens, AdamW: ours at `training.precision = "f32"` and
  `"bf16"`, PyTorch in f32 and under `torch.autocast("cpu", dtype=torch.bfloat16)` (f32 master
  weights and optimizer, as ours). Reports tokens/s, and ours bf16 / ours f32.
- `generate`: the Qwen3-0.6B shape (configs/bench-lora-0.6b.toml, random weights) in bf16: a
  128-token prefill and greedy decoding of 64 tokens, `bench generate --dtype bf16` against HF
  `generate` on the model built in `torch.bfloat16`.

LoRA on the 1.7B shape against PEFT on a bf16 base is `compare_pytorch.py --suite real --shapes
1.7b`. Each measurement runs in its own process; rounds alternate the sides so that background
load hits them alike; the 1-minute load average is printed before each.

    python benches/compare_bf16.py [--rounds 3] [--jobs train,generate]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tomllib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_pytorch as cp  # noqa: E402

GEN_CONFIG = "configs/bench-lora-0.6b.toml"


def child(kind, path, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--configs", path, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=cp.ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def train_job(args, summary):
    for path in args.configs:
        sides = {"ours f32": [], "ours bf16": [], "torch f32": [], "torch autocast bf16": []}
        for r in range(args.rounds):
            line = []
            for side in sides:
                l0 = cp.load()
                if side == "ours f32":
                    res = cp.ours_train(path, args.steps, args.warmup, sets=['training.precision="f32"'])
                elif side == "ours bf16":
                    res = cp.ours_train(path, args.steps, args.warmup, sets=['training.precision="bf16"'])
                else:
                    res = child("autocast" if "bf16" in side else "f32", path, args)
                sides[side].append(res["tokens_per_sec"])
                line.append(f"{side} {res['tokens_per_sec']:.0f} tok/s (load {l0:.2f})")
            print(f"{path} round {r}: " + " | ".join(line), flush=True)
        med = {k: statistics.median(v) for k, v in sides.items()}
        summary.append((f"train {path}: ours bf16 / ours f32", med["ours bf16"], med["ours f32"]))
        summary.append((f"train {path}: ours bf16 / torch autocast bf16", med["ours bf16"], med["torch autocast bf16"]))
        summary.append((f"train {path}: ours f32 / torch f32", med["ours f32"], med["torch f32"]))


def generate_job(args, summary):
    ours, theirs = [], []
    for r in range(args.rounds):
        l0 = cp.load()
        o = cp.ours_generate(GEN_CONFIG, 128, 64, dtype="bf16")
        l1 = cp.load()
        t = child("generate", GEN_CONFIG, args)
        print(f"generate 0.6b bf16 round {r}: ours prefill {o['prompt_tokens_per_sec']:.0f} tok/s, decode "
              f"{o['decode_tokens_per_sec']:.1f} tok/s (load {l0:.2f}) | HF bf16 prefill "
              f"{t['prompt_tokens_per_sec']:.0f} tok/s, decode {t['decode_tokens_per_sec']:.1f} tok/s (load {l1:.2f})",
              flush=True)
        ours.append(o)
        theirs.append(t)
    for key, name in [("prompt_tokens_per_sec", "prefill"), ("decode_tokens_per_sec", "decode")]:
        o = statistics.median(x[key] for x in ours)
        t = statistics.median(x[key] for x in theirs)
        summary.append((f"0.6b bf16 {name}: ours / HF bf16", o, t))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", default=["configs/bench-dense.toml", "configs/bench-moe.toml"])
    ap.add_argument("--jobs", default="train,generate")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=["f32", "autocast", "generate"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        with open(os.path.join(cp.ROOT, args.configs[0]), "rb") as f:
            cfg = tomllib.load(f)
        if args.child == "generate":
            print(json.dumps(cp.torch_generate(cfg, 128, 64, dtype=torch.bfloat16)))
        else:
            print(json.dumps(cp.torch_train(cfg, args.steps, args.warmup, autocast=args.child == "autocast")))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; qwen-burn binary {cp.BIN}")
    print(subprocess.run(["lscpu"], capture_output=True, text=True).stdout.split("Model name:")[1].splitlines()[0].strip())
    summary = []
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    if "train" in jobs:
        train_job(args, summary)
    if "generate" in jobs:
        generate_job(args, summary)
    print("\nsummary (tokens/s, medians over rounds; ratio > 1: the first is faster)")
    for name, a, b in summary:
        print(f"  {name:64s} {a:9.1f} {b:9.1f}  ratio {a / b:.2f}")
    print(f"load average now {os.getloadavg()}")


if __name__ == "__main__":
    main()
