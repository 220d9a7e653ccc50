"""Train the same run in HF transformers + PyTorch: same initial weights (qwen-burn init), same
batches in the same order (qwen-burn batches), same AdamW (decay on matrices only), same
warmup + cosine schedule, same global-norm clipping. Writes metrics.jsonl in qwen-burn's schema.

    python train_hf.py --config config.toml --init init_hf --batches batches.jsonl --out hf_run
"""
import argparse
import json
import math
import os
import time
import tomllib

import torch
from transformers import Qwen3ForCausalLM


def learning_rate(step, max_steps, opt, sched):
    # crates/train/src/schedule.rs, line for line.
    peak, floor = opt["lr"], sched.get("min_lr", 0.0)
    warmup = sched.get("warmup_steps", 0)
    if step < warmup:
        return peak * (step + 1) / warmup
    decay_steps = max(max_steps - warmup, 1)
    progress = min((step - warmup) / decay_steps, 1.0)
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - floor)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--init", required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with open(args.config, "rb") as f:
        cfg = tomllib.load(f)
    opt_cfg, sched = cfg["optimizer"], cfg.get("schedule", {})
    max_steps = cfg["training"]["max_steps"]

    model = Qwen3ForCausalLM.from_pretrained(args.init, dtype=torch.float32, attn_implementation="eager")
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": opt_cfg["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=opt_cfg["lr"], betas=(opt_cfg["beta1"], opt_cfg["beta2"]), eps=opt_cfg["eps"], foreach=False)

    os.makedirs(args.out, exist_ok=True)
    out = open(os.path.join(args.out, "metrics.jsonl"), "w")
    start = time.time()
    with open(args.batches) as f:
        for line in f:
            b = json.loads(line)
            step = b["step"]
            if step > max_steps:
                break
            inputs = torch.tensor(b["inputs"])
            targets = torch.tensor(b["targets"])
            logits = model(input_ids=inputs).logits
            loss = torch.nn.functional.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), opt_cfg["grad_clip"])
            lr = learning_rate(step - 1, max_steps, opt_cfg, sched)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.write(json.dumps({"step": step, "split": "train", "loss": loss.item(), "lr": lr,
                                  "grad_norm": norm.item(), "elapsed_secs": time.time() - start}) + "\n")
            if step % 50 == 0:
                print(f"step {step}: loss {loss.item():.4f}", flush=True)
    out.close()


if __name__ == "__main__":
    main()
