"""Markdown table of experiment 011's results.jsonl (one line per model: eval --generate on the
500 held-out prompts). Usage: python3 table.py results.jsonl"""
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| model | greedy accuracy | pass@1 | pass@2 | pass@4 | pass@8 | mean length |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['run']} | {r['accuracy']:.3f} | {r['pass@1']:.3f} | {r['pass@2']:.3f} | "
          f"{r['pass@4']:.3f} | {r['pass@8']:.3f} | {r['mean_length']:.1f} |")
