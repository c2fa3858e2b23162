"""python -m sgl_convwin plan: sizes computed from first principles, JSON, errors, plot."""

import json

import pytest
import torch

from sgl_convwin import cli, plan
from support import usage_error


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
    (["--model", "qwen3-next-80b-a3b", "--draft-tokens", "0"], "draft tokens must be >= 1, got 0"),
    (["--model", "qwen3-next-80b-a3b", "--topk", "0"], "topk must be >= 1, got 0"),
    (["--model", "qwen3-next-80b-a3b", "--max-running-requests", "-1"], "max running requests must be >= 0, got -1"),
])
def test_errors(capsys, args, message):
    usage_error(capsys, ["plan", *args], message)


def test_shapes_the_ops_refuse_are_sized_with_a_note(capsys):
    gdn = ["--model", "custom", "--layers", "2", "--mixer", "gdn", "--num-k-heads", "2", "--head-k-dim", "64",
           "--num-v-heads", "4", "--head-v-dim", "64"]
    for extra, shown in (([], False), (["--kernel-size", "9"], True), (["--draft-tokens", "65"], True)):
        assert cli.main(["plan", *gdn, *extra]) == 0
        assert ("Sizes only: the package's commits, verifies and ring take K <= 5" in capsys.readouterr().out) == shown


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "memory.png"
    assert cli.main(["plan", "--model", "nemotron-h", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_presets_are_consistent():
    for name, shape in plan.PRESETS.items():
        assert shape.conv_dim % 8 == 0 and shape.kernel_size == 4, name


# --- the whole speculative state: four designs (issues 14, 15, 17) -------------------------------

OLD_KEYS = {  # what the first planner printed and callers may read: still there, same meaning
    "model", "tp", "draft_tokens", "topk", "max_running_requests", "dtype", "conv_layers",
    "conv_dim_per_rank", "kernel_size", "dedup_layout", "dense_bytes_per_slot", "dedup_bytes_per_slot",
    "saving_bytes_per_slot", "saving_bytes_total", "dedup_ratio", "ssm_snapshot_bytes_per_slot",
    "saving_share_of_speculative_state",
}
DESIGN_KEYS = ("snapshot", "dedup_snapshot", "input_replay", "replay")

# CONTEXT.md's shapes table at TP1: (mixer layers, conv_dim, state MiB per layer)
TABLE = {
    "qwen3-next-80b-a3b": (36, 8192, 2), "qwen3.5-35b-a3b": (30, 8192, 2), "qwen3.5-9b": (24, 8192, 2),
    "qwen3.5-0.8b": (18, 6144, 1), "nemotron-h-8b": (24, 10240, 4), "nemotron-h-47b": (45, 20480, 16),
    "nemotron-h-56b": (54, 20480, 16), "nemotron-3-nano-30b-a3b": (23, 6144, 2),
}


def test_qwen3_next_exact_values(capsys):
    """The numbers the issue fixes: Qwen3-Next TP1, D = 4, bf16."""
    result = run_json(capsys, "--model", "qwen3-next-80b-a3b", "--draft-tokens", "4", "--dtype", "bf16")
    assert result["snapshot_bytes_per_slot"] == 309_067_776 == 36 * (4 * 8192 * 3 * 2) + 36 * 4 * 32 * 128 * 128 * 4
    assert result["replay_bytes_per_slot"] == 3_575_808 == 36 * 6 * 8192 * 2 + 36 * 4 * 2 * 32 * 4
    assert result["dedup_snapshot_bytes_per_slot"] == 36 * 6 * 8192 * 2 + 36 * 4 * 32 * 128 * 128 * 4
    # widened conv state (+D columns) + post-conv k, v (16*128 + 32*128, bf16) + fp32 g, beta per token
    assert result["input_replay_bytes_per_slot"] == 36 * 4 * 8192 * 2 + 36 * 4 * 6144 * 2 + 36 * 4 * 64 * 4
    assert [d["key"] for d in result["designs"]] == list(DESIGN_KEYS)
    for design in result["designs"]:
        assert design["bytes_per_slot"] == result[f"{design['key']}_bytes_per_slot"] == sum(design["parts"].values())
        assert design["bytes_total"] == 256 * design["bytes_per_slot"] == result[f"{design['key']}_bytes_total"]
    assert result["replay_ratio_to_snapshot"] == 3_575_808 / 309_067_776
    assert OLD_KEYS <= result.keys()


def test_designs_ordered_for_qwen3_next(capsys):
    sizes = [run_json(capsys, "--model", "qwen3-next-80b-a3b")[f"{key}_bytes_per_slot"] for key in DESIGN_KEYS]
    assert sizes[0] > sizes[1] > sizes[2] > sizes[3]


@pytest.mark.parametrize("name", sorted(TABLE))
def test_presets_from_their_dims(name):
    shape = plan.PRESETS[name]
    mixer = shape.mixer
    if isinstance(mixer, plan.GatedDeltaNet):
        hk, dk, hv, dv = mixer.num_k_heads, mixer.head_k_dim, mixer.num_v_heads, mixer.head_v_dim
        conv_dim, state = 2 * hk * dk + hv * dv, hv * dk * dv
        gates, cached = 2 * hv, hk * dk + hv * dv
    else:
        h, p, g, ns = mixer.num_heads, mixer.head_dim, mixer.n_groups, mixer.d_state
        conv_dim, state = h * p + 2 * g * ns, h * p * ns
        gates, cached = h, h * p + g * ns
    assert (shape.conv_dim, shape.ssm_state_elements) == (conv_dim, state)
    assert (mixer.gate_scalars, mixer.cached_inputs) == (gates, cached)
    layers, table_dim, mib = TABLE[name]
    assert (shape.conv_layers, conv_dim, state * 4) == (layers, table_dim, mib * 2**20)
    assert "nothing assumed" in shape.source or "ASSUMED" in shape.source  # each source says which
    assert shape.draft_source


def test_nemotron_h_alias_and_mamba2_keys(capsys):
    assert plan.PRESETS["nemotron-h"] is plan.PRESETS["nemotron-3-nano-30b-a3b"]
    result = run_json(capsys, "--model", "nemotron-h-8b", "--draft-tokens", "4", "--topk", "1")
    layers, dim, state = 24, 10240, 128 * 64 * 128
    assert result["mixer"] == "mamba2"
    assert result["snapshot_bytes_per_slot"] == layers * 4 * dim * 3 * 2 + layers * 4 * state * 4
    assert result["replay_bytes_per_slot"] == layers * 6 * dim * 2 + layers * 4 * 128 * 4  # dt per head
    # x and B (128*64 + 8*128) in bf16 + fp32 dt, conv state widened by 4 columns
    widened, x_and_b, dt = layers * 4 * dim * 2, layers * 4 * (8192 + 1024) * 2, layers * 4 * 128 * 4
    assert result["input_replay_bytes_per_slot"] == widened + x_and_b + dt


def test_tree_sizing(capsys):
    """topk > 1: dense windows N*(K-1) columns, dedup N+K-2 rows, one snapshot and one set of gates per
    node; input replay (no engine replays trees) keeps dense windows plus the per-node inputs."""
    n, k, layers, dim = 8, 4, 36, 8192
    result = run_json(capsys, "--model", "qwen3-next-80b-a3b", "--draft-tokens", str(n), "--topk", "3")
    snapshots, gates = layers * n * 32 * 128 * 128 * 4, layers * n * 64 * 4
    assert result["dense_bytes_per_slot"] == layers * n * (k - 1) * dim * 2
    assert result["dedup_bytes_per_slot"] == layers * (n + k - 2) * dim * 2
    assert result["snapshot_bytes_per_slot"] == result["dense_bytes_per_slot"] + snapshots
    assert result["dedup_snapshot_bytes_per_slot"] == result["dedup_bytes_per_slot"] + snapshots
    assert result["input_replay_bytes_per_slot"] == result["dense_bytes_per_slot"] + layers * n * 6144 * 2 + gates
    assert result["replay_bytes_per_slot"] == layers * (n + k - 2) * dim * 2 + gates
    assert "rows, one per node" in result["dedup_layout"]


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b", "nemotron-h-8b"])
def test_everything_mixer_wide_divides_by_tp(capsys, name):
    base = run_json(capsys, "--model", name)
    for tp in (2, 4, 8):
        result = run_json(capsys, "--model", name, "--tp", str(tp))
        assert result["conv_dim_per_rank"] * tp == base["conv_dim_per_rank"]
        for key in ("state_bytes_per_layer", "gate_scalars_per_token", "cached_inputs_per_token",
                    *(f"{design}_bytes_per_slot" for design in DESIGN_KEYS)):
            assert result[key] * tp == base[key], (tp, key)
    mixer = plan.PRESETS[name].mixer.per_rank(4, name)
    assert mixer.conv_dim * 4 == plan.PRESETS[name].conv_dim


@pytest.mark.parametrize("args, message", [
    (["--model", "qwen3.5-0.8b", "--tp", "32"], "num_k_heads 16 is not divisible by tp=32"),
    (["--model", "nemotron-h-8b", "--tp", "16"], "n_groups 8 is not divisible by tp=16"),
    (["--model", "qwen3-next-80b-a3b", "--tp", "0"], "tp must be >= 1"),
])
def test_tp_errors(capsys, args, message):
    usage_error(capsys, ["plan", *args], message)


GDN_DIMS = ["--num-k-heads", "2", "--head-k-dim", "8", "--num-v-heads", "4", "--head-v-dim", "8"]


@pytest.mark.parametrize("args, message", [
    (["--layers", "2", "--mixer", "gdn", "--num-k-heads", "2"], "needs --head-k-dim, --num-v-heads, --head-v-dim"),
    (["--layers", "2", "--num-heads", "4"], "--num-heads needs --mixer"),
    (["--layers", "2", "--mixer", "gdn", *GDN_DIMS, "--d-state", "4"], "--d-state does not apply to --mixer gdn"),
    (["--layers", "2", "--mixer", "mamba2", "--num-heads", "4", "--head-dim", "4"], "needs --n-groups, --d-state"),
    (["--layers", "2", "--mixer", "gdn", *GDN_DIMS, "--conv-dim", "100"], "conv_dim 100 does not match"),
    (["--layers", "2", "--mixer", "gdn", *GDN_DIMS, "--ssm-state", "7"], "SSM state 7 does not match"),
    (["--mixer", "gdn", *GDN_DIMS], "needs --layers"),
    (["--layers", "2", "--mixer", "gdn", *GDN_DIMS[:-1], "0"], "every dim must be >= 1"),
])
def test_custom_errors(capsys, args, message):
    usage_error(capsys, ["plan", "--model", "custom", *args], message)


def test_custom_dims_only_for_custom(capsys):
    usage_error(capsys, ["plan", "--model", "qwen3-next-80b-a3b", "--conv-dim", "4096", "--mixer", "gdn"],
                "--conv-dim, --mixer apply only to --model custom")
    usage_error(capsys, ["plan", "--model", "qwen3-next-80b-a3b", "--kernel-size", "3"],
                "--kernel-size applies only to --model custom")


def test_custom_with_mixer_dims(capsys):
    result = run_json(capsys, "--model", "custom", "--layers", "3", "--mixer", "gdn", *GDN_DIMS, "--dtype", "fp32")
    dim, state = 2 * 2 * 8 + 4 * 8, 4 * 8 * 8
    assert result["conv_dim_per_rank"] == dim and result["state_bytes_per_layer"] == state * 4
    assert result["snapshot_bytes_per_slot"] == 3 * 4 * 3 * dim * 4 + 3 * 4 * state * 4
    assert result["replay_bytes_per_slot"] == 3 * 6 * dim * 4 + 3 * 4 * 8 * 4
    result = run_json(capsys, "--model", "custom", "--layers", "3", "--mixer", "mamba2", "--num-heads", "4",
                      "--head-dim", "2", "--n-groups", "2", "--d-state", "3", "--tp", "2")
    assert result["conv_dim_per_rank"] == (4 * 2 + 2 * 2 * 3) // 2 and result["gate_scalars_per_token"] == 2


def test_custom_without_the_state_says_it_is_unknown(capsys):
    """No meaningless saving share: without the state's size, everything that needs it is null."""
    result = run_json(capsys, "--model", "custom", "--layers", "2", "--conv-dim", "100")
    assert result["saving_share_of_speculative_state"] is None and result["ssm_snapshot_bytes_per_slot"] is None
    assert all(result[f"{key}_bytes_per_slot"] is None for key in DESIGN_KEYS)
    assert cli.main(["plan", "--model", "custom", "--layers", "2", "--conv-dim", "100"]) == 0
    text = capsys.readouterr().out
    assert "recurrent state: UNKNOWN" in text and "share of the speculative state is unknown" in text
    assert "%" not in text
    # the state size alone gives the snapshot designs, not the replay ones (they need the mixer's dims)
    result = run_json(capsys, "--model", "custom", "--layers", "2", "--conv-dim", "100", "--ssm-state", "1000")
    assert result["snapshot_bytes_per_slot"] == 2 * 4 * 3 * 100 * 2 + 2 * 4 * 1000 * 4
    assert result["input_replay_bytes_per_slot"] is None and result["replay_bytes_per_slot"] is None
    assert 0 < result["saving_share_of_speculative_state"] < 1


def test_text_shows_what_is_planned(capsys):
    """--draft-tokens 8 --topk 3 on a topk-1 preset: the text says tree of 8, never the preset's chain."""
    assert cli.main(["plan", "--model", "qwen3-next-80b-a3b", "--draft-tokens", "8", "--topk", "3"]) == 0
    text = capsys.readouterr().out
    assert "tree of 8 nodes (topk 3)" in text
    assert "topk 1" not in text and "4 draft tokens" not in text and "steps 3" not in text
    assert cli.main(["plan", "--model", "qwen3-next-80b-a3b"]) == 0
    text = capsys.readouterr().out
    assert "chain of 4 draft tokens" in text and "the preset's default" in text


def test_text_shows_four_designs_and_assumptions(capsys):
    assert cli.main(["plan", "--model", "qwen3-next-80b-a3b"]) == 0
    text = capsys.readouterr().out
    for label in ("(a) snapshots", "(b) dedup conv + snapshots", "(c) input replay", "(d) this package"):
        assert label in text
    assert "294.75 MiB" in text and "3.41 MiB" in text  # 309,067,776 and 3,575,808 bytes
    assert "NOT counted (every design keeps them)" in text and "in bf16" in text and "fp32" in text


def test_top_level_help_has_no_markup(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert "``" not in text and "plan" in text


def test_plot_shows_four_designs_uncut(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    for name, extra in (("qwen3-next-80b-a3b", ()), ("nemotron-h-47b", ("--draft-tokens", "16", "--tp", "8"))):
        path = tmp_path / f"{name}.png"
        assert cli.main(["plan", "--model", name, *extra, "--plot", str(path)]) == 0
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    p = plan.make_plan(plan.PRESETS["qwen3-next-80b-a3b"], 1, 4, 1, 256, "bf16")
    fig = plan.designs_figure(p)
    fig.canvas.draw()
    renderer, (ax,) = fig.canvas.get_renderer(), fig.axes
    assert len(ax.patches) == 4
    box = fig.bbox
    for text in (ax.title, ax.xaxis.label, *ax.texts, *ax.get_yticklabels()):
        extent = text.get_window_extent(renderer)
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1, text
    assert "qwen3-next-80b-a3b, TP1, chain of 4 draft tokens" in ax.get_title()
    plt.close(fig)
    capsys.readouterr()
    usage_error(capsys, ["plan", "--model", "custom", "--layers", "2", "--conv-dim", "64", "--plot",
                         str(tmp_path / "x.png")], "recurrent state is unknown")


# --- (e) the ring: memory per slot and state passes per step -----------------------------------


def test_ring_qwen3_next_tp1():
    """D = 4, R = 16, bf16 rows: 20 rows x 36 layers x (16 KiB of conv inputs + 256 B of g, beta), plus
    the cursor -- 11.4 MiB a slot (docs/design.md), within the issue's 12 MiB."""
    result = plan.make_plan(plan.PRESETS["qwen3-next-80b-a3b"], 1, 4, 1, 256, "bf16")
    assert (result.ring_capacity, result.ring_rows) == (16, 20)
    assert result.ring_parts == {"rows": 20 * 36 * 8192 * 2, "gates": 20 * 36 * 2 * 32 * 4, "cursor": 8}
    assert result.ring_bytes_per_slot == 11_980_808 and round(result.ring_bytes_per_slot / 2**20, 1) == 11.4
    assert result.ring_bytes_total == 256 * 11_980_808
    # a = 2.5: pending 2.5, 5, ..., 12.5 at the verifies, 12.5 + 4 > 16 folds: every F = floor(12 / 2.5) + 1 = 5 steps
    assert (result.accept_length, result.ring_fold_every_steps) == (2.5, 5)
    assert (result.replay_state_passes_per_step, result.ring_state_passes_per_step) == (3, 1.2)
    assert result.ring_state_passes_per_step_run == 1.4  # the fold's read, then the verify's
    assert result.ring_mean_pending_tokens == 7.5
    assert result.ring_pending_share_of_state_pass == 7.5 * (8192 * 2 + 256) / (32 * 128 * 128 * 4)


def test_ring_in_json_and_text(capsys):
    result = run_json(capsys, "--model", "qwen3-next-80b-a3b", "--capacity", "8", "--accept-length", "3")
    assert result["ring_bytes_per_slot"] == 36 * 12 * (8192 * 2 + 2 * 32 * 4) + 8
    assert result["ring_fold_every_steps"] == 2 and result["ring_state_passes_per_step"] == 1.5  # floor(4/3) + 1
    assert cli.main(["plan", "--model", "qwen3-next-80b-a3b"]) == 0
    text = capsys.readouterr().out
    assert "(e) the ring" in text and "20 rows per slot and layer" in text and "11.43 MiB per slot" in text
    assert "ring 1 + 1/F = 1.20" in text and "F = floor((R - N)/a) + 1 = 5 steps" in text and "(d) 3" in text
    assert "1 + 2/F = 1.40 as the kernels run" in text


def test_ring_nemotron_h_8b_tp1():
    """Mamba2 (H 128, conv dim 10240, 24 layers), its preset's tree of N = 8, R = 16, bf16 rows: 24 rows x
    24 layers x (20 KiB of conv inputs + 512 B of dt), plus the cursor; F = floor(8 / 2.5) + 1 = 4."""
    result = plan.make_plan(plan.PRESETS["nemotron-h-8b"], 1, 8, 3, 256, "bf16")
    assert (result.ring_capacity, result.ring_rows) == (16, 24)
    assert result.ring_parts == {"rows": 24 * 24 * 10240 * 2, "gates": 24 * 24 * 128 * 4, "cursor": 8}
    assert result.ring_bytes_per_slot == 12_091_400 and round(result.ring_bytes_per_slot / 2**20, 2) == 11.53
    assert (result.ring_fold_every_steps, result.ring_state_passes_per_step) == (4, 1.25)
    assert result.ring_mean_pending_tokens == 6.25
    assert result.ring_pending_share_of_state_pass == 6.25 * (10240 * 2 + 512) / (128 * 64 * 128 * 4)


def test_ring_of_mamba2_in_json_and_text(capsys):
    result = run_json(capsys, "--model", "nemotron-h-8b", "--draft-tokens", "4", "--topk", "1")
    assert result["ring_bytes_per_slot"] == 24 * 20 * (10240 * 2 + 128 * 4) + 8
    assert result["ring_state_passes_per_step"] == 1.2 and result["replay_state_passes_per_step"] == 3
    assert result["ring_state_passes_per_step_run"] == 1.4
    assert cli.main(["plan", "--model", "nemotron-h-8b"]) == 0
    text = capsys.readouterr().out
    assert "24 rows per slot and layer" in text and "+ dt 288.00 KiB (fp32)" in text and "ring 1 + 1/F = 1.25" in text


def test_ring_needs_the_mixer_dims(capsys):
    result = run_json(capsys, "--model", "custom", "--layers", "2", "--conv-dim", "100")
    assert result["ring_bytes_per_slot"] is None and result["ring_state_passes_per_step"] is None
    assert result["ring_state_passes_per_step_run"] is None
    assert cli.main(["plan", "--model", "custom", "--layers", "2", "--conv-dim", "100", "--ssm-state", "1000"]) == 0
    assert "(e) the ring: unknown without the mixer's dims" in capsys.readouterr().out
    from sgl_convwin.integrations import bytes_per_slot

    assert bytes_per_slot(2, 100, 4).ring is None
    assert bytes_per_slot(24, 10240, 4, mixer=plan.PRESETS["nemotron-h-8b"].mixer).ring == 24 * 20 * 20_992 + 8


RING_SHAPES = [  # (model, tp, draft tokens, topk, dtype, capacity)
    ("qwen3-next-80b-a3b", 1, 4, 1, "bf16", None), ("qwen3-next-80b-a3b", 2, 8, 3, "fp32", 12),
    ("qwen3.5-0.8b", 4, 20, 1, "fp16", None), ("qwen3.5-9b", 8, 2, 1, "bf16", 2),
    ("nemotron-h-8b", 1, 8, 3, "bf16", None), ("nemotron-h-47b", 8, 4, 1, "fp16", 6),
    ("nemotron-3-nano-30b-a3b", 2, 20, 1, "fp32", None),
]


@pytest.mark.parametrize("name, tp, n, topk, dtype, capacity", RING_SHAPES)
def test_ring_bytes_are_what_the_ring_cache_allocates(capsys, name, tp, n, topk, dtype, capacity):
    """ring_bytes_per_slot x M == RingCache(M slots).nbytes at the rank's dims, and bytes_per_slot's ring."""
    import sgl_convwin
    from sgl_convwin.integrations import bytes_per_slot

    shape = plan.PRESETS[name]
    mixer = shape.mixer.per_rank(tp, name)
    extra = () if capacity is None else ("--capacity", str(capacity))
    result = run_json(capsys, "--model", name, "--tp", str(tp), "--draft-tokens", str(n), "--topk", str(topk),
                      "--dtype", dtype, *extra)
    heads, num_gates = (mixer.num_v_heads, 2) if mixer.kind == "gdn" else (mixer.num_heads, 1)
    cache = sgl_convwin.RingCache(shape.conv_layers, 3, mixer.conv_dim, n, heads, capacity=result["ring_capacity"],
                                  dtype=plan._DTYPES[dtype], device="meta", num_gates=num_gates)
    assert result["ring_capacity"] == (max(16, n) if capacity is None else capacity)
    assert cache.nbytes == 3 * result["ring_bytes_per_slot"]
    slot = bytes_per_slot(shape.conv_layers, mixer.conv_dim, n, dtype=plan._DTYPES[dtype], mixer=mixer,
                          tree=topk > 1, capacity=capacity)
    assert slot.ring == result["ring_bytes_per_slot"]


@pytest.mark.parametrize("capacity, num_draft, accepted, tree_depth", [
    (16, 4, 3, None), (16, 4, 2, None), (16, 4, 1, None), (9, 4, 4, None), (4, 4, 2, None), (7, 3, 3, None),
    (20, 8, 5, None), (16, 8, 3, 4), (16, 8, 2, 2), (9, 8, 1, 1)])
def test_fold_period_is_ring_accepts(capacity, num_draft, accepted, tree_depth):
    """F = floor((R - T)/a) + 1 (T: N, or a tree's depth) against the cursor ring_accept really keeps:
    a fold shows as pending restarting at the step's accepted tokens. Every step accepts a, counted
    from an empty ring (trees: a chain of tree_depth nodes, the rest roots)."""
    import sgl_convwin

    ring = sgl_convwin.alloc_ring(1, 1, 4, num_draft, 1, capacity=capacity)
    slots, steps = torch.tensor([0]), torch.tensor([accepted - 1])
    parents = None if tree_depth is None else torch.tensor([[-1, *range(tree_depth - 1),
                                                             *[-1] * (num_draft - tree_depth)]])
    folds = []
    for _ in range(60):
        before = int(ring.cursor[0, 1])
        sgl_convwin.ring_accept(ring.cursor, ring.rows, ring.gates, slots, steps, parents, num_draft=num_draft,
                                tree_depth=tree_depth)
        folds.append(int(ring.cursor[0, 1]) < before + accepted)
    period = plan.ring_traffic(capacity, num_draft, accepted, tree_depth).fold_every_steps
    first = folds.index(True)
    assert all(fold == ((step - first) % period == 0) for step, fold in enumerate(folds[first:], first)), folds
    traffic = plan.ring_traffic(capacity, num_draft, accepted, tree_depth)
    assert (traffic.state_passes_per_step, traffic.state_passes_per_step_run) == (1 + 1 / period, 1 + 2 / period)


@pytest.mark.parametrize("args, message", [
    (["--model", "qwen3-next-80b-a3b", "--capacity", "3"], "ring capacity 3 must be >= the draft tokens N = 4"),
    (["--model", "qwen3-next-80b-a3b", "--accept-length", "5"], "accept length 5.0 must lie in [1, N = 4]"),
    (["--model", "qwen3-next-80b-a3b", "--accept-length", "0.5"], "accept length 0.5 must lie in [1, N = 4]"),
    (["--model", "nemotron-h-8b", "--tree-depth", "3", "--accept-length", "3.5"],
     "accept length 3.5 must lie in [1, T = 3]"),
    (["--model", "nemotron-h-8b", "--tree-depth", "9"], "tree depth 9 must lie in [1, N = 8]"),
    (["--model", "qwen3-next-80b-a3b", "--tree-depth", "2"], "tree depth is a tree's (topk > 1)"),
])
def test_ring_errors(capsys, args, message):
    usage_error(capsys, ["plan", *args], message)
