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
import time
import tomllib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_pytorch as cp  # noqa: E402

GEN_CONFIG = "configs/bench-lora-0.6b.toml"


def torch_autocast_train(cfg, steps, warmup, autocast):
    """AdamW steps on random tokens, f32 weights; the forward and loss under bf16 autocast when
    `autocast` (the backward follows the forward's dtypes, as autocast documents)."""
    torch.manual_seed(0)
    model = cp.hf_model(cfg)
    model.train()
    o, t = cfg["optimizer"], cfg["training"]
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                            weight_decay=o["weight_decay"])
    b, s, v = t["batch_size"], t["seq_len"], cfg["model"]["vocab_size"]
    times = []
    for i in range(warmup + steps):
        ids = torch.randint(0, v, (b, s))
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    med = statistics.median(times)
    return {"tokens_per_sec": b * s / med, "step_ms_median": med * 1e3, "peak_rss_mb": cp.rss_mb()}


def torch_bf16_generate(cfg, prompt_len, new_tokens, repeats=3):
    torch.manual_seed(0)
    model = cp.hf_model(cfg, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, cfg["model"]["vocab_size"], (1, prompt_len))
    rates, prefills = [], []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            model(ids)
            prefill = time.perf_counter() - start
            prefills.append(prompt_len / prefill)
            start = time.perf_counter()
            out = model.generate(ids, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 pad_token_id=0, eos_token_id=None)
            total = time.perf_counter() - start
            rates.append((out.shape[1] - prompt_len - 1) / max(total - prefill, 1e-9))
    return {"decode_tokens_per_sec": statistics.median(rates[1:]),
            "prompt_tokens_per_sec": statistics.median(prefills[1:]), "peak_rss_mb": cp.rss_mb()}


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
            print(json.dumps(torch_bf16_generate(cfg, 128, 64)))
        else:
            print(json.dumps(torch_autocast_train(cfg, args.steps, args.warmup, args.child == "autocast")))
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
