export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
echo "== mamba2 tma $(date -u +%T)"
timeout 60 python3 benchmarks/explore/replay_sweep.py --mixer mamba2 --batches 64 256 --configs 32/1 --tma on off > $OUT/replay_tma_mamba2.log 2>&1; echo rc=$?
timeout 40 python3 benchmarks/explore/replay_sweep.py --mixer mamba2 --tree --batches 256 --configs 32/1 --tma on off >> $OUT/replay_tma_mamba2.log 2>&1; echo rc=$?
grep -v "^$" $OUT/replay_tma_mamba2.log
echo "== verify sweep $(date -u +%T)"
timeout 250 python3 benchmarks/explore/verify_sweep.py --nodes 4 8 > $OUT/verify_sweep_preload.log 2>&1; echo rc=$?
grep -E "preload|default" $OUT/verify_sweep_preload.log | head -80
echo "== rbench mamba2 $(date -u +%T)"
timeout 200 python3 benchmarks/bench_commit.py --mixer mamba2 --batches 1 8 64 256 --json $OUT/bench_commit_mamba2.json > $OUT/bench_commit_mamba2.log 2>&1; echo rc=$?
grep '^|' $OUT/bench_commit_mamba2.log | head -30
echo "== done $(date -u +%T)"
