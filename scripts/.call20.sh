export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
git log --oneline -1 2>/dev/null
bash scripts/gpu_checklist.sh $OUT tests rsan
echo "== done $(date -u +%T)"
