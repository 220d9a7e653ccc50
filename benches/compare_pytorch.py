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

`--shapes` picks the real suite's jobs (comma list; default `0.6b`, the jobs above): `1.7b` and
`4b` time LoRA on the Qwen3-1.7B / Qwen3-4B shapes of issue 27 (configs/bench-lora-1.7b.toml,
configs/bench-lora-4b.toml: random weights, rows of 1 x 512, r=8 / alpha 16 on the seven
projections, AdamW, clip 1.0; ours keeps the frozen base in bf16) against two PEFT runs of the
same Qwen3ForCausalLM: the whole model in f32, and the frozen base built in bf16 (`dtype=
torch.bfloat16`, the usual way of loading a base for PEFT) with the adapters in f32. Each round
runs ours / PEFT f32 / PEFT bf16, each in its own process (peak RSS per job); the summary has a
table per shape with ours / PEFT f32 for speed and for peak RSS. PEFT f32 on 4b (16 GB of f32
weights) runs only with `--torch-4b-f32`; `--no-torch-bf16 [SHAPES]` skips the bf16-base PEFT run
(for all shapes, or for the listed ones). A job that fails (e.g. killed for memory) is reported
and the rest go on.

    python benches/compare_pytorch.py [--rounds 3] [--steps 5] [--configs ...]
    python benches/compare_pytorch.py --suite real [--rounds 2]
    python benches/compare_pytorch.py --suite real --shapes 1.7b [--rounds 2] [--no-torch-bf16]
    python benches/compare_pytorch.py --suite real --shapes 4b [--rounds 1] [--torch-4b-f32] [--no-torch-bf16]

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
# Real-suite LoRA shapes (`--shapes`): 0.6b runs the issue-13 jobs (LoRA, full fine-tuning,
# generation); the others run LoRA only, against PEFT with an f32 and with a bf16 base.
LORA_SHAPES = {"0.6b": "configs/bench-lora-0.6b.toml", "1.7b": "configs/bench-lora-1.7b.toml",
               "4b": "configs/bench-lora-4b.toml"}
# Shapes whose PEFT f32 run is skipped unless --torch-4b-f32 (weights alone 16 GB in f32).
F32_GUARDED = {"4b"}


def rss_mb():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load():
    return os.getloadavg()[0]


def hf_model(cfg, dtype=None):
    """The config's architecture, randomly initialised; `dtype` (dense only) builds the weights
    directly in that dtype, as `from_pretrained(..., dtype=...)` would, so that no f32 copy ever
    exists (it would count in the peak RSS)."""
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
    if dtype is not None:
        try:
            return Qwen3ForCausalLM._from_config(Qwen3Config(**common), dtype=dtype)
        except TypeError:  # older transformers spell it torch_dtype
            return Qwen3ForCausalLM._from_config(Qwen3Config(**common), torch_dtype=dtype)
    return Qwen3ForCausalLM(Qwen3Config(**common))


def torch_train(cfg, steps, warmup, lora=False, base_dtype=None, autocast=False):
    """Times AdamW steps; with `lora`, PEFT LoRA on the config's targets, the base built in
    `base_dtype` (None: f32) and the adapters in f32 (PEFT's autocast_adapter_dtype); with
    `autocast`, the forward and loss under `torch.autocast("cpu", dtype=torch.bfloat16)` (the
    backward follows the forward's dtypes, as autocast documents; weights and optimizer f32)."""
    torch.manual_seed(0)
    model = hf_model(cfg, dtype=base_dtype)
    if lora:
        from peft import LoraConfig, get_peft_model
        lc = cfg["lora"]
        model = get_peft_model(model, LoraConfig(r=lc["rank"], lora_alpha=lc["alpha"], lora_dropout=0.0,
                                                 target_modules=lc["targets"]), autocast_adapter_dtype=True)
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
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    med = statistics.median(times)
    res = {"tokens_per_sec": b * s / med, "step_ms_median": med * 1e3, "peak_rss_mb": rss_mb()}
    if lora:
        res["trainable_params"] = sum(p.numel() for p in params)
        res["adapter_dtypes"] = sorted({str(p.dtype) for p in params})
        res["base_dtypes"] = sorted({str(p.dtype) for p in model.parameters() if not p.requires_grad})
    return res


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


def torch_generate(cfg, prompt_len, new_tokens, repeats=3, dtype=None):
    """Prefill and greedy decoding with the KV cache; the model built in `dtype` (None: f32)."""
    torch.manual_seed(0)
    model = hf_model(cfg, dtype=dtype).eval()
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
    ap.add_argument("--shapes", default="0.6b",
                    help=f"real suite: comma list of {','.join(LORA_SHAPES)} (default 0.6b: the issue-13 jobs; "
                         "1.7b / 4b: LoRA vs PEFT f32 and PEFT with a bf16 base)")
    ap.add_argument("--no-torch-bf16", nargs="?", const="all", default="", metavar="SHAPES",
                    help="real suite: skip the PEFT run with a bf16 base, for all shapes or for the comma-listed ones")
    ap.add_argument("--no-torch-f32", action="store_true",
                    help="real suite: skip the PEFT runs with an f32 base (the bf16 comparison alone)")
    ap.add_argument("--torch-4b-f32", action="store_true",
                    help="real suite: also run PEFT with an f32 base on 4b (16 GB of f32 weights; skipped otherwise)")
    ap.add_argument("--torch-job", choices=["train", "lora", "lora_bf16", "generate"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.shapes = [x.strip() for x in args.shapes.split(",") if x.strip()]
    no_bf16 = [x.strip() for x in args.no_torch_bf16.split(",") if x.strip()]
    for x in args.shapes + [x for x in no_bf16 if x != "all"]:
        if x not in LORA_SHAPES:
            ap.error(f"unknown shape {x!r}; known: {', '.join(LORA_SHAPES)}")
    args.no_torch_bf16 = set(LORA_SHAPES) if "all" in no_bf16 else set(no_bf16)
    torch.set_num_threads(args.threads)
    if args.torch_job:
        with open(os.path.join(ROOT, args.configs[0]), "rb") as f:
            cfg = tomllib.load(f)
        if args.torch_job in ("train", "lora", "lora_bf16"):
            if args.torch_job == "train" and args.suite == "real":
                cfg["training"].update(batch_size=1, seq_len=256)
            print(json.dumps(torch_train(cfg, args.steps, args.warmup, lora=args.torch_job != "train",
                                         base_dtype=torch.bfloat16 if args.torch_job == "lora_bf16" else None)))
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


def attempt(fn):
    """(result, None), or (None, why) when the job's process failed (e.g. killed for memory)."""
    try:
        return fn(), None
    except subprocess.CalledProcessError as e:
        why = f"exit {e.returncode}"
        if e.returncode in (-9, 137):
            why += " (SIGKILL: likely out of memory)"
        tail = [l for l in (e.stderr or "").strip().splitlines() if l.strip()][-2:]
        return None, why + (": " + " | ".join(tail) if tail else "")


def lora_plan(shape, args):
    """{side: None to run, or the reason it is skipped} for the 1.7b / 4b LoRA jobs."""
    plan = {"qwen-burn": None, "peft-f32": None, "peft-bf16": None}
    if shape in F32_GUARDED and not args.torch_4b_f32:
        plan["peft-f32"] = f"skipped: f32 weights of {shape} are ~16 GB; pass --torch-4b-f32 to run it"
    if args.no_torch_f32:
        plan["peft-f32"] = "skipped: --no-torch-f32"
    if shape in args.no_torch_bf16:
        plan["peft-bf16"] = "skipped: --no-torch-bf16"
    return plan


def fmt_job(res, why):
    if res is None:
        return why
    return (f"{res['tokens_per_sec']:.1f} tok/s ({res['step_ms_median']:.0f} ms/step) "
            f"rss {res['peak_rss_mb']:.0f} MB")


def lora_round(shape, r, args, results):
    """One round of a 1.7b / 4b LoRA shape: ours, PEFT f32, PEFT bf16 base, each its own process."""
    path = LORA_SHAPES[shape]
    for side, why in lora_plan(shape, args).items():
        l0 = load()
        if why is None:
            if side == "qwen-burn":
                res, why = attempt(lambda: ours_train(path, args.steps, args.warmup))
            else:
                res, why = attempt(lambda: torch_job("lora" if side == "peft-f32" else "lora_bf16", path, args))
            if why is not None:
                why = f"FAILED, {why}"
        else:
            res = None
        results[shape][side].append((res, why))
        print(f"round {r} lora {shape}: {side:9s} {fmt_job(res, why)}" + (f" (load {l0:.2f})" if res is not None else ""),
              flush=True)


def lora_table(shape, args, entries):
    with open(os.path.join(ROOT, LORA_SHAPES[shape]), "rb") as f:
        base = tomllib.load(f)["lora"].get("base_dtype", "f32")
    labels = {"qwen-burn": f"qwen-burn ({base} base)", "peft-f32": "PEFT (f32 base)", "peft-bf16": "PEFT (bf16 base)"}
    print(f"\nLoRA {shape} ({LORA_SHAPES[shape]}; tokens/s and ms/step: medians over rounds; peak RSS: max)")
    print(f"  {'side':24s} {'tokens/s':>9s} {'ms/step':>9s} {'peak RSS MB':>12s}  rounds")
    med = {}
    for side, label in labels.items():
        ok = [res for res, _ in entries[side] if res is not None]
        if ok:
            med[side] = (statistics.median(x["tokens_per_sec"] for x in ok), max(x["peak_rss_mb"] for x in ok))
            ms = statistics.median(x["step_ms_median"] for x in ok)
            note = f"{len(ok)}/{len(entries[side])}"
            dt = ok[0].get("base_dtypes")
            if dt:
                note += f"  base {','.join(dt)}, adapters {','.join(ok[0]['adapter_dtypes'])}"
            print(f"  {label:24s} {med[side][0]:9.1f} {ms:9.0f} {med[side][1]:12.0f}  {note}")
        else:
            why = next((w for _, w in entries[side] if w), "no result")
            print(f"  {label:24s} {'-':>9s} {'-':>9s} {'-':>12s}  {why}")
    for other in ("peft-f32", "peft-bf16"):
        if "qwen-burn" in med and other in med:
            o, t = med["qwen-burn"], med[other]
            print(f"  ours / {labels[other]}: speed {o[0] / t[0]:.2f}x (> 1 = ours faster), "
                  f"peak RSS {o[1] / t[1]:.2f}x (< 1 = ours smaller)")
        else:
            missing = [x for x in ("qwen-burn", other) if x not in med]
            why = "; ".join(f"{labels[x]}: {next((w for _, w in entries[x] if w), 'no result')}" for x in missing)
            print(f"  ours / {labels[other]}: n/a ({why})")


def real_suite(args):
    """Issue 13: LoRA, full fine-tuning, prefill and decode on the Qwen3-0.6B shape (`--shapes`
    0.6b); issue 27: LoRA on the 1.7b / 4b shapes vs PEFT with an f32 and a bf16 base."""
    lora_cfg, full_cfg = "configs/bench-lora-0.6b.toml", "configs/qwen3-0.6b.toml"
    full_sets = ["training.batch_size=1", "training.seq_len=256", "training.grad_accum=1"]
    steps, warmup = args.steps, args.warmup
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, attention {ATTN}; qwen-burn binary {BIN}; "
          f"{steps} timed steps after {warmup}; shapes {','.join(args.shapes)}", flush=True)
    big = [x for x in args.shapes if x != "0.6b"]
    for shape in big:
        for side, why in lora_plan(shape, args).items():
            if why is not None:
                print(f"lora {shape}: {side} {why}", flush=True)
    results = {shape: {side: [] for side in lora_plan(shape, args)} for shape in big}
    rows = {k: ([], []) for k in ["lora", "full", "prefill", "decode", "decode_bf16"]}
    rss = {k: ([], []) for k in ["lora", "full", "decode"]}
    for r in range(args.rounds):
        for shape in big:
            lora_round(shape, r, args, results)
        if "0.6b" not in args.shapes:
            continue
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
    for shape in big:
        lora_table(shape, args, results[shape])
    if "0.6b" in args.shapes:
        print("\nsummary (medians; tokens/s; ratio = qwen-burn / PyTorch; decode_bf16 is ours with bf16 weights vs HF in f32)")
        for k, (o, t) in rows.items():
            line = f"  {k:12s} qwen-burn {statistics.median(o):8.2f}  pytorch {statistics.median(t):8.2f}  ratio {statistics.median(o) / statistics.median(t):.2f}"
            if k in rss:
                line += f"  peak RSS MB qwen-burn {max(rss[k][0]):.0f} pytorch {max(rss[k][1]):.0f}"
            print(line)
    print(f"load average now {os.getloadavg()}")


if __name__ == "__main__":
    main()
