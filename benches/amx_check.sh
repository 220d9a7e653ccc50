#!/usr/bin/env bash
# bf16 on a CPU with AMX (issue 41), on a lent device machine's host CPU (an Intel Xeon with
# AMX-BF16 and AVX512-BF16, 16 cores; its PyTorch, transformers and PEFT are preinstalled). The
# jobs run at once (and the tests), each pinned to two cores of their own (one thread a core), each alternating
# its sides, so that the machine's other load and the neighbouring jobs hit both sides alike:
#   T: the kernels' bf16 tests (every path this CPU has)
#   A: one projection (f32, bf16 on AVX512-BF16, bf16 on AMX, bf16 with the weight packed once);
#      the AMX tile walks against each other (bf16_projection --amx-walks); the attention at f32
#      and bf16 (attention_kernel, where DIR holds it); LoRA 1.7B; `bench train` of bench-dense
#      at f32 and at mixed precision (AMX), three rounds
#   B, B2: LoRA on the Qwen3-1.7B shape against PEFT on a bf16 base (compare_pytorch.py), two
#      processes on pairs of their own, so that a short lease gets two or more rounds
#   C: bf16 prefill and decoding of the 0.6B shape against HF bf16 (compare_bf16.py generate)
#   D: mixed-precision training against torch.autocast (compare_bf16.py train)
#   P: the tests (T) first, then a perf profile of the LoRA 1.7B step, where DIR holds perf.tar.xz
#   G: where the machine has an NVIDIA GPU and DIR holds lib/libvulkan.so.1, the wgpu path on it
#      (benches/gpu_check.sh with the device wgpu alone; the binary built with the wgpu feature)
#   E: where DIR holds qwen-burn-base (an older build), this binary against it alternating:
#      LoRA 1.7B and bench-dense at mixed precision, two rounds
# Build here and carry DIR with qwen-burn, kernels-tests (the kernels crate's unit-test binary),
# bf16_projection and, optionally, attention_kernel (the examples), their debug sections stripped (`strip --strip-debug`: job P
# needs the symbols), each as NAME or NAME.xz.
# Usage: benches/amx_check.sh DIR OUT [SECONDS_PER_JOB]
set -uo pipefail
D=$1; OUT=$2; LIMIT=${3:-420}
mkdir -p "$OUT" /tmp/amx-bin
for f in qwen-burn kernels-tests bf16_projection attention_kernel qwen-burn-base; do
  [ -f "$D/$f" ] || [ -f "$D/$f.xz" ] || { { [ "$f" = qwen-burn-base ] || [ "$f" = attention_kernel ]; } && continue; }
  if [ -f "$D/$f" ]; then cp "$D/$f" /tmp/amx-bin/$f; else
    python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$D/$f.xz" /tmp/amx-bin/$f
  fi
  chmod +x /tmp/amx-bin/$f
done
B=/tmp/amx-bin/qwen-burn; export B
export QWEN_BURN_BIN=$B PYTHONUNBUFFERED=1
{
  lscpu
  echo "--- siblings"; cat /sys/devices/system/cpu/cpu*/topology/thread_siblings_list | sort -u | tr '\n' ' '; echo
  python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'capability', torch.backends.cpu.get_cpu_capability(), 'transformers', transformers.__version__, 'peft', peft.__version__)"
} > "$OUT/machine.txt" 2>&1
grep -E "Model name|^CPU\(s\)|Thread" "$OUT/machine.txt"; grep -o "amx[a-z0-9_]*\|avx512_bf16" "$OUT/machine.txt" | sort -u | tr '\n' ' '; echo; tail -n 1 "$OUT/machine.txt"
# One CPU of each physical core, then pairs of them.
mapfile -t CORES < <(for c in /sys/devices/system/cpu/cpu[0-9]*; do sed 's/[,-].*//' "$c/topology/thread_siblings_list"; done | sort -un)
pair() { echo "${CORES[$((2 * $1))]},${CORES[$((2 * $1 + 1))]}"; }
echo "pairs: $(pair 0) | $(pair 1) | $(pair 2) | $(pair 3)"
fig() { local l m; l=$(tail -n 1); m=$(grep -o '"bf16_kernel":"[a-z0-9]*"\|"tokens_per_sec":[0-9.]*\|"step_ms_median":[0-9.]*\|"peak_rss_mb":[0-9.]*\|"mfu":[0-9.]*\|"mfu_of_bf16_peak":[0-9.]*\|"bf16_peak_tflops":[0-9.]*' <<< "$l" | tr '\n' ' '); echo "${m:-$l}"; }
job_t() { /tmp/amx-bin/kernels-tests bf16 --nocapture 2>&1 | grep -E "bf16 products|cpuid|paths|test |result|panicked|off by"; }
job_a() {
  for r in 1; do
    for k in avx512bf16 amx; do
      echo "== projection round $r, $k"
      QWEN_BURN_BF16_KERNEL=$k /tmp/amx-bin/bf16_projection 512 2048x2048 2048x6144 6144x2048 2>&1
    done
  done
  echo "== AMX walks"
  /tmp/amx-bin/bf16_projection --amx-walks 512 2048x6144 6144x2048 2>&1
  if [ -x /tmp/amx-bin/attention_kernel ]; then
    for shape in "1 16 8 512 128" "8 8 4 256 32"; do
      echo "== attention $shape"
      /tmp/amx-bin/attention_kernel $shape 2>&1
    done
  fi
  echo -n "lora-1.7b kernel amx: "
  $B bench train --config configs/bench-lora-1.7b.toml --steps 2 --warmup 1 --json 2>&1 | fig
  for r in 1 2 3; do
    for s in f32:amx bf16:amx; do
      echo -n "bench-dense round $r precision ${s%%:*} kernel ${s##*:}: "
      QWEN_BURN_BF16_KERNEL=${s##*:} $B bench train --config configs/bench-dense.toml --steps 5 --warmup 2 --set "training.precision=\"${s%%:*}\"" --json 2>&1 | fig
    done
  done
}
# A profile of the LoRA step (perf's cpu-clock samples), where DIR holds perf.tar.xz: perf and
# the libraries it needs besides glibc's, from this machine (the lent machines have no perf).
job_p() {
  [ -f "$D/perf.tar.xz" ] || { echo "no perf.tar.xz: no profile"; return 0; }
  mkdir -p /tmp/perfb && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$D/perf.tar.xz" /tmp/perfb
  echo -n "lora-1.7b under perf: "
  LD_LIBRARY_PATH=/tmp/perfb/lib /tmp/perfb/perf record -q -e cpu-clock -F 499 -o /tmp/perf.data -- $B bench train --config configs/bench-lora-1.7b.toml --steps 2 --warmup 1 --json 2>&1 | fig
  LD_LIBRARY_PATH=/tmp/perfb/lib /tmp/perfb/perf report -i /tmp/perf.data --stdio --sort symbol --percent-limit 0.4 2>&1 | grep -v "^#" | grep -v "^$" | cut -c1-150 | head -60
}
job_e() {
  [ -x /tmp/amx-bin/qwen-burn-base ] || { echo "no qwen-burn-base: no comparison"; return 0; }
  for r in 1 2; do
    for b in qwen-burn-base qwen-burn; do
      echo -n "round $r $b lora-1.7b: "
      /tmp/amx-bin/$b bench train --config configs/bench-lora-1.7b.toml --steps 2 --warmup 1 --json 2>&1 | fig
      echo -n "round $r $b bench-dense bf16: "
      /tmp/amx-bin/$b bench train --config configs/bench-dense.toml --steps 5 --warmup 2 --set 'training.precision="bf16"' --json 2>&1 | fig
    done
  done
}
job_b() { python3 benches/compare_pytorch.py --suite real --shapes 1.7b --no-torch-f32 --rounds 2 --steps 2 --warmup 1 --threads 2; }
job_b2() { python3 benches/compare_pytorch.py --suite real --shapes 1.7b --no-torch-f32 --rounds 1 --steps 2 --warmup 1 --threads 2; }
job_tp() { job_t; job_p; }
job_g() {
  command -v nvidia-smi > /dev/null && [ -f "$D/lib/libvulkan.so.1" ] || { echo "no GPU or no carried Vulkan loader: no wgpu check"; return 0; }
  mkdir -p /tmp/amx-bin/lib && cp "$D/lib/libvulkan.so.1" /tmp/amx-bin/lib/
  bash benches/gpu_check.sh /tmp/amx-bin/qwen-burn /nonexistent /tmp/gpu-out wgpu
}
job_c() { python3 benches/compare_bf16.py --jobs generate --rounds 2 --threads 2; }
job_d() { python3 benches/compare_bf16.py --jobs train --rounds 2 --threads 2; }
T0=$(date +%s)
i=0
export D
for j in a b b2 c d tp g e; do
  ( export -f job_$j job_t job_p fig; timeout "$LIMIT" taskset -c "$(pair $i)" bash -c "job_$j" > "$OUT/job_$j.log" 2>&1; echo "job $j exit $? after $(( $(date +%s) - T0 )) s" >> "$OUT/job_$j.log" ) &
  i=$((i + 1))
done
wait
for j in tp a b b2 c d g e; do echo "===== job $j"; cat "$OUT/job_$j.log"; done
