"""python -m sgl_convwin plan: sizes computed from first principles, JSON, errors, plot."""

import json

import pytest

from sgl_convwin import cli, plan


def run_json(capsys, *args):
    assert cli.main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_qwen3_next_chain_from_first_principles(capsys):
    result = run_json(capsys, "--model", "qwen3-next-80b-a3b")
    layers, dim, D, K, bf16 = 36, 8192, 4, 4, 2
    assert result["dense_bytes_per_slot"] == layers * D * dim * (K - 1) * bf16  # D windows of K-1
    assert result["dedup_bytes_per_slot"] == layers * (D + K - 2) * dim * bf16  # one sequence
    assert result["saving_bytes_total"] == 256 * (result["dense_bytes_per_slot"] - result["dedup_bytes_per_slot"])
    assert result["ssm_snapshot_bytes_per_slot"] == layers * D * 32 * 128 * 128 * 4


def test_nemotron_tree_per_rank(capsys):
    result = run_json(capsys, "--model", "nemotron-h", "--tp", "4", "--max-running-requests", "10")
    layers, dim, N, K = 23, 6144 // 4, 5, 4  # the preset's tree: 5 draft tokens, topk 3
    assert (result["topk"], result["conv_dim_per_rank"]) == (3, dim)
    assert result["dense_bytes_per_slot"] == layers * N * dim * (K - 1) * 2
    assert result["dedup_bytes_per_slot"] == layers * (N + K - 2) * dim * 2
    assert result["ssm_snapshot_bytes_per_slot"] == layers * N * (64 * 64 * 128 // 4) * 4
    assert 0 < result["saving_share_of_speculative_state"] < 0.05  # the honest part


def test_overrides_and_custom(capsys):
    result = run_json(capsys, "--model", "custom", "--layers", "2", "--conv-dim", "100", "--kernel-size", "3",
                      "--draft-tokens", "6", "--topk", "2", "--dtype", "fp32")
    assert result["dense_bytes_per_slot"] == 2 * 6 * 100 * 2 * 4
    assert result["dedup_bytes_per_slot"] == 2 * 7 * 100 * 4
    assert run_json(capsys, "--model", "qwen3.5-35b-a3b", "--layers", "10")["conv_layers"] == 10


def test_table_output(capsys):
    assert cli.main(["plan", "--model", "qwen3-next-80b-a3b", "--tp", "2"]) == 0
    text = capsys.readouterr().out
    assert "conv_dim 4096" in text and "SSM state snapshots" in text and "(0.50x)" in text


@pytest.mark.parametrize("args, message", [
    (["--model", "nemotron-h", "--tp", "5"], "not divisible by tp=5"),
    (["--model", "custom", "--layers", "3"], "needs --conv-dim"),
    (["--model", "qwen3-next-80b-a3b", "--draft-tokens", "0"], "draft tokens and topk must be >= 1"),
])
def test_errors(args, message):
    with pytest.raises(SystemExit, match=message):
        cli.main(["plan", *args])


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "memory.png"
    assert cli.main(["plan", "--model", "nemotron-h", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_presets_are_consistent():
    for name, shape in plan.PRESETS.items():
        assert shape.conv_dim % 8 == 0 and shape.kernel_size == 4, name
