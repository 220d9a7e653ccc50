#!/usr/bin/env bash
# The wgpu path on a lent GPU machine, beside flex on the same machine's CPU cores: the device
# check behind benches/README.md's "GPU (wgpu)" section. Build here with
#   cargo build --release --features qwen-burn/wgpu && strip -o BIN target/release/qwen-burn
# and carry BIN (xz-compressed as BIN.xz when it is too large to carry), the Vulkan loader
# (libvulkan.so.1, in BIN's folder's lib/: the lent machines have none), a model directory
# exported from the arithmetic SFT run (`qwen-burn export --checkpoint RUN --out DIR`) and this
# repository. Usage: benches/gpu_check.sh BIN SFT_DIR OUT [DEVICES]  (default "wgpu flex")
set -uo pipefail
B=$1; SFT=$2; OUT=$3; DEVICES=${4:-wgpu flex}
mkdir -p "$OUT"
[ -x "$B" ] || python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]+'.xz'), open(sys.argv[1],'wb'))" "$B"
chmod +x "$B"
T0=$(date +%s)
ph() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
ph machine
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
lscpu | grep -E "Model name|^CPU\(s\)"
# Headless NVIDIA containers ship an ICD that names libGLX_nvidia.so.0, whose Vulkan entry points
# fail without a display ("Could not get 'vkCreateInstance'"); the EGL library serves Vulkan.
egl=$(ldconfig -p | grep -o '/[^ ]*libEGL_nvidia.so.0' | head -n 1)
if ! ldconfig -p | grep -q libvulkan.so.1; then
  export LD_LIBRARY_PATH=$(cd "$(dirname "$B")" && pwd)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if [ -n "$egl" ]; then
  printf '{"file_format_version":"1.0.1","ICD":{"library_path":"%s","api_version":"1.3.0"}}' "$egl" > "$OUT/egl_icd.json"
  export VK_DRIVER_FILES=$OUT/egl_icd.json VK_ICD_FILENAMES=$OUT/egl_icd.json
fi
# The command's JSON on one line, the figures that matter.
fig() { tail -n 1 | grep -o '"step_ms_median":[0-9.]*\|"tokens_per_sec":[0-9.]*\|"prompt_tokens_per_sec":[0-9.]*\|"mfu":[0-9.]*\|"peak_rss_mb":[0-9.]*\|"peak_tflops":[0-9.]*' | tr '\n' ' '; echo; }
for d in $DEVICES; do
  ph "peak $d"; timeout 60 "$B" bench peak --device $d --n $([ $d = flex ] && echo 2048 || echo 8192) --repeats 5 --json 2>&1 | tr -d '\n ' | fig
done
for c in bench-dense bench-moe bench-dense-4096 bench-lora-0.6b; do
  for d in $DEVICES; do
    ph "$c $d"; timeout 90 "$B" bench train --config configs/$c.toml --device $d --steps 5 --warmup 2 --json 2>&1 | fig
  done
done
for d in $DEVICES; do
  ph "generate 0.6B $d"; timeout 60 "$B" bench generate --config configs/qwen3-0.6b.toml --device $d --repeats 2 --json 2>&1 | tr -d '\n ' | fig
  ph "tiny 100 steps $d"; timeout 90 "$B" train --config configs/tiny.toml --device $d --set training.max_steps=100 --set checkpoint.interval=100 --run-dir "$OUT/tiny-$d" > "$OUT/tiny-$d.log" 2>&1; tail -n 1 "$OUT/tiny-$d.log"
  ph "grpo 3 steps $d"; timeout 90 "$B" train --config configs/grpo.toml --device $d --set training.max_steps=3 --set training.eval_interval=0 --set checkpoint.interval=3 --set "model.from=\"$SFT\"" --run-dir "$OUT/grpo-$d" > "$OUT/grpo-$d.log" 2>&1; tail -n 1 "$OUT/grpo-$d.log"
done
rm -rf "$OUT"/*/checkpoints
ph done
