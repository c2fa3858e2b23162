"""The package as users meet it: the kernels are found from a checkout and an install alike, and
the command line works."""

import os
import subprocess
import sys

import pytest

import sgl_convwin
from sgl_convwin import cli
from support import HAS_TRITON

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
    assert "OK: every layout committed exactly what the oracle says" in out
    for layout in sgl_convwin.LAYOUTS:
        assert f"{layout} " in out


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "sgl_convwin", "selfcheck", "--num-draft", "2"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "D=2" in out.stdout


@pytest.mark.parametrize("args", [["--kernel-size", "1"], ["--num-draft", "0"]])
def test_selfcheck_rejects_impossible_sizes_without_a_traceback(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["selfcheck", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--kernel-size >= 2" in err and "Traceback" not in err
