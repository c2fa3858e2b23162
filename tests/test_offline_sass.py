"""scripts/offline_sass.py, the offline compile of the recurrence kernels' launches: it compiles
mamba2_verify's launch for sm_90 here (no GPU needed) and reports ptxas's counts; and
scripts/ncu_lines.py, which matches a Nsight Compute profile to that compile's source lines."""

import ast
import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "offline_sass.py")


def test_counts_for_sm90():
    pytest.importorskip("triton")
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}  # (compiled, not interpreted)
    run = subprocess.run([sys.executable, SCRIPT, "mamba2_verify", "--batch", "2", "--tunings", "{}", "--opcodes", "5"],
                         env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    line = next(line for line in run.stdout.splitlines() if line.startswith("{} _mamba2_verify_kernel grid (256, 2):"))
    counts = ast.literal_eval(line.split(": ", 1)[1])
    assert counts["registers"] > 0 and counts["instructions"] > 0 and counts["mma.sync"] > 0
    opcodes = dict(counts["opcodes"])  # the five most frequent, as many as the SASS holds of each
    assert len(opcodes) == 5 and opcodes.get("HMMA", counts["mma.sync"]) == counts["mma.sync"]
    assert sum(opcodes.values()) <= counts["instructions"] and all(name.isupper() for name in opcodes)


def _ncu_csv(path, kernel_name, opcodes, executed, samples):
    """An ``ncu --page source --csv --print-source sass`` file of one kernel: per instruction its SASS,
    its executed count and its stall samples (all of them long-scoreboard ones)."""
    import csv

    with open(path, "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["Kernel Name", kernel_name])
        rows.writerow(["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
                       "stall_long_sb", "stall_long_sb (Not Issued)"])
        for i, (op, n, s) in enumerate(zip(opcodes, executed, samples)):
            rows.writerow([hex(0x7F0000 + 16 * i), f"{op} R0, R1", str(s), f"{n:,}", str(s), "0"])


def test_ncu_lines_matches_a_profile_to_source_lines(tmp_path):
    """scripts/ncu_lines.py against a profile written from the compile itself: each line's share of
    the instructions executed is the sum over its instructions, and a profile of another compile (one
    opcode changed) is refused rather than mismatched."""
    pytest.importorskip("triton")
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}  # (compiled)
    lines_script = os.path.join(os.path.dirname(SCRIPT), "ncu_lines.py")
    dump = ("import json, sys; sys.path.insert(0, sys.argv[1]); import ncu_lines, offline_sass; "
            "call = offline_sass.KERNELS['mamba2_verify'](2, {})[0]; "
            "print(json.dumps([call.kernel.__name__, ncu_lines.compiled_lines(call, 90)]))")
    run = subprocess.run([sys.executable, "-c", dump, os.path.dirname(SCRIPT)], env=env, capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    name, compiled = json.loads(run.stdout.splitlines()[-1])
    assert compiled and all(op.isupper() for op, _ in compiled)
    lines = [tuple(where) for _, where in compiled if where is not None]
    target = max(set(lines), key=lines.count)  # the line with the most instructions
    on_target = [where is not None and tuple(where) == target for _, where in compiled]
    executed = [1000 if hit else 1 for hit in on_target]
    expected = 100 * sum(n for n, hit in zip(executed, on_target) if hit) / sum(executed)
    path = tmp_path / "sass.csv"
    _ncu_csv(path, name, [op for op, _ in compiled], executed, [3] * len(compiled))
    run = subprocess.run([sys.executable, lines_script, str(path), "mamba2_verify", "--batch", "2", "--top", "1"],
                         env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    shown = run.stdout.splitlines()[-1].split()
    assert shown[0] == f"{target[0]}:{target[1]}" and shown[1] == f"{expected:.1f}%"

    other = [op for op, _ in compiled]
    other[len(other) // 2] = "BRA" if other[len(other) // 2] != "BRA" else "NOP"
    _ncu_csv(path, name, other, executed, [3] * len(compiled))
    run = subprocess.run([sys.executable, lines_script, str(path), "mamba2_verify", "--batch", "2"], env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 1 and "another compile was profiled" in run.stdout
