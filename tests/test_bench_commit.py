"""benchmarks/bench_commit.py: its baseline kernels (the snapshot copy, the input replay, the verify
stand-in) and its calls of the package's ops against its float64 loops (its --check), and a CPU dry
run of its timing flow (timers stubbed) so that a broken table is found before a GPU run."""

import json
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_commit  # noqa: E402


def test_check_passes():
    assert bench_commit.check("cuda" if torch.cuda.is_available() else "cpu")


def test_timing_flow_dry_run(monkeypatch, tmp_path, capsys):
    """Every table and the JSON, on tiny shapes on the CPU, each timed call run once."""
    calls = []

    def run_once(fn):
        fn()
        calls.append(fn)
        return 10.0, 8.0

    monkeypatch.setattr(bench_commit, "DEVICE", "cpu")
    monkeypatch.setattr(bench_commit, "time_fn", run_once)
    monkeypatch.setattr(bench_commit, "release", lambda: None)
    for name in ("memory_allocated", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda: 0)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", None)  # the optional FLA row: not here
    shapes = bench_commit.Shapes(layers=2, k_heads=2, v_heads=4, head_k=16, head_v=16, num_draft=4)
    memory = SimpleNamespace(limit=1 << 40, room=lambda: 1 << 40)
    path = str(tmp_path / "out.json")
    results = dict(commit=[], verify=[])
    batches = [1, 3]
    bench_commit.bench_commit(shapes, batches, ["chain", "tree"], 1000.0, memory, 32, results, path)
    bench_commit.bench_verify(shapes, batches, 1000.0, memory, 32, results, path)
    bench_commit.traffic_model(shapes, batches, 4, 1000.0, results)
    bench_commit.write_json(path, results)

    candidates = 3
    assert len(results["commit"]) == 2 * len(batches) * candidates
    assert len(results["verify"]) == 2 * len(batches)
    assert len(results["model"]) == 4
    assert len(calls) == len(results["commit"]) + len(results["verify"])
    assert json.load(open(path))["commit"][0]["bytes"] > 0
    out = capsys.readouterr().out
    assert "| chain | 3 |" in out and "| tree | 3 |" in out and "whole step" in out


def test_transposed_flow_dry_run(monkeypatch, capsys):
    """--transposed's table on tiny shapes on the CPU: gdn_commit on a pool stored [.., dv, dk] agrees
    with the contiguous pool's before each is timed (run once here)."""
    monkeypatch.setattr(bench_commit, "DEVICE", "cpu")
    monkeypatch.setattr(bench_commit, "time_fn", lambda fn: (fn(), (10.0, 8.0))[1])
    monkeypatch.setattr(bench_commit, "release", lambda: None)
    shapes = bench_commit.Shapes(layers=2, k_heads=2, v_heads=4, head_k=16, head_v=32, num_draft=4)
    assert bench_commit.bench_transposed(shapes, [1, 3], ["chain", "tree"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| chain", "| tree"))]
    assert rows == [f"| {mode} | {b} | 8.0 | 8.0 | 1.00x |" for mode in ("chain", "tree") for b in (1, 3)]


def test_model_memory_matches_the_plan_numbers():
    """Qwen3-Next TP1, D=4: the snapshot design's and this package's speculative bytes per slot are
    the issue's plan figures (309,067,776 and 3,575,808)."""
    results = {}
    bench_commit.traffic_model(bench_commit.QWEN3_NEXT_TP1, [1], 4, 4000.0, results)
    memory = [row["speculative_bytes_per_slot"] for row in results["model"]]
    assert memory[0] == 309_067_776 and memory[2] == 3_575_808


def test_mamba2_timing_flow_dry_run(monkeypatch, tmp_path, capsys):
    """--mixer mamba2's tables and JSON (Mamba2 shapes, the three candidates, the traffic model), on
    tiny shapes on the CPU, each timed call run once; its verify timing is GDN-only."""
    calls = []

    def run_once(fn):
        fn()
        calls.append(fn)
        return 10.0, 8.0

    monkeypatch.setattr(bench_commit, "DEVICE", "cpu")
    monkeypatch.setattr(bench_commit, "time_fn", run_once)
    monkeypatch.setattr(bench_commit, "release", lambda: None)
    for name in ("memory_allocated", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda: 0)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    shapes = bench_commit.Mamba2Shapes(layers=2, heads=4, head_dim=8, groups=2, d_state=16, num_draft=4)
    memory = SimpleNamespace(limit=1 << 40, room=lambda: 1 << 40)
    path = str(tmp_path / "out.json")
    results = dict(commit=[], verify=[])
    batches = [1, 3]
    bench_commit.bench_commit(shapes, batches, ["chain", "tree"], 1000.0, memory, 4, results, path)
    bench_commit.traffic_model(shapes, batches, 4, 1000.0, results)
    bench_commit.write_json(path, results)

    candidates = 3
    assert len(results["commit"]) == 2 * len(batches) * candidates
    assert len(calls) == len(results["commit"])
    assert {r["label"] for r in results["commit"]} >= {"snapshot copy + conv scatter", "input replay (x,B cache)"}
    assert len(results["model"]) == 4 and "x,B,dt" in results["model"][1]["design"]
    assert json.load(open(path))["commit"][0]["bytes"] > 0
    out = capsys.readouterr().out
    assert "| chain | 3 |" in out and "| tree | 3 |" in out


def test_mamba2_bytes_and_memory_at_nemotron_h_8b():
    """Nemotron-H-8B TP1: 24 layers x 4 MiB fp32 state per slot; the byte formulas' state terms."""
    s = bench_commit.NEMOTRON_H_8B_TP1
    assert (s.dim, s.replay_width, s.state_numel * 4) == (10240, 9216, 4 << 20)
    state = 24 * 2 * (4 << 20)  # one row: read + write every layer's state
    assert bench_commit.commit_bytes("snapshot", s, 1, 1) == state + 24 * 2 * 3 * 10240 * 2
    assert bench_commit.commit_bytes("replay", s, 1, 1) == state + 24 * (9216 * 2 + 128 * 4 + 128 * 4)
    assert bench_commit.commit_bytes("convwin", s, 1, 1) == state + 24 * (
        10240 * 2 + 3 * 10240 * 2 + 128 * 4 + 3 * 10240 * 2 + 10240 * 4 * 2 + 10240 * 2 + 128 * 4)
    results = {}
    bench_commit.traffic_model(s, [1], 4, 4000.0, results)
    assert results["model"][0]["speculative_bytes_per_slot"] == 24 * 4 * 3 * 10240 * 2 + 4 * 24 * (4 << 20)
