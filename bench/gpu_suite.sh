#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one go, logs under OUTDIR:
#   bench/gpu_suite.sh OUTDIR [env] [tests] [bench] [memory] [sweep]   (default: all)
#   env     versions of the GPU, driver, torch, triton
#   tests   the GPU tests (compiled kernels vs the torch backend, snapshot, routing, nccl;
#           pytest-xdist runs them in parallel) and the parity check against the oracle
#   bench   bench/bench_triton.py -> reports/bench_triton_gpu.{md,json} (copied to OUTDIR)
#   memory  nsadiag memory --device cuda --ab-expandable-segments -> OUTDIR/memory-cuda
#   sweep   12 layers x 2048 tokens, bf16, gradient checkpointing -> OUTDIR/sweep-cuda
# Extra arguments for bench/bench_triton.py go in BENCH_ARGS.
set -uo pipefail
out=${1:?usage: bench/gpu_suite.sh OUTDIR [env] [tests] [bench] [memory] [sweep]}
shift
parts=${*:-env tests bench memory sweep}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
stamp() { echo "== $1 $(date +%T)"; }
for part in $parts; do
  stamp "$part"
  case $part in
    env)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
        --format=csv 2>&1 | tee "$out/env.txt"
      $py -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch',
torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__,
torch.cuda.get_device_name())" 2>&1 | tee -a "$out/env.txt" ;;
    tests)
      # every test marked gpu, then the oracle parity check of every backend (it also runs
      # on the CPU, so it carries no gpu mark); kernels compile in parallel workers
      timeout 420 $py -m pytest -q -p no:cacheprovider -n 6 -m gpu tests/ 2>&1 \
        | tee "$out/tests.log" | tail -25
      timeout 120 $py -m pytest -q -p no:cacheprovider tests/nsa/test_bench_triton.py \
        tests/nsadiag/cli/test_cli_env.py tests/nsadiag/checks/test_checks.py \
        -k "bench or env or triton_backend" 2>&1 \
        | tee -a "$out/tests.log" | tail -8 ;;
    bench)
      # shellcheck disable=SC2086
      timeout 540 $py bench/bench_triton.py ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.log" | tail -40
      cp reports/bench_triton_gpu.md reports/bench_triton_gpu.json "$out/" 2>/dev/null ;;
    memory)
      rm -rf "$out/memory-cuda"
      timeout 300 $py -m nsadiag.cli memory --device cuda --dtype bfloat16 --layers 12 \
        --seq-len 2048 --grad-ckpt --ab-expandable-segments --out "$out/memory-cuda" \
        2>&1 | tail -40 ;;
    sweep)
      rm -rf "$out/sweep-cuda"
      timeout 540 $py -m nsadiag.cli sweep-layers --device cuda --dtype bfloat16 --grad-ckpt \
        --layers 1-12 --seq-len 2048 --steps 3 --budget 120 --stall-timeout 60 \
        --out "$out/sweep-cuda" 2>&1 | tail -40 ;;
    *) echo "unknown part $part" ;;
  esac
done
