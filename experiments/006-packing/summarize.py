"""Summarise experiment 006 (see run.sh): a Markdown table on stdout, and JSONL tables of the
validation curves for `qwen-burn plot --table`."""

import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])


def records(run):
    with open(out / run / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def val(run):
    return [(r["step"], r["loss"]) for r in records(run) if r.get("split") == "val"]


def tokens_per_sec(run):
    xs = [r["tokens_per_sec"] for r in records(run) if r.get("split") == "train" and r.get("tokens_per_sec")]
    return statistics.median(xs[1:] or xs)


def padding_share(path):
    real = total = 0
    with open(path) as f:
        for line in f:
            b = json.loads(line)
            for row in b["attention_mask"]:
                real += sum(row)
                total += len(row)
    return 1 - real / total


print("## SFT (configs/finetune.toml, LoRA on the tiny base model, 150 steps)\n")
print("Validation loss on each variant's own validation rows (step 0 and final), the final")
print("adapters scored one conversation a row, median training tokens/s, padding share.\n")
print("| variant | seed | val step 0 | val final (own rows) | val final, one conversation a row | tokens/s |")
print("|---|---|---|---|---|---|")
curves = []
for v in ["masked", "leaky", "padded"]:
    for seed in [7, 8]:
        run = f"sft_{v}_seed{seed}"
        if not (out / run).exists():
            continue
        curve = val(run)
        own0, own = curve[0][1], curve[-1][1]
        alone = val(f"eval_{v}_seed{seed}")[0][1]
        print(f"| {v} | {seed} | {own0:.6f} | {own:.4f} | {alone:.4f} | {tokens_per_sec(run):.0f} |")
        curves += [{"run": f"{v} seed {seed}", "step": s, "loss": l} for s, l in curve]
with open(out / "sft_val.jsonl", "w") as f:
    f.writelines(json.dumps(c) + "\n" for c in curves)
print()
for v in ["masked", "padded"]:
    p = out / f"batches_{v}.jsonl"
    if p.exists():
        print(f"- padding share of the {'packed' if v == 'masked' else 'one-conversation'} rows over 150 steps: {padding_share(p):.1%}")
print()
m0 = val("sft_masked_seed7")[0][1]
p0 = val("sft_padded_seed7")[0][1]
l0 = val("sft_leaky_seed7")[0][1]
print(f"- step-0 validation, packed + masked vs one conversation a row: {m0:.7f} vs {p0:.7f}, relative difference {abs(m0 - p0) / p0:.2e}")
print(f"- step-0 validation, packed without the mask vs one conversation a row: {l0:.7f} vs {p0:.7f}, relative difference {abs(l0 - p0) / p0:.2e}")
print()
print("## Text pretraining (configs/tiny.toml, 500 steps)\n")
print("| data.document_mask | seed | val step 0 | val final | best val | tokens/s |")
print("|---|---|---|---|---|---|")
curves = []
for mask in ["true", "false"]:
    for seed in [1337, 2]:
        run = f"text_mask_{mask}_seed{seed}"
        if not (out / run).exists():
            continue
        curve = val(run)
        print(f"| {mask} | {seed} | {curve[0][1]:.4f} | {curve[-1][1]:.4f} | {min(l for _, l in curve):.4f} | {tokens_per_sec(run):.0f} |")
        curves += [{"run": f"mask={mask} seed {seed}", "step": s, "loss": l} for s, l in curve]
with open(out / "text_val.jsonl", "w") as f:
    f.writelines(json.dumps(c) + "\n" for c in curves)
