"""The launchers' plan caches (csrc_triton/_common.LaunchPlans): a plan is reused only for the same
shapes and strides, so calls that differ only in strides, layer or index values each get their own
launch arguments and the right result."""

import importlib

import pytest
import torch

import sgl_convwin
from sgl_convwin import reference
from support import IMPLS, chain_parents, impl_params

L, M, DIM, D, K = 2, 4, 12, 4, 4


@pytest.fixture()
def kernels():
    pytest.importorskip("triton")
    from sgl_convwin._kernels import triton_kernels

    return triton_kernels()


def test_plans_are_bounded_and_keep_empty_plans(kernels):
    plans = kernels._common.LaunchPlans()
    plans.max_size = 2
    missing = kernels._common.MISSING
    assert plans.get(("a",), missing) is missing
    assert plans.add(("a",), None) is None and plans.get(("a",), missing) is None  # "nothing to do" is a plan
    plans.add(("b",), 1)
    plans.add(("c",), 2)  # full: cleared first
    assert plans.get(("a",), missing) is missing and plans.get(("c",), missing) == 2


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda"))
def test_same_shapes_other_strides_each_get_their_own_plan(impl):
    """One logical window shape, three physical layouts (three stride patterns), then both state
    layouts: every call right, in an order that would expose a plan reused across strides."""
    generator = torch.Generator().manual_seed(5)
    dst, src, steps = (torch.tensor(v, device=impl.device) for v in ([2, 0, 3], [1, 3, 0], [3, 0, 2]))
    for state_layout in ("dim_major", "window_major", "dim_major"):
        for layout in ("dense", "channel_major", "token_major", "dense"):
            buffer = torch.randn(sgl_convwin.physical_shape(layout, L, M, DIM, D, K), generator=generator)
            windows = sgl_convwin.window_view(buffer.to(impl.device), layout, D, K)
            shape = (L, 5, DIM, K - 1) if state_layout == "dim_major" else (L, 5, K - 1, DIM)
            conv_state = torch.randn(shape, generator=generator).to(impl.device)
            want = reference.scatter_reference(conv_state, windows, dst, src, steps, state_layout)
            impl.scatter(conv_state, windows, dst, src, steps, state_layout=state_layout)
            assert torch.equal(conv_state.cpu(), want), (layout, state_layout)


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda"))
def test_verify_plans_follow_layer_and_strides(impl):
    """The verify launcher's plan leaves out the layer (its offset is computed per call): every
    layer of a buffer, then the same call on a transposed (channel_major) buffer and on x with
    other strides, each equal to the CPU implementation."""
    generator = torch.Generator().manual_seed(6)
    conv_state = torch.randn(L, 5, DIM, K - 1, generator=generator)
    weight = torch.randn(DIM, K, generator=generator)
    slots = torch.tensor([3, 1])
    x_plain = torch.randn(2, D, DIM, generator=generator)
    x_strided = torch.randn(2, DIM, D, generator=generator).transpose(1, 2).copy_(x_plain)
    for layout in ("token_major", "channel_major"):
        for x in (x_plain, x_strided):
            for layer in range(L):
                results = []
                for run in (IMPLS["cpu"], impl):
                    buffer = torch.zeros(sgl_convwin.physical_shape(layout, L, M, DIM, D, K), device=run.device)
                    out = torch.zeros(2, D, DIM, device=run.device)
                    run.causal_conv1d_verify(
                        out, buffer, conv_state.to(run.device), x.to(run.device), weight.to(run.device), None,
                        slots.to(run.device), slots.to(run.device), layer, torch.tensor([chain_parents(D)] * 2, device=run.device),
                        layout=layout)
                    results.append((buffer.cpu(), out.cpu()))
                assert torch.equal(results[0][0], results[1][0]), (layout, layer)
                torch.testing.assert_close(results[1][1], results[0][1], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "layout, num_draft, dtype, flat",
    [
        ("token_major", 16, torch.bfloat16, True),  # gathered from 3 rows, channels 2 bytes apart
        ("channel_major", 4, torch.bfloat16, True),  # channels 12 bytes apart
        ("channel_major", 8, torch.bfloat16, False),  # 20 bytes
        ("channel_major", 16, torch.bfloat16, False),  # 36 bytes
        ("channel_major", 4, torch.float32, False),  # 24 bytes
    ],
)
def test_scatter_plan_stores(kernels, layout, num_draft, dtype, flat):
    """The commit launcher's measured choice (docs/benchmarks.md): flat, vectorised stores unless
    the source is gathered from channels STRIDED_GATHER_BYTES or more apart; int32 offsets."""
    meta = dict(device="meta", dtype=dtype)
    buffer = torch.empty(sgl_convwin.physical_shape(layout, 36, 8, 8192, num_draft, 4), **meta)
    windows = sgl_convwin.window_view(buffer, layout, num_draft, 4)
    state = torch.empty(36, 8, 8192, 3, **meta)
    index = torch.zeros(8, dtype=torch.int32, device="meta")  # 8 rows: a grid large enough
    _, _, plan = kernels.scatter.scatter_launch_args(state, windows, index, index, index)
    assert plan["DST_CONTIGUOUS"] is flat and plan["WIDE_OFFSETS"] is False


SMALL_GRIDS = [  # layers, dim, rows (B), the gather block the plan must choose
    (36, 8192, 1, 1024),  # Qwen3-Next TP1, B = 1: 216 programs at 4096, 864 at 1024
    (36, 8192, 8, 4096),  # B = 8: 1728 programs, enough
    (36, 2048, 8, 1024),  # TP4, B = 8: 576 at 4096, 864 at 2048
    (23, 6144, 8, 2048),  # Nemotron-H, B = 8: 920 at 4096, 1656 at 2048
]


@pytest.mark.parametrize("layers, dim, rows, block", SMALL_GRIDS)
@pytest.mark.parametrize("layout", ["dense", "token_major", "channel_major"])
def test_scatter_plan_small_grid(kernels, layers, dim, rows, block, layout):
    """A gather whose grid would have fewer than SMALL_GRID_PROGRAMS programs is latency: it halves
    its block until the grid has that many (down to SMALL_GATHER_BLOCK), and stores through the
    destination's strides when the source channels are not adjacent (channel_major, 6 elements
    apart at D = 4). A straight copy (dense) keeps its block. The grid is (blocks, rows, layers)."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    buffer = torch.empty(sgl_convwin.physical_shape(layout, layers, 8, dim, 4, 4), **meta)
    windows = sgl_convwin.window_view(buffer, layout, 4, 4)
    state = torch.empty(layers, 8, dim, 3, **meta)
    index = torch.zeros(rows, dtype=torch.int32, device="meta")
    grid, _, plan = kernels.scatter.scatter_launch_args(state, windows, index, index, index)
    small = block < 4096
    want_block = 2048 if layout == "dense" else block
    want_flat = not (small and layout == "channel_major")
    assert (plan["BLOCK"], plan["DST_CONTIGUOUS"]) == (want_block, want_flat)
    assert grid == (-(-dim * 3 // want_block), rows, layers)


VERIFY_PLANS = [  # layout, nodes, tree, rows (B); the kernel, channels per program and flags the plan must choose
    ("token_major", 4, False, 8, "rows", 64, dict(EARLY=True, ONE_STORE=False)),
    ("token_major", 4, False, 64, "node_loop", 128, dict(PREFETCH=2, ROWS=True, OFFSETS32=True)),
    ("token_major", 4, False, 256, "node_loop", 128, dict(PREFETCH=4, ROWS=True, OFFSETS32=False)),
    ("channel_major", 4, False, 8, "rows", 64, dict(EARLY=True, ONE_STORE=False)),
    ("channel_major", 4, False, 32, "rows", 64, dict(EARLY=True, ONE_STORE=False)),
    ("channel_major", 4, False, 64, "small_tree", 128, dict(ROWS=True, NODES=4, SLOTS_AS_MASKS=False, RUN=6,
                                                            RUN_GROUP=4, RUN_VEC=8, RUN_VECTORS=4)),
    ("channel_major", 4, False, 256, "small_tree", 128, dict(ROWS=True, NODES=4, SLOTS_AS_MASKS=False, RUN=6,
                                                             RUN_GROUP=4, RUN_VEC=8, RUN_VECTORS=4)),
    ("token_major", 8, True, 8, "rows", 32, dict(ONE_STORE=False, GATHER_LINKS=True)),
    ("token_major", 8, True, 64, "small_tree", 128, dict(ROWS=True, NODES=8, SLOTS_AS_MASKS=True, OFFSETS32=True,
                                                         PACKED_LINKS=True)),
    ("token_major", 8, True, 256, "small_tree", 128, dict(ROWS=True, NODES=8, SLOTS_AS_MASKS=True, OFFSETS32=True,
                                                          PACKED_LINKS=True)),
    ("token_major", 32, True, 64, "rows", 32, dict(ONE_STORE=False)),
    ("token_major", 32, True, 128, "node_loop", 128, dict(PREFETCH=2, OFFSETS32=True)),
    ("channel_major", 8, True, 8, "rows", 32, dict(ONE_STORE=False, GATHER_LINKS=True)),
    ("channel_major", 8, True, 32, "rows", 32, dict(ONE_STORE=False, GATHER_LINKS=True)),
    ("channel_major", 8, True, 64, "small_tree", 128, dict(ROWS=True, NODES=8, SLOTS_AS_MASKS=True, RUN=10,
                                                           RUN_GROUP=4, RUN_VEC=8, RUN_VECTORS=8, PACKED_LINKS=False)),
    ("channel_major", 8, True, 256, "small_tree", 128, dict(ROWS=True, NODES=8, SLOTS_AS_MASKS=True, RUN=10,
                                                            RUN_GROUP=4, RUN_VEC=8, RUN_VECTORS=8, PACKED_LINKS=False)),
    ("dense", 4, False, 1, "node_loop", 32, dict(PREFETCH=2, ROWS=False, OFFSETS32=True)),
    ("dense", 4, False, 8, "node_loop", 64, dict(PREFETCH=2, ROWS=False, num_warps=2, OFFSETS32=True)),
    ("dense", 4, False, 32, "node_loop", 64, dict(PREFETCH=2, ROWS=False, num_warps=2, OFFSETS32=True)),
    ("dense", 4, False, 64, "small_tree", 64, dict(ROWS=False, NODES=4, SLOTS_AS_MASKS=False, OFFSETS32=True, RUN=3,
                                                   RUN_GROUP=2, RUN_VEC=2, RUN_VECTORS=4)),
    ("dense", 4, False, 256, "small_tree", 128, dict(ROWS=False, NODES=4, SLOTS_AS_MASKS=False, RUN=3, RUN_GROUP=4,
                                                     RUN_VEC=4, RUN_VECTORS=4)),
    ("dense", 8, True, 1, "small_tree", 32, dict(ROWS=False, NODES=8, SLOTS_AS_MASKS=False, OFFSETS32=True, RUN=0,
                                                 PACKED_LINKS=True)),
    ("dense", 8, True, 8, "small_tree", 64, dict(ROWS=False, NODES=8, OFFSETS32=True, RUN=0, PACKED_LINKS=True)),
    ("dense", 8, True, 64, "small_tree", 128, dict(ROWS=False, NODES=8, SLOTS_AS_MASKS=False, OFFSETS32=True, RUN=3,
                                                   RUN_GROUP=4, RUN_VEC=4, RUN_VECTORS=4, PACKED_LINKS=True)),
    ("dense", 8, True, 256, "small_tree", 128, dict(ROWS=False, NODES=8, RUN=3, RUN_GROUP=4, RUN_VEC=4,
                                                    RUN_VECTORS=4, PACKED_LINKS=True)),
    ("dense", 32, True, 64, "node_loop", 64, dict(PREFETCH=2, ROWS=False, OFFSETS32=True)),
]

# the channels a lane of the node loops holds whose committed inputs and weights come in as runs (0: by
# column), where VERIFY_PLANS picks the node loop or the small-tree kernel
LANE_GROUPS = {
    ("token_major", 4, False, 64): 4, ("token_major", 4, False, 256): 4, ("channel_major", 4, False, 64): 4,
    ("channel_major", 4, False, 256): 4, ("token_major", 8, True, 64): 4, ("token_major", 8, True, 256): 4,
    ("token_major", 32, True, 128): 4, ("channel_major", 8, True, 64): 4, ("channel_major", 8, True, 256): 4,
    ("dense", 4, False, 1): 0, ("dense", 4, False, 8): 0, ("dense", 4, False, 32): 0, ("dense", 4, False, 64): 2,
    ("dense", 4, False, 256): 4, ("dense", 8, True, 1): 0, ("dense", 8, True, 8): 2, ("dense", 8, True, 64): 4,
    ("dense", 8, True, 256): 4, ("dense", 32, True, 64): 2,
}


def verify_plan(kernels, layout, rows, nodes, *, tree=False, conv=True, dtype=torch.bfloat16, dim=8192,
                buffer_nodes=None, layers=36, tuning=None):
    """The verify launcher's (kernel, grid, constexprs) for a call on meta tensors: K = 4, a
    dim-major state, a buffer of ``buffer_nodes`` draft steps (x's nodes if None), SiLU; a capture
    (no conv) when not ``conv``."""
    meta = dict(device="meta", dtype=dtype)
    buffer = torch.empty(sgl_convwin.physical_shape(layout, layers, rows, dim, buffer_nodes or nodes, 4), **meta)
    dest = buffer.transpose(-1, -2) if layout == "channel_major" else buffer
    state = torch.empty(layers, rows, dim, 3, **meta)
    x = torch.empty(rows, nodes, dim, **meta)
    weight = torch.empty(dim, 4, **meta) if conv else None
    index = torch.zeros(rows, dtype=torch.int32, device="meta")
    parents = torch.zeros(rows, nodes, dtype=torch.int32, device="meta") if tree else None
    kernel, grid, _, plan = kernels.verify._plan(x if conv else None, dest, state, x, weight, None, index, index,
                                                 parents, layout == "dense", conv, tuning or {})
    return kernel, grid, plan


@pytest.mark.parametrize("layout, nodes, tree, rows, kernel, channels, flags", VERIFY_PLANS)
def test_verify_plan(kernels, layout, nodes, tree, rows, kernel, channels, flags):
    """The verify launcher's measured choices at the Qwen3-Next TP1 shape (dim 8192, K = 4, bf16;
    docs/benchmarks.md, "Verify kernel"): trees of up to 8 nodes take the unrolled small-tree
    kernel on dense windows (64 channels; 32 below 8 requests) and on token_major rows from 64
    requests (128, a bad slot skipped by masks), and so do channel_major rows and dense windows
    under a conv from 64 requests, chains too (a chain's bad slot skipped by a branch), stored as
    runs (dense windows: 128 channels, chains from 256 requests); the node loop serves dense
    windows, token_major chains from 32 requests and token_major trees of more than 8 nodes from
    128 (one warp; dense chains from 8 requests 64 channels over 2 warps), the small-tree kernel's
    tree links packed into one integer but on channel_major rows; else the rows tile, at
    128 channels for up to 8 nodes from 64 requests, storing its rows as one tile on channel_major
    rows at 128 channels (two rows per lane) and walking a tree's links in registers; the tile's slot-free loads go
    first and the loop's inputs two nodes ahead (chains from 128 requests: four, on int64 offsets;
    the node loops' other offsets int32); dense windows and channel_major rows on a grid of channel
    blocks first."""
    chosen, grid, plan = verify_plan(kernels, layout, rows, nodes, tree=tree)
    want = {"rows": kernels.verify._verify_rows_kernel, "node_loop": kernels.verify._verify_node_loop_kernel,
            "small_tree": kernels.verify._verify_small_tree_kernel}[kernel]
    assert chosen is want
    assert (plan["BLOCK"], plan["num_warps"]) == (channels, flags.get("num_warps", 1))
    # a request's channel blocks dispatched first for dense windows and channel_major rows
    blocks_first = layout != "token_major"
    assert plan["BLOCKS_FIRST"] == blocks_first
    assert grid == ((8192 // channels, rows) if blocks_first else (rows, 8192 // channels))
    assert {name: plan[name] for name in flags} == flags
    # committed inputs and weights as runs wherever a lane holds two or more channels
    assert plan.get("LANE_GROUP") == LANE_GROUPS.get((layout, nodes, tree, rows))


@pytest.mark.parametrize("case, group", [
    ("contiguous", 4),
    ("capture alone", 4),
    ("float32", 4),
    ("state strided by channel", 0),
    ("weight strided by channel", 0),
    ("dim no multiple of 4", 0),
    ("one channel a lane", 0),
    ("asked not to", 0),
])
def test_verify_plan_lane_runs_where_contiguous(kernels, case, group):
    """The node loops load the committed inputs and weights as runs (LANE_GROUP: the channels a lane
    holds) only where each channel's K-1 committed inputs and K weights are contiguous, back to
    back, dim is a multiple of the group and a lane holds two channels or more; a capture has no
    weights to check. token_major chains at 256 requests (the node loop, 128 channels, one warp)."""
    dtype = torch.float32 if case == "float32" else torch.bfloat16
    meta = dict(device="meta", dtype=dtype)
    dim = 8190 if case == "dim no multiple of 4" else 8192
    rows, nodes = 256, 4
    dest = torch.empty(sgl_convwin.physical_shape("token_major", 2, rows, dim, nodes, 4), **meta)
    state = torch.empty(2, rows, dim, 3, **meta)
    if case == "state strided by channel":
        state = torch.empty(2, rows, 3, dim, **meta).transpose(-1, -2)
    weight = torch.empty(dim, 4, **meta)
    if case == "weight strided by channel":
        weight = torch.empty(4, dim, **meta).t()
    x = torch.empty(rows, nodes, dim, **meta)
    conv = case != "capture alone"
    index = torch.zeros(rows, dtype=torch.int32, device="meta")
    tuning = dict(block=64, num_warps=2) if case == "one channel a lane" else {}
    if case == "asked not to":
        tuning = dict(lane_runs=False)
    kernel, _, _, plan = kernels.verify._plan(x if conv else None, dest, state, x, weight if conv else None, None,
                                              index, index, None, False, conv, tuning)
    assert kernel is kernels.verify._verify_node_loop_kernel
    assert plan["LANE_GROUP"] == group


@pytest.mark.parametrize("draft, nodes, dtype, dim, run_store", [  # (RUN, RUN_GROUP, RUN_VEC, RUN_VECTORS)
    ("buffer as long as the nodes", 4, torch.bfloat16, 8192, (6, 4, 8, 4)),
    ("buffer longer than the nodes", 6, torch.bfloat16, 8192, None),
    ("float32: 4 per 16 bytes", 4, torch.float32, 8192, (6, 4, 4, 8)),
    ("odd run: 8-byte vectors", 5, torch.bfloat16, 8192, (7, 4, 4, 8)),
    ("dim no multiple of 4", 4, torch.bfloat16, 8190, None),
])
def test_verify_plan_channel_major_runs(kernels, draft, nodes, dtype, dim, run_store):
    """channel_major rows go out as runs (the small-tree kernel, 64 requests, 128 channels: 4 a lane)
    only where the stored rows fill every channel's run (the buffer holds as many draft steps as x
    has nodes) and dim is a multiple of the channels a lane holds, and only from one-warp
    programs; a group's runs go out in vectors of up to 16 bytes; otherwise the rows tile serves
    them (or the small-tree kernel row by row, at two warps)."""
    longer = draft == "buffer longer than the nodes"
    problem = dict(dtype=dtype, dim=dim, buffer_nodes=6 if longer else None, layers=2)
    chosen, _, plan = verify_plan(kernels, "channel_major", 64, 4 if longer else nodes, **problem)
    if run_store is None:
        assert chosen is kernels.verify._verify_rows_kernel
    else:
        assert chosen is kernels.verify._verify_small_tree_kernel
        assert (plan["RUN"], plan["RUN_GROUP"], plan["RUN_VEC"], plan["RUN_VECTORS"]) == run_store
        # two warps store row by row (Triton 3.6 miscompiles the run's joins there: _run_layout)
        _, _, plan = verify_plan(kernels, "channel_major", 64, 4 if longer else nodes, **problem,
                                 tuning=dict(num_warps=2))
        assert plan["RUN"] == 0


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
@pytest.mark.parametrize("tree", (False, True), ids=("chain", "tree"))
def test_dense_windows_as_runs_under_a_conv_from_64_requests(kernels, dtype, tree):
    """Dense windows go out as runs (a channel's K-1 columns) by default under a conv from 64
    requests (128 channels a program, 4 a lane, whose 12 elements go out as vectors of 4; chains
    below 256 requests 64 channels, 2 a lane: vectors of 2); a capture alone and fewer requests store
    each column on its own, unless the runs keyword asks for runs; runs=False turns them off."""
    nodes = 8 if tree else 4
    wide = (3, 4, 4, 4)  # (RUN, RUN_GROUP, RUN_VEC, RUN_VECTORS)
    for rows, conv, tuning, want in (
        (64, True, {}, wide if tree else (3, 2, 2, 4)),
        (256, True, {}, wide),
        (32, True, {}, None),
        (64, False, {}, None),
        (64, True, dict(runs=False), None),
        (8, True, dict(runs=True), (3, 2, 2, 4) if tree else None),  # (chains below 64: the node loop)
        (64, False, dict(runs=True), wide if tree else (3, 2, 2, 4)),
    ):
        chosen, _, plan = verify_plan(kernels, "dense", rows, nodes, tree=tree, conv=conv, dtype=dtype, layers=2,
                                      tuning=tuning)
        if want is None and not tree:
            assert chosen is kernels.verify._verify_node_loop_kernel, (rows, conv, tuning)
            continue
        assert chosen is kernels.verify._verify_small_tree_kernel, (rows, conv, tuning)
        got = (plan["RUN"], plan["RUN_GROUP"], plan["RUN_VEC"], plan["RUN_VECTORS"])
        assert got == (want or (0, 1, 1, 1)), (rows, conv, tuning)


@pytest.mark.parametrize("dim, tree, kernel, channels, run_store", [
    (8190, True, "small_tree", 64, (3, 2, 2, 4)),  # 2 channels a lane at 64 channels: runs there
    (8190, False, "node_loop", 64, None),  # a chain's runs would take 128 channels at 256 requests
    (8191, True, "small_tree", 64, None),  # odd: the default row-by-row configuration
])
def test_dense_windows_take_runs_only_where_they_fit(kernels, dim, tree, kernel, channels, run_store):
    """Where dim is no multiple of the channels a lane holds at the runs' 128 channels a program,
    dense windows at 256 requests keep the configuration they take without runs (the small tree's
    64 channels, storing runs only if 2 channels a lane fit; chains the node loop), not 128
    channels row by row, which was the slowest there (99.0 vs 76.4 us on trees)."""
    chosen, _, plan = verify_plan(kernels, "dense", 256, 8 if tree else 4, tree=tree, dim=dim, layers=2)
    want = {"node_loop": kernels.verify._verify_node_loop_kernel,
            "small_tree": kernels.verify._verify_small_tree_kernel}[kernel]
    assert chosen is want
    assert plan["BLOCK"] == channels
    assert plan.get("RUN", 0) == (0 if run_store is None else run_store[0])
    if run_store is not None:
        assert (plan["RUN"], plan["RUN_GROUP"], plan["RUN_VEC"], plan["RUN_VECTORS"]) == run_store


@pytest.mark.parametrize("rows", (4, 8, 64))
@pytest.mark.parametrize("tree", (False, True), ids=("chain", "tree"))
def test_channel_major_runs_from_8_requests_for_a_capture(kernels, rows, tree):
    """A capture (no conv) stores channel_major runs from 8 requests, the fused conv from 64
    (measured: _small_tree); below, the rows tile."""
    nodes = 8 if tree else 4
    for conv, least in ((False, 8), (True, 64)):
        chosen, _, plan = verify_plan(kernels, "channel_major", rows, nodes, tree=tree, conv=conv, layers=2)
        runs = rows >= least
        assert chosen is (kernels.verify._verify_small_tree_kernel if runs else kernels.verify._verify_rows_kernel)
        assert plan.get("RUN", 0) == (nodes + 2 if runs else 0)


def test_verify_launchers_refuse_a_prefetch_out_of_range(kernels):
    """The node loop loads 0 to 4 nodes ahead; another distance is refused with what is allowed."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    x, state = torch.empty(1, 4, 8, **meta), torch.empty(1, 2, 8, 3, **meta)
    buffer = torch.empty(sgl_convwin.physical_shape("token_major", 1, 2, 8, 4, 4), **meta)
    index = torch.zeros(1, dtype=torch.int64, device="meta")
    for prefetch in (-1, 5):
        with pytest.raises(ValueError, match=f"prefetch {prefetch}: the node loop loads 0 to 4 nodes ahead"):
            kernels.launch_capture(buffer, state, x, index, index, 0, None, dense=False, node_loop=True,
                                   prefetch=prefetch)


def test_verify_launchers_name_an_unknown_tuning_keyword(kernels):
    """A misspelt tuning keyword is refused, not silently ignored."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    x, state = torch.empty(1, 4, 8, **meta), torch.empty(1, 2, 8, 3, **meta)
    buffer = torch.empty(sgl_convwin.physical_shape("token_major", 1, 2, 8, 4, 4), **meta)
    index = torch.zeros(1, dtype=torch.int64, device="meta")
    with pytest.raises(TypeError, match=r"unknown tuning \['one_stores'\]"):
        kernels.launch_capture(buffer, state, x, index, index, 0, None, dense=False, one_stores=True)


TREE_PLANS = [  # layers, dim, rows (B), channels per program, warps, parent links loaded up front
    (36, 8192, 1, 512, 1, True),  # Qwen3-Next TP1: 576 programs
    (36, 8192, 8, 512, 1, True),  # 4608 programs: still two vectors per thread
    (36, 8192, 16, 512, 2, True),
    (36, 8192, 256, 512, 2, True),
    (36, 2048, 8, 512, 1, True),  # TP4
    (23, 6144, 8, 512, 1, True),  # Nemotron-H
    (23, 6144, 32, 512, 2, True),
]


@pytest.mark.parametrize("layers, dim, rows, channels, warps, preloaded", TREE_PLANS)
def test_scatter_tree_plan(kernels, layers, dim, rows, channels, warps, preloaded):
    """The tree commit's plan at every grid size: 512 channels per program, 16-byte vectors, two
    per thread (one warp) in grids of up to 4608 programs and one (two warps) beyond, the parent
    links (8 nodes) loaded up front, a dim-major state's window interleaved in registers and
    stored as lane rows."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    state = torch.empty(layers, 8, dim, 3, **meta)
    tree_rows = torch.empty(sgl_convwin.physical_shape("token_major", layers, 8, dim, 8, 4), **meta)
    grid, _, plan = kernels.scatter_tree._plan_scatter_tree(state, tree_rows, rows, 8, (1, 1, 1, (8, 1)))
    assert (plan["GROUPS"] * plan["VEC"], plan["VEC"], plan["num_warps"]) == (channels, 8, warps)
    assert (plan["INTERLEAVE"], plan["LANE_ROWS"], plan["PRELOADED_NODES"]) == (True, True, 8 if preloaded else 0)
    assert grid == (-(-dim // channels), rows, layers)


def test_scatter_tree_plan_choices(kernels):
    """Vectors divide dim and hold 16 bytes; window-major states and K = 2 store each column through
    the strides; big trees walk link by link; forced choices are kept, bad ones refused."""
    meta = dict(device="meta")
    plan_of = kernels.scatter_tree._plan_scatter_tree

    def plan(dim=8192, width=3, nodes=8, rows=1, dtype=torch.bfloat16, window_major=False, **forced):
        state = torch.empty(2, 4, width, dim, dtype=dtype, **meta).transpose(2, 3) if window_major else \
            torch.empty(2, 4, dim, width, dtype=dtype, **meta)
        buffer = torch.empty(2, 4, nodes + width - 1, dim, dtype=dtype, **meta)
        choices = [forced.get(name) for name in ("channels", "num_warps", "vec", "preload_parents", "lane_rows")]
        return plan_of(state, buffer, rows, nodes, (1, 1, 1, (nodes, 1)), *choices)[2]

    assert plan()["VEC"] == 8 and plan(dtype=torch.float32)["VEC"] == 4
    assert plan(dim=8190)["VEC"] == 2 and plan(dim=8191)["VEC"] == 1
    assert plan(window_major=True)["INTERLEAVE"] is False and plan(width=1)["INTERLEAVE"] is False
    assert plan(width=8)["VEC"] == 8 and plan(width=9)["VEC"] == 4  # 64 elements interleaved per thread
    assert plan(nodes=32)["PRELOADED_NODES"] == 32 and plan(nodes=33)["PRELOADED_NODES"] == 0
    assert plan()["LANE_ROWS"] and not plan(lane_rows=False)["LANE_ROWS"]
    assert not plan(window_major=True)["LANE_ROWS"] and not plan(window_major=True, lane_rows=True)["LANE_ROWS"]
    assert plan(dim=100)["GROUPS"] * plan(dim=100)["VEC"] == 128  # never more channels than dim needs
    # two vectors per thread up to 4608 programs (16 blocks x 2 layers x 144 rows), then one
    assert plan(rows=144)["num_warps"] == 1 and plan(rows=145)["num_warps"] == 2
    assert plan(dtype=torch.float32)["num_warps"] == 2 and plan(dtype=torch.float32, rows=145)["num_warps"] == 4
    forced = plan(channels=64, num_warps=8, vec=2, preload_parents=False)
    assert (forced["GROUPS"], forced["VEC"], forced["num_warps"], forced["PRELOADED_NODES"]) == (32, 2, 8, 0)
    with pytest.raises(ValueError, match="channels must be a power of two"):
        plan(channels=96)
    with pytest.raises(ValueError, match="at most 32 nodes"):
        plan(nodes=33, preload_parents=True)


@pytest.mark.parametrize("tree", [False, True])
def test_commit_grid_limits(kernels, tree):
    """Rows are the grid's y axis: more than 65535 in one call are refused with the numbers, before
    any launch (meta tensors: no memory)."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    state = torch.empty(1, 2, 8, 3, **meta)
    index = torch.zeros(65536, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="commits at most 65535 rows per call, got 65536"):
        if tree:
            rows = torch.empty(1, 2, 4, 8, **meta)
            kernels.scatter_tree.launch_scatter_tree(state, rows, index, index, index, index[:, None])
        else:
            windows = torch.empty(1, 2, 1, 8, 3, **meta)
            kernels.scatter.scatter_launch_args(state, windows, index, index, index)


def test_scatter_plan_takes_wide_offsets_past_int32(kernels):
    """A window spanning 2**31 elements or more gets int64 per-element offsets, and forcing int32
    ones is refused (meta tensors: no memory)."""
    meta = dict(device="meta", dtype=torch.bfloat16)
    windows = torch.empty(1, 2, 1, 2**16, 2**15 + 1, **meta)[..., :3]  # channels 2**15 + 1 elements apart
    state = torch.empty(1, 2, 2**16, 3, **meta)
    index = torch.zeros(1, dtype=torch.int64, device="meta")
    _, _, plan = kernels.scatter.scatter_launch_args(state, windows, index, index, index)
    assert plan["WIDE_OFFSETS"] is True
    with pytest.raises(ValueError, match="int32 offsets cannot address it"):
        kernels.scatter.scatter_launch_args(state, windows, index, index, index, wide_offsets=False)
    half = slice(0, 2**15)  # half the channels: the span fits
    _, _, plan = kernels.scatter.scatter_launch_args(state[:, :, half], windows[:, :, :, half], index, index, index)
    assert plan["WIDE_OFFSETS"] is False


def test_direct_launch_only_on_verified_triton_versions(monkeypatch):
    """fixed_launch launches the compiled kernel directly only on the Triton versions that path
    was verified on; elsewhere every call goes through Triton's own launch."""
    pytest.importorskip("triton")
    from sgl_convwin._kernels import triton_kernels

    common = importlib.import_module(triton_kernels().__name__ + "._common")
    assert common.direct_launch_supported("3.6.0") and not common.direct_launch_supported("3.9.0")

    calls = []

    class FakeKernel:  # the parts of a JITFunction fixed_launch uses
        arg_names = ["a", "b", "n", "BLOCK"]

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append("triton")
                return Compiled()
            return launch

    class Compiled:
        def __getitem__(self, grid):
            return lambda *args: calls.append("direct")

    aligned = torch.zeros(8)
    for supported, expected in ((False, ["triton"] * 3), (True, ["triton", "direct", "direct"])):
        monkeypatch.setattr(common, "direct_launch_supported", lambda: supported)
        calls.clear()
        run = common.fixed_launch(FakeKernel(), (1,), (8,), {"BLOCK": 4}, num_tensors=2)
        for _ in range(3):
            run(aligned, aligned)
        assert calls == expected, (supported, calls)


@pytest.mark.parametrize("grid", [(5,), (5, 6), (5, 6, 7)])
def test_direct_launch_gets_a_three_dim_grid(monkeypatch, grid):
    """A compiled kernel's direct launch reads grid[0], grid[1] and grid[2]: fixed_launch pads a
    1-D or 2-D grid with ones (Triton's own launch does that itself)."""
    pytest.importorskip("triton")
    from sgl_convwin._kernels import triton_kernels

    common = importlib.import_module(triton_kernels().__name__ + "._common")
    monkeypatch.setattr(common, "direct_launch_supported", lambda: True)
    grids = []

    class FakeKernel:
        arg_names = ["a", "n", "BLOCK"]

        def __getitem__(self, grid):
            return lambda *args, **kwargs: Compiled()

    class Compiled:
        def __getitem__(self, grid):
            grids.append(grid)
            return lambda *args: None

    run = common.fixed_launch(FakeKernel(), grid, (8,), {"BLOCK": 4}, num_tensors=1)
    run(torch.zeros(8))
    assert grids == [grid + (1,) * (3 - len(grid))]
