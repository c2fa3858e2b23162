#!/usr/bin/env bash
# What is still to run on the H200, in phases; several phases may share one device call (keep the
# sum under the call's 10 minutes).
# Usage (from the repo root, on the device): bash scripts/gpu_checklist.sh OUT_DIR PHASE [PHASE ...]
#   tests     every GPU test (pytest -m gpu: under xdist 14 processes, else three concurrent groups; 521 s of
#             its 540 on an H100: tests1 and tests2 split it over two calls)
#   sanitize  compute-sanitizer memcheck + racecheck (scripts/gpu_sanitize.sh)
#   scaling   commit time vs B and vs D, JSON + PNGs (bench_scatter.py, plot_scaling.py)
#   demo      python -m sgl_convwin demo --device cuda
#   step      verify per layer and per step (36 layers + commit) against the engine baselines, chain and
#             topk-3 tree (benchmarks/bench_verify.py)
#   vtests    the GPU tests of the verify kernels only
#   fp32      the commit table with float32 caches (bench_scatter.py --dtypes fp32)
#   commit    the commit table (bench_scatter.py, Qwen3-Next TP1, D = 4, bf16) with the tree commit
#   tree      the tree commit against the dense fallback, three shapes, B = 1 .. 256, with its launch choices
#             swept (channels per program / warps, parent links preloaded or walked link by link)
#   tsan      compute-sanitizer memcheck + racecheck over test_scatter_tree.py's CUDA tests (its lane-row stores go
#             through shared memory)
#   shapes    the commit table at the Qwen3-Next TP4 and Nemotron-H shapes, B = 1 .. 256
#   eager     host time per eager call of every op against a raw launch (benchmarks/bench_scatter.py --eager-only)
#   replay    the replay commits' GPU tests (gdn_commit, mamba2_commit: oracle, fuzz, CUDA graphs, opcheck, cache)
#   rsan      compute-sanitizer memcheck + racecheck over the replay commits' CUDA tests
#   rbench    bench_commit.py: gdn_commit and mamba2_commit against snapshot-copy and input-replay commits
#   smem      the shared-memory replay kernels' users: test_replay_commit.py whole, then the CUDA-graph,
#             opcheck, compile and cache tests of the replay commits (cold compiles: about 190 s + 120 s)
#   runs      the verify run store (channel_major rows, dense windows under a conv): its GPU tests, then
#             memcheck and racecheck over them
#   ring      the ring's kernels (never run on a GPU before): their GPU tests, then memcheck and racecheck
#             over the call-by-call ones; then gdn_verify's GPU tests (its two kernels)
#   ringbench the ring against the eager step (benchmarks/bench_ring.py): step, fold and verify-only times, traffic model
#   ringnext  the rings' kernels called directly (gdn_ring_verify's mma and Triton kernels, the Mamba2 ring's):
#             their GPU tests, memcheck + racecheck, then the GDN verify's one-layer sweep (the default; the
#             fold launch on 8 warps; every launch on 8 warps)
#   m2ringbench  the Mamba2 ring against mamba2_verify + mamba2_commit (bench_ring.py --mixer mamba2), then its
#             launches' one-layer sweep (BLOCK_P / warps / heads a program / stages / precisions / fold warps / cap)
#   gvsan     compute-sanitizer memcheck + racecheck over gdn_verify's GPU tests of launch choices, skipped rows,
#             odd sizes, views and model shapes (both CUDA kernels)
#   m2verify  mamba2_verify's GPU tests (never run on a GPU before), then memcheck and racecheck over them
#   transposed  pools stored [.., dv, dk] (engines' layout): gdn_verify's and the ring kernels' GPU tests of them,
#             gdn_verify's sweep over them (fp32 both forms, bf16); then the small batches' sweep (B = 2 .. 8, each kernel)
#   ringT     the ring kernels' pdl tests; the GDN ring (chains, B = 64 / 256): contiguous, transposed checkpoints,
#             RING_MMA_PDL=1; memcheck + racecheck over some transposed pools' and the pdl tests
#   spread    gdn_verify's mma kernel on 64-column tiles where 128-column ones leave fewer than MMA_MIN_PROGRAMS
#             programs (MMA_SPREAD_BLOCK_V, off until this runs): its GPU tests, then the sweep at B = 2 / 3
#   masks     gdn_verify's mma kernel given each tree node's path mask instead of its link (tree_masks: checked, not
#             walked; 5.8% fewer instructions a bf16 tree program offline): its GPU tests, then trees with and
#             without at B = 8 / 64 / 256, fp32 and bf16 (chains skip the entry)
#   ringconv  ring_conv1d_verify's tiles (channels per program / warps; 64 / 1 its default) at
#             B = 8 .. 256
#   shallow   gdn_verify's trees: the Triton kernel's walk by pointer jumping (doubling), either kernel's inverse as
#             one block where no root path is over 4 nodes (shallow), both the defaults: the GPU tests of
#             test_gdn_verify.py and test_mamba2_verify.py (its Triton kernel shares the walk), then trees each way
#             (each option off) against the default, B = 1 / 2 / 8 (the Triton kernel's beside the mma kernel's), 64 / 256
#   chunk16   gdn_verify's mma kernel at chunks of 16 rows (the float32 default since a53206b, its GPU tests never run):
#             test_gdn_verify.py's GPU tests; 32 rows, 64-column tiles at 16, the stacked products at 16 / 32, the
#             small inputs loaded where used (early_loads 0) or only the gates early (1) against the default (v too;
#             B = 64 / 256)
#   bf16chunks  bf16 pools' chunks of 32 / 16 rows against their 64 (stacked; effective queries), B = 64 / 256
#   early     gdn_verify's small inputs loaded early (1 for chains, 0 for trees since the chunk16 run): its GPU tests
#             (launch choices, tree walks, the model's shape), early_loads 0 / 1 / 2 against it (B = 64 / 256), then
#             gvbench's fp32 tables (bench_gdn_verify.py)
#   gvncu     test_gdn_verify.py's GPU tests, then Nsight Compute over one gdn_verify layer at B = 64, chain and tree,
#             bf16 and fp32 pools (bench_gdn_verify.py --ncu): details and per-instruction stall samples as CSV
#             (by source line here: python scripts/ncu_lines.py OUT/ncu_gv_bf16_sass.csv gdn_verify_bf16_tree)
#   h200      gdn_verify's prefetch (none, 16, 32 rows), value runs (off), pdl 2 and v's rows prefetched
#             (prefetch_values) against the defaults, fp32 and bf16 pools (B = 64 / 256; bf16 also its native
#             products, chunks of 64 / 32 rows), about 5 minutes
#   vruns     gdn_verify's v loads and out stores in 16-byte runs (value_runs, the default since 2026-12-07, timed on
#             contiguous pools then: docs/benchmarks.md): its bit-for-bit tests, memcheck + racecheck over its
#             launch-choice tests, then the sweep against an element an access on fp32 pools stored transposed
#   chunkT    gdn_verify on pools stored transposed at the chunks of a column's whole line (fp32: 32 rows, the
#             default since 2026-12-07): their GPU tests, memcheck + racecheck over them, the sweep against 16 rows
#   depth     trees folding by their depth (tree_depth): the ring's GPU tests of it (and the random steps, CUDA
#             graphs, opcheck, due folds), then tree steps told and not told, both mixers, GDN chains beside (B = 64 /
#             256)
#   ring16    the GDN ring's chain steps at RING_MMA_CHUNK_K=16 against its default
#   foldtile  the GDN due flush's fold programs on 64 / 32 columns with their whole [dk, columns] tile staged in
#             shared memory (no second read of it), against the default (128 columns, its rows read again)
#   commitT   gdn_commit on pools stored [.., dv, dk] (the engines' layout) against contiguous ones, chains and trees
#   gvbench   gdn_verify against FLA, a snapshot stand-in and the read floor, chains and trees, B = 1 .. 256, with the
#             whole-step table (benchmarks/bench_gdn_verify.py; needs fla-core from .whl), then bf16 states at B = 64 / 256
#   pdl       the verifies launched as programmatic dependents (gdn_verify's pdl 1 / 2, mamba2_verify's pdl; never
#             run on a GPU): their GPU tests (two layers chained through out, eager and graphed), then gdn_verify's
#             sweep against the default, the state chunks through shared memory and the persistent kernel (fp32,
#             bf16), then mamba2_verify with pdl; each table beside a plain read of the pools, a launch a layer
#   qeff      gdn_verify's effective queries (both kernels' default for float32 states; the Triton kernel's never run
#             on a GPU): its GPU tests, scripts/gdn_verify_precision.py, then each kernel with and without them
#             (bench_gdn_verify.py --sweep, B = 1 .. 256), and the mma kernel's both forms on pools stored
#             transposed (the engines' layout; never timed: the staged chunks by one-element cp.async)
#   floor     the log decays' floor (LOG_DECAY_FLOOR, every chunked kernel; never run on a GPU): the strong-decay
#             tests of the verifies and both rings (ops and kernels); floorsan: memcheck + racecheck over the verifies' ones
#   treewalk  the tree walks on registers (2632c4d; run 2026-12-04, docs/benchmarks.md): the GPU tests of
#             test_gdn_verify.py, test_ring_kernels*.py, test_ring.py, test_mamba2_verify.py, then trees against chains
#             (bench_gdn_verify.py, B = 1 .. 256, no step table) and the GDN ring's trees (bench_ring.py)
#   m2bench   mamba2_verify against an engine-style selective-state-update stand-in, chains and trees of 8,
#             B = 1 .. 256, Nemotron-H-8B TP1 (benchmarks/bench_mamba2_verify.py), with issue #40's targets
#   gvprefetch  gdn_verify's v rows prefetched into L2 at a program's start (prefetch_values, off): its GPU tests
#             (bit for bit against none) and the launch plans', memcheck + racecheck over them (the sweep: h200);
#             the GDN ring's drafts' v alike (RING_MMA_PREFETCH_VALUES, off): its tests, then chain steps with it
#   m2prefetch  mamba2_verify's small inputs prefetched into L2 at a program's start (prefetch_inputs) and four heads
#             a program, their loops flattened (heads_per_program, flatten, at 96 registers): the GPU tests (bit for bit
#             against the defaults), memcheck + racecheck over them, then the bench (B = 64 / 256) with each, with
#             pdl, against the defaults (on an H200: its B = 64 gap to an H100 is the question), about 7 minutes
#   m2tune    mamba2_verify's launcher choices around its defaults (narrower tiles, 8 warps, chunk depths; each
#             checked against the oracle first), B = 64 / 256, chains and trees
#   ringfold  the rings' fold and verify launches where a step has few rows to fold (the sweeps' last column: 1 row in
#             6 folding) against each of their defaults turned off (the fold's register cap, the folded windows moved
#             by the verify launch, the GDN ring's two verify launches as one), after those options' GPU tests
#   varquick  in one call: the GDN ring's state-read kernel tests at dk = dv = 128 (stages, registers), the Mamba2
#             ring's flattened loops and capacity-16 chains, then whole GDN steps with the state through registers
#   vartests  the variants' GPU tests in one run (the GDN ring's state_stages, chunk_k, registers, 64-column tiles
#             (RING_MMA_SPREAD's), 8 warps, its other launches in CUDA graphs; gdn_verify's state_stages; the Mamba2
#             ring's flatten, fold_verify and pdl), then the capture ops in one CUDA graph and every op's device guard
#   varbench  the same variants timed in one process each: the GDN ring's one-layer sweep at B = 64 / 256 and its
#             tiles at B = 1 / 8 (whole steps too), the Mamba2 ring's sweep, gdn_verify's sweep (fp32, bf16)
#   varsan    compute-sanitizer memcheck + racecheck over the variants' memory paths (the GDN ring's state chunks by
#             cp.async and through registers, at fp32 and dk / dv 128; the Mamba2 ring's fold_verify)
#   varsteps  whole GDN ring steps (bench_ring.py --profile, chains, B = 64 / 256) with each set of variants' module
#             defaults (--constants) against the defaults; m2varsteps the same for the Mamba2 ring
#   stackparts the GDN ring's stack staged in up to 4 blocks of rows, the first the fewest that hold the pending
#             tokens (RING_MMA_STACK_PARTS=4, never run on a GPU; a tree's rows on the stack of 32: 13% fewer
#             instructions offline, chains unchanged): its GPU tests (against the PyTorch code, bit for bit against 2),
#             then tree steps (B = 64 / 256, --profile) each way, twice, alternating; chain steps each way once
#   ringncu   Nsight Compute over one layer of each ring (GDN, then Mamba2) at B = 64, 1 row in 6 folding (the fold
#             launch and the verify launch, bench_ring.py --ncu mixed), then the GDN ring with every row folding (--ncu
#             fold): the details page and the SASS page's per-instruction stall samples as CSV, the reports beside them
#             (by source line here: python scripts/ncu_lines.py OUT/ncu_ring_mixed_gdn_sass.csv gdn_ring --kind 3)
#   due       each step's folds first, every layer in one launch (gdn_ring_flush / mamba2_ring_flush(..., num_draft=N);
#             run 2026-12-05, docs/benchmarks.md): their GPU tests (bit for bit against the verifies' folds; random
#             sequences; the verify's after_due_flush hint), then whole chain steps with and without (bench_ring.py
#             --profile [--no-due-first]), both mixers, B = 1 .. 256, then the GDN flush's tiles a fold program walks
#             (bench_ring.py --flush-sweep; run again 2026-12-05 with fold_tiles: 1.2x slower, docs/benchmarks.md)
#   plans     the ring ops' eager plans (_common.planned_calls): test_eager_signatures.py's GPU
#             tests (planned = unplanned, the binder skipped after a first call), then the ring's GPU tests through them
#   ringprof  where each ring step's time goes, both mixers, B = 1 .. 256 (bench_ring.py --profile: each kernel's
#             time per step, a kernel launched several times a layer split by its launch)
#   persist   gdn_verify's mma kernel persistent (never run on a GPU): its GPU tests, then the sweep of at most 6 .. 9
#             programs an SM (registers capped to fit) against the default at B = 64 / 128 / 256, fp32 and bf16
#             states (a program a tile leaves 2048 tiles 1.72 waves of 9 an SM at B = 64)
# Before a call that runs a changed kernel: `python scripts/offline_sass.py gdn_ring_test_shapes --batch 4` (and
# mamba2_ring_test_shapes) under Triton 3.6 (a venv here) compiles every launch at the tests' shapes, without a GPU.
# The replay phases need fla-core and einops for the FLA rows: carry .whl and install it first.
# With pytest-xdist's and execnet's wheels in .whl (pip download pytest-xdist execnet --no-deps -d .whl),
# vtests and runs spread their tests over 12 processes: the kernels' compiles are what take the time.
set -uo pipefail
out=${1:?output directory}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
if ls .whl/pytest_xdist-*.whl .whl/execnet-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-deps .whl/pytest_xdist-*.whl .whl/execnet-*.whl >> "$out/install.log" 2>&1
fi
xdist=""
python3 -c "import xdist" 2> /dev/null && xdist="-n 12"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
gdn_steps() {  # whole GDN ring steps (chains, or STEP_DRAFTS; B = 64 / 256, --profile), one process per set of
  # module constants
  local rc=0 constants drafts=${STEP_DRAFTS:-chain}
  for constants in "$@"; do
    echo "# gdn $drafts ${constants:-defaults}"
    timeout 100 python3 benchmarks/bench_ring.py --batches 64 256 --drafts $drafts --profile \
      ${constants:+--constants $constants} > "$out/varsteps.log" 2>&1 || rc=1
    grep -E '^(chain|tree|\| _gdn)' "$out/varsteps.log"; cat "$out/varsteps.log" >> "$out/varsteps_all.log"
  done
  return $rc
}

tests_sanitized() {  # tests_sanitized NAME FILE TEST_K SANITIZE_K: a test file's GPU tests -k TEST_K (150 s), then
  # memcheck + racecheck over its tests -k SANITIZE_K (120 s each), logs under $out/NAME*
  local name=$1 file=$2 rc=0
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist "$file" -k "$3" > "$out/gpu_tests_$name.log" 2>&1 \
    || rc=1
  tail -2 "$out/gpu_tests_$name.log"
  mkdir -p "$out/${name}san"
  SANITIZE_TIMEOUT=120 SANITIZE_TESTS="$file" SANITIZE_K="$4" bash scripts/gpu_sanitize.sh "$out/${name}san" || rc=1
  return $rc
}

ncu_report() {  # ncu_report NAME LIMIT ARGS...: Nsight Compute (--set full) over the profiled range of ARGS (a command
  # and ncu's own options before it), the report's details and per-instruction SASS pages as CSV, a summary of them
  local name=$1 limit=$2 rc=0
  shift 2
  timeout "$limit" ncu --clock-control none --profile-from-start off --set full --import-source yes -f \
    -o "$out/$name" "$@" > "$out/ncu_$name.log" 2>&1 || rc=1
  tail -3 "$out/ncu_$name.log"
  ncu -i "$out/$name.ncu-rep" --page details --csv > "$out/ncu_${name}_details.csv" 2>&1 || rc=1
  ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass > "$out/ncu_${name}_sass.csv" 2>&1 || rc=1
  grep -E '"(Duration|Registers Per Thread|Achieved Occupancy|DRAM Throughput|Issue Slots Busy|Memory Throughput)"' \
    "$out/ncu_${name}_details.csv" | cut -c1-200
  return $rc
}

status=0
for phase in "$@"; do
  echo "== $phase ($(date -u +%H:%M:%S))"
  case "$phase" in
    tests1|tests2) rc=0  # the whole suite in two calls (tests1: the rings, replay commits and multi-GPU ops)
              half=(tests/test_ring.py tests/test_ring_mamba2.py tests/test_ring_kernels.py
                    tests/test_ring_kernels_mamba2.py tests/test_ring_kernels_conv_accept.py tests/test_replay_commit.py
                    tests/test_multi_gpu.py)
              if [ "$phase" = tests1 ]; then files=("${half[@]}"); else files=(tests); for f in "${half[@]}"; do
                files+=(--ignore="$f"); done; fi
              timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu ${xdist:+-n 14} --durations=5 "${files[@]}" \
                > "$out/gpu_$phase.log" 2>&1 || rc=1
              tail -3 "$out/gpu_$phase.log" ;;
    tests)    rc=0
              if [ -n "$xdist" ]; then  # the whole suite over 14 processes: the kernels' compiles take the time
                timeout 540 python3 -m pytest -q -p no:cacheprovider -m gpu -n 14 --durations=5 tests \
                  > "$out/gpu_tests.log" 2>&1 || rc=1
                tail -3 "$out/gpu_tests.log"
                echo "== $phase: exit $rc"; [ "$rc" -eq 0 ] || status=1; continue
              fi
              # without xdist three concurrent groups (they no longer finish in 300 s with other jobs beside)
              P="python3 -m pytest -q -p no:cacheprovider -m gpu --durations=5"
              timeout 300 $P tests/test_replay_commit.py tests/test_integrations.py > "$out/gpu_tests_1.log" 2>&1 &
              pids="$!"
              timeout 300 $P tests/test_opcheck.py tests/test_verify.py tests/test_compile.py tests/test_cache.py \
                > "$out/gpu_tests_2.log" 2>&1 &
              pids="$pids $!"
              timeout 300 $P tests --ignore=tests/test_replay_commit.py --ignore=tests/test_integrations.py \
                --ignore=tests/test_opcheck.py --ignore=tests/test_verify.py --ignore=tests/test_compile.py \
                --ignore=tests/test_cache.py > "$out/gpu_tests_3.log" 2>&1 &
              pids="$pids $!"
              for pid in $pids; do wait "$pid" || rc=1; done
              for group in 1 2 3; do tail -3 "$out/gpu_tests_$group.log"; done ;;
    vtests)   timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_verify.py > "$out/gpu_vtests.log" 2>&1
              rc=$?; tail -3 "$out/gpu_vtests.log" ;;
    step)     timeout 170 python3 benchmarks/bench_verify.py --drafts chain tree3 > "$out/bench_verify.log" 2>&1
              rc=$?; grep -E '^(\||verify:|engine|checks and tables)' "$out/bench_verify.log"; tail -2 "$out/bench_verify.log" ;;
    sanitize) SANITIZE_TIMEOUT=165 bash scripts/gpu_sanitize.sh "$out"; rc=$? ;;
    fp32)     timeout 200 python3 benchmarks/bench_scatter.py --dtypes fp32 --json "$out/fp32.json" > "$out/bench_fp32.log" 2>&1
              rc=$?; grep "^|" "$out/bench_fp32.log" ;;
    scaling)  timeout 270 python3 benchmarks/bench_scatter.py --batches 1 8 64 256 512 --drafts 2 4 8 16 \
                --json "$out/scaling.json" > "$out/bench_scaling.log" 2>&1
              rc=$?
              python3 benchmarks/plot_scaling.py "$out/scaling.json" --out "$out" && tail -5 "$out/bench_scaling.log" ;;
    demo)     timeout 200 python3 -m sgl_convwin demo --device cuda --no-progress > "$out/demo_cuda.log" 2>&1
              rc=$?; cat "$out/demo_cuda.log" ;;
    eager)    timeout 200 python3 benchmarks/bench_scatter.py --eager-only > "$out/eager.log" 2>&1
              rc=$?; sed -n "/^eager host time/,\$p" "$out/eager.log" ;;
    commit)   timeout 200 python3 benchmarks/bench_scatter.py --tree --json "$out/commit.json" > "$out/bench_commit.log" 2>&1
              rc=$?; grep '^|' "$out/bench_commit.log" ;;
    tree)     timeout 280 python3 benchmarks/bench_scatter.py --tree-only --batches 1 8 64 256 \
                --shapes qwen3next-tp1 qwen3next-tp4 nemotronh-tp1 \
                --tree-configs 256/1 512/1 512/2 1024/4 \
                > "$out/bench_tree.log" 2>&1
              rc=$?; grep -E '^(\||tree commit)' "$out/bench_tree.log" ;;
    tsan)     SANITIZE_TESTS=tests/test_scatter_tree.py SANITIZE_TIMEOUT=240 bash scripts/gpu_sanitize.sh "$out"
              rc=$? ;;
    shapes)   timeout 200 python3 benchmarks/bench_scatter.py --shapes qwen3next-tp4 nemotronh-tp1 --batches 1 8 64 256 \
                > "$out/bench_shapes.log" 2>&1
              rc=$?; sed -n '/^| shape/,$p' "$out/bench_shapes.log" ;;
    replay)   timeout 380 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_replay_commit.py \
                tests/test_cudagraph.py tests/test_cache.py tests/test_opcheck.py tests/test_integrations.py \
                > "$out/gpu_tests_replay.log" 2>&1
              rc=$?; tail -5 "$out/gpu_tests_replay.log" ;;
    rsan)     SANITIZE_TIMEOUT=200 SANITIZE_TESTS="tests/test_replay_commit.py" bash scripts/gpu_sanitize.sh "$out"
              rc=$? ;;
    rbench)   rc=0
              for mixer in gdn mamba2; do
                timeout 280 python3 benchmarks/bench_commit.py --mixer "$mixer" --batches 1 8 64 256 \
                  --json "$out/bench_commit_$mixer.json" > "$out/bench_commit_$mixer.log" 2>&1 || rc=1
                grep '^|' "$out/bench_commit_$mixer.log" | head -40
              done ;;
    smem)     rc=0
              timeout 280 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_replay_commit.py \
                > "$out/gpu_tests_smem_replay.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_smem_replay.log"
              timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cudagraph.py tests/test_opcheck.py \
                tests/test_compile.py tests/test_cache.py -k "commit or replay or gates or mamba2 or gdn" \
                > "$out/gpu_tests_smem_users.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_smem_users.log" ;;
    runs)     rc=0
              timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_verify.py \
                -k "cuda and (runs or small-tree)" > "$out/gpu_tests_runs.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_runs.log"
              mkdir -p "$out/runs"
              SANITIZE_TIMEOUT=150 SANITIZE_TESTS=tests/test_verify.py SANITIZE_K="cuda and runs" \
                bash scripts/gpu_sanitize.sh "$out/runs" || rc=1 ;;
    ring)     rc=0
              timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_ring_kernels.py \
                tests/test_ring_kernels_conv_accept.py tests/test_gdn_verify.py > "$out/gpu_tests_ring.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_ring.log"
              mkdir -p "$out/ring"
              SANITIZE_TIMEOUT=150 SANITIZE_TESTS="tests/test_ring_kernels.py tests/test_ring_kernels_conv_accept.py" \
                SANITIZE_K="cuda and not steps" bash scripts/gpu_sanitize.sh "$out/ring" || rc=1 ;;
    gvsan)    mkdir -p "$out/gvsan"
              SANITIZE_TIMEOUT=200 SANITIZE_TESTS=tests/test_gdn_verify.py \
                SANITIZE_K="launch_choices or skipped_rows or one_node or views or model_shape" \
                bash scripts/gpu_sanitize.sh "$out/gvsan"; rc=$? ;;
    m2verify) rc=0
              timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_mamba2_verify.py \
                > "$out/gpu_tests_mamba2_verify.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_mamba2_verify.log"
              mkdir -p "$out/m2verify"
              SANITIZE_TIMEOUT=150 SANITIZE_TESTS=tests/test_mamba2_verify.py SANITIZE_K="cuda" \
                bash scripts/gpu_sanitize.sh "$out/m2verify" || rc=1 ;;
    gvbench)  rc=0
              python3 -m pip install -q --no-deps .whl/fla_core-*.whl .whl/einops-*.whl >> "$out/install.log" 2>&1
              timeout 200 python3 benchmarks/bench_gdn_verify.py > "$out/bench_gdn_verify.log" 2>&1 || rc=1
              grep -E '^(\||read ceiling)' "$out/bench_gdn_verify.log"
              timeout 120 python3 benchmarks/bench_gdn_verify.py --state-dtype bf16 --batches 64 256 --no-step \
                > "$out/bench_gdn_verify_bf16.log" 2>&1 || rc=1
              grep '^|' "$out/bench_gdn_verify_bf16.log" ;;
    persist)  rc=0
              timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py \
                -k "launch_choices or launch_plans or model_shape" > "$out/gpu_tests_persist.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_persist.log"
              for dtype in fp32 bf16; do
                timeout 150 python3 benchmarks/bench_gdn_verify.py --sweep --only 16 17 18 19 20 --batches 64 128 256 \
                  --state-dtype $dtype > "$out/sweep_persist_$dtype.log" 2>&1 || rc=1
                grep '^|' "$out/sweep_persist_$dtype.log"
              done ;;
    pdl)      rc=0
              timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py \
                tests/test_mamba2_verify.py -k "pdl or launch_choices" > "$out/gpu_tests_pdl.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_pdl.log"
              timeout 200 python3 benchmarks/bench_gdn_verify.py --sweep --only 10 11 16 18 21 22 23 --batches 64 256 \
                > "$out/sweep_pdl_fp32.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_pdl_fp32.log"
              timeout 120 python3 benchmarks/bench_gdn_verify.py --sweep --only 3 10 15 21 22 --batches 64 256 \
                --state-dtype bf16 > "$out/sweep_pdl_bf16.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_pdl_bf16.log"
              timeout 150 python3 benchmarks/bench_mamba2_verify.py --batches 64 256 --tunings pdl=1 \
                > "$out/bench_mamba2_pdl.log" 2>&1 || rc=1
              grep -E '^(\||  )' "$out/bench_mamba2_pdl.log" ;;
    floor)    rc=0
              timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py \
                tests/test_mamba2_verify.py tests/test_ring.py tests/test_ring_mamba2.py tests/test_ring_kernels.py \
                tests/test_ring_kernels_mamba2.py -k strong_decays \
                > "$out/gpu_tests_floor.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_floor.log" ;;
    qeff)     rc=0
              timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py \
                > "$out/gpu_tests_qeff.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_qeff.log"
              timeout 60 python3 scripts/gdn_verify_precision.py > "$out/precision.log" 2>&1 || rc=1
              cat "$out/precision.log"
              timeout 180 python3 benchmarks/bench_gdn_verify.py --sweep --only 0 27 28 --batches 1 8 64 256 \
                > "$out/sweep_qeff.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_qeff.log"
              timeout 100 python3 benchmarks/bench_gdn_verify.py --sweep --only 28 --batches 64 256 --transposed \
                > "$out/sweep_qeff_transposed.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_qeff_transposed.log" ;;
    transposed) rc=0
              timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py \
                tests/test_ring_kernels.py -k "transposed or misaligned or fuzz" > "$out/gpu_tests_transposed.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_transposed.log"
              timeout 120 python3 benchmarks/bench_gdn_verify.py --sweep --only 27 28 --batches 8 64 256 --transposed \
                > "$out/sweep_transposed.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_transposed.log"
              timeout 80 python3 benchmarks/bench_gdn_verify.py --sweep --only 28 --batches 64 256 --transposed \
                --state-dtype bf16 > "$out/sweep_transposed_bf16.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_transposed_bf16.log"
              timeout 80 python3 benchmarks/bench_gdn_verify.py --sweep --only 25 27 28 --batches 2 4 8 \
                > "$out/sweep_small.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_small.log" ;;
    ringT)    rc=0; mkdir -p "$out/ringT"  # (see the usage above)
              timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_ring_kernels.py \
                -k "programmatic or due_flush_on_the_mma" > "$out/gpu_tests_ring_pdl.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_ring_pdl.log"
              for variant in "" --transposed "--constants RING_MMA_PDL=1"; do
                name=$(echo "$variant" | tr -c 'A-Za-z0-9\n' _)
                timeout 100 python3 benchmarks/bench_ring.py --batches 64 256 --drafts chain $variant \
                  > "$out/bench_ring$name.log" 2>&1 || rc=1
                echo "# bench_ring.py --batches 64 256 --drafts chain $variant"; grep '^|' "$out/bench_ring$name.log"
              done
              SANITIZE_TIMEOUT=100 SANITIZE_TESTS="tests/test_gdn_verify.py tests/test_ring_kernels.py" \
                SANITIZE_K="transposed and (default or stages-16 or pool) or programmatic" \
                bash scripts/gpu_sanitize.sh "$out/ringT" || rc=1 ;;
    spread)   rc=0  # (gdn_verify's 64-column tiles where 128 columns leave too few programs: tests, then B = 2 / 3)
              timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py \
                -k "spread_tiles or launch_choices" > "$out/gpu_tests_spread.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_spread.log"
              timeout 120 python3 benchmarks/bench_gdn_verify.py --sweep --batches 2 3 --only 6 8 \
                > "$out/sweep_spread.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_spread.log" ;;
    shallow)  rc=0  # (gdn_verify's trees: the Triton kernel's walk by pointer jumping, either kernel's inverse as
              # one block where no root path is over 4 nodes: their tests and gdn_verify's, then trees each way)
              timeout 280 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py \
                tests/test_mamba2_verify.py > "$out/gpu_tests_shallow.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_shallow.log"
              timeout 170 python3 benchmarks/bench_gdn_verify.py --sweep --batches 1 2 8 --only 0 29 30 31 32 33 \
                > "$out/sweep_shallow_small.log" 2>&1 || rc=1
              grep -E '^\||FAILED' "$out/sweep_shallow_small.log"
              timeout 120 python3 benchmarks/bench_gdn_verify.py --sweep --batches 64 256 --only 29 33 \
                > "$out/sweep_shallow_large.log" 2>&1 || rc=1
              grep -E '^\||FAILED' "$out/sweep_shallow_large.log" ;;
    chunk16)  rc=0  # (gdn_verify's chunks of 16 rows: tests, then tiles and bf16 chunks swept; the ring at 16 rows)
              timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py \
                > "$out/gpu_tests_chunk16.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_chunk16.log"
              timeout 150 python3 benchmarks/bench_gdn_verify.py --sweep --batches 64 256 --only 1 28 34 35 38 39 40 41 \
                > "$out/sweep_chunk16.log" 2>&1 || rc=1
              grep -E '^\||FAILED' "$out/sweep_chunk16.log" ;;
    early)    rc=0  # (gdn_verify's mma kernel with its small inputs early for chains only; the whole table after)
              timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py \
                -k "launch_choices or tree_walks or model_shape" > "$out/gpu_tests_early.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_early.log"
              timeout 100 python3 benchmarks/bench_gdn_verify.py --sweep --batches 64 256 --only 40 41 42 \
                > "$out/sweep_early.log" 2>&1 || rc=1
              grep -E '^\||FAILED' "$out/sweep_early.log"
              python3 -m pip install -q --no-deps .whl/fla_core-*.whl .whl/einops-*.whl >> "$out/install.log" 2>&1
              timeout 120 python3 benchmarks/bench_gdn_verify.py > "$out/bench_gdn_verify.log" 2>&1 || rc=1
              grep -E '^(\||read ceiling)' "$out/bench_gdn_verify.log" ;;
    gvncu)    rc=0  # (gdn_verify's GPU tests, then Nsight Compute over one layer, chain and tree, B = 64, bf16 and fp32)
              timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py \
                > "$out/gpu_tests_gdn_verify.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_gdn_verify.log"
              for dtype in bf16 fp32; do
                ncu_report "gv_$dtype" 150 python3 benchmarks/bench_gdn_verify.py --ncu --batches 64 \
                  --state-dtype $dtype || rc=1
              done ;;
    h200)     rc=0  # (the sweeps that set the prefetch and value-runs defaults, on an H200; with pdl 2, which
              # says how much of a layer's fixed loss is the launch's ramp, and v prefetched, which how much is the
              # epilogue's load; bf16 also the stacked products as bf16 mma, which an H100 did not need)
              for only in "fp32:53 54 50 57 22 58" "bf16:53 54 50 57 22 58 43 44"; do
                dtype=${only%%:*}
                timeout 160 python3 benchmarks/bench_gdn_verify.py --sweep --batches 64 256 --only ${only#*:} \
                  --state-dtype $dtype > "$out/sweep_h200_$dtype.log" 2>&1 || rc=1
                grep -E '^(\||read)|FAILED|Error' "$out/sweep_h200_$dtype.log"
              done ;;
    vruns)    rc=0  # (gdn_verify's v and out in 16-byte runs, the default: its bit-for-bit tests, memcheck +
              # racecheck over its launch choices, which run it on and off; then the sweep on fp32 pools transposed)
              timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py -k value_runs \
                > "$out/gpu_tests_vruns.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_vruns.log"
              mkdir -p "$out/vrunsan"
              SANITIZE_TIMEOUT=90 SANITIZE_TESTS=tests/test_gdn_verify.py SANITIZE_K="launch_choices and cuda" \
                bash scripts/gpu_sanitize.sh "$out/vrunsan" || rc=1
              timeout 80 python3 benchmarks/bench_gdn_verify.py --sweep --batches 64 256 --only 57 --transposed \
                > "$out/sweep_vruns_transposed.log" 2>&1 || rc=1
              grep -E '^\||FAILED|Error' "$out/sweep_vruns_transposed.log" ;;
    bf16chunks) timeout 80 python3 benchmarks/bench_gdn_verify.py --sweep --batches 64 256 --only 1 2 36 37 \
                --state-dtype bf16 > "$out/sweep_chunk16_bf16.log" 2>&1
              rc=$?; grep -E '^\||FAILED' "$out/sweep_chunk16_bf16.log" ;;
    chunkT)   rc=0  # (gdn_verify's transposed pools at 32-row fp32 chunks: tests, sanitizers, then the sweep)
              tests_sanitized chunkT tests/test_gdn_verify.py "transposed" \
                "cuda and transposed and (model_shape or state_stages or misaligned)" || rc=1
              for dtype in fp32 bf16; do
                timeout 90 python3 benchmarks/bench_gdn_verify.py --sweep --batches 8 64 256 --only 2 --transposed \
                  --state-dtype $dtype > "$out/sweep_chunkT_$dtype.log" 2>&1 || rc=1
                grep -E '^(\||read)|FAILED|Error' "$out/sweep_chunkT_$dtype.log"
              done ;;
    depth)    rc=0  # (trees folding by their depth, tree_depth: the GPU tests, then tree steps told and not told)
              timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_ring.py tests/test_ring_kernels.py \
                -k "depth or due_folds or cuda_graph or opcheck or random_steps" > "$out/gpu_tests_depth.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_depth.log"
              for mixer in gdn mamba2; do
                for told in --tree-depth --no-tree-depth; do
                  echo "# $mixer $told"
                  drafts=$([ $told$mixer = --tree-depthgdn ] && echo "chain tree" || echo tree)
                  limit=$([ "$drafts" = tree ] && echo 90 || echo 130)
                  timeout $limit python3 benchmarks/bench_ring.py --mixer $mixer --batches 64 256 --drafts $drafts $told \
                    > "$out/ring_depth_${mixer}${told}.log" 2>&1 || rc=1
                  grep -E '^(check|  (chain|tree)|\| (chain|tree))|FAILED|Error' "$out/ring_depth_${mixer}${told}.log"
                done
              done ;;
    ring16)   gdn_steps "" "RING_MMA_CHUNK_K=16"; rc=$? ;;
    foldtile) timeout 150 python3 benchmarks/bench_ring.py --batches 64 256 --flush-sweep - mma=1/block_v=64/fold_warps=2 \
                mma=1/block_v=64/fold_warps=2/state_stages=4 mma=1/block_v=64/fold_warps=2/state_stages=4/fold_maxnreg=0 \
                mma=1/block_v=32/fold_warps=1/state_stages=4 mma=1/block_v=64/fold_warps=4/state_stages=4 - \
                > "$out/foldtile.log" 2>&1
              rc=$?; grep -E '^\||Error' "$out/foldtile.log" ;;
    masks)    rc=0  # (gdn_verify's mma kernel given each tree node's path mask: tests, then trees both ways)
              timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py \
                -k "tree_masks or tree_path_masks" > "$out/gpu_tests_masks.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_masks.log"
              for dtype in fp32 bf16; do
                timeout 120 python3 benchmarks/bench_gdn_verify.py --sweep --only 29 --batches 8 64 256 \
                  --state-dtype $dtype > "$out/sweep_masks_$dtype.log" 2>&1 || rc=1
                grep -E '^\||FAILED' "$out/sweep_masks_$dtype.log"
              done ;;
    ringconv) timeout 150 python3 benchmarks/bench_ring.py --conv-sweep 64/2 128/1 128/2 256/2 256/4 512/4 1024/4 \
                --batches 8 64 256 > "$out/bench_ring_conv.log" 2>&1
              rc=$?; grep -E '^\|' "$out/bench_ring_conv.log" ;;
    commitT)  timeout 200 python3 benchmarks/bench_commit.py --transposed --batches 8 64 256 > "$out/bench_commit_T.log" 2>&1
              rc=$?; grep -E '^\||differs' "$out/bench_commit_T.log" ;;
    floorsan) mkdir -p "$out/floorsan"
              SANITIZE_TIMEOUT=150 SANITIZE_TESTS="tests/test_gdn_verify.py tests/test_mamba2_verify.py" \
                SANITIZE_K="strong_decays" bash scripts/gpu_sanitize.sh "$out/floorsan"; rc=$? ;;
    treewalk) rc=0
              timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_gdn_verify.py \
                tests/test_ring_kernels.py tests/test_ring_kernels_mamba2.py tests/test_ring.py tests/test_mamba2_verify.py \
                > "$out/gpu_tests_treewalk.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_treewalk.log"
              timeout 150 python3 benchmarks/bench_gdn_verify.py --no-step > "$out/bench_gdn_verify_treewalk.log" 2>&1 || rc=1
              grep -E '^(\||read ceiling)' "$out/bench_gdn_verify_treewalk.log"
              timeout 150 python3 benchmarks/bench_ring.py --batches 64 256 --drafts tree > "$out/bench_ring_tree.log" 2>&1 \
                || rc=1
              grep '^|' "$out/bench_ring_tree.log" ;;
    m2bench)  timeout 200 python3 benchmarks/bench_mamba2_verify.py --json "$out/bench_mamba2_verify.json" \
                > "$out/bench_mamba2_verify.log" 2>&1
              rc=$?; grep -E '^(\||[0-9]{4}-|check|read ceiling|targets|[0-9]+ layers per step)|FAILED' "$out/bench_mamba2_verify.log"
              tail -2 "$out/bench_mamba2_verify.log" ;;
    ringbench) timeout 300 python3 benchmarks/bench_ring.py > "$out/bench_ring.log" 2>&1
              rc=$?; grep -E '^(\||[0-9]+ layers)' "$out/bench_ring.log"; tail -2 "$out/bench_ring.log" ;;
    ringnext) rc=0
              timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_ring_kernels.py \
                tests/test_ring_kernels_mamba2.py > "$out/gpu_tests_ringnext.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_ringnext.log"
              mkdir -p "$out/ringnext"
              SANITIZE_TIMEOUT=100 SANITIZE_TESTS="tests/test_ring_kernels.py tests/test_ring_kernels_mamba2.py" \
                SANITIZE_K="mma or cuda" bash scripts/gpu_sanitize.sh "$out/ringnext" || rc=1
              timeout 90 python3 benchmarks/bench_ring.py --batches 64 256 --sweep mma/128/4 mma/128/4/0,128/1/8 \
                mma/128/8/0/1 > "$out/bench_ring_sweep.log" 2>&1 || rc=1
              grep "^|" "$out/bench_ring_sweep.log" ;;
    m2ringbench) timeout 280 python3 benchmarks/bench_ring.py --mixer mamba2 --batches 1 8 64 256 \
                > "$out/bench_ring_mamba2.log" 2>&1
              rc=$?; grep -E '^(\||[0-9]+ layers)' "$out/bench_ring_mamba2.log"; tail -2 "$out/bench_ring_mamba2.log"
              timeout 150 python3 benchmarks/bench_ring.py --mixer mamba2 --batches 64 256 \
                --sweep 64/4/16/1 64/4/16/1/chunk_n=0 64/4/8/1 64/4/16/1/maxnreg=168 64/4/8/1/maxnreg=168 \
                64/4/16/1/maxnreg=0 > "$out/sweep_ring_mamba2.log" 2>&1
              rc=$((rc | $?)); grep '^|' "$out/sweep_ring_mamba2.log"
              # the folded windows moved by the verify launch (FUSED_WINDOW: one launch a layer fewer), every B
              timeout 120 python3 benchmarks/bench_ring.py --mixer mamba2 --batches 1 8 \
                --sweep 64/4/16/1/fused_window=0 64/4/16/1 > "$out/sweep_ring_mamba2_window.log" 2>&1
              rc=$((rc | $?)); grep '^|' "$out/sweep_ring_mamba2_window.log" ;;
    gvprefetch) rc=0
              tests_sanitized gvprefetch tests/test_gdn_verify.py "prefetch or launch_plans" \
                "cuda and prefetch_values" || rc=1
              timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_ring_kernels.py \
                -k prefetched_values > "$out/gpu_tests_ringprefetch.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_ringprefetch.log"
              gdn_steps "" "RING_MMA_PREFETCH_VALUES=1" || rc=1 ;;
    m2prefetch) rc=0
              tests_sanitized m2prefetch tests/test_mamba2_verify.py "prefetch or launch_choices or launch_orders" \
                "cuda and (launch_orders or launch_choices)" || rc=1
              timeout 300 python3 benchmarks/bench_mamba2_verify.py --batches 64 256 --standin-tiles 16/2 \
                --tunings prefetch_inputs=1 pdl=1 prefetch_inputs=1,pdl=1 heads_per_program=4,flatten=1,maxnreg=96 \
                heads_per_program=4,flatten=1,maxnreg=96,prefetch_inputs=1 > "$out/bench_mamba2_prefetch.log" 2>&1 \
                || rc=1
              grep -E 'graph|FAILED|^\|' "$out/bench_mamba2_prefetch.log" ;;
    m2tune)   timeout 240 python3 benchmarks/bench_mamba2_verify.py --batches 64 256 --standin-tiles 16/2 \
                --tunings num_warps=8 block_p=32 block_p=32,num_warps=2 chunk_stages=4,num_warps=8 \
                chunk_n=16,chunk_stages=6 > "$out/bench_mamba2_verify_tune.log" 2>&1
              rc=$?; grep -E 'graph|FAILED' "$out/bench_mamba2_verify_tune.log" ;;
    ringfold) rc=0
              timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_ring_kernels.py \
                tests/test_ring_kernels_mamba2.py -k "mma or capacity_16 or matches_pytorch" \
                > "$out/gpu_tests_ringfold.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_ringfold.log"
              timeout 150 python3 benchmarks/bench_ring.py --batches 64 256 --sweep mma/128/4 mma/128/4/fold_maxnreg=0 \
                mma/128/4/fused_window=0 mma/128/4/merged=0 mma/128/4/merged=0/fused_window=0/fold_maxnreg=0 \
                > "$out/sweep_ring_fold_gdn.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_ring_fold_gdn.log"
              timeout 150 python3 benchmarks/bench_ring.py --mixer mamba2 --batches 64 256 --sweep 64/4/16/1 \
                64/4/16/1/fold_maxnreg=0 64/4/16/1/fused_window=0 64/4/16/1/fold_heads_per_program=2 \
                > "$out/sweep_ring_fold_mamba2.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_ring_fold_mamba2.log" ;;
    varquick) rc=0  # (one call: the variants' kernel tests at the model's head dim, then whole GDN steps)
              timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_ring_kernels.py \
                tests/test_ring_kernels_mamba2.py -k "(mma_kernel and 128 and 16 and fp32 and (registers or \
                stages)) or flattened or (capacity_16 and chain)" > "$out/gpu_tests_varquick.log" 2>&1 || rc=1
              tail -3 "$out/gpu_tests_varquick.log"
              gdn_steps "" "RING_MMA_STATE_STAGES=0" || rc=1 ;;
    vartests) select="registers or fold-verify or fold_verify or stages or 64-columns or capacity_16 or pdl or variants"
              select="$select or 8-warps or flattened or misaligned"
              timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist --durations=5 \
                tests/test_ring_kernels.py tests/test_gdn_verify.py tests/test_ring_kernels_mamba2.py tests/test_ring.py \
                -k "$select or (mamba2 and matches_pytorch)" \
                > "$out/gpu_tests_variants.log" 2>&1
              rc=$?; tail -8 "$out/gpu_tests_variants.log"
              # (then the capture ops in one CUDA graph and every op's device guard)
              timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cudagraph.py tests/test_multi_gpu.py \
                -k "capture_ops or enters_its_tensors_device" > "$out/gpu_tests_audit.log" 2>&1 || rc=1
              tail -3 "$out/gpu_tests_audit.log" ;;
    varbench) rc=0
              timeout 240 python3 benchmarks/bench_ring.py --batches 64 256 --sweep mma/128/4 mma/128/4/state_stages=0 \
                mma/128/4/state_stages=3 mma/128/4/state_stages=4 mma/128/4/chunk_k=16/state_stages=4 mma/128/8 \
                mma/128/8/state_stages=0 mma/128/4 > "$out/sweep_variants_gdn.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_variants_gdn.log"
              timeout 80 python3 benchmarks/bench_ring.py --batches 1 8 --sweep mma/128/4 mma/64/4 mma/32/4 \
                > "$out/sweep_variants_small.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_variants_small.log"
              for spread in 0 1; do  # (whole steps: the small batches' narrower tiles, the folds' too)
                timeout 60 python3 benchmarks/bench_ring.py --batches 1 8 --drafts chain --profile \
                  --constants RING_MMA_SPREAD=$spread > "$out/profile_variants_spread$spread.log" 2>&1 || rc=1
                grep -E '^chain' "$out/profile_variants_spread$spread.log"
              done
              timeout 200 python3 benchmarks/bench_ring.py --mixer mamba2 --batches 64 256 --sweep 64/4/16/1 \
                64/4/16/1/flatten=1 64/4/16/1/flatten=1/maxnreg=168 64/4/16/1/fold_heads_per_program=1 \
                64/4/16/1/fold_verify=1 64/4/16/1/fold_verify=1/fold_maxnreg=0 64/4/16/1/fold_verify=1/pdl=1 \
                64/4/16/1/fold_verify=1/pdl=1/flatten=1 64/4/16/1 > "$out/sweep_variants_mamba2.log" 2>&1 || rc=1
              grep '^|' "$out/sweep_variants_mamba2.log"
              for dtype in fp32 bf16; do
                timeout 100 python3 benchmarks/bench_gdn_verify.py --sweep --only 10 11 12 13 14 15 --batches 64 256 \
                  --state-dtype $dtype > "$out/sweep_variants_gdn_verify_$dtype.log" 2>&1 || rc=1
                grep '^|' "$out/sweep_variants_gdn_verify_$dtype.log"
              done ;;
    varsan)   mkdir -p "$out/varsan"
              SANITIZE_TIMEOUT=270 SANITIZE_TESTS="tests/test_ring_kernels.py tests/test_ring_kernels_mamba2.py" \
                SANITIZE_K="(fp32 and 128 and 16 and chain and (default or registers or state-stages-3 or state-stages-whole-tile)) or (mamba2 and matches_pytorch and head-chain)" \
                bash scripts/gpu_sanitize.sh "$out/varsan"; rc=$? ;;
    varsteps) rc=0
              gdn_steps "" "RING_MMA_STATE_STAGES=0" "RING_MMA_STATE_STAGES=4 RING_MMA_CHUNK_K=16" || rc=1 ;;
    m2varsteps) rc=0
              for constants in "" "FLATTEN_HEADS=1" "FOLD_VERIFY=1 PDL=1" "FOLD_VERIFY=1 PDL=1 FLATTEN_HEADS=1"; do
                echo "# mamba2 ${constants:-defaults}"
                timeout 100 python3 benchmarks/bench_ring.py --mixer mamba2 --batches 64 256 --drafts chain --profile \
                  ${constants:+--constants $constants} > "$out/varsteps.log" 2>&1 || rc=1
                grep -E '^(chain|\| _mamba2)' "$out/varsteps.log"; cat "$out/varsteps.log" >> "$out/varsteps_all.log"
              done ;;
    stackparts) rc=0
              timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_ring_kernels.py \
                -k four_parts > "$out/gpu_tests_stackparts.log" 2>&1 || rc=1
              tail -2 "$out/gpu_tests_stackparts.log"
              STEP_DRAFTS=tree gdn_steps "" "RING_MMA_STACK_PARTS=4" "" "RING_MMA_STACK_PARTS=4" || rc=1
              gdn_steps "" "RING_MMA_STACK_PARTS=4" || rc=1 ;;
    ringncu)  rc=0  # (GDN, then Mamba2: each mixer's ring launches of one layer, 1 row in 6 folding; then the
              # GDN fold with every row folding: a fold program's own efficiency, the GPU full of them)
              for run in gdn/mixed mamba2/mixed gdn/fold; do
                mixer=${run%/*}; column=${run#*/}; name="${column}_$mixer"
                if [ "$mixer" = gdn ]; then kernels=_gdn_ring_verify_mma_kernel; spec=mma/128/4
                else kernels=_mamba2_ring; spec=64/4/16/1; fi
                ncu_report "ring_$name" 300 -k regex:$kernels python3 benchmarks/bench_ring.py --mixer $mixer \
                  --batches 64 --sweep $spec --ncu $column || rc=1
              done ;;
    due)      rc=0
              timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_ring.py \
                tests/test_ring_mamba2.py tests/test_ring_kernels.py tests/test_ring_kernels_mamba2.py \
                -k "due or random_steps or flush or hint or fold-row-programs or fold_programs" > "$out/gpu_tests_due.log" 2>&1 || rc=1
              tail -3 "$out/gpu_tests_due.log"
              for mixer in gdn mamba2; do
                for flag in --no-due-first ""; do
                  timeout 90 python3 benchmarks/bench_ring.py --mixer $mixer --batches 1 8 64 256 --drafts chain \
                    --profile $flag > "$out/steps_due_$mixer${flag:+1}.log" 2>&1 || rc=1
                  grep -E '^(chain|\| _)' "$out/steps_due_$mixer${flag:+1}.log"
                done
              done
              timeout 120 python3 benchmarks/bench_ring.py --batches 64 256 --flush-sweep - fold_tiles=2 fold_tiles=4 \
                fold_tiles=8 fold_tiles=0 > "$out/flush_sweep.log" 2>&1 || rc=1
              grep -E '^\|' "$out/flush_sweep.log" ;;
    plans)    rc=0
              timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_eager_signatures.py \
                > "$out/gpu_tests_plans.log" 2>&1 || rc=1
              tail -3 "$out/gpu_tests_plans.log"
              timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu $xdist tests/test_ring.py tests/test_ring_mamba2.py \
                tests/test_cudagraph.py tests/test_compile.py -k "ring or mamba2" > "$out/gpu_tests_plans_ring.log" 2>&1 || rc=1
              tail -3 "$out/gpu_tests_plans_ring.log" ;;
    ringprof) rc=0
              for mixer in gdn mamba2; do
                timeout 200 python3 benchmarks/bench_ring.py --mixer "$mixer" --batches 1 8 64 256 --profile \
                  > "$out/profile_ring_$mixer.log" 2>&1 || rc=1
                grep -E '^(\||chain|tree)' "$out/profile_ring_$mixer.log"
              done ;;
    *)        echo "unknown phase $phase"; rc=2 ;;
  esac
  echo "== $phase: exit $rc"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
