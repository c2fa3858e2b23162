"""benchmarks/bench_mamba2_verify.py: its engine stand-in kernel and its calls of mamba2_verify against
the float64 oracle (its --check-only, tiny shapes; the kernel interpreted on the CPU), and a CPU dry
run of its timing flow (timers stubbed) so that a broken table is found before a GPU run."""

import dataclasses
import json
import os
import sys

import pytest
import torch

pytest.importorskip("triton")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_mamba2_verify  # noqa: E402


def test_check_only_passes(capsys):
    """Chains, trees, a padded row, z on, two stand-in tiles (the engines' 4/4 and a 16-row one), one
    tuning of mamba2_verify's launcher."""
    assert bench_mamba2_verify.main(["--check-only", "--shape", "tiny", "--z", "--standin-tiles", "4/4", "16/2",
                                     "--tunings", "chunk_n=16,chunk_stages=2"]) == 0
    out = capsys.readouterr().out
    assert out.count("(ok)") == 8 and "FAILED" not in out
    assert "mamba2_verify chunk_n=16,chunk_stages=2, tree" in out
    assert "command: python3 benchmarks/bench_mamba2_verify.py --check-only" in out


def test_timing_flow_dry_run(monkeypatch, tmp_path, capsys):
    """The per-call lines, the table and the JSON on tiny shapes on the CPU, each timed call run once."""
    calls = []

    def run_once(fn):
        fn()
        calls.append(fn)
        return 10.0, 8.0

    monkeypatch.setattr(bench_mamba2_verify, "DEVICE", "cpu")
    monkeypatch.setattr(bench_mamba2_verify, "time_fn", run_once)
    path = str(tmp_path / "out.json")
    shapes = dataclasses.replace(bench_mamba2_verify.SHAPES["tiny"], layers=1)
    batches, tiles = [1, 2], [(4, 4), (16, 2)]
    rows = bench_mamba2_verify.bench(shapes, batches, ["chain", "tree"], torch.float32, tiles, 1000.0,
                                     json_path=path, header=dict(device="cpu"), tunings=[dict(chunk_n=0)])

    assert len(rows) == len(calls) == len(batches) * (2 * (2 + len(tiles)) + 1)  # + the plain read, once
    assert json.load(open(path)) == dict(device="cpu", rows=rows)
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(batches)
    # chain and tree 8.0 us each, the stand-in and the plain read too: ratios 1.00x; no targets off the Nemotron-H shape
    assert table[-1].startswith("| 2 | 8.0 |") and table[-1].endswith("| 8.0 (4/4) | 1.00x | - |")
    assert table[-1].split(" | ")[4:8] == ["8.0", "8.0 (4/4)", "1.00x", "1.00x"]


def test_targets():
    targets = bench_mamba2_verify.targets
    assert targets(1, 300.0, 10.0, 1.2, 1.1) == "stand-in >= 1x ok, tree <= 1.15x ok"
    assert targets(64, 1800.0, 1500.0, 1.5, 1.2) == "floor >= 80% ok, <= 1900 us ok, tree <= 1.15x MISSED"
    assert targets(256, 8000.0, 5000.0, 1.9, None) == "floor >= 80% MISSED, <= 7400 us MISSED, stand-in >= 2x MISSED"
    # missed, and out of reach when the plain read of the same pools is under 2x the stand-in too
    assert targets(256, 7000.0, 5800.0, 1.7, None, 1.93).endswith(
        "stand-in >= 2x MISSED (out of reach: a plain read of the pools is only 1.93x faster)")
    assert targets(256, 7000.0, 5800.0, 1.7, None, 2.1).endswith("stand-in >= 2x MISSED")
