export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
echo "== tests $(date -u +%T)"
P="python3 -m pytest -q -p no:cacheprovider -m gpu --durations=3"
timeout 170 $P tests/test_verify.py > $OUT/gpu_tests_verify.log 2>&1 &
timeout 170 $P tests/test_replay_commit.py -k "load_choice or descriptor" tests/test_cudagraph.py > $OUT/gpu_tests_replay_choice.log 2>&1 &
wait
for f in gpu_tests_verify gpu_tests_replay_choice; do grep -E "passed|failed|FAILED|Error" $OUT/$f.log | tail -6; done
echo "== gdn tree tma $(date -u +%T)"
timeout 70 python3 benchmarks/explore/replay_sweep.py --tree --batches 64 256 --configs 64/2 --tma on off > $OUT/replay_tma_gdn_tree.log 2>&1; echo rc=$?
grep -v "^$" $OUT/replay_tma_gdn_tree.log
echo "== step $(date -u +%T)"
timeout 170 python3 benchmarks/bench_verify.py --drafts chain tree3 > $OUT/bench_verify.log 2>&1; echo rc=$?
grep -E '^(\||verify:|engine|checks and tables)' $OUT/bench_verify.log | head -70
echo "== rbench gdn chain $(date -u +%T)"
timeout 150 python3 benchmarks/bench_commit.py --mixer gdn --modes chain --batches 1 8 64 256 --json $OUT/bench_commit_gdn_chain.json > $OUT/bench_commit_gdn_chain.log 2>&1; echo rc=$?
grep '^|' $OUT/bench_commit_gdn_chain.log | head -30
echo "== done $(date -u +%T)"
