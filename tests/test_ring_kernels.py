"""The ring's Triton kernels against the ring ops' PyTorch code (cpu_ring.py, itself held to the
float64 oracle by test_ring.py), under Triton's interpreter and on the GPU.

One call at a time from random ring states: every cursor a ring position (pending tokens wrapping
the ring's end, folds and no folds), padded rows, chains and trees. Outputs and folded states are
arithmetic (tolerances against the PyTorch code's fp32); conv windows, gates, the ring's rows and
every state the call must not touch are compared bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sgl_convwin
from sgl_convwin._kernels import triton_kernels
from support import HAS_TRITON, INTERPRET, ring_pytorch_code, sprinkled, trees

FILL = 7.0

interpreted = pytest.mark.skipif(not (INTERPRET and HAS_TRITON), reason="Triton's interpreter runs on the CPU only")
DEVICES = [pytest.param("cpu", marks=interpreted), pytest.param("cuda", marks=pytest.mark.gpu)]


def ring_case(*, num_rows=3, num_nodes=2, capacity=4, kernel_size=4, num_k_heads=1, ratio=2, head_k_dim=16,
              head_v_dim=16, num_state_slots=5, num_ring_slots=4, parents=None, cursors=None, ring_slots=None,
              state_slots=None, rows_dtype=torch.float32, state_dtype=torch.float32, strong_decays=False, device="cpu",
              seed=0, transposed=False):
    """gdn_ring_verify's arguments for layer 1 of 2, random but for what is given; strong_decays: about
    one log decay in four, given or in the ring, -1e4 .. -inf; transposed: the checkpoints stored
    [.., dv, dk] (engines' layout) and passed transposed."""
    gen = torch.Generator().manual_seed(seed)
    num_v_heads = num_k_heads * ratio
    dim = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    ring_rows = capacity + num_nodes
    layers = 2

    def randn(*shape, std=1.0):
        return torch.randn(shape, generator=gen) * std

    if cursors is None:
        start = torch.randint(0, ring_rows, (num_ring_slots,), generator=gen)
        pending = torch.randint(0, capacity + 1, (num_ring_slots,), generator=gen)
        cursors = torch.stack([start, pending], dim=1)
    if ring_slots is None:
        ring_slots = torch.randperm(num_ring_slots, generator=gen)[:num_rows]
    if state_slots is None:
        state_slots = torch.randperm(num_state_slots, generator=gen)[:num_rows]
    q = randn(num_rows, num_nodes, num_k_heads, head_k_dim)
    k = randn(num_rows, num_nodes, num_k_heads, head_k_dim)
    v = randn(num_rows, num_nodes, num_v_heads, head_v_dim)
    g = -torch.rand(num_rows, num_nodes, num_v_heads, generator=gen)
    beta = torch.rand(num_rows, num_nodes, num_v_heads, generator=gen)
    ssm = randn(layers, num_state_slots, num_v_heads, head_k_dim, head_v_dim, std=0.3).to(state_dtype)
    if transposed:
        ssm = ssm.transpose(-1, -2).contiguous().transpose(-1, -2)
    conv = randn(layers, num_state_slots, dim, kernel_size - 1).to(rows_dtype)
    rows = randn(layers, num_ring_slots, ring_rows, dim).to(rows_dtype)
    gates = torch.stack([-torch.rand(layers, num_ring_slots, ring_rows, num_v_heads, generator=gen),
                         torch.rand(layers, num_ring_slots, ring_rows, num_v_heads, generator=gen)], dim=3)
    if strong_decays:
        g = sprinkled(g, (-1e4, -1e6, -1e30, float("-inf")), 4, gen)
        gates[:, :, :, 0] = sprinkled(gates[:, :, :, 0], (-1e4, -1e6, -1e30, float("-inf")), 4, gen)
    weight = randn(dim, kernel_size, std=0.5)
    bias = randn(dim, std=0.1)
    tensors = dict(q=q, k=k, v=v, g=g, beta=beta, ssm_state=ssm, conv_state=conv, rows=rows, gates=gates,
                   cursor=cursors.to(torch.int32), conv_weight=weight, conv_bias=bias,
                   ring_slots=torch.as_tensor(ring_slots), state_slots=torch.as_tensor(state_slots),
                   parents=None if parents is None else torch.as_tensor(parents).expand(num_rows, -1).contiguous())
    return {name: None if t is None else t.to(device) for name, t in tensors.items()}


IEEE = dict(precision="ieee")  # float32 products: what the PyTorch code computes, so tight tolerances hold


def run_both(case, *, layer=1, use_qk_l2norm=True, tuning=IEEE):
    """(PyTorch code's tensors, kernels' tensors) after one call each on copies of ``case``."""
    tuning = dict(tuning or {})

    def call(launch):
        mine = {name: None if t is None else t.clone() for name, t in case.items()}
        out = torch.full(mine["v"].shape, FILL, device=mine["v"].device)
        args = (out, mine["q"], mine["k"], mine["v"], mine["g"], mine["beta"], mine["ssm_state"], mine["conv_state"],
                mine["rows"], mine["gates"], mine["cursor"], mine["conv_weight"], mine["conv_bias"],
                mine["ring_slots"], mine["state_slots"], layer, mine["parents"])
        if launch:
            kernel_args, kernel_kwargs = sgl_convwin.gdn_ring_verify.kernel_arguments(
                *args, use_qk_l2norm=use_qk_l2norm)
            triton_kernels().launch_gdn_ring_verify(*kernel_args, **{**kernel_kwargs, **tuning})
        else:
            ring_pytorch_code("gdn_ring_verify")(*args, use_qk_l2norm=use_qk_l2norm)
        mine["out"] = out
        return mine

    return call(False), call(True)


def assert_agree(want, got, tol=2e-5, state_tol=None):
    """Arithmetic within tol (the folded states: state_tol, default tol) x the largest magnitude;
    everything else bit for bit."""
    for name, bound in (("out", tol), ("ssm_state", tol if state_tol is None else state_tol)):
        scale = want[name].float().abs().max().item()
        error = (got[name].float() - want[name].float()).abs().max().item()
        assert error <= bound * scale, (name, error, scale)
    assert torch.equal(got["out"] == FILL, want["out"] == FILL)  # the rows left alone
    for name in ("conv_state", "gates", "rows", "cursor"):
        assert torch.equal(got[name], want[name]), name


def assert_same_untouched(case, want, got):
    """States the PyTorch code left as they were, the kernels left bit for bit too."""
    kept = torch.eq(want["ssm_state"], case["ssm_state"]).flatten(2).all(-1)  # [L, S]
    assert torch.equal(got["ssm_state"][kept], case["ssm_state"][kept])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_matches_pytorch_code(device, tree):
    """Every slot's cursor at a different place: folds (pending + N > capacity) beside rows that only
    replay, a ring wrapping its end, an empty ring, and a padded row."""
    cursors = torch.tensor([[5, 4], [1, 2], [0, 0], [4, 3]])  # C = 7, capacity 4, N = 3: folds when pending >= 2
    parents = [-1, 0, 0] if tree else None
    case = ring_case(num_rows=4, num_nodes=3, capacity=4, cursors=cursors, ring_slots=[0, 1, 2, 3],
                     state_slots=[3, 0, 4, -1], parents=parents, device=device)
    want, got = run_both(case)
    assert not torch.equal(want["ssm_state"], case["ssm_state"])  # something folded
    assert not torch.equal(want["conv_state"], case["conv_state"])
    assert_agree(want, got)
    assert_same_untouched(case, want, got)
    want, got = run_both(case, tuning={})  # the default for a float32 checkpoint: tf32x3 products
    assert_agree(want, got, tol=2e-3, state_tol=1e-4)
    want, got = run_both(case, tuning=dict(precision="tf32", fold_precision="tf32x3"))  # tf32x3 where it folds
    assert_agree(want, got, tol=2e-3, state_tol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_strong_decays(device, tree):
    """Log decays of -1e4 .. -inf among the pending tokens' and the drafts' (rows that fold, that only
    replay, an empty ring, a padded row): the kernels' floored sums agree with the PyTorch code, which
    replays the pending tokens one at a time, and the drafts' gates are stored as given."""
    cursors = torch.tensor([[5, 4], [1, 2], [0, 0], [4, 3]])
    case = ring_case(num_rows=4, num_nodes=3, capacity=4, cursors=cursors, ring_slots=[0, 1, 2, 3],
                     state_slots=[3, 0, 4, -1], parents=[-1, 0, 0] if tree else None, strong_decays=True,
                     device=device)
    assert (case["g"] < -1e3).any() and (case["gates"][1, :, :, 0] < -1e3).any()
    for tuning, tol, state_tol in ((IEEE, 1e-4, 1e-4), ({}, 2e-3, 1e-4)):
        want, got = run_both(case, tuning=tuning)
        assert not torch.equal(want["ssm_state"], case["ssm_state"])  # something folded
        assert_agree(want, got, tol=tol, state_tol=state_tol)


@pytest.mark.gpu
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_mma_kernel_strong_decays(tree):
    """test_strong_decays on the mma kernel (128 x 128 tiles, capacity 16)."""
    nodes = [-1, 0, 0, 1] if tree else [-1, 0, 1, 2]
    cursors = torch.tensor([[17, 16], [15, 9], [0, 0], [2, 12], [1, 1]])
    case = ring_case(num_rows=5, num_nodes=4, capacity=16, num_k_heads=2, head_k_dim=128, head_v_dim=128,
                     num_state_slots=6, num_ring_slots=5, cursors=cursors, ring_slots=[0, 1, 2, 3, 4],
                     state_slots=[3, 0, 5, -1, 1], parents=nodes, rows_dtype=torch.bfloat16, strong_decays=True,
                     device="cuda")
    want, got = run_both(case, tuning=MMA)
    assert not torch.equal(want["ssm_state"], case["ssm_state"])  # something folded
    assert_agree(want, got, tol=2e-3, state_tol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_repeated_token_rows(device):
    """Pending rows all the same token (identical keys, 12 pending and 4 drafts a path of 16), betas
    of 0.7, no decay: the power series over a whole path did not survive tf32 (9e-3 x max |o| off);
    at tf32 for the rows that do not fold, as the kernels run by default."""
    cursors = torch.tensor([[3, 12], [0, 8], [9, 12]])  # C = 20, capacity 16, N = 4: none folds
    case = ring_case(num_rows=3, num_nodes=4, capacity=16, cursors=cursors, ring_slots=[0, 1, 2],
                     state_slots=[1, 3, 0], num_ring_slots=3, device=device, seed=2)
    case["rows"][:] = case["rows"][:, :, :1]
    case["conv_state"][:] = case["rows"][:, :1, :1, :].transpose(-1, -2)[..., :1]
    case["gates"][..., 0, :] = 0.0
    case["gates"][..., 1, :] = 0.7
    want, got = run_both(case, tuning=dict(precision="tf32", fold_precision="tf32x3"))
    assert_agree(want, got, tol=2e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_low_precision_rows_and_state(device):
    case = ring_case(num_rows=3, num_nodes=2, capacity=3, rows_dtype=torch.bfloat16, state_dtype=torch.bfloat16,
                     kernel_size=3, device=device, seed=3)
    want, got = run_both(case, use_qk_l2norm=False)
    assert_agree(want, got, tol=1e-2)  # the bf16 checkpoint's rounding
    assert_same_untouched(case, want, got)
    case["q"] = case["q"].bfloat16()  # q and k of two dtypes
    want, got = run_both(case, use_qk_l2norm=False)
    assert_agree(want, got, tol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_cursors_and_links_skip(device):
    """A cursor outside the ring and a tree with a forward link: the first row is left alone
    entirely, the second folds and stores its gates but writes no output."""
    cursors = torch.tensor([[9, 1], [2, 3], [0, 1]])  # start 9 >= C = 6
    case = ring_case(num_rows=3, num_nodes=2, capacity=4, num_ring_slots=3, cursors=cursors, ring_slots=[0, 1, 2],
                     state_slots=[0, 1, 2], parents=[-1, 0], device=device, seed=5)
    case["parents"][1] = torch.tensor([-1, 1])
    want, got = run_both(case)
    assert (want["out"][:2] == FILL).all()
    assert_agree(want, got)


@pytest.mark.parametrize("device", DEVICES)
def test_wide_cursor_values_skip(device):
    """An int64 cursor whose start or pending is a ring position only once narrowed to 32 bits."""
    cursors = torch.tensor([[2**32, 1], [1, 2**32 + 2], [1, 2]])
    case = ring_case(num_rows=3, num_nodes=2, capacity=4, num_ring_slots=3, cursors=cursors, ring_slots=[0, 1, 2],
                     state_slots=[0, 1, 2], device=device, seed=9)
    case["cursor"] = cursors.to(device)
    want, got = run_both(case)
    assert (want["out"][:2] == FILL).all() and (want["out"][2] != FILL).all()
    assert_agree(want, got)
    want, got = run_flush_both(case)
    assert_agree(dict(want, out=torch.zeros(1)), dict(got, out=torch.zeros(1)))


@interpreted
@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_fuzz_interpreted(data):
    """Random cursors, capacities, drafts, trees, conv widths, groupings and padding."""
    num_nodes = data.draw(st.integers(1, 4), label="nodes")
    capacity = data.draw(st.integers(num_nodes, 6), label="capacity")
    num_rows = data.draw(st.integers(1, 3), label="rows")
    case = ring_case(
        num_rows=num_rows, num_nodes=num_nodes, capacity=capacity, kernel_size=data.draw(st.integers(2, 5)),
        ratio=data.draw(st.sampled_from([1, 2])), num_ring_slots=4,
        state_slots=data.draw(st.lists(st.integers(-1, 4), min_size=num_rows, max_size=num_rows, unique=True)),
        parents=data.draw(st.one_of(st.none(), trees(num_nodes)), label="parents"), seed=data.draw(st.integers(0, 99)),
    )
    want, got = run_both(case, use_qk_l2norm=data.draw(st.booleans()))
    assert_agree(want, got)
    assert_same_untouched(case, want, got)


MMA = dict(mma=True)  # gdn_ring_verify_mma's kernel: tf32, 3xTF32 in a row that folds a float32 checkpoint


@pytest.mark.parametrize("num_nodes, capacity, kinds", [
    (4, 16, [(2, 16, 12), (0, 16, 12), (1, 32, 12)]), (4, 12, [(2, 16, 0), (1, 16, 0)]),
    (4, 8, [(2, 16, 0), (1, 16, 0)]), (9, 14, [(2, 16, 0), (1, 32, 0)]), (16, 16, [(2, 16, 0), (1, 32, 0)]),
    (9, 24, None)])
def test_mma_verify_stack_sized_by_the_capacity(num_nodes, capacity, kinds, monkeypatch):
    """A row that does not fold holds at most max(R, N) = R keys (pending + N <= R, or nothing
    pending), so the mma verify launches' stack is sized by that and their queries start at row
    VERIFY_KEYS = R (KIND, NODES, SMALL_KEYS as in test_mma_launches_by_kind_of_row): 16 rows where
    R + N <= 16 (no small kind then), else 32. The launcher takes the mma kernel wherever R + N <= 32
    (16 nodes at R = 16), else the Triton kernel; asked for the mma kernel past that, it refuses."""
    case = ring_case(num_rows=2, num_nodes=num_nodes, capacity=capacity, head_k_dim=32, head_v_dim=32)
    args, kwargs = sgl_convwin.gdn_ring_verify.kernel_arguments(
        torch.empty(case["v"].shape), case["q"], case["k"], case["v"], case["g"], case["beta"], case["ssm_state"],
        case["conv_state"], case["rows"], case["gates"], case["cursor"], case["conv_weight"], case["conv_bias"],
        case["ring_slots"], case["state_slots"], 1, None)
    ring_calls = triton_kernels().gdn_ring_verify._ring_calls
    assert triton_kernels().gdn_ring_verify.mma_verify_keys(capacity + num_nodes, num_nodes) == capacity
    monkeypatch.setattr(triton_kernels().gdn_ring_verify, "_mma_kernel_runs_on", lambda ssm: True)  # (a GPU's)
    chosen = ring_calls(*args, **kwargs)  # the launcher's own choice: the mma kernel wherever its stack fits 32 rows
    assert any("KIND" in c.constexprs for c in chosen) == (capacity + num_nodes <= 32)
    if capacity + num_nodes > 32:
        with pytest.raises(ValueError, match=f"a stack of {capacity} keys"):
            ring_calls(*args, **kwargs, mma=True)
        return
    calls = [c for c in ring_calls(*args, **kwargs, mma=True, merged=False) if "KIND" in c.constexprs]
    assert [(c.constexprs["KIND"], c.constexprs["NODES"], c.constexprs["SMALL_KEYS"]) for c in calls] == kinds
    assert {c.constexprs["VERIFY_KEYS"] for c in calls} == {capacity}


@pytest.mark.parametrize("tree_depth, capacity, mma", [(4, 16, True), (1, 16, True), (8, 16, True), (2, 24, False)])
def test_mma_verify_stack_sized_by_the_tree_depth(tree_depth, capacity, mma, monkeypatch):
    """Trees of N = 8 at tree_depth T: a row that does not fold holds at most C - T keys (pending + T
    <= R), so the verify launches' queries start at row VERIFY_KEYS = C - T and fold above it; the
    mma kernel wherever C - T + N <= 32."""
    case = ring_case(num_rows=2, num_nodes=8, capacity=capacity, head_k_dim=32, head_v_dim=32,
                     parents=torch.tensor([[-1, 0, 1, 2, 3, 4, 5, 6][:tree_depth] + [-1] * (8 - tree_depth)] * 2))
    args, kwargs = sgl_convwin.gdn_ring_verify.kernel_arguments(
        torch.empty(case["v"].shape), case["q"], case["k"], case["v"], case["g"], case["beta"], case["ssm_state"],
        case["conv_state"], case["rows"], case["gates"], case["cursor"], case["conv_weight"], case["conv_bias"],
        case["ring_slots"], case["state_slots"], 1, case["parents"], tree_depth=tree_depth)
    monkeypatch.setattr(triton_kernels().gdn_ring_verify, "_mma_kernel_runs_on", lambda ssm: True)
    calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs)
    assert {c.constexprs["FOLD_ABOVE"] for c in calls if "FOLD_ABOVE" in c.constexprs} == {capacity + 8 - tree_depth}
    assert any("KIND" in c.constexprs for c in calls) == mma
    assert {c.constexprs["VERIFY_KEYS"] for c in calls if c.constexprs.get("KIND", 2) != 2} <= {capacity + 8 - tree_depth}


@pytest.mark.parametrize("num_nodes, small, kinds", [
    (4, True, [(2, 16, 12), (0, 16, 12), (1, 32, 12)]), (8, True, [(2, 16, 8), (0, 16, 8), (1, 32, 8)]),
    (4, False, [(2, 16, 0), (1, 32, 0)]), (9, True, [(2, 16, 0), (1, 32, 0)])])
def test_mma_launches_by_kind_of_row(monkeypatch, num_nodes, small, kinds):
    """The mma kernel's launches at capacity 16 (KIND, NODES, SMALL_KEYS): first the folds, on a
    stack of the pending keys (16 rows here), then rows with few pending tokens on a stack of 16 rows
    while 2 N <= 16, then the others on 32; every launch sorts rows by the same rule (SMALL_KEYS: 0,
    none small); programmatic dependents by default (CPU tensors count as sm_90's), plain ones with
    RING_MMA_PDL 0."""
    case = ring_case(num_rows=2, num_nodes=num_nodes, capacity=16 if num_nodes < 9 else 23 - num_nodes,
                     head_k_dim=32, head_v_dim=32)
    out = torch.empty(case["v"].shape)
    args, kwargs = sgl_convwin.gdn_ring_verify.kernel_arguments(
        out, case["q"], case["k"], case["v"], case["g"], case["beta"], case["ssm_state"], case["conv_state"],
        case["rows"], case["gates"], case["cursor"], case["conv_weight"], case["conv_bias"], case["ring_slots"],
        case["state_slots"], 1, None)
    apart = dict(mma=True, small=small, merged=False)  # each kind of row its own launch
    calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, **apart)
    assert [(c.constexprs["KIND"], c.constexprs["NODES"], c.constexprs["SMALL_KEYS"])
            for c in calls if "KIND" in c.constexprs] == kinds
    assert [(c.constexprs["PDL"], c.constexprs.get("launch_pdl")) for c in calls] == [(True, True)] * len(kinds)
    monkeypatch.setattr(triton_kernels().gdn_ring_verify, "RING_MMA_PDL", 0)
    calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, **apart)
    assert [(c.constexprs["PDL"], "launch_pdl" in c.constexprs) for c in calls] == [(False, False)] * len(kinds)
    monkeypatch.setattr(triton_kernels().gdn_ring_verify, "RING_MMA_PDL", 1)
    # the fold launch's own warps, the verifies' unchanged
    calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, **apart, block_v=64, num_warps=4,
                                                         fold_warps=8)
    assert [(c.constexprs["KIND"], c.constexprs["WARPS"], c.constexprs["num_warps"]) for c in calls
            if "KIND" in c.constexprs] == [(kind, 8 if kind == 2 else 4, 8 if kind == 2 else 4)
                                           for kind, _, _ in kinds]
    with pytest.raises(ValueError, match="block_v >= 8 x warps"):
        triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, mma=True, block_v=32, fold_warps=8)
    # the fold launch's own column tiles and grid (head_v_dim 32: one tile of 32, two of 16)
    calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, **apart, num_warps=4, fold_block_v=16,
                                                         fold_warps=2)
    assert [(c.constexprs["KIND"], c.constexprs["BLOCK_V"], c.grid[0]) for c in calls if "KIND" in c.constexprs] == [
        (kind, 16 if kind == 2 else 32, case["v"].shape[2] * (2 if kind == 2 else 1)) for kind, _, _ in kinds]
    for fold_block_v, fold_warps in ((16, 4), (24, 1)):
        with pytest.raises(ValueError, match=f"the folds.*got block_v {fold_block_v}, {fold_warps} warps"):
            triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, mma=True, fold_block_v=fold_block_v,
                                                         fold_warps=fold_warps)
    for tiles in (dict(chunk_k=8), dict(chunk_k=24), dict(block_v=48), dict(block_v=32, num_warps=3)):
        with pytest.raises(ValueError, match="powers of two"):  # (else a compile error)
            triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, mma=True, **tiles)
    # the fold's own cap: 168 by default, none on request
    calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, mma=True, small=small)
    assert calls[0].constexprs["KIND"] == 2 and calls[0].constexprs["maxnreg"] == 168
    calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, mma=True, small=small, fold_maxnreg=0)
    assert calls[0].constexprs["KIND"] == 2 and "maxnreg" not in calls[0].constexprs
    # by default the folded windows moved by the verify launches (no window launch); apart on request
    calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, **apart)
    assert [c.constexprs.get("FUSED_WINDOW") for c in calls] == [True] * len(kinds)
    calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, **apart, fused_window=False)
    assert [c.constexprs.get("FUSED_WINDOW") for c in calls] == [False] * len(kinds) + [None]  # + the window's
    # the state chunks through shared memory, two by default: every launch, at most a tile's chunks (dk
    # 32: one of 32 rows, two of 16); through registers where a thread's copy would be under 4 bytes
    # (below: a bf16 state on 32 columns over 4 warps), or on request; a pool stored transposed, as
    # engines store it, copies 16 bytes down a column
    assert triton_kernels().gdn_ring_verify.RING_MMA_STATE_STAGES == 2  # (benchmarks.md, "Ring": 2 the fastest)
    for stages, chunk_k, want in ((None, None, 1), (None, 16, 2), (0, None, 0), (2, None, 1), (2, 16, 2), (3, 16, 2)):
        calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, **apart, state_stages=stages,
                                                             chunk_k=chunk_k)
        assert [c.constexprs["STATE_STAGES"] for c in calls] == [want] * len(kinds)
        assert [c.constexprs["CHUNK_K"] for c in calls if "KIND" in c.constexprs] == [chunk_k or 32] * len(kinds)
    transposed = case["ssm_state"].transpose(-1, -2).contiguous().transpose(-1, -2)
    transposed_args = [transposed if a is case["ssm_state"] else a for a in args]
    calls = triton_kernels().gdn_ring_verify._ring_calls(*transposed_args, **kwargs, **apart, state_stages=2,
                                                         chunk_k=16)
    assert [c.constexprs["STATE_STAGES"] for c in calls] == [2] * len(kinds)
    bf16_args = [a.to(torch.bfloat16) if a is case["ssm_state"] else a for a in args]
    assert sum(a.dtype == torch.bfloat16 for a in bf16_args if isinstance(a, torch.Tensor)) == 1
    calls = triton_kernels().gdn_ring_verify._ring_calls(*bf16_args, **kwargs, **apart, state_stages=2)
    assert [c.constexprs["STATE_STAGES"] for c in calls if "KIND" in c.constexprs] == [0] * len(kinds)
    for state, want in ((case["ssm_state"], 1), (transposed, 1)):  # (a thread's 4 adjacent values, or 8 rows)
        bf16 = [state.to(torch.bfloat16) if a is case["ssm_state"] else a for a in args]
        calls = triton_kernels().gdn_ring_verify._ring_calls(*bf16, **kwargs, **apart, state_stages=2, block_v=32,
                                                             num_warps=1)
        assert [c.constexprs["STATE_STAGES"] for c in calls if "KIND" in c.constexprs] == [want] * len(kinds)
    # by default the rows on the stack of 16 and the others in one launch (KIND 3), where there are both
    calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, mma=True, small=small)
    if len(kinds) == 3:
        assert [c.constexprs["KIND"] for c in calls if "KIND" in c.constexprs] == [2, 3]
        assert calls[1].constexprs["SMALL_KEYS"] == kinds[1][2] and calls[1].constexprs["NODES"] == 32
    else:
        assert [c.constexprs["KIND"] for c in calls if "KIND" in c.constexprs] == [kind for kind, _, _ in kinds]
    # register caps: one for both launches that do not fold, or a pair (small rows', others'; by default
    # none, 128)
    for maxnreg, caps in ((168, {0: 168, 1: 168}), ((0, 128), {1: 128}), (0, {}), ("default", {1: 128}),
                          (None, {1: 128})):
        calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, **apart, fold_maxnreg=0,
                                                             **({} if maxnreg == "default" else dict(maxnreg=maxnreg)))
        assert {c.constexprs["KIND"]: c.constexprs["maxnreg"] for c in calls if "maxnreg" in c.constexprs} == {
            kind: cap for kind, cap in caps.items() if kind in [k for k, _, _ in kinds]}
    calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, mma=True, small=small)
    assert {c.constexprs["KIND"]: c.constexprs["maxnreg"] for c in calls} == {2: 168, len(kinds) % 2 * 2 + 1: 128}


@pytest.mark.parametrize("num_rows, spread, warps, block_v", [(1, False, None, 128), (1, True, None, 32),
                                                             (8, True, None, 64), (16, True, None, 128),
                                                             (1, True, 8, 64)])
def test_mma_tiles_by_batch(num_rows, spread, warps, block_v, monkeypatch):
    """The mma launches' tiles at dv 128: 128 columns, or with RING_MMA_SPREAD as gdn_verify's
    spread_block (halved while a launch of 32 heads would have fewer than 512 programs, to 32, or
    on 8 warps to their 64 columns), the folds' too."""
    monkeypatch.setattr(triton_kernels().gdn_ring_verify, "RING_MMA_SPREAD", spread)
    case = ring_case(num_rows=num_rows, num_nodes=4, capacity=16, num_k_heads=16, head_k_dim=32, head_v_dim=128,
                     num_state_slots=num_rows, num_ring_slots=num_rows, ring_slots=list(range(num_rows)),
                     state_slots=list(range(num_rows)))
    out = torch.empty(case["v"].shape)
    args, kwargs = sgl_convwin.gdn_ring_verify.kernel_arguments(
        out, case["q"], case["k"], case["v"], case["g"], case["beta"], case["ssm_state"], case["conv_state"],
        case["rows"], case["gates"], case["cursor"], case["conv_weight"], case["conv_bias"], case["ring_slots"],
        case["state_slots"], 1, None)
    calls = triton_kernels().gdn_ring_verify._ring_calls(*args, **kwargs, mma=True,
                                                         **({"num_warps": warps} if warps else {}))
    assert [(c.constexprs["BLOCK_V"], c.grid[0]) for c in calls if "KIND" in c.constexprs] == [
        (block_v, 32 * 128 // block_v)] * 2


def mixed_rows_case(num_nodes, capacity, head_dim, cursors=None, **kwargs):
    """The mma kernel's GPU case: five rows of two key heads (dk = dv = head_dim), bf16 rows -- by
    default one that folds (every slot pending, wrapping the ring's end), one that replays 9
    (wrapping), an empty ring, one with capacity - N pending, and a padded row (slot -1)."""
    ring_rows = capacity + num_nodes
    if cursors is None:
        cursors = [[ring_rows - 3, capacity], [ring_rows - 5, 9], [0, 0], [2, capacity - num_nodes], [1, 1]]
    return ring_case(num_rows=5, num_nodes=num_nodes, capacity=capacity, num_k_heads=2, head_k_dim=head_dim,
                     head_v_dim=head_dim, num_state_slots=6, num_ring_slots=5, cursors=torch.tensor(cursors),
                     ring_slots=[0, 1, 2, 3, 4], state_slots=[3, 0, 5, -1, 1], rows_dtype=torch.bfloat16,
                     device="cuda", **kwargs)


def assert_mixed_rows_agree(case, want, got, state_dtype=torch.float32):
    """A mixed_rows_case's call: something folded, outputs within 2e-3, states within 1e-4 (bf16: 1e-2),
    every row left alone by the PyTorch code left alone by the kernels."""
    assert not torch.equal(want["ssm_state"], case["ssm_state"])  # something folded
    assert_agree(want, got, tol=2e-3, state_tol=1e-4 if state_dtype == torch.float32 else 1e-2)
    assert_same_untouched(case, want, got)


@pytest.mark.gpu
@pytest.mark.parametrize("nodes", [[-1, 0, 1, 2], [-1, 0, 0, 1], [-1, 0, 0, 0, 1, 1, 1, 4]],
                         ids=["chain", "tree", "tree8"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [32, 128])
@pytest.mark.parametrize("capacity", [16, 20])
@pytest.mark.parametrize("fold", [{}, dict(fold_block_v=32, fold_warps=2), dict(fused_window=False),
                                  dict(merged=False), dict(block_v=64), dict(state_stages=0), dict(state_stages=3),
                                  dict(chunk_k=16, state_stages=4), dict(state_stages=4), dict(num_warps=8),
                                  dict(fold_tiles=0)],
                         ids=["default", "fold-32-columns", "window-apart", "unmerged", "64-columns", "registers",
                              "state-stages-3", "state-stages-16-rows", "state-stages-whole-tile", "8-warps",
                              "fold-row-programs"])
def test_mma_kernel_matches_pytorch_code(nodes, state_dtype, head_dim, capacity, fold):
    """gdn_ring_verify_mma's kernel at capacity 16 (R + N = 20 / 24 verify stack rows: chains of 4 /
    trees of 8) and 20 (24 / 28: the pending tokens past half the stack): rows that fold (every slot
    pending), rows that only replay (wrapping the ring's end), few pending tokens (the stack of 16
    rows), an empty ring, a padded row; by default the folded windows moved by the verify launches,
    merged into one; the fold launch also over its own narrower tiles; the windows in a launch of
    their own; the two verify launches apart; every launch over tiles of 64 columns (two a head: the
    small batches' choice); the state chunks through registers, a chunk ahead, instead of shared
    memory (2 in flight by default; 3; 4 of 16 rows; the whole tile, which the fold then reads back);
    8 warps a program; the fold launch one program a row, its tiles one after another (the same bits
    as the default's)."""
    num_nodes = len(nodes)
    if ("fold_block_v" in fold or "block_v" in fold or "num_warps" in fold) and head_dim == 32:
        pytest.skip("one tile of 32 columns either way (8 warps: 64 or more)")
    if head_dim == 32 and ("chunk_k" not in fold and fold.get("state_stages", 0) > 2
                           or fold == dict(state_stages=0) and state_dtype == torch.bfloat16):
        pytest.skip("the default's launches: one chunk of 32 rows (a bf16 one through registers either way)")
    case = mixed_rows_case(num_nodes, capacity, head_dim, parents=nodes, state_dtype=state_dtype)
    want, got = run_both(case, tuning=dict(MMA, **fold))
    assert_mixed_rows_agree(case, want, got, state_dtype)
    if "fold_tiles" in fold:
        _, default = run_both(case, tuning=MMA)
        for name in ("ssm_state", "conv_state", "gates", "out"):
            assert torch.equal(got[name], default[name]), name


@pytest.mark.gpu
@pytest.mark.parametrize("nodes", [[-1, 0, 1, 2], [-1, 0, 0, 0, 1, 1, 1, 4]], ids=["chain", "tree8"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("fold", [{}, dict(state_stages=3), dict(chunk_k=16, state_stages=4),
                                  dict(fold_block_v=32, fold_warps=2), dict(state_stages=0)],
                         ids=["default", "state-stages-3", "state-stages-16-rows", "fold-32-columns", "registers"])
def test_mma_kernel_transposed_checkpoints(nodes, state_dtype, fold):
    """Checkpoints stored [.., dv, dk] and passed transposed (engines' layout): the state chunks
    copied 16 bytes down a column and the folds stored so, against the PyTorch code, rows that fold
    and rows that only replay."""
    case = mixed_rows_case(len(nodes), 16, 128, parents=nodes, state_dtype=state_dtype, transposed=True)
    assert case["ssm_state"].stride(-2) == 1
    want, got = run_both(case, tuning=dict(MMA, **fold))
    assert got["ssm_state"].stride() == case["ssm_state"].stride()
    assert_mixed_rows_agree(case, want, got, state_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("nodes", [[-1, 0, 1, 2], [-1, 0, 0, 0, 1, 1, 1, 4]], ids=["chain", "tree8"])
def test_mma_kernel_as_programmatic_dependent(monkeypatch, nodes):
    """RING_MMA_PDL (the default): every mma launch a programmatic dependent, its reads after the
    wait: the verify launch right after the fold launch whose checkpoints it reads, against the
    PyTorch code, rows that fold and rows that replay, in either layer."""
    monkeypatch.setattr(triton_kernels().gdn_ring_verify, "RING_MMA_PDL", 1)
    case = mixed_rows_case(len(nodes), 16, 64, parents=nodes)
    for layer in (0, 1):
        want, got = run_both(case, layer=layer, tuning=MMA)
        assert_mixed_rows_agree(case, want, got)


@pytest.mark.gpu
@pytest.mark.parametrize("nodes", [[-1, 0, 1, 2], [-1, 0, 0, 0, 1, 1, 1, 4]], ids=["chain", "tree8"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mma_kernel_stack_in_four_parts(monkeypatch, nodes, state_dtype):
    """RING_MMA_STACK_PARTS = 4: the stack staged in blocks of 8 rows where its pending tokens fit
    them (a tree's on the stack of 32), against the PyTorch code and bit for bit against 2 (the
    same arithmetic a row: only the rows' grouping changes), rows that fold, replay, hold nothing, pad."""
    case = mixed_rows_case(len(nodes), 16, 128, parents=nodes, state_dtype=state_dtype)
    runs = {}
    for parts in (2, 4):
        monkeypatch.setattr(triton_kernels().gdn_ring_verify, "RING_MMA_STACK_PARTS", parts)
        want, runs[parts] = run_both(case, tuning=MMA)
        assert_mixed_rows_agree(case, want, runs[parts], state_dtype)
    for name in ("out", "ssm_state", "conv_state", "gates"):
        assert torch.equal(runs[4][name], runs[2][name]), name


@pytest.mark.gpu
@pytest.mark.parametrize("nodes", [[-1, 0, 1, 2], [-1, 0, 0, 0, 1, 1, 1, 4]], ids=["chain", "tree8"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mma_kernel_prefetched_values(monkeypatch, nodes, state_dtype):
    """RING_MMA_PREFETCH_VALUES: the drafts' v rows hinted into L2 at a verify program's start, against
    the PyTorch code and bit for bit against none: rows that fold, replay, hold nothing, pad."""
    case = mixed_rows_case(len(nodes), 16, 128, parents=nodes, state_dtype=state_dtype)
    runs = {}
    for prefetch in (False, True):
        monkeypatch.setattr(triton_kernels().gdn_ring_verify, "RING_MMA_PREFETCH_VALUES", prefetch)
        want, runs[prefetch] = run_both(case, tuning=MMA)
        assert_mixed_rows_agree(case, want, runs[prefetch], state_dtype)
    for name in ("out", "ssm_state", "conv_state", "gates"):
        assert torch.equal(runs[True][name], runs[False][name]), name


@pytest.mark.gpu
@pytest.mark.parametrize("capacity", [20, 24])
def test_mma_kernel_takes_wide_rings(capacity):
    """The mma kernel verifies chains of 8 at capacities 20 and 24 (R + N = 28 and 32 stack rows: a
    row that does not fold holds at most R keys): rows that fold, replay, hold nothing, pad."""
    ring_rows = capacity + 8
    case = mixed_rows_case(8, capacity, 128, cursors=[[ring_rows - 3, capacity], [ring_rows - 5, capacity - 9],
                                                       [0, 0], [2, 3], [1, 1]])
    want, got = run_both(case, tuning=MMA)
    assert_mixed_rows_agree(case, want, got)


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mma_kernel_takes_16_nodes(state_dtype):
    """The mma kernel verifies a tree of 16 nodes at capacity 16 (R + N = 32 stack rows: a row that
    does not fold holds at most R keys): rows that fold, replay, hold nothing, pad."""
    nodes = [-1, 0, 0, 0, 1, 1, 1, 2, 2, 3, 4, 4, 5, 7, 9, 12]
    capacity, ring_rows = 16, 32
    case = mixed_rows_case(len(nodes), capacity, 128, cursors=[[ring_rows - 3, capacity], [ring_rows - 5, 9], [0, 0],
                                                               [2, 0], [1, 1]], parents=nodes, state_dtype=state_dtype)
    want, got = run_both(case, tuning=MMA)
    assert_mixed_rows_agree(case, want, got, state_dtype)


def ring_step_calls(kernels, verify_tuning=IEEE):
    """(conv, verify, accept, flush) of one world: the ring's kernels, or the ops' PyTorch code."""
    if not kernels:
        return tuple(ring_pytorch_code(name) for name in ("ring_conv1d_verify", "gdn_ring_verify", "ring_accept",
                                                          "gdn_ring_flush"))
    launchers = triton_kernels()

    def through(op, launch, **tuning):
        def call(*args, **kwargs):
            kernel_args, kernel_kwargs = op.kernel_arguments(*args, **kwargs)
            launch(*kernel_args, **{**kernel_kwargs, **tuning})
        return call

    return (through(sgl_convwin.ring_conv1d_verify, launchers.launch_ring_conv1d_verify),
            through(sgl_convwin.gdn_ring_verify, launchers.launch_gdn_ring_verify, **verify_tuning),
            through(sgl_convwin.ring_accept, launchers.launch_ring_accept),
            through(sgl_convwin.gdn_ring_flush, launchers.launch_gdn_ring_flush, **IEEE))


@pytest.mark.parametrize("device, verify, tree", [
    pytest.param("cpu", "ieee", True, marks=[interpreted, pytest.mark.slow], id="tree-cpu"),  # (chains: the GPU's)
    *(pytest.param("cuda", verify, tree, marks=pytest.mark.gpu, id=f"{'tree' if tree else 'chain'}-cuda-{verify}")
      for verify in ("ieee", "mma", "mma-unmerged", "mma-apart", "mma-registers")
      for tree in (False, True)),
])
def test_steps_against_pytorch_code(device, verify, tree):
    """Twelve decode steps of two layers (ring_conv1d_verify, gdn_ring_verify per layer, then
    ring_accept), then a flush: one world all kernels, one all PyTorch code. The states they leave,
    step after step (folds, wrapped rings, nothing accepted, a padded row), agree. verify: the
    Triton verify kernel in float32 ("ieee"), or the mma kernel at its own precision (a verify stack
    of 16 rows: R + N = 8): by default its verify launches merged into one and moving the folded
    windows ("mma"), the two launches apart ("mma-unmerged"), and the windows in a launch of their
    own too, the fold uncapped ("mma-apart"), the state chunks through registers instead of shared
    memory ("mma-registers")."""
    gen = torch.Generator().manual_seed(1)
    layers, num_nodes, capacity, kernel_size = 2, 3, 5, 4
    head_dim = 16 if verify == "ieee" else 32  # (the mma kernel's four warps take 32 columns or more)
    case = ring_case(num_rows=3, num_nodes=num_nodes, capacity=capacity, kernel_size=kernel_size, num_ring_slots=3,
                     cursors=torch.zeros(3, 2, dtype=torch.int64), ring_slots=[2, -1, 1], state_slots=[1, -1, 3],
                     head_k_dim=head_dim, head_v_dim=head_dim, device=device)  # row 1 padded
    parents = torch.tensor([[-1, 0, 0]] * 3, device=device) if tree else None
    weight = torch.randn(layers, *case["conv_weight"].shape, generator=gen).to(device) * 0.5
    bias = torch.randn(layers, case["conv_bias"].shape[0], generator=gen).to(device) * 0.1
    names = ("ssm_state", "conv_state", "rows", "gates", "cursor")
    worlds = [{name: case[name].clone() for name in names} for _ in range(2)]
    num_rows, dim = 3, case["rows"].shape[-1]
    num_k_heads, head_k_dim = case["q"].shape[2:]
    num_v_heads, head_v_dim = case["v"].shape[2:]
    for step in range(13):
        x = torch.randn(num_rows, num_nodes, dim, generator=gen).to(device)
        drafts = {name: torch.randn(case[name].shape, generator=gen).to(device) for name in ("q", "k", "v")}
        drafts["g"] = -torch.rand(case["g"].shape, generator=gen).to(device)
        drafts["beta"] = torch.rand(case["beta"].shape, generator=gen).to(device)
        steps = torch.randint(-1, num_nodes, (num_rows,), generator=gen).to(device)
        results = []
        for kernels, world in zip((False, True), worlds):
            conv1d_verify, gdn_ring_verify, ring_accept, gdn_ring_flush = ring_step_calls(
                kernels, {"ieee": IEEE, "mma": MMA, "mma-unmerged": dict(MMA, merged=False),
                          "mma-apart": dict(MMA, merged=False, fused_window=False, fold_maxnreg=0),
                          "mma-registers": dict(MMA, state_stages=0)}[verify])
            out = torch.full(case["v"].shape, FILL, device=device)
            conv_out = torch.full((layers, num_rows, num_nodes, dim), FILL, device=device)
            if step == 12:  # the states an engine would hand on
                gdn_ring_flush(world["ssm_state"], world["conv_state"], world["cursor"], world["rows"], world["gates"],
                               weight, case["ring_slots"], case["state_slots"], num_k_heads=num_k_heads,
                               head_k_dim=head_k_dim, num_v_heads=num_v_heads, head_v_dim=head_v_dim, conv_bias=bias)
            for layer in range(layers if step < 12 else 0):
                conv1d_verify(conv_out[layer], world["rows"], world["conv_state"], x, weight[layer], bias[layer],
                              case["ring_slots"], case["state_slots"], world["cursor"], layer, parents)
                gdn_ring_verify(out, drafts["q"], drafts["k"], drafts["v"], drafts["g"], drafts["beta"],
                                world["ssm_state"], world["conv_state"], world["rows"], world["gates"], world["cursor"],
                                weight[layer], bias[layer], case["ring_slots"], case["state_slots"], layer, parents)
            if step < 12:
                ring_accept(world["cursor"], world["rows"], world["gates"], case["ring_slots"], steps, parents,
                            num_draft=num_nodes)
            results.append((out, conv_out))
        (want_out, want_conv), (got_out, got_conv) = results
        scale = want_conv.abs().max().item()
        assert (got_conv - want_conv).abs().max().item() <= 2e-6 * scale  # (fma against rounded products)
        assert_agree(dict(worlds[0], out=want_out), dict(worlds[1], out=got_out),
                     tol=1e-4 if verify == "ieee" else 2e-3, state_tol=1e-4)
    assert not torch.equal(worlds[0]["ssm_state"], case["ssm_state"])  # checkpoints were folded
    assert (worlds[0]["cursor"][:, 1] == 0).all()  # and flushed
    assert not torch.equal(worlds[0]["cursor"], case["cursor"])


def run_flush_both(case, tuning=IEEE, num_draft=None):
    """(PyTorch code's tensors, kernels' tensors) after one gdn_ring_flush each, every layer."""
    num_v_heads, head_k_dim, head_v_dim = case["ssm_state"].shape[2:]
    num_k_heads = case["q"].shape[2]
    layers = case["ssm_state"].shape[0]
    weight = torch.stack([case["conv_weight"], case["conv_weight"].flip(1)])[:layers]
    bias = torch.stack([case["conv_bias"], -case["conv_bias"]])[:layers]

    def call(launch):
        mine = {name: case[name].clone() for name in ("ssm_state", "conv_state", "cursor", "rows", "gates")}
        args = (mine["ssm_state"], mine["conv_state"], mine["cursor"], mine["rows"], mine["gates"], weight,
                case["ring_slots"], case["state_slots"])
        kwargs = dict(num_k_heads=num_k_heads, head_k_dim=head_k_dim, num_v_heads=num_v_heads, head_v_dim=head_v_dim,
                      conv_bias=bias, num_draft=num_draft)
        if launch:
            kernel_args, kernel_kwargs = sgl_convwin.gdn_ring_flush.kernel_arguments(*args, **kwargs)
            triton_kernels().launch_gdn_ring_flush(*kernel_args, **kernel_kwargs, **tuning)
        else:
            ring_pytorch_code("gdn_ring_flush")(*args, **kwargs)
        return mine

    return call(False), call(True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layers", [2, 1])
def test_flush_matches_pytorch_code(device, layers):
    """Every layer's fold of every pending token (a full ring, one wrapping its end, an empty one, a
    bad cursor, a padded row) by the chunk kernel, then the cursors; a model of one layer too
    (weights [1, dim, K])."""
    cursors = torch.tensor([[3, 5], [5, 2], [0, 0], [1, 9], [2, 3]])  # C = 6 (capacity 4, N = 2): pending <= 5
    case = ring_case(num_rows=5, num_nodes=2, capacity=4, num_ring_slots=5, num_state_slots=6, cursors=cursors,
                     ring_slots=[0, 1, 2, 3, 4], state_slots=[4, 2, 0, 1, -1], device=device, seed=7)
    for name in ("ssm_state", "conv_state", "rows", "gates"):
        case[name] = case[name][:layers]
    want, got = run_flush_both(case)
    for layer in range(layers):  # every layer folded
        assert not torch.equal(want["ssm_state"][layer], case["ssm_state"][layer])
    assert_agree(dict(want, out=torch.zeros(1)), dict(got, out=torch.zeros(1)))
    assert_same_untouched(case, want, got)


@pytest.mark.parametrize("device", DEVICES)
def test_due_flush_matches_pytorch_code(device):
    """flush(num_draft=N): every layer's fold of the rows the next verify of N drafts would fold
    (pending + N > capacity), the others untouched -- fewer pending, nothing pending, more than the
    capacity pending (not a verify's ring position), a padded row -- then their cursors only."""
    cursors = torch.tensor([[3, 4], [5, 2], [0, 0], [1, 3], [2, 3], [4, 5]])  # C = 6 (capacity 4, N = 2)
    case = ring_case(num_rows=6, num_nodes=2, capacity=4, num_ring_slots=6, num_state_slots=7, cursors=cursors,
                     ring_slots=[0, 1, 2, 3, 4, 5], state_slots=[4, 2, 0, 1, -1, 6], device=device, seed=8)
    want, got = run_flush_both(case, num_draft=2)
    folded, kept = [4, 1], [2, 0, 6, 3, 5]  # (state slots)
    assert not torch.equal(want["ssm_state"][:, folded], case["ssm_state"][:, folded])
    for name in ("ssm_state", "conv_state"):
        assert torch.equal(got[name][:, kept], case[name][:, kept]), name
    assert torch.equal(got["cursor"].cpu(), torch.tensor([[1, 0], [5, 2], [0, 0], [4, 0], [2, 3], [4, 5]]))
    assert_agree(dict(want, out=torch.zeros(1)), dict(got, out=torch.zeros(1)))
    assert_same_untouched(case, want, got)


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_fold_programs_walk_a_divisor_of_a_rows_tiles():
    """Both rings' fold launches (fold_tiles): a program walks 1, several or all (0) of a row's tiles,
    a divisor of them; any other count is refused before a launch."""
    walking = triton_kernels()._common.programs_walking
    assert [walking("op", 32, n) for n in (1, 4, 32, 0)] == [(1, 32), (4, 8), (32, 1), (32, 1)]
    with pytest.raises(ValueError, match="op: a fold program's tiles must divide a row's 32, got 3"):
        walking("op", 32, 3)


def flush_arguments(case, **kwargs):
    """gdn_ring_flush's kernel arguments over a ring_case of one key head of dk = dv = 32 and two
    value heads, every layer with the case's conv weight and bias."""
    layers = case["ssm_state"].shape[0]
    return sgl_convwin.gdn_ring_flush.kernel_arguments(
        case["ssm_state"], case["conv_state"], case["cursor"], case["rows"], case["gates"],
        torch.stack([case["conv_weight"]] * layers), case["ring_slots"], case["state_slots"], num_k_heads=1,
        head_k_dim=32, num_v_heads=2, head_v_dim=32, conv_bias=torch.stack([case["conv_bias"]] * layers), **kwargs)


def test_due_flush_plans_the_verifys_fold_over_every_layer(monkeypatch):
    """Where the verify runs the mma kernel a due flush is one launch of the verify's own fold
    (KIND 2: its stack, tiles, warps, stages and register cap; every other constexpr alike but the
    rule's, N = 0 with FOLD_ABOVE = C - 2N, and what only the verify kinds read) over a grid of every
    layer, then the windows and the cursors by the same rule; a full flush stays on the chunk kernel."""
    case = ring_case(num_rows=3, num_nodes=4, capacity=16, head_k_dim=32, head_v_dim=32)
    layers = case["ssm_state"].shape[0]
    args, kwargs = flush_arguments(case, num_draft=4)
    module = triton_kernels().gdn_ring_verify
    monkeypatch.setattr(module, "_mma_kernel_runs_on", lambda ssm: True)  # (a GPU's)
    fold, window, cursors = module._flush_calls(*args, **kwargs)  # (the launcher's own choice)
    assert fold.kernel.__name__ == "_gdn_ring_verify_mma_kernel" and fold.grid[2] == layers
    verify_args, verify_kwargs = sgl_convwin.gdn_ring_verify.kernel_arguments(
        torch.empty(case["v"].shape), case["q"], case["k"], case["v"], case["g"], case["beta"], case["ssm_state"],
        case["conv_state"], case["rows"], case["gates"], case["cursor"], case["conv_weight"], case["conv_bias"],
        case["ring_slots"], case["state_slots"], 1, None)
    verify_fold = module._ring_calls(*verify_args, **verify_kwargs)[0]
    assert verify_fold.constexprs["KIND"] == 2 and fold.grid[:2] == verify_fold.grid[:2]
    rule_and_verify = {"NUM_NODES", "FOLD_ABOVE", "FUSED_WINDOW", "VERIFY_KEYS", "SMALL_KEYS"}
    assert {name: value for name, value in fold.constexprs.items() if name not in rule_and_verify} == \
        {name: value for name, value in verify_fold.constexprs.items() if name not in rule_and_verify}
    assert (fold.constexprs["NUM_NODES"], fold.constexprs["FOLD_ABOVE"], fold.constexprs["MAX_PENDING"]) == (0, 12, 16)
    for call in (window, cursors):
        assert (call.constexprs["MAX_PENDING"], call.constexprs["FOLD_ABOVE"]) == (16, 12)
    assert "KIND" not in module._flush_calls(*args, **dict(kwargs, num_draft=None))[0].constexprs
    with pytest.raises(ValueError, match="at most 32 pending keys"):  # (a full flush's C - 1 = 19 fit; 40 not)
        wide = ring_case(num_rows=1, num_nodes=4, capacity=37, head_k_dim=32, head_v_dim=32)
        wide_args, wide_kwargs = flush_arguments(wide)
        module._flush_calls(*wide_args, **wide_kwargs, mma=True)


@pytest.mark.parametrize("capacity, stack", [(16, 16), (12, 16), (20, 32)])
def test_a_due_flush_folds_on_a_stack_of_16_rows_up_to_16_pending_tokens(monkeypatch, capacity, stack):
    """design.md's reason for the default capacity (16): the due flush's mma fold of a ring holding at
    most 16 pending tokens runs on a stack of 16 rows; more pending tokens take a stack of 32."""
    case = ring_case(num_rows=2, num_nodes=4, capacity=capacity, head_k_dim=32, head_v_dim=32)
    args, kwargs = flush_arguments(case, num_draft=4)
    module = triton_kernels().gdn_ring_verify
    monkeypatch.setattr(module, "_mma_kernel_runs_on", lambda ssm: True)  # (a GPU's)
    fold = module._flush_calls(*args, **kwargs)[0]
    assert (fold.constexprs["KIND"], fold.constexprs["MAX_PENDING"], fold.constexprs["NODES"]) == (2, capacity, stack)


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [0, 1], ids=["plain", "pdl"])
def test_due_flush_on_the_mma_kernel_matches_pytorch_code(monkeypatch, pdl):
    """The due flush's mma fold over two layers of distinct weights (dk = dv = 32, capacity 16, N = 4:
    the verify's own kernel) against the PyTorch code: 3xTF32 folds within 1e-4 x max |S|, windows
    and cursors bit for bit, rows not due untouched; a program folding two of a row's four tiles, or
    all, leaves the same bits; launched plainly or as a programmatic dependent (RING_MMA_PDL)."""
    monkeypatch.setattr(triton_kernels().gdn_ring_verify, "RING_MMA_PDL", pdl)
    cursors = torch.tensor([[3, 16], [5, 12], [0, 13], [1, 3]])  # C = 20: due when pending > 12
    case = ring_case(num_rows=4, num_nodes=4, capacity=16, num_k_heads=2, head_k_dim=32, head_v_dim=32,
                     num_ring_slots=4, num_state_slots=5, cursors=cursors, ring_slots=[0, 1, 2, 3],
                     state_slots=[4, 2, 0, 1], device="cuda", seed=9)  # (4 value heads: a tile each)
    want, got = run_flush_both(case, tuning={}, num_draft=4)
    assert torch.equal(got["cursor"].cpu(), torch.tensor([[19, 0], [5, 12], [13, 0], [1, 3]]))
    assert_agree(dict(want, out=torch.zeros(1)), dict(got, out=torch.zeros(1)), state_tol=1e-4)
    assert_same_untouched(case, want, got)
    for tiles in (0, 2):  # a program folding a row's tiles, or two, one after another: the same bits
        _, walked = run_flush_both(case, tuning=dict(fold_tiles=tiles), num_draft=4)
        for name in ("ssm_state", "conv_state", "cursor"):
            assert torch.equal(walked[name], got[name]), (tiles, name)
