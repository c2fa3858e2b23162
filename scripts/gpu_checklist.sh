#!/usr/bin/env bash
# What is still to run on the H200, in phases that each fit one device call (<= 10 minutes).
# Usage (from the repo root, on the device): bash scripts/gpu_checklist.sh PHASE OUT_DIR
#   tests     install + every GPU test (pytest -m gpu), incl. the 10,000-replay and reduce-overhead tests
#   sanitize  compute-sanitizer memcheck + racecheck (scripts/gpu_sanitize.sh)
#   verify    the verify-kernel sweep and the tiles candidate (benchmarks/explore_verify_kernel.py)
#   scaling   commit time vs B and vs D, JSON + PNGs (bench_scatter.py, plot_scaling.py)
#   demo      python -m sgl_convwin demo --device cuda
set -uo pipefail
phase=${1:?phase}
out=${2:?output directory}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
case "$phase" in
  tests)    timeout 560 python3 -m pytest -q -p no:cacheprovider -m gpu --durations=10 tests > "$out/gpu_tests.log" 2>&1
            status=$?; tail -15 "$out/gpu_tests.log"; exit $status ;;
  sanitize) timeout 560 bash scripts/gpu_sanitize.sh "$out" ;;
  verify)   timeout 560 python3 benchmarks/explore_verify_kernel.py > "$out/explore_verify.log" 2>&1
            status=$?; tail -60 "$out/explore_verify.log"; exit $status ;;
  scaling)  timeout 500 python3 benchmarks/bench_scatter.py --batches 1 8 64 256 512 --drafts 2 4 8 16 \
              --json "$out/scaling.json" > "$out/bench_scaling.log" 2>&1
            status=$?
            python3 benchmarks/plot_scaling.py "$out/scaling.json" --out "$out" && tail -5 "$out/bench_scaling.log"
            exit $status ;;
  demo)     timeout 300 python3 -m sgl_convwin demo --device cuda --no-progress | tee "$out/demo_cuda.log" ;;
  *)        echo "unknown phase $phase"; exit 2 ;;
esac
