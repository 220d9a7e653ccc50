"""Side by side: qwen-burn vs PyTorch (HF transformers) on the same machine, alternating.

For each config (default: configs/bench-dense.toml, configs/bench-moe.toml) it builds the same
architecture as Qwen3ForCausalLM / Qwen3MoeForCausalLM (eager attention, f32, CPU), trains on
random tokens with AdamW (same betas, eps, weight decay), global-norm clipping and the config's
batch shape, with torch.set_num_threads(THREADS), and times `qwen-burn bench train` on the same
config; the two alternate ROUNDS times so background load hits both alike. Then it compares
greedy decoding (HF generate with its KV cache vs `qwen-burn bench generate`).

`--suite real` runs the real-checkpoint jobs of issue 13 on the Qwen3-0.6B shape instead (random
weights, batch 1 x 256, f32): LoRA (PEFT r=8, alpha 16 on q,k,v,o,gate,up,down vs
configs/bench-lora-0.6b.toml), full fine-tuning (AdamW, clip 1.0), and greedy decoding of 32
tokens after a 128-token prompt (HF generate vs `bench generate`), with the peak RSS of each
process (ru_maxrss of the PyTorch child; `peak_rss_mb` of ours).

    python benches/compare_pytorch.py [--rounds 3] [--steps 5] [--configs ...]
    python benches/compare_pytorch.py --suite real [--rounds 2]

Prints one line per measurement and a summary with the ratios ours / PyTorch (> 1 = we are
faster in tokens/s) and the machine load (1-minute load average) before each measurement.
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
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("QWEN_BURN_BIN", os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "qwen-burn"))


ATTN = "sdpa"


def rss_mb():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load():
    return os.getloadavg()[0]


def hf_model(cfg):
    m = dict(cfg["model"])
    moe = m.pop("model_type") == "qwen3_moe"
    common = dict(vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["intermediate_size"],
                  num_hidden_layers=m["num_hidden_layers"], num_attention_heads=m["num_attention_heads"],
                  num_key_value_heads=m["num_key_value_heads"], head_dim=m["head_dim"],
                  max_position_embeddings=m["max_position_embeddings"], rms_norm_eps=m["rms_norm_eps"],
                  rope_theta=m["rope_theta"], tie_word_embeddings=m["tie_word_embeddings"],
                  attn_implementation=ATTN)
    if moe:
        c = Qwen3MoeConfig(**common, num_experts=m["num_experts"], num_experts_per_tok=m["num_experts_per_tok"],
                           moe_intermediate_size=m["moe_intermediate_size"], norm_topk_prob=m["norm_topk_prob"],
                           router_aux_loss_coef=m["router_aux_loss_coef"], output_router_logits=True,
                           decoder_sparse_step=1, mlp_only_layers=[])
        try:
            return Qwen3MoeForCausalLM(c, experts_implementation="eager") if False else Qwen3MoeForCausalLM(c)
        except TypeError:
            return Qwen3MoeForCausalLM(c)
    return Qwen3ForCausalLM(Qwen3Config(**common))


def torch_train(cfg, steps, warmup, lora=False):
    torch.manual_seed(0)
    model = hf_model(cfg)
    if lora:
        from peft import LoraConfig, get_peft_model
        lc = cfg["lora"]
        model = get_peft_model(model, LoraConfig(r=lc["rank"], lora_alpha=lc["alpha"], lora_dropout=0.0,
                                                 target_modules=lc["targets"]))
    model.train()
    o = cfg["optimizer"]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                            weight_decay=o["weight_decay"])
    t = cfg["training"]
    b, s, v = t["batch_size"], t["seq_len"], cfg["model"]["vocab_size"]
    times = []
    for i in range(warmup + steps):
        ids = torch.randint(0, v, (b, s))
        start = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    med = statistics.median(times)
    return {"tokens_per_sec": b * s / med, "step_ms_median": med * 1e3, "peak_rss_mb": rss_mb()}


def ours_train(path, steps, warmup, replicas=1, batch_size=None, sets=()):
    """`qwen-burn bench train`; with replicas > 1 the same step (same tokens) is split into
    `replicas` micro-batches on data-parallel replicas of the CPU device (`--device flex,flex`)."""
    extra = []
    if replicas > 1:
        extra = ["--device", ",".join(["flex"] * replicas), "--set", f"training.batch_size={batch_size // replicas}",
                 "--set", f"training.grad_accum={replicas}"]
    for kv in sets:
        extra += ["--set", kv]
    out = subprocess.run([BIN, "bench", "train", "--config", path, "--steps", str(steps), "--warmup", str(warmup), "--json"]
                         + extra, check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def torch_generate(cfg, prompt_len, new_tokens, repeats=3):
    torch.manual_seed(0)
    model = hf_model(cfg).eval()
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
            # generate() includes one prefill; the rest are decode steps.
            rates.append((out.shape[1] - prompt_len - 1) / max(total - prefill, 1e-9))
    return {"decode_tokens_per_sec": statistics.median(rates[1:]),
            "prompt_tokens_per_sec": statistics.median(prefills[1:]), "peak_rss_mb": rss_mb()}


def ours_generate(path, prompt_len, new_tokens, repeats=3, dtype=None):
    extra = ["--dtype", dtype] if dtype else []
    out = subprocess.run([BIN, "bench", "generate", "--config", path, "--prompt-len", str(prompt_len),
                          "--new-tokens", str(new_tokens), "--repeats", str(repeats), "--json"] + extra,
                         check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def torch_job(kind, path, args):
    """Run one PyTorch measurement in a child process, so that its OpenMP threads (which spin
    for a while after each parallel region) are gone before qwen-burn is timed."""
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-job", kind, "--configs", path,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads),
           "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens), "--suite", args.suite]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", default=["configs/bench-dense.toml", "configs/bench-moe.toml"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--suite", choices=["small", "real"], default="small")
    ap.add_argument("--torch-job", choices=["train", "lora", "generate"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.torch_job:
        with open(os.path.join(ROOT, args.configs[0]), "rb") as f:
            cfg = tomllib.load(f)
        if args.torch_job in ("train", "lora"):
            if args.torch_job == "train" and args.suite == "real":
                cfg["training"].update(batch_size=1, seq_len=256)
            print(json.dumps(torch_train(cfg, args.steps, args.warmup, lora=args.torch_job == "lora")))
        else:
            repeats = 2 if args.suite == "real" else 3
            print(json.dumps(torch_generate(cfg, args.prompt_len, args.new_tokens, repeats)))
        return
    if args.suite == "real":
        return real_suite(args)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; qwen-burn binary {BIN}")
    summary = []
    for path in args.configs:
        with open(os.path.join(ROOT, path), "rb") as f:
            cfg = tomllib.load(f)
        ours, ours2, theirs = [], [], []
        batch = cfg["training"]["batch_size"]
        for r in range(args.rounds):
            l0 = load()
            o = ours_train(path, args.steps, args.warmup)
            l1 = load()
            o2 = ours_train(path, args.steps, args.warmup, replicas=2, batch_size=batch)
            l2 = load()
            t = torch_job("train", path, args)
            print(f"{path} round {r}: qwen-burn flex {o['tokens_per_sec']:.0f} tok/s ({o['step_ms_median']:.0f} ms/step, "
                  f"load {l0:.2f}) | flex,flex {o2['tokens_per_sec']:.0f} tok/s ({o2['step_ms_median']:.0f} ms/step, "
                  f"load {l1:.2f}) | pytorch {t['tokens_per_sec']:.0f} tok/s ({t['step_ms_median']:.0f} ms/step, "
                  f"load {l2:.2f})", flush=True)
            ours.append(o["tokens_per_sec"])
            ours2.append(o2["tokens_per_sec"])
            theirs.append(t["tokens_per_sec"])
        summary.append((f"train {path} (flex)", statistics.median(ours), statistics.median(theirs),
                        statistics.median(ours) / statistics.median(theirs)))
        summary.append((f"train {path} (flex,flex)", statistics.median(ours2), statistics.median(theirs),
                        statistics.median(ours2) / statistics.median(theirs)))
        l0 = load()
        og = ours_generate(path, args.prompt_len, args.new_tokens)
        tg = torch_job("generate", path, args)
        print(f"{path} decode: qwen-burn {og['decode_tokens_per_sec']:.0f} tok/s | HF generate "
              f"{tg['decode_tokens_per_sec']:.0f} tok/s (load {l0:.2f})", flush=True)
        summary.append((f"decode {path}", og["decode_tokens_per_sec"], tg["decode_tokens_per_sec"],
                        og["decode_tokens_per_sec"] / tg["decode_tokens_per_sec"]))
    print("\nsummary (tokens/s; ratio = qwen-burn / PyTorch)")
    for name, o, t, ratio in summary:
        print(f"  {name:48s} qwen-burn {o:8.0f}  pytorch {t:8.0f}  ratio {ratio:.2f}")
    print(f"load average now {os.getloadavg()}")


def real_suite(args):
    """Issue 13: LoRA, full fine-tuning, prefill and decode on the Qwen3-0.6B shape."""
    lora_cfg, full_cfg = "configs/bench-lora-0.6b.toml", "configs/qwen3-0.6b.toml"
    full_sets = ["training.batch_size=1", "training.seq_len=256", "training.grad_accum=1"]
    steps, warmup = args.steps, args.warmup
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, attention {ATTN}; qwen-burn binary {BIN}; "
          f"{steps} timed steps after {warmup}", flush=True)
    rows = {k: ([], []) for k in ["lora", "full", "prefill", "decode", "decode_bf16"]}
    rss = {k: ([], []) for k in ["lora", "full", "decode"]}
    for r in range(args.rounds):
        l0 = load()
        o = ours_train(lora_cfg, steps, warmup)
        l1 = load()
        t = torch_job("lora", lora_cfg, args)
        print(f"round {r} lora: qwen-burn {o['tokens_per_sec']:.1f} tok/s rss {o['peak_rss_mb']:.0f} MB (load {l0:.2f}) | "
              f"peft {t['tokens_per_sec']:.1f} tok/s rss {t['peak_rss_mb']:.0f} MB (load {l1:.2f})", flush=True)
        rows["lora"][0].append(o["tokens_per_sec"]); rows["lora"][1].append(t["tokens_per_sec"])
        rss["lora"][0].append(o["peak_rss_mb"]); rss["lora"][1].append(t["peak_rss_mb"])
        l0 = load()
        o = ours_train(full_cfg, steps, warmup, sets=full_sets)
        l1 = load()
        t = torch_job("train", full_cfg, args)
        print(f"round {r} full: qwen-burn {o['tokens_per_sec']:.1f} tok/s rss {o['peak_rss_mb']:.0f} MB (load {l0:.2f}) | "
              f"pytorch {t['tokens_per_sec']:.1f} tok/s rss {t['peak_rss_mb']:.0f} MB (load {l1:.2f})", flush=True)
        rows["full"][0].append(o["tokens_per_sec"]); rows["full"][1].append(t["tokens_per_sec"])
        rss["full"][0].append(o["peak_rss_mb"]); rss["full"][1].append(t["peak_rss_mb"])
        l0 = load()
        o = ours_generate(full_cfg, args.prompt_len, args.new_tokens, repeats=1)
        l1 = load()
        ob = ours_generate(full_cfg, args.prompt_len, args.new_tokens, repeats=1, dtype="bf16")
        t = torch_job("generate", full_cfg, args)
        print(f"round {r} generate: qwen-burn prefill {o['prompt_tokens_per_sec']:.1f} decode {o['decode_tokens_per_sec']:.2f} "
              f"tok/s rss {o['peak_rss_mb']:.0f} MB (load {l0:.2f}) | bf16 weights decode {ob['decode_tokens_per_sec']:.2f} | HF prefill {t['prompt_tokens_per_sec']:.1f} decode {t['decode_tokens_per_sec']:.2f} tok/s "
              f"rss {t['peak_rss_mb']:.0f} MB (load {l1:.2f})", flush=True)
        rows["prefill"][0].append(o["prompt_tokens_per_sec"]); rows["prefill"][1].append(t["prompt_tokens_per_sec"])
        rows["decode"][0].append(o["decode_tokens_per_sec"]); rows["decode"][1].append(t["decode_tokens_per_sec"])
        rows["decode_bf16"][0].append(ob["decode_tokens_per_sec"]); rows["decode_bf16"][1].append(t["decode_tokens_per_sec"])
        rss["decode"][0].append(o["peak_rss_mb"]); rss["decode"][1].append(t["peak_rss_mb"])
    print("\nsummary (medians; tokens/s; ratio = qwen-burn / PyTorch; decode_bf16 is ours with bf16 weights vs HF in f32)")
    for k, (o, t) in rows.items():
        line = f"  {k:12s} qwen-burn {statistics.median(o):8.2f}  pytorch {statistics.median(t):8.2f}  ratio {statistics.median(o) / statistics.median(t):.2f}"
        if k in rss:
            line += f"  peak RSS MB qwen-burn {max(rss[k][0]):.0f} pytorch {max(rss[k][1]):.0f}"
        print(line)
    print(f"load average now {os.getloadavg()}")


if __name__ == "__main__":
    main()
