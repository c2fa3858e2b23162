"""benchmarks/bench_gdn_verify.py: its --check against the float64 oracle, and a CPU dry run of its
tile sweep (timers stubbed, the Triton kernel interpreted) -- every tuning checked against the oracle
before it is timed, one that fails it reported and left out -- so that a broken sweep is found before
a GPU run."""

import os
import sys

import pytest
import torch

pytest.importorskip("triton")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_gdn_verify  # noqa: E402
from support import INTERPRET  # noqa: E402

from sgl_convwin._kernels import triton_kernels  # noqa: E402

pytestmark = pytest.mark.skipif(not INTERPRET, reason="the dry run interprets the Triton kernel on the CPU")
SHAPES = bench_gdn_verify.Shapes(layers=1, k_heads=1, v_heads=2, head_k=16, head_v=32)
TUNINGS = [dict(mma=False, block_v=16), dict(mma=False, precision="ieee")]


def dry_run(monkeypatch, launch=None):
    """sweep() on the CPU at B = 2, each timed step run once; (its result, the table's rows)."""
    timed = []

    def run_once(fn):
        fn()
        timed.append(fn)
        return 10.0, 8.0

    monkeypatch.setattr(bench_gdn_verify, "time_fn", run_once)
    monkeypatch.setattr(bench_gdn_verify, "registers", lambda p, tuning: (0, 0))
    monkeypatch.setattr(bench_gdn_verify, "READ_GBPS", 1000.0)
    if launch is not None:
        monkeypatch.setattr(triton_kernels(), "launch_gdn_verify", launch)
    ok = bench_gdn_verify.sweep(SHAPES, [2], torch.float32, TUNINGS, device="cpu")
    return ok, timed


def test_sweep_checks_then_times_each_tuning(monkeypatch, capsys):
    """Chains and trees: the plain read, the default and both tunings timed, each passing the check."""
    ok, timed = dry_run(monkeypatch)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| chain") or line.startswith("| tree")]
    assert ok and "FAILED" not in out
    assert len(rows) == 2 * (2 + len(TUNINGS))
    assert len(timed) == 1 + 2 * (1 + len(TUNINGS))  # (the plain read once a batch: the same bytes for trees)
    assert [row.split(" | ")[2] for row in rows[:4]] == [
        "plain read of the pools, a launch a layer", "default", "mma=False/block_v=16", "mma=False/precision=ieee"]


def test_sweep_leaves_out_a_tuning_that_fails_the_oracle(monkeypatch, capsys):
    """A launch whose outputs are off (here: one tuning's, shifted by 1) is reported, not timed, and
    the sweep fails; the others are still timed."""
    launch = triton_kernels().launch_gdn_verify

    def off_by_one(out, *args, **kwargs):
        launch(out, *args, **kwargs)
        if kwargs.get("block_v") == 16:
            out += 1.0

    ok, timed = dry_run(monkeypatch, off_by_one)
    out = capsys.readouterr().out
    assert not ok
    assert out.count("mma=False/block_v=16: FAILED the oracle check") == 2  # chain and tree
    assert "| mma=False/block_v=16 |" not in out
    assert len(timed) == 1 + 2 * len(TUNINGS)
