#!/usr/bin/env bash
# The GPU check, as one command, for a machine with a CUDA GPU where torch
# (a CUDA build) and triton are already installed; it installs nothing.
#
#   bash benchmarks/device_check.sh OUTDIR
#
# 0. compiles every Triton kernel for the device's own architecture with
#    `fastnorm kernels --target sm_XY` (registers, spills, load widths, FP64 per
#    element) and, on sm_90, compares it with the table committed before any
#    GPU run (benchmarks/results/gpu/kernels_sm_90.txt; the prediction it feeds
#    is benchmarks/results/gpu/prediction.md);
# 1. builds the C++ extension in place (CPU tensors; optional: on failure the
#    torch backend serves them);
# 2. runs the CUDA tests (tests/test_cuda.py and the monitor's: against the
#    float64 oracle, no host sync under set_sync_debug_mode("error"), launch
#    counts from torch.profiler, > 2^31 elements, CUDA graph capture and replay,
#    torch.compile; the per-tensor statistics against the CPU's, the locator with
#    no host read under set_sync_debug_mode("error"));
# 3. runs `fastnorm bench --device cuda`: GPT-2 small, ResNet-50, LLaMA-2 7B
#    shapes, many small and tiny tensors (fp32, bf16), and the host cost per call
#    at 150, 2000 and 10000 tensors, against torch and apex (when installed);
#    torch's fused AdamW step on GPT-2 small and LLaMA-2 7B (bf16; its fp32 step
#    does not fit), clipping by clip_ first or through the step (StepClipper);
#    then torch.compile of torch's clip on GPT-2 small only (compiling is slow).
# What comes back fits the device tool's 8 files: env.txt (with the build log
# and the kernels' table),
# cuda_tests.log, bench.log, bench/cuda.{json,md,png}, compile.log,
# compile/cuda.json. Budget: under 8 minutes on an H200.
set -uo pipefail
out="${1:?usage: bash benchmarks/device_check.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

# Every path and name used below must exist, or the check stops here, before the device time is spent.
for path in tests/test_cuda.py tests/test_monitor.py tests/test_locate.py tests/test_stats.py; do
  [ -f "$path" ] || { echo "missing $path"; exit 2; }
done
python3 -c "import torch, triton, fastnorm.stats, fastnorm.locate" || { echo "an import failed"; exit 2; }

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__); print(torch.cuda.get_device_name())"
  git rev-parse HEAD 2>/dev/null
  arch=$(python3 -c "import torch; print('sm_%d%d' % torch.cuda.get_device_capability())")
  echo "== fastnorm kernels --target $arch"
  jobs=$(nproc); [ "$jobs" -gt 8 ] && jobs=8
  timeout 120 python3 -m fastnorm kernels --target "$arch" --jobs "$jobs" > "$out/kernels.txt" || status=1
  cat "$out/kernels.txt"
  committed="benchmarks/results/gpu/kernels_$arch.txt"
  if [ -f "$committed" ]; then
    if diff -q "$committed" "$out/kernels.txt" > /dev/null; then
      echo "== same as $committed (compiled without a GPU)"
    else
      echo "== differs from $committed (compiled without a GPU):"
      diff "$committed" "$out/kernels.txt"
    fi
  fi
  rm -f "$out/kernels.txt"
  echo "== build"
  python3 setup.py build_ext --inplace 2>&1 | tail -5 || echo "C++ extension did not build: CPU tensors use the torch backend"
} > "$out/env.txt" 2>&1
head -6 "$out/env.txt"
grep "^== same as\|^== differs" "$out/env.txt"

echo "== CUDA tests"
timeout 240 python3 -m pytest tests/test_cuda.py tests/test_monitor.py -m cuda -q -p no:cacheprovider -rA \
  > "$out/cuda_tests.log" 2>&1 || status=1
tail -5 "$out/cuda_tests.log"

echo "== fastnorm bench --device cuda"
timeout 330 python3 -m fastnorm bench --device cuda --repeats 10 --warmup 2 --dtypes fp32,bf16 \
  --workloads gpt2-small,resnet50,llama-7b,many-small,tiny,tiny-150,tiny-10000,step-gpt2-small,step-llama-7b \
  --contenders fastnorm,torch,loop,roofline,apex,adamw --out "$out/bench" > "$out/bench.log" 2>&1 || status=1
rm -f "$out/bench/results.csv"
tail -45 "$out/bench.log"

echo "== with torch.compile (GPT-2 small)"
timeout 120 python3 -m fastnorm bench --device cuda --repeats 10 --warmup 2 --dtypes bf16 \
  --workloads gpt2-small --no-plot --out "$out/compile" > "$out/compile.log" 2>&1 || status=1
rm -f "$out/compile/results.csv" "$out/compile/cuda.md"
tail -15 "$out/compile.log"
exit $status
