"""benchmarks/bench_ring.py's traffic model: its cursor-rule simulation of folds per step against
plan's closed form F = floor((R - N) / a) + 1 (constant acceptance), and its path lengths; its
check of the verify op before timing; a CPU dry run of its flows."""

import os
import sys

import pytest

pytest.importorskip("triton")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_ring  # noqa: E402
from support import INTERPRET  # noqa: E402
from sgl_convwin import plan  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402


@pytest.mark.parametrize("capacity, num_draft, accepted", [(16, 4, 1), (16, 4, 2), (16, 4, 3), (16, 4, 4), (8, 2, 2),
                                                         (5, 4, 4), (32, 5, 3)])
def test_simulated_folds_match_plan(capacity, num_draft, accepted):
    rows = [[accepted - 1] * 3]  # every row accepts `accepted` chain tokens every step
    simulated = bench_ring.folds_per_step(rows, num_draft, capacity, None, steps=4200)
    expected = 1 / plan.ring_traffic(capacity, num_draft, accepted).fold_every_steps
    assert simulated == pytest.approx(expected, abs=2e-3)


def test_tree_path_lengths():
    lengths = [bench_ring.path_length(node, bench_ring.TREE_PARENTS) for node in range(8)]
    assert lengths == [1, 2, 2, 2, 3, 3, 3, 4]
    assert [bench_ring.path_length(step, None) for step in range(4)] == [1, 2, 3, 4]


@pytest.mark.parametrize("mixer", ["gdn", "mamba2"])
def test_flow_dry_run(monkeypatch, capsys, mixer):
    """The whole flow on tiny shapes on the CPU (the ops' PyTorch code; timers and ceilings stubbed,
    each timed function run once), then the tile sweep (the kernels interpreted), so a broken
    bench is found before a GPU run."""
    import dataclasses

    def run_once(fn, *args, **kwargs):
        fn()
        return 10.0, 8.0

    tiny = dict(gdn=dataclasses.replace(bench_ring.SHAPES["gdn"], layers=2, k_heads=1, v_heads=2, head_k=16,
                                        head_v=16),
                mamba2=dataclasses.replace(bench_ring.SHAPES["mamba2"], layers=2, heads=2, head_dim=16, groups=1,
                                           d_state=16))
    monkeypatch.setattr(bench_ring, "DEVICE", "cpu")
    monkeypatch.setattr(bench_ring, "SHAPES", tiny)
    monkeypatch.setattr(bench_ring, "UNROLL", 2)
    monkeypatch.setattr(bench_ring, "time_fn", run_once)
    monkeypatch.setattr(bench_ring, "graph_time_us", lambda fn, **kwargs: run_once(fn)[1])
    monkeypatch.setattr(bench_ring, "read_ceiling_gbps", lambda: 4000.0)
    monkeypatch.setattr(bench_ring, "copy_ceiling_gbps", lambda: 3000.0)
    monkeypatch.setattr(bench_ring, "environment_line", lambda: "env")
    batches = ["1", "3"]
    constant = "RING_MMA_MERGED" if mixer == "gdn" else "FUSED_WINDOW"
    module = getattr(triton_kernels(), "gdn_ring_verify" if mixer == "gdn" else "mamba2_ring_verify")
    monkeypatch.setattr(module, constant, getattr(module, constant))  # (restored after the test)
    assert bench_ring.main(["--batches", *batches, "--capacity", "8", "--mixer", mixer, "--constants",
                            f"{constant}=0"]) == 0
    assert getattr(module, constant) == 0
    with pytest.raises(SystemExit):
        bench_ring.main(["--mixer", mixer, "--constants", "NO_SUCH_CONSTANT=1"])
    # every constant is read when a launch is built: none is a parameter's default, read at import
    # (setting one would time the defaults); such a one is refused
    assert bench_ring.captured_constants(module) == set()
    monkeypatch.setattr(bench_ring, "captured_constants", lambda _: {constant})
    with pytest.raises(SystemExit):
        bench_ring.main(["--mixer", mixer, "--constants", f"{constant}=1"])
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| chain") or
             line.startswith("| tree")]
    assert len(table) == 2 * len(batches)
    monkeypatch.setattr(bench_ring, "TRANSPOSED", False)  # (restored after the test)
    if mixer == "gdn":  # the checkpoints stored [.., dv, dk], as engines store them
        assert bench_ring.main(["--batches", "2", "--capacity", "8", "--drafts", "chain", "--transposed"]) == 0
        assert bench_ring.TRANSPOSED
        assert len([line for line in capsys.readouterr().out.splitlines() if line.startswith("| chain")]) == 1
        if INTERPRET:  # the conv's tiles (interpreted; a tile wider than the channels too)
            assert bench_ring.main(["--batches", "2", "--capacity", "8", "--conv-sweep", "32/1", "128/2/1"]) == 0
            rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |")]
            assert [row.split(" | ")[1] for row in rows] == ["default", "32/1", "128/2/1"]
            assert all("failed" not in row for row in rows)
    else:
        with pytest.raises(SystemExit):
            bench_ring.main(["--mixer", mixer, "--transposed"])
    if mixer == "mamba2" and INTERPRET:
        assert bench_ring.main(["--batches", "2", "--capacity", "8", "--mixer", mixer, "--sweep", "16/4/1",
                                "16/4/2/1/tf32", "16/4/1/fold_heads_per_program=2"]) == 0
        rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |")]
        assert len(rows) == 3 and not any("failed" in row for row in rows), rows
    assert bench_ring.main(["--batches", "2", "--capacity", "8", "--mixer", mixer, "--drafts", "tree",
                            "--profile"]) == 0
    out = capsys.readouterr().out  # (no kernel events on the CPU: the flow and the table's header only)
    assert "tree B=2: graph step 4.0 us, its kernels 0.0 us (eager)" in out, out  # (8 us: a graph of 2)
    assert "| kernel | launches per step | us per step | share |" in out
    # by default each step's folds first, every layer: flush(num_draft=N) with the verify's N
    flushes = []
    flush = getattr(bench_ring.sgl_convwin, f"{mixer}_ring_flush")
    monkeypatch.setattr(bench_ring.sgl_convwin, f"{mixer}_ring_flush",
                        lambda *args, **kwargs: flushes.append(kwargs.get("num_draft")) or flush(*args, **kwargs))
    assert bench_ring.main(["--batches", "2", "--capacity", "8", "--mixer", mixer, "--drafts", "chain"]) == 0
    assert flushes and set(flushes) == {4} and bench_ring.DUE_FIRST
    capsys.readouterr()
    flushes.clear()
    assert bench_ring.main(["--batches", "2", "--capacity", "8", "--mixer", mixer, "--drafts", "chain",
                            "--no-due-first"]) == 0
    assert not bench_ring.DUE_FIRST and None not in flushes and 4 not in flushes
    if mixer == "gdn" and INTERPRET:
        assert bench_ring.main(["--batches", "2", "--capacity", "8", "--mixer", mixer, "--sweep", "16/4/ieee"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert ("| B | tile | pending 8, us per layer | pending 4, us per layer | pending 8 (fold), us per layer | "
                "1 row in 6 folding, the others 8, us per layer |") in out
        assert [line for line in out if line.startswith("| 2 |")] == ["| 2 | 16/4/ieee | 8.0 | 8.0 | 8.0 | 8.0 |"]
        # --ncu: one column's launches run (untimed) for the profiler, the others not at all
        calls = []
        real_launch = triton_kernels().launch_gdn_ring_verify
        monkeypatch.setattr(triton_kernels(), "launch_gdn_ring_verify",
                            lambda *args, **kwargs: calls.append(1) or real_launch(*args, **kwargs))
        assert bench_ring.main(["--batches", "2", "--capacity", "8", "--mixer", mixer, "--sweep", "16/4/ieee",
                                "--ncu", "mixed"]) == 0
        assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |")] == [
            "| 2 | 16/4/ieee | - | - | - | profiled |"]
        assert len(calls) == 3
        with pytest.raises(SystemExit):
            bench_ring.main(["--mixer", mixer, "--ncu", "fold"])
        # --flush-sweep: the due flush's launches alone, per tuning (a stubbed timer: 8 - 8 us)
        monkeypatch.setattr(bench_ring.sgl_convwin, "gdn_ring_flush", flush)  # (the public op again)
        flushes = []
        real_flush = triton_kernels().launch_gdn_ring_flush
        monkeypatch.setattr(triton_kernels(), "launch_gdn_ring_flush",
                            lambda *args, **kwargs: flushes.append(kwargs) or real_flush(*args, **kwargs))
        assert bench_ring.main(["--batches", "2", "--capacity", "8", "--flush-sweep", "-", "fold_tiles=0"]) == 0
        assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |")] == [
            "| 2 | - | 0.0 |", "| 2 | fold_tiles=0 | 0.0 |"]
        assert [kwargs.get("fold_tiles") for kwargs in flushes] == [None, 0]
        assert {kwargs["num_draft"] for kwargs in flushes} == {4}
        with pytest.raises(SystemExit):
            bench_ring.main(["--mixer", "mamba2", "--flush-sweep", "-"])


@pytest.mark.parametrize("mixer", ["gdn", "mamba2"])
def test_check_fails_a_wrong_verify(monkeypatch, capsys, mixer):
    """The check before any timing (CPU: the op is the PyTorch code, so it agrees bit for bit) fails
    an op whose outputs are off, chains and trees, and main then times nothing."""
    import dataclasses

    import sgl_convwin

    tiny = dict(gdn=dataclasses.replace(bench_ring.SHAPES["gdn"], layers=2, k_heads=1, v_heads=2, head_k=16,
                                        head_v=16),
                mamba2=dataclasses.replace(bench_ring.SHAPES["mamba2"], layers=2, heads=2, head_dim=16, groups=1,
                                           d_state=16))
    monkeypatch.setattr(bench_ring, "DEVICE", "cpu")
    assert bench_ring.check(mixer, tiny[mixer], 8)
    assert capsys.readouterr().out.count("(ok)") == 2
    op = getattr(sgl_convwin, f"{mixer}_ring_verify")

    class Off:  # the op, its outputs shifted by 1
        kernel_arguments = staticmethod(op.kernel_arguments)

        def __call__(self, out, *args, **kwargs):
            op(out, *args, **kwargs)
            out += 1.0

    monkeypatch.setattr(sgl_convwin, f"{mixer}_ring_verify", Off())
    assert not bench_ring.check(mixer, tiny[mixer], 8)
    assert capsys.readouterr().out.count("(FAILED)") == 2
    monkeypatch.setattr(bench_ring, "SHAPES", tiny)
    monkeypatch.setattr(bench_ring, "read_ceiling_gbps", lambda: 4000.0)
    monkeypatch.setattr(bench_ring, "copy_ceiling_gbps", lambda: 3000.0)
    monkeypatch.setattr(bench_ring, "environment_line", lambda: "env")
    assert bench_ring.main(["--batches", "2", "--capacity", "8", "--mixer", mixer]) == 1
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
