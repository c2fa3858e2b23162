#!/usr/bin/env bash
# compute-sanitizer (memcheck, then racecheck) over short GPU runs of every op's tests, on the H200.
# Usage: bash scripts/gpu_sanitize.sh [LOG_DIR]; prints each tool's summary ("ERROR SUMMARY: ...").
# SANITIZE_TIMEOUT (seconds, default 900) bounds each tool's run; SANITIZE_TESTS (space-separated
# test files) narrows it to the ops a change touched, SANITIZE_K (pytest -k) to some of their tests.
# The fuzz tests use the "sanitize" hypothesis profile (8 derandomised examples each; they include
# out-of-range indices and broken parent links, the cases a bad kernel would read or write beyond).
set -uo pipefail
log_dir=${1:-.}
export HYPOTHESIS_PROFILE=sanitize PYTHONUNBUFFERED=1
read -r -a tests <<< "${SANITIZE_TESTS:-tests/test_scatter.py tests/test_scatter_tree.py tests/test_verify.py}"
status=0
for tool in memcheck racecheck; do
  timeout "${SANITIZE_TIMEOUT:-900}" compute-sanitizer --tool "$tool" --target-processes all --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider -m gpu -k "${SANITIZE_K:-cuda and not model_sized}" "${tests[@]}" \
    > "$log_dir/sanitize-$tool.log" 2>&1 || status=1
  echo "== $tool"; grep -E "SUMMARY|passed|failed" "$log_dir/sanitize-$tool.log" | tail -3
done
exit $status
