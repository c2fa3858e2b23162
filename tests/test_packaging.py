"""The package as users meet it: the kernels are found from a checkout and an install alike, and
the command line works."""

import os
import subprocess
import sys

import pytest

import sgl_convwin
from sgl_convwin import cli
from support import HAS_TRITON, usage_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_source_checkout_finds_its_kernels():
    """With the checkout first on sys.path and no install finder, csrc_triton/ beside the package
    is loaded as sgl_convwin.csrc_triton (what happens when tests run from the repo root against
    a non-editable install)."""
    code = (
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "import sgl_convwin, sgl_convwin._kernels as k\n"
        "m = k.triton_kernels()\n"
        "print(sgl_convwin.__file__, m.__file__, m.launch_scatter_tree.__module__)\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    package_file, kernels_file, module = out.stdout.split()
    assert package_file == os.path.join(ROOT, "sgl_convwin", "__init__.py")
    assert kernels_file == os.path.join(ROOT, "csrc_triton", "__init__.py")
    assert module == "sgl_convwin.csrc_triton.scatter_tree"


def test_selfcheck_passes(capsys):
    assert cli.main(["selfcheck"]) == 0
    out = capsys.readouterr().out
    assert "OK: every op matched its oracle" in out
    for op in ("causal_conv1d_verify", "capture", "scatter / scatter_tree", "capture_gates", "gdn_commit",
               "mamba2_commit"):
        for layout in sgl_convwin.LAYOUTS:
            assert any(line.split() == [*op.split(), layout, "ok", "ok"] for line in out.splitlines()), (op, layout)
    for op in ("gdn_verify", "mamba2_verify"):
        assert [op, "-", "ok", "ok"] in [line.split() for line in out.splitlines()], op


@pytest.mark.parametrize("op", ["gdn_commit", "mamba2_commit", "scatter_tree", "capture_gates", "gdn_verify",
                                "mamba2_verify"])
def test_selfcheck_fails_when_an_op_is_wrong(monkeypatch, capsys, op):
    """An op that writes nothing must turn its lines to FAIL and the exit status to 1."""
    monkeypatch.setattr(f"sgl_convwin.selfcheck.{op}", lambda *args, **kwargs: None)
    assert cli.main(["selfcheck", "--num-draft", "2"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "FAILED" in out


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "sgl_convwin", "selfcheck", "--num-draft", "2"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "N=2 draft tokens" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["--kernel-size", "1"], "argument --kernel-size: must be >= 2, got 1"),
    (["--num-draft", "0"], "argument --num-draft: must be >= 1, got 0"),
])
def test_selfcheck_rejects_impossible_sizes_without_a_traceback(args, message, capsys):
    usage_error(capsys, ["selfcheck", *args], message)
