"""Side by side: qwen-burn's DPO and SFT against HF TRL's `DPOTrainer` and `SFTTrainer` on the
same machine, alternating.

Jobs (`--jobs`, default all three), each round running ours then TRL, each in its own process:
- `tiny`: `configs/dpo.toml` as shipped: full fine-tuning of the README's tiny run (RUN, default
  `runs/tiny`, exported once to an HF directory for TRL) on `datasets/preference/austen_style.jsonl`
  with the shipped tokenizer: 8 pairs a step, `max_length` 128 (`keep_start`), AdamW lr 3e-4, no
  weight decay, clip 1.0, beta 0.1, the reference's log-probabilities computed before the first
  step on both sides (TRL's `precompute_ref_log_probs=True`), rows padded to the micro-batch's
  longest on both sides. Ours is `qwen-burn train` with a record every step; a step's time is
  the difference of consecutive records' `elapsed_secs` (TRL: of consecutive `on_step_end`
  calls), so both include the batch's collation.
- `lora`: LoRA DPO on the Qwen3-0.6B shape (`configs/bench-lora-0.6b.toml`: random weights, r 8 /
  alpha 16 on the seven projections, AdamW, clip 1.0), one pair a step of a 128-token prompt and
  two 128-token completions (rows of 256), random tokens. Ours is `qwen-burn bench train --set
  data.kind="preference"`; TRL gets the same shapes as pre-tokenized pairs, with PEFT, its
  reference log-probabilities precomputed (outside the timed steps, as ours).
- `sft`: `configs/finetune.toml` as shipped: LoRA chat SFT (r 8, PEFT on TRL's side) of the same
  tiny run on `datasets/chat/shakespeare_chat.jsonl`, 8 rows of 128 tokens a step,
  conversations packed into rows; TRL's `SFTTrainer` with `packing=True` (`bfd`: padding-free, positions restarting per
  conversation, as our document mask) and `assistant_only_loss` with a ChatML template marking
  the replies and their <|im_end|>. Timed as `tiny`.

Activation checkpointing (`--checkpointing`): TRL 1.16.0's DPOConfig, SFTConfig and GRPOConfig turn
HF's `gradient_checkpointing` on by default (each decoder layer recomputed in the backward);
qwen-burn's `training.activation_checkpointing` is off by default. `shipped` runs each side as
it ships (TRL recomputing, ours not); `off` turns TRL's off; `on` turns ours on ("layers") with
TRL's, so that the speed and the peak RSS compare the same work.

Both sides use `THREADS` threads (torch.set_num_threads; ours uses every core of this 2-core
machine). Prints one line per measurement (with the 1-minute load average before it) and a
summary of the medians' ratios TRL / ours (> 1: we are faster) and peak RSS (ru_maxrss of TRL's
process; ours: `peak_rss_mb` of `bench train`, ru_maxrss of the `train` process otherwise).

    python benches/compare_trl.py [--jobs tiny lora sft] [--rounds 2] [--steps 40] [--lora-steps 5]
                                  [--checkpointing shipped|off|on]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import BIN, ROOT, hf_model, load, ours_train, rss_mb  # noqa: E402

EOS = "<|endoftext|>"
SFT_CONFIG = "configs/finetune.toml"
# `--checkpointing`: TRL's `gradient_checkpointing` (None: TRL's default) and our override.
CHECKPOINTING = {"shipped": (None, []), "off": (False, []),
                 "on": (True, ['training.activation_checkpointing="layers"'])}
MODE = "shipped"
GRPO_CONFIG = "configs/grpo.toml"
# ChatML prompts ending with the assistant's header (what qwen-burn renders for GRPO's prompts).
CHATML_PROMPT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# ChatML with the assistants' replies and their <|im_end|> marked for `assistant_only_loss`.
CHATML = ("{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant\n{% generation %}"
          "{{ m['content'] }}<|im_end|>{% endgeneration %}\n{% else %}<|im_start|>{{ m['role'] }}\n"
          "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}")


def tokenizer():
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(tokenizer_file=os.path.join(ROOT, "datasets/tokenizer.json"), eos_token=EOS,
                                   pad_token=EOS)


def trl_args(config_cls, out, steps, batch, cfg, seed, **extra):
    """TRL's arguments (`config_cls`: DPOConfig, SFTConfig, GRPOConfig) for a config's optimizer
    (AdamW with its betas, eps, weight decay and clip; qwen-burn's defaults where it says
    nothing) and schedule (cosine to `min_lr`), plus the trainer's own settings (`extra`)."""
    o, s = cfg["optimizer"], cfg.get("schedule", {})
    trl_gc = CHECKPOINTING[MODE][0]
    if trl_gc is not None:
        extra["gradient_checkpointing"] = trl_gc
    return config_cls(output_dir=out, max_steps=steps, per_device_train_batch_size=batch, learning_rate=o["lr"],
                      adam_beta1=o.get("beta1", 0.9), adam_beta2=o.get("beta2", 0.95), adam_epsilon=o.get("eps", 1e-8),
                      weight_decay=o.get("weight_decay", 0.1), max_grad_norm=o.get("grad_clip", 1.0),
                      lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr": s.get("min_lr", 0.0)},
                      warmup_steps=s.get("warmup_steps", 0), use_cpu=True, report_to="none", save_strategy="no",
                      eval_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, seed=seed,
                      bf16=False, fp16=False, **extra)


def dpo_args(out, steps, batch, cfg, max_length, seed):
    """DPOTrainer's: beta 0.1, sigmoid, `keep_start`, the reference precomputed."""
    from trl import DPOConfig
    return trl_args(DPOConfig, out, steps, batch, cfg, seed, max_length=max_length, beta=0.1,
                    loss_type=["sigmoid"], truncation_mode="keep_start", precompute_ref_log_probs=True)


def trl_run(trainer_cls, warmup, **kw):
    """Trains and returns the seconds between consecutive steps' ends (the first `warmup` left
    out; the first step's own time is not among them), the logged losses and the peak RSS."""
    from transformers import TrainerCallback

    class Ends(TrainerCallback):
        def __init__(self):
            self.ends, self.losses = [], []

        def on_step_end(self, args, state, control, **_):
            self.ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **_):
            if logs and "loss" in logs:
                self.losses.append(logs["loss"])

    ends = Ends()
    trainer = trainer_cls(callbacks=[ends], **kw)
    trainer.train()
    gaps = [b - a for a, b in zip(ends.ends, ends.ends[1:])][warmup:]
    return {"step_s_median": statistics.median(gaps), "steps_timed": len(gaps), "losses": ends.losses,
            "peak_rss_mb": rss_mb()}


def trl_tiny(args):
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOTrainer
    torch.set_num_threads(args.threads)
    cfg = tomllib.load(open(os.path.join(ROOT, "configs/dpo.toml"), "rb"))
    t = cfg["training"]
    data = load_dataset("json", data_files=os.path.join(ROOT, cfg["data"]["inputs"][0]), split="train")
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as out:
        res = trl_run(DPOTrainer, args.warmup, model=model, processing_class=tokenizer(), train_dataset=data,
                      args=dpo_args(out, args.steps, t["batch_size"], cfg, t["seq_len"], t["seed"]))
    res["loss_last"] = res.pop("losses")[-1]
    return res


def trl_lora(args):
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOTrainer

    class Pretokenized(DPOTrainer):
        def _prepare_dataset(self, dataset, *_, **__):
            return dataset

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = tomllib.load(open(os.path.join(ROOT, "configs/bench-lora-0.6b.toml"), "rb"))
    t, lc, v = cfg["training"], cfg["lora"], cfg["model"]["vocab_size"]
    half = t["seq_len"] // 2
    n = args.lora_steps + args.warmup + 1
    g = torch.Generator().manual_seed(0)
    ids = lambda: torch.randint(0, v, (half,), generator=g).tolist()  # noqa: E731
    data = Dataset.from_list([{"prompt_ids": ids(), "chosen_ids": ids(), "rejected_ids": ids()} for _ in range(n)])
    model = hf_model(cfg)
    peft = LoraConfig(r=lc["rank"], lora_alpha=lc["alpha"], lora_dropout=0.0, target_modules=lc["targets"])
    with tempfile.TemporaryDirectory() as out:
        res = trl_run(Pretokenized, args.warmup, model=model, processing_class=tokenizer(), train_dataset=data,
                      peft_config=peft, args=dpo_args(out, n, 1, cfg, t["seq_len"], 0))
    res["tokens_per_sec"] = 2 * t["seq_len"] / res["step_s_median"]
    res["loss_last"] = res.pop("losses")[-1]
    return res


def trl_sft(args):
    """TRL's SFTTrainer on `configs/finetune.toml`'s data and settings (LoRA through PEFT): the
    assistants' replies and their <|im_end|> (`assistant_only_loss`, a ChatML template marking them, which is what
    qwen-burn renders without a template), conversations packed into rows (`bfd`, padding-free
    with per-conversation positions, as our packed rows with the document mask)."""
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer
    torch.set_num_threads(args.threads)
    cfg = tomllib.load(open(os.path.join(ROOT, SFT_CONFIG), "rb"))
    t, lc = cfg["training"], cfg["lora"]
    peft = LoraConfig(r=lc["rank"], lora_alpha=lc["alpha"], lora_dropout=0.0, target_modules=lc["targets"])
    data = load_dataset("json", data_files=os.path.join(ROOT, cfg["data"]["inputs"][0]), split="train")
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32)
    tok = tokenizer()
    tok.chat_template = CHATML
    with tempfile.TemporaryDirectory() as out:
        res = trl_run(SFTTrainer, args.warmup, model=model, processing_class=tok, train_dataset=data,
                      peft_config=peft,
                      args=trl_args(SFTConfig, out, args.steps, t["batch_size"], cfg, t["seed"],
                                    max_length=t["seq_len"], assistant_only_loss=True, packing=True,
                                    packing_strategy="bfd"))
    res["loss_last"] = res.pop("losses")[-1]
    return res


def trl_grpo(args):
    """TRL's GRPOTrainer on `configs/grpo.toml`'s prompts and settings: `group_size` completions
    of each of `batch_size` prompts a step (HF `generate`, the same temperature and length),
    the reward `exact_match` (the last `#### N`, else the last number, against the answer), the
    config's loss type, beta, optimizer and schedule."""
    import re

    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer
    torch.set_num_threads(args.threads)
    cfg = tomllib.load(open(os.path.join(ROOT, GRPO_CONFIG), "rb"))
    t, rl = cfg["training"], cfg["rl"]
    data = load_dataset("json", data_files=os.path.join(ROOT, cfg["data"]["inputs"][0]), split="train")
    model = AutoModelForCausalLM.from_pretrained(args.grpo_hf_dir, dtype=torch.float32)
    tok = tokenizer()
    tok.chat_template = CHATML_PROMPT
    pattern = re.compile(r"#### (-?[0-9][0-9,]*\.?[0-9]*)")
    number = re.compile(r"-?[0-9][0-9,]*\.?[0-9]*")

    def answer_of(text):
        found = pattern.findall(text) or number.findall(text)
        if not found:
            return None
        n = found[-1].replace(",", "")
        return n.rstrip("0").rstrip(".") if "." in n else n

    def exact_match(completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(answer_of(x) is not None and answer_of(x) == answer_of(a)) for x, a in zip(texts, answer)]

    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    config = trl_args(GRPOConfig, tempfile.mkdtemp(), args.grpo_steps, t["batch_size"] * rl["group_size"], cfg,
                      t["seed"], num_generations=rl["group_size"], max_completion_length=rl["max_new_tokens"],
                      temperature=rl["temperature"], loss_type=rl["loss_type"], beta=rl["beta"],
                      generation_kwargs={"eos_token_id": [tok.eos_token_id, im_end]})
    res = trl_run(GRPOTrainer, args.warmup, model=model, processing_class=tok, train_dataset=data,
                  reward_funcs=[exact_match], args=config)
    res["loss_last"] = res.pop("losses")[-1]
    return res


def ours_tiny(args, config="configs/dpo.toml", start=None, steps=None):
    """`qwen-burn train --config CONFIG` from START (default `--run`) for `steps` steps, a record
    every step."""
    start, steps = start or args.run, steps or args.steps
    with tempfile.TemporaryDirectory() as run:
        cmd = [BIN, "train", "--config", config, "--run-dir", run, "--set", f"model.from=\"{start}\"",
               "--set", f"training.max_steps={steps}", "--set", "logging.interval=1",
               "--set", f"training.eval_interval={steps + 1}", "--set", f"checkpoint.interval={steps}",
               "--set", "training.sample_interval=0"]
        for override in CHECKPOINTING[MODE][1]:
            cmd += ["--set", override]
        with tempfile.TemporaryFile() as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            _, status, usage = os.wait4(p.pid, 0)
            if status != 0:
                log.seek(0)
                sys.exit(f"{' '.join(cmd)} failed:\n{log.read().decode(errors='replace')[-3000:]}")
        recs = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    train = {}
    for r in recs:
        if "elapsed_secs" in r and "grad_norm" in r:
            train[r["step"]] = r
    steps = sorted(train)
    gaps = [train[b]["elapsed_secs"] - train[a]["elapsed_secs"] for a, b in zip(steps, steps[1:])][args.warmup:]
    return {"step_s_median": statistics.median(gaps), "steps_timed": len(gaps), "loss_last": train[steps[-1]]["loss"],
            "peak_rss_mb": usage.ru_maxrss / 1024}


def ours_lora(args):
    res = ours_train("configs/bench-lora-0.6b.toml", args.lora_steps, args.warmup,
                     sets=['data.kind="preference"'] + CHECKPOINTING[MODE][1])
    res["step_s_median"] = res["step_ms_median"] / 1e3
    res["loss_last"] = res["final_loss"]
    return res


def child(job, args):
    """TRL's job in its own process (its own peak RSS)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--trl-job", job, "--steps", str(args.steps),
           "--lora-steps", str(args.lora_steps), "--warmup", str(args.warmup), "--threads", str(args.threads),
           "--run", args.run, "--hf-dir", args.hf_dir or "", "--grpo-steps", str(args.grpo_steps),
           "--grpo-hf-dir", args.grpo_hf_dir or "", "--checkpointing", args.checkpointing]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"TRL's {job} job failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


JOBS = ["tiny", "lora", "sft", "grpo"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", nargs="+", choices=JOBS, default=["tiny", "lora", "sft"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40, help="steps of the tiny job")
    ap.add_argument("--lora-steps", type=int, default=5, help="timed steps of the LoRA job")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--run", default="runs/tiny", help="the tiny job's starting run")
    ap.add_argument("--grpo-run", default="runs/arith_sft", help="the grpo job's starting run")
    ap.add_argument("--grpo-steps", type=int, default=6, help="steps of the grpo job")
    ap.add_argument("--checkpointing", choices=list(CHECKPOINTING), default="shipped",
                    help="activation checkpointing: each side's default, both off, or both on")
    ap.add_argument("--hf-dir", help=argparse.SUPPRESS)
    ap.add_argument("--grpo-hf-dir", help=argparse.SUPPRESS)
    ap.add_argument("--trl-job", choices=JOBS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global MODE
    MODE = args.checkpointing
    if args.trl_job:
        print(json.dumps({"tiny": trl_tiny, "lora": trl_lora, "sft": trl_sft, "grpo": trl_grpo}[args.trl_job](args)))
        return
    with tempfile.TemporaryDirectory() as hf:
        if "tiny" in args.jobs or "sft" in args.jobs:
            args.hf_dir = os.path.join(hf, "model")
            subprocess.run([BIN, "export", "--checkpoint", args.run, "--out", args.hf_dir], check=True,
                           capture_output=True, cwd=ROOT)
        if "grpo" in args.jobs:
            args.grpo_hf_dir = os.path.join(hf, "grpo")
            subprocess.run([BIN, "export", "--checkpoint", args.grpo_run, "--out", args.grpo_hf_dir], check=True,
                           capture_output=True, cwd=ROOT)
        results = {j: {"ours": [], "trl": []} for j in args.jobs}
        for r in range(args.rounds):
            for job in args.jobs:
                ours = {"tiny": ours_tiny, "lora": ours_lora, "sft": lambda a: ours_tiny(a, SFT_CONFIG),
                        "grpo": lambda a: ours_tiny(a, GRPO_CONFIG, a.grpo_run, a.grpo_steps)}[job]
                for side, fn in (("ours", ours),
                                 ("trl", lambda a, j=job: child(j, a))):
                    la = load()
                    res = fn(args)
                    results[job][side].append(res)
                    print(f"round {r + 1} {job:>4} {side:>4} (load {la:.2f}): step {res['step_s_median']:.3f} s "
                          f"median of {res.get('steps_timed', res.get('steps'))}, peak RSS "
                          f"{res['peak_rss_mb']:.0f} MB, "
                          f"last loss {res['loss_last']:.4f}", flush=True)
    print(f"\nsummary, --checkpointing {MODE} (TRL / ours: > 1 means qwen-burn is faster; RSS ours / TRL)")
    for job, sides in results.items():
        for r, (o, t) in enumerate(zip(sides["ours"], sides["trl"])):
            print(f"{job:>4} round {r + 1}: speed {t['step_s_median'] / o['step_s_median']:.2f}x, "
                  f"RSS {o['peak_rss_mb'] / t['peak_rss_mb']:.2f}")


if __name__ == "__main__":
    main()
