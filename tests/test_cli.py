"""The command line refuses every bad argument as argparse does -- exit status 2, one line on
stderr, no traceback -- and runs the edge cases it accepts."""

import io
import subprocess
import sys

import pytest
import torch

from sgl_convwin import cli, demo
from support import usage_error

DEMO_ERRORS = [
    (["--requests", "0"], "argument --requests: must be >= 1, got 0"),
    (["--tokens", "-1"], "argument --tokens: must be >= 1, got -1"),
    (["--tokens", "many"], "argument --tokens: invalid int value: 'many'"),
    (["--draft", "0"], "argument --draft: must be >= 1, got 0"),
    (["--tree-nodes", "0"], "argument --tree-nodes: must be >= 1, got 0"),
    (["--layers", "0"], "argument --layers: must be >= 1, got 0"),
    (["--topk", "1"], "argument --topk: must be >= 2, got 1"),
    (["--device", "tpu"], "argument --device: not a device: 'tpu'"),
    (["--device", "mps"], "argument --device: 'mps': the ops run on cpu or cuda[:index]"),
    (["--layouts", "rows"], "argument --layouts: invalid choice: 'rows'"),
    (["--capacity", "16"], "--capacity needs --ring"),
    (["--ring", "--mixer", "linear"], "--ring runs Gated DeltaNet or Mamba2 layers (--mixer gdn|mamba2), not "
                                      "--mixer linear"),
    (["--ring", "--layouts", "dense"], "--layouts does not apply to --ring"),
    (["--ring", "--capacity", "7"], "--capacity 7 must be >= --draft and --tree-nodes (8)"),
    (["--ring", "--capacity", "0"], "argument --capacity: must be >= 1, got 0"),
    (["--topk", "65"], "argument --topk: must be <= 64 (the tiny model's vocabulary), got 65"),
    (["--ring", "--draft", "65", "--capacity", "65"], "--ring verifies at most 64 draft tokens a step"),
    (["--ring", "--tree-nodes", "65", "--capacity", "65"], "--ring verifies at most 64 draft tokens a step"),
    (["--seed", str(2**32)], f"argument --seed: must be <= {2**32 - 1} (a 32-bit seed), got {2**32}"),
    (["--seed", "-1"], "argument --seed: must be >= 0, got -1"),
]
SELFCHECK_ERRORS = [
    (["--num-draft", "65"], "argument --num-draft: must be <= 64 (the verify ops' most), got 65"),
    (["--seed", str(2**64)], "argument --seed: must be <= 4294967295"),
]


@pytest.mark.parametrize("args, message", DEMO_ERRORS)
def test_demo_refuses_bad_arguments(capsys, args, message):
    usage_error(capsys, ["demo", *args], message)


@pytest.mark.parametrize("args, message", SELFCHECK_ERRORS)
def test_selfcheck_refuses_bad_arguments(capsys, args, message):
    usage_error(capsys, ["selfcheck", *args], message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA build with a GPU accepts --device cuda")
@pytest.mark.parametrize("command, device", [("demo", "cuda"), ("selfcheck", "cuda:7")])
def test_cuda_without_a_cuda_device(capsys, command, device):
    usage_error(capsys, [command, "--device", device], f"argument --device: '{device}': torch")


def test_cuda_index_beyond_the_visible_devices(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    usage_error(capsys, ["selfcheck", "--device", "cuda:2"], "only 2 CUDA device(s) visible")


PLAN_ERRORS = [
    (["--model", "qwen3-next-80b-a3b", "--plot", "/nonexistent/dir/x.png"],
     "--plot /nonexistent/dir/x.png: the folder /nonexistent/dir does not exist"),
    (["--model", "qwen3-next-80b-a3b", "--layers", "0"], "--layers must be >= 1, got 0"),
    (["--model", "qwen3-next-80b-a3b", "--tp", "0"], "tp must be >= 1"),
    (["--model", "custom", "--layers", "2", "--conv-dim", "8", "--kernel-size", "1"], "--kernel-size must be >= 2"),
    (["--model", "qwen3-next-80b-a3b", "--kernel-size", "3"], "--kernel-size applies only to --model custom"),
    (["--model", "nemotron-h-8b", "--conv-dim", "8", "--ssm-state", "4"],
     "--conv-dim, --ssm-state apply only to --model custom"),
    (["--model", "llama"], "argument --model: invalid choice: 'llama'"),
    (["--model", "qwen3-next-80b-a3b", "--plot", ""], "--plot '': a file name is needed"),
    (["--model", "qwen3-next-80b-a3b", "--plot", "/tmp"], "--plot '/tmp': a file name is needed"),
]


@pytest.mark.parametrize("args, message", PLAN_ERRORS)
def test_plan_refuses_bad_arguments(capsys, args, message):
    usage_error(capsys, ["plan", *args], message)


def test_plot_into_an_unwritable_file(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    folder = tmp_path / "x.png"
    folder.mkdir()  # a folder, whatever its name, is no file to write
    usage_error(capsys, ["plan", "--model", "qwen3-next-80b-a3b", "--plot", str(folder)],
                f"--plot '{folder}': a file name is needed")
    usage_error(capsys, ["plan", "--model", "qwen3-next-80b-a3b", "--plot", "/proc/x.png"], "--plot /proc/x.png")


def test_plot_writes_exactly_the_file_named(tmp_path, capsys):
    """A name without an extension (or another one) is still the PNG's file: matplotlib would add
    .png to it, or read the format from it."""
    pytest.importorskip("matplotlib")
    for name in ("plan", "plan.data"):
        assert cli.main(["plan", "--model", "qwen3-next-80b-a3b", "--plot", str(tmp_path / name)]) == 0
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan", "plan.data"]
    assert f"plot written to {tmp_path / 'plan.data'}" in capsys.readouterr().out


def test_a_closed_pipe_shows_no_traceback():
    """`... plan --json | head -c 100`: the reader leaves early; the command ends without a traceback."""
    command = [sys.executable, "-m", "sgl_convwin", "plan", "--model", "qwen3-next-80b-a3b", "--json"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        process.stdout.close()  # (before the command writes: it is still importing torch)
        stderr = process.stderr.read().decode()
        assert process.wait() == 1 and not stderr, stderr


def test_an_interrupt_shows_no_traceback(capsys, monkeypatch):
    """Ctrl-C during a command: one line and the shell's status for SIGINT."""
    def interrupted(argv):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "_run", interrupted)
    assert cli.main(["demo"]) == 130
    assert capsys.readouterr().err == "sgl_convwin: interrupted\n"


def test_the_module_shows_no_traceback():
    """What a user sees from the shell for a refused argument: exit status 2 and one line."""
    out = subprocess.run([sys.executable, "-m", "sgl_convwin", "demo", "--device", "tpu"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.splitlines()) == 1 and "error: argument --device" in out.stderr


@pytest.mark.parametrize("mixer", demo.MIXERS)
def test_one_node_drafts_decode_exactly(mixer):
    """--draft 1 / --tree-nodes 1: one token per verify step, nothing drafted; the streams still
    equal greedy decoding and the acceptance rate is n/a, not a division by zero."""
    out = io.StringIO()
    assert demo.run_demo(new_tokens=5, batch=2, prompt_len=4, draft=1, tree_nodes=1, topk=3, layers=2,
                         show_progress=False, out=out, mixer=mixer)
    table = [line for line in out.getvalue().splitlines() if line.startswith("| ") and "layout" not in line]
    assert len(table) == 6 and all("| yes | n/a | 1.00 |" in line for line in table), out.getvalue()


def test_demo_cli_with_one_node_drafts(capsys):
    assert cli.main(["demo", "--draft", "1", "--tree-nodes", "1", "--tokens", "3", "--requests", "1",
                     "--layers", "1", "--no-progress", "--layouts", "token_major"]) == 0
    assert "all streams identical to greedy decoding" in capsys.readouterr().out


@pytest.mark.parametrize("mixer", ["gdn", "mamba2"])
def test_demo_ring_cli(capsys, mixer):
    """demo --ring: exit status 0 and the ring's lines; 1 when a stream differs from greedy decoding."""
    args = ["demo", "--ring", "--capacity", "8", "--tokens", "6", "--requests", "2", "--layers", "2", "--no-progress",
            "--mixer", mixer]
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert "| ring R=8 | chain N=4 topk 1 | yes |" in text and "| ring R=8 | tree N=8 topk 3 | yes |" in text
    assert "all streams identical to greedy decoding" in text


def test_demo_ring_cli_exit_status_on_a_difference(monkeypatch):
    monkeypatch.setattr(demo, "greedy_reference", lambda *a: [[0] * 6, [0] * 6])
    assert cli.main(["demo", "--ring", "--tokens", "6", "--requests", "2", "--layers", "2", "--no-progress"]) == 1
