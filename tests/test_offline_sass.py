"""scripts/offline_sass.py, the offline compile of the recurrence kernels' launches: it compiles
mamba2_verify's launch for sm_90 here (no GPU needed) and reports ptxas's counts."""

import ast
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
