"""benchmarks/bench_verify.py: a CPU dry run of its timing flow (timers stubbed, each timed call run
once) so that a broken table is found before a GPU run. Its oracle check runs in CI as
``bench_verify.py --verify-only``."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_verify  # noqa: E402
import common  # noqa: E402


def test_timing_flow_dry_run(monkeypatch, capsys):
    calls = []

    def run_once(fn, *args, **kwargs):
        fn()
        calls.append(fn)
        return 10.0

    monkeypatch.setattr(bench_verify, "graph_time_us", run_once)
    monkeypatch.setattr(common, "do_bench_us", run_once)
    monkeypatch.setattr(common, "copy_ceiling_gbps", lambda: 1000.0)
    batches, drafts = [1, 3], ["chain", "tree3"]
    bench_verify.bench(batches, drafts, layers=2, dim=24, device=common.DEVICE)

    out = capsys.readouterr().out
    tables = [line for line in out.splitlines() if line.startswith("| ")]
    layer_rows = [line for line in tables if "per layer" not in line and line.count("|") == 8]
    step_rows = [line for line in tables if "per step" not in line and line.count("|") == 10]
    # chain: 2 engine baselines + 3 layouts + the two copies and the stream; tree: the channel-major
    # sequence does not apply
    assert len(layer_rows) == len(batches) * (8 + 7)
    for row in (bench_verify.COPY_ROW, bench_verify.MIX_ROW, bench_verify.STREAM_ROW):
        assert sum(row in line for line in layer_rows) == len(batches) * len(drafts)
    assert len(step_rows) == len(batches) * (7 + 6)
    # the copy rows are timed too, the stream at each of its configurations
    streams = len(batches) * len(drafts)
    assert len(calls) == len(layer_rows) + 2 * len(step_rows) + (len(bench_verify.STREAM_CONFIGS) - 1) * streams
    assert "| tree N=8 topk 3 | 3 | engine conv update, dense windows |" in out
    assert "| chain D=4 | 3 | engine conv update, channel-major sequence |" in out
    assert "| chain D=4 | 1 | engine conv update, channel-major sequence (no commit) |" in out
    assert "| tree N=8 topk 3 | 1 | engine conv update, channel-major sequence" not in out


def test_bytes_moved():
    """Qwen3-Next TP1, one layer, chain D=4, B=1: x, committed inputs, weights, outputs, capture."""
    dim = 8192
    base = (4 + 3 + 4) * dim + 5 * dim
    assert bench_verify.layer_bytes(dim, 4, 4, 1, "dense") == 2 * (base + 4 * 3 * dim)
    assert bench_verify.layer_bytes(dim, 4, 4, 1, "channel_major") == 2 * (base + 6 * dim)
    # a capture alone: x and the committed inputs read, the rows written (no weights, no outputs)
    assert bench_verify.layer_bytes(dim, 4, 4, 1, "channel_major", conv=False) == 2 * (4 + 3 + 6) * dim
    commit = 2 * 2 * 3 * dim
    assert bench_verify.step_bytes(36, dim, 4, 4, 1, "dense") == 36 * (2 * (base + 12 * dim) + commit)
    assert bench_verify.step_bytes(36, dim, 4, 4, 1, "dense", commit=False) == 36 * 2 * (base + 12 * dim)
