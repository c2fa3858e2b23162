"""The Mamba2 ring's Triton kernels (csrc_triton/mamba2_ring_verify.py) against the ring ops' PyTorch
code (cpu_ring.py, itself held to the float64 oracle by test_ring_mamba2.py), under Triton's
interpreter and on the GPU, one call at a time from random ring states: every cursor a ring
position (folds and no folds, pending tokens wrapping the ring's end, an empty ring), padded rows,
chains and trees, every optional term. Outputs and folded states are arithmetic (tolerances
against the PyTorch code's float32); the stored dt within float32 rounding (a softplus computed
two ways); conv windows, the ring's rows, the cursor and every state the call must not touch bit
for bit.
"""

from __future__ import annotations

import pytest
import torch

import sgl_convwin
from sgl_convwin._kernels import triton_kernels
from support import HAS_TRITON, INTERPRET, ring_pytorch_code, sprinkled

FILL = 7.0
IEEE = dict(precision="ieee")  # float32 products: what the PyTorch code computes, so tight tolerances hold

interpreted = pytest.mark.skipif(not (INTERPRET and HAS_TRITON), reason="Triton's interpreter runs on the CPU only")
DEVICES = [pytest.param("cpu", marks=interpreted), pytest.param("cuda", marks=pytest.mark.gpu)]


def mamba2_ring_case(*, num_rows=4, num_nodes=3, capacity=4, kernel_size=4, num_heads=4, head_dim=16, n_groups=2,
                     d_state=16, num_state_slots=5, num_ring_slots=4, parents=None, cursors=None, ring_slots=None,
                     state_slots=None, rows_dtype=torch.float32, state_dtype=torch.float32, terms=True,
                     strong_decays=False, device="cpu", seed=0):
    """mamba2_ring_verify's arguments (as keywords) for layer 1 of 2, random but for what is given;
    strong_decays: about one step in four, given or in the ring, 1e3 .. 1e7 (log decays d A below -64)."""
    gen = torch.Generator().manual_seed(seed)
    dim = num_heads * head_dim + 2 * n_groups * d_state
    ring_rows, layers = capacity + num_nodes, 2

    def randn(*shape, std=1.0):
        return torch.randn(shape, generator=gen) * std

    if cursors is None:
        cursors = torch.stack([torch.randint(0, ring_rows, (num_ring_slots,), generator=gen),
                               torch.randint(0, capacity + 1, (num_ring_slots,), generator=gen)], dim=1)
    if ring_slots is None:
        ring_slots = torch.randperm(num_ring_slots, generator=gen)[:num_rows]
    if state_slots is None:
        state_slots = torch.randperm(num_state_slots, generator=gen)[:num_rows]
    mixed = randn(num_rows, num_nodes, dim)
    tensors = dict(
        x=mixed[..., :num_heads * head_dim].unflatten(-1, (num_heads, head_dim)),
        dt=randn(num_rows, num_nodes, num_heads, std=0.5) - 1.0, A=-torch.rand(num_heads, generator=gen) * 2 - 0.1,
        B=mixed[..., num_heads * head_dim:-n_groups * d_state].unflatten(-1, (n_groups, d_state)),
        C=mixed[..., -n_groups * d_state:].unflatten(-1, (n_groups, d_state)),
        ssm_state=randn(layers, num_state_slots, num_heads, head_dim, d_state, std=0.3).to(state_dtype),
        conv_state=randn(layers, num_state_slots, dim, kernel_size - 1).to(rows_dtype),
        rows=randn(layers, num_ring_slots, ring_rows, dim).to(rows_dtype),
        gates=torch.rand(layers, num_ring_slots, ring_rows, 1, num_heads, generator=gen) * 0.5,
        cursor=cursors.to(torch.int32), conv_weight=randn(dim, kernel_size, std=0.5), conv_bias=randn(dim, std=0.1),
        ring_slots=torch.as_tensor(ring_slots), state_slots=torch.as_tensor(state_slots),
        parents=None if parents is None else torch.as_tensor(parents).expand(num_rows, -1).contiguous(),
        D=randn(num_heads) if terms else None, z=randn(num_rows, num_nodes, num_heads, head_dim) if terms else None,
        dt_bias=randn(num_heads, std=0.3) if terms else None,
    )
    if strong_decays:
        for name in ("dt", "gates"):
            tensors[name] = sprinkled(tensors[name], (1e3, 1e5, 1e7), 4, gen)
    return {name: None if t is None else t.to(device) for name, t in tensors.items()}


def run_both(case, *, dt_softplus=True, tuning=IEEE):
    """(PyTorch code's tensors, kernels' tensors) after one mamba2_ring_verify each on copies of
    ``case``."""
    tuning = dict(tuning)

    def call(launch):
        mine = {name: None if t is None else t.clone() for name, t in case.items()}
        out = torch.full(mine["x"].shape, FILL, device=mine["x"].device)
        args = (out, mine["x"], mine["dt"], mine["A"], mine["B"], mine["C"], mine["ssm_state"], mine["conv_state"],
                mine["rows"], mine["gates"], mine["cursor"], mine["conv_weight"], mine["conv_bias"],
                mine["ring_slots"], mine["state_slots"], 1, mine["parents"])
        kwargs = dict(D=mine["D"], z=mine["z"], dt_bias=mine["dt_bias"], dt_softplus=dt_softplus)
        if launch:
            kernel_args, kernel_kwargs = sgl_convwin.mamba2_ring_verify.kernel_arguments(*args, **kwargs)
            triton_kernels().launch_mamba2_ring_verify(*kernel_args, **{**kernel_kwargs, **tuning})
        else:
            ring_pytorch_code("mamba2_ring_verify")(*args, **kwargs)
        mine["out"] = out
        return mine

    return call(False), call(True)


def assert_agree(want, got, tol=2e-5, state_tol=None):
    """Arithmetic within tol (the folded states: state_tol, default tol) x the largest magnitude, the
    stored dt within float32 rounding; everything else bit for bit."""
    for name, bound in (("out", tol), ("ssm_state", tol if state_tol is None else state_tol)):
        scale = want[name].float().abs().max().item()
        error = (got[name].float() - want[name].float()).abs().max().item()
        assert error <= bound * scale, (name, error, scale)
    assert torch.equal(got["out"] == FILL, want["out"] == FILL)  # the rows left alone
    assert torch.allclose(got["gates"], want["gates"], rtol=1e-6, atol=1e-7)
    for name in ("conv_state", "rows", "cursor"):
        assert torch.equal(got[name], want[name]), name


def assert_same_untouched(case, want, got):
    kept = torch.eq(want["ssm_state"], case["ssm_state"]).flatten(2).all(-1)  # [L, S]
    assert torch.equal(got["ssm_state"][kept], case["ssm_state"][kept])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("share", [1, 2], ids=["head", "group"])
def test_matches_pytorch_code(device, tree, share):
    """Folds (pending + N > capacity) beside rows that only replay, a ring wrapping its end, an
    empty ring and a padded row; every optional term. A program per head, or per group's two heads
    (the fold's too); the folded windows in the verify launch or their own; the folding rows' drafts
    verified by the folds' launch or by the verify's."""
    cursors = torch.tensor([[5, 4], [1, 2], [0, 0], [4, 3]])  # C = 7, capacity 4, N = 3: folds when pending >= 2
    case = mamba2_ring_case(num_rows=4, num_nodes=3, capacity=4, cursors=cursors, ring_slots=[0, 1, 2, 3],
                            state_slots=[3, 0, 4, -1], parents=[-1, 0, 0] if tree else None, device=device)
    for fused_window, fold_verify in ((False, False), (True, False), (False, True), (True, True)):
        # (the folded windows in the verify launch: each head's program; the folding rows' drafts verified
        # by the folds' launch)
        want, got = run_both(case, tuning=dict(IEEE, heads_per_program=share, fold_heads_per_program=share,
                                               fused_window=fused_window, fold_verify=fold_verify))
        assert not torch.equal(want["ssm_state"], case["ssm_state"])  # something folded
        assert not torch.equal(want["conv_state"], case["conv_state"])
        assert_agree(want, got)
        assert_same_untouched(case, want, got)
    want, got = run_both(case, tuning=dict(heads_per_program=share))  # the default precision: 3xTF32 here
    assert_agree(want, got, tol=2e-3, state_tol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("share", [1, 2], ids=["head", "group"])
def test_fold_programs_walking_tiles_leave_the_same_bits(device, share):
    """The fold launch one program a row (fold_tiles=0, after a due flush: nothing to fold) or one a
    pair of program tiles (fold_tiles=2), folding them one after another -- here where two rows do
    fold, each tile's program tile of its own group -- leaves what a program a tile leaves, bit for
    bit."""
    cursors = torch.tensor([[5, 4], [1, 2], [0, 0], [4, 3]])  # C = 7, capacity 4, N = 3: folds when pending >= 2
    case = mamba2_ring_case(num_rows=4, num_nodes=3, capacity=4, cursors=cursors, ring_slots=[0, 1, 2, 3],
                            state_slots=[3, 0, 4, -1], head_dim=32, device=device, seed=3)
    tuning = dict(IEEE, fold_heads_per_program=share, block_p=16)  # (two column blocks a head)
    _, tiles = run_both(case, tuning=tuning)
    for walked in (0, 2):
        _, rows = run_both(case, tuning=dict(tuning, fold_tiles=walked))
        assert not torch.equal(rows["ssm_state"], case["ssm_state"])  # something folded
        for name in ("out", "ssm_state", "conv_state", "gates", "cursor"):
            assert torch.equal(rows[name], tiles[name]), (walked, name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_strong_decays(device, tree):
    """Steps of 1e3 .. 1e7 among the pending tokens' and the drafts' (rows that fold, that only replay,
    an empty ring, a padded row): the kernel's floored sums agree with the PyTorch code, which replays
    the pending tokens one at a time (float32 products: the outputs are the big steps' updates)."""
    case = mamba2_ring_case(cursors=torch.tensor([[5, 4], [1, 2], [0, 0], [4, 3]]), ring_slots=[0, 1, 2, 3],
                            state_slots=[3, 0, 4, -1], parents=[-1, 0, 0] if tree else None, strong_decays=True,
                            device=device)
    assert (case["dt"] > 1e2).any() and (case["gates"][1] > 1e2).any()
    want, got = run_both(case)
    assert not torch.equal(want["ssm_state"], case["ssm_state"])  # something folded
    assert_agree(want, got, tol=1e-4, state_tol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_capacity_16_matches_pytorch_code(device, tree):
    """Capacity 16, N = 3 (C = 19 rows): the folds' launch on a stack of 16 pending tokens, then
    every row's verify on a stack of 16 (a folded row's from its new checkpoint). Rows folding 16
    and 14 pending tokens, 13 (the most that do not fold), 5 wrapping the ring's end, an empty ring,
    a padded row. d_state 40: C S0^T whole, and over chunks of 16 state rows (the third partial, the
    fourth all padding); the folded windows in a launch of their own or in the verify's; the heads'
    loop and the chunks' as one (flatten); the folding rows' drafts verified by the folds' launch."""
    cursors = torch.tensor([[17, 16], [10, 13], [0, 0], [18, 5], [3, 14], [1, 2]])
    case = mamba2_ring_case(num_rows=6, num_nodes=3, capacity=16, num_ring_slots=6, num_state_slots=6, cursors=cursors,
                            ring_slots=[0, 1, 2, 3, 4, 5], state_slots=[3, 0, 4, 1, 5, -1], d_state=40,
                            parents=[-1, 0, 0] if tree else None, device=device, seed=9)

    def ring_calls(**tuning):
        return triton_kernels().mamba2_ring_verify._ring_calls(
            *sgl_convwin.mamba2_ring_verify.kernel_arguments(
                torch.empty(case["x"].shape, device=device), case["x"], case["dt"], case["A"], case["B"], case["C"],
                case["ssm_state"], case["conv_state"], case["rows"], case["gates"], case["cursor"],
                case["conv_weight"], case["conv_bias"], case["ring_slots"], case["state_slots"], 1, case["parents"])[0],
            dt_softplus=True, **tuning)

    calls = ring_calls()
    launches = [(call.kernel.__name__, call.constexprs["STACK"]) for call in calls if "STACK" in call.constexprs]
    assert launches == [("_mamba2_ring_fold_kernel", 16), ("_mamba2_ring_verify_kernel", 16)]
    # the fold at most 4 heads a program (a step's folding rows are few: here a group's 2), the verify a
    # group's heads where it can
    fold, verify = calls[:2]
    num_heads, head_dim = case["x"].shape[2:]
    tiles = num_heads * -(-head_dim // fold.constexprs["BLOCK_P"])
    assert (fold.constexprs["HEADS_PER_PROGRAM"], fold.grid[0]) == (2, tiles // 2)
    assert verify.grid[0] * verify.constexprs["HEADS_PER_PROGRAM"] == tiles
    assert (verify.constexprs["CHUNK_N"], verify.constexprs["CHUNK_STAGES"]) == (32, 3)  # (d_state 40: chunks of 32)
    # by default the folded windows moved by the verify launch (no window launch) and the fold capped
    # at 168 registers; apart and uncapped on request
    assert [call.kernel.__name__ for call in calls] == ["_mamba2_ring_fold_kernel", "_mamba2_ring_verify_kernel"]
    assert fold.constexprs["maxnreg"] == 168 and verify.constexprs["maxnreg"] == 128
    apart = ring_calls(fused_window=False, fold_maxnreg=0)
    assert "maxnreg" not in apart[0].constexprs
    assert [call.kernel.__name__ for call in apart][:2] == ["_mamba2_ring_fold_kernel", "_mamba2_ring_verify_kernel"]
    assert len(apart) == 3  # the window launch
    assert verify.constexprs["FLATTEN"] is False  # (the heads' and chunks' loops apart by default)
    assert (verify.constexprs["ROWS"], verify.constexprs["PDL"]) == (0, False)
    # on request the folding rows' drafts verified by the folds' launch (the verify kernel's ROWS 1, the
    # fold's heads a program and cap), the others by a ROWS 2 launch; that one a
    # programmatic dependent launch with pdl (only beside fold_verify, the windows in their own launch)
    tuned = ring_calls(fold_verify=True, pdl=True)
    assert [(c.kernel.__name__, c.constexprs.get("ROWS"), c.constexprs.get("CHUNK_N"), c.constexprs.get("maxnreg"),
             c.constexprs.get("HEADS_PER_PROGRAM"), c.constexprs.get("launch_pdl")) for c in tuned][:2] == [
        ("_mamba2_ring_verify_kernel", 1, 32, 168, fold.constexprs["HEADS_PER_PROGRAM"], None),
        ("_mamba2_ring_verify_kernel", 2, 32, 128, verify.constexprs["HEADS_PER_PROGRAM"], True)]
    assert len(tuned) == 3 and not tuned[1].constexprs["FUSED_WINDOW"]  # + the window launch
    for wrong in (dict(), dict(fold_verify=True, fused_window=True)):
        with pytest.raises(ValueError, match="pdl overlaps"):
            ring_calls(pdl=True, **wrong)
    for chunk_n, fused_window, flatten, fold_verify, pdl in (
            (0, False, False, False, False), (16, False, False, False, False), (32, True, False, False, False),
            (16, False, True, False, False), (32, True, True, False, False), (0, True, True, False, False),
            (32, True, False, True, False), (16, False, True, True, False), (32, False, False, True, True)):
        if flatten and device == "cpu":
            continue  # (a compiler's choice the interpreter ignores: the GPU's)
        want, got = run_both(case, tuning=dict(IEEE, chunk_n=chunk_n, fused_window=fused_window, flatten=flatten,
                                               fold_verify=fold_verify, pdl=pdl))
        folded = ~torch.eq(want["ssm_state"], case["ssm_state"]).flatten(2).all(-1)[1]
        assert folded.tolist() == [False, False, False, True, False, True]  # slots 3, 5: rows of 16 and 14 pending
        assert_agree(want, got)
        assert_same_untouched(case, want, got)


@pytest.mark.gpu
@pytest.mark.parametrize("fold_verify", [False, True], ids=["flatten", "flatten-fold-verify"])
def test_flattened_loops_over_column_blocks(fold_verify):
    """The heads' and chunks' loops as one (flatten, which the interpreter ignores) where a head's
    rows take two column blocks and a program two heads: the drafts' dt stored by the first block
    alone, under a mask inside the fused loop (a runtime if there breaks Triton 3.6's loop fusion)."""
    case = mamba2_ring_case(num_rows=4, num_nodes=3, capacity=8, head_dim=24, d_state=64, device="cuda", seed=13)
    want, got = run_both(case, tuning=dict(IEEE, block_p=16, heads_per_program=2, chunk_n=32, flatten=True,
                                           fold_verify=fold_verify))
    assert_agree(want, got)
    assert_same_untouched(case, want, got)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel_size", [2, 5])
def test_odd_sizes_deep_trees_and_bad_ring_slots(device, kernel_size):
    """Kernel sizes 2 and 5 (a row of 1 pending token reaching back into the window beside two that
    fold), a tree three links deep, head_dim 24 and d_state 12 in two column blocks of 16 (the masks;
    the dt stored by the first block alone), a ring slot of -1 and one past the ring pool: those two
    rows left alone."""
    cursors = torch.tensor([[8, 3], [2, 1], [0, 0], [4, 5], [1, 1]])  # C = 9, N = 4: folds when pending >= 2
    case = mamba2_ring_case(num_rows=5, num_nodes=4, capacity=5, kernel_size=kernel_size, head_dim=24, d_state=12,
                            num_ring_slots=5, num_state_slots=6, cursors=cursors, ring_slots=[0, 1, -1, 3, 7],
                            state_slots=[5, 0, 1, 2, 3], parents=[-1, 0, 1, 2], device=device, seed=11 + kernel_size)
    want, got = run_both(case, tuning=dict(IEEE, block_p=16))
    assert (got["out"][2] == FILL).all() and (got["out"][4] == FILL).all()
    folded = ~torch.eq(want["ssm_state"], case["ssm_state"]).flatten(2).all(-1)[1]
    assert folded.tolist() == [False, False, True, False, False, True]  # state slots 2 and 5: pending 5 and 3
    assert_agree(want, got)
    assert_same_untouched(case, want, got)


@pytest.mark.parametrize("device", DEVICES)
def test_low_precision_and_no_optional_terms(device):
    case = mamba2_ring_case(num_rows=3, num_nodes=2, capacity=3, kernel_size=3, rows_dtype=torch.bfloat16,
                            state_dtype=torch.bfloat16, terms=False, n_groups=1, device=device, seed=3)
    want, got = run_both(case, dt_softplus=False)
    assert_agree(want, got, tol=1e-2)  # the bf16 checkpoint's rounding
    assert_same_untouched(case, want, got)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_cursors_and_links_skip(device):
    """A cursor outside the ring and a tree with a forward link: the first row is left alone
    entirely, the second folds and stores its dt but writes no output."""
    cursors = torch.tensor([[9, 1], [2, 3], [0, 1]])  # start 9 >= C = 6
    case = mamba2_ring_case(num_rows=3, num_nodes=2, capacity=4, num_ring_slots=3, cursors=cursors,
                            ring_slots=[0, 1, 2], state_slots=[0, 1, 2], parents=[-1, 0], device=device, seed=5)
    case["parents"][1] = torch.tensor([-1, 1])  # node 1's parent is itself
    want, got = run_both(case)
    assert (got["out"][:2] == FILL).all() and not (got["out"][2] == FILL).all()
    assert not torch.equal(want["ssm_state"], case["ssm_state"])  # row 1 folded
    assert_agree(want, got)
    assert_same_untouched(case, want, got)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layers, share, num_draft", [(2, 1, None), (1, 1, None), (2, 2, None), (2, 1, 3)])
def test_flush_matches_pytorch_code(device, layers, share, num_draft):
    """Every layer's checkpoint after its pending tokens, the windows and the cursors, as the
    PyTorch code leaves them; a padded row and an empty ring touch nothing; one layer too; a
    program per head or per group's two heads; with num_draft = 3 only the rows a verify of 3
    drafts would fold (pending > 1: the row with 1 pending keeps it)."""
    cursors = torch.tensor([[5, 4], [1, 2], [0, 0], [4, 3], [2, 1]])  # C = 7 (capacity 4, N = 3)
    case = mamba2_ring_case(num_rows=5, num_nodes=3, capacity=4, cursors=cursors, num_ring_slots=5, num_state_slots=6,
                            ring_slots=[0, 1, 2, 3, 4], state_slots=[3, 0, 4, -1, 5], device=device, seed=7)
    for name in ("ssm_state", "conv_state", "rows", "gates"):
        case[name] = case[name][:layers]
    weight = torch.stack([case["conv_weight"], case["conv_weight"].flip(0)])[:layers]  # each layer its own
    bias = torch.stack([case["conv_bias"], -case["conv_bias"]])[:layers]
    A = torch.stack([case["A"], case["A"] * 0.5])[:layers]
    num_heads, head_dim, d_state = case["ssm_state"].shape[2:]
    heads = dict(num_heads=num_heads, head_dim=head_dim, n_groups=case["B"].shape[2], d_state=d_state)

    def call(launch):
        mine = {name: case[name].clone() for name in ("ssm_state", "conv_state", "cursor", "rows", "gates")}
        args = (mine["ssm_state"], mine["conv_state"], mine["cursor"], mine["rows"], mine["gates"], weight, A,
                case["ring_slots"], case["state_slots"])
        if launch:
            kernel_args, kernel_kwargs = sgl_convwin.mamba2_ring_flush.kernel_arguments(
                *args, conv_bias=bias, num_draft=num_draft, **heads)
            triton_kernels().launch_mamba2_ring_flush(*kernel_args, **kernel_kwargs, **IEEE,
                                                      heads_per_program=share)
        else:
            ring_pytorch_code("mamba2_ring_flush")(*args, conv_bias=bias, num_draft=num_draft, **heads)
        return mine

    want, got = call(False), call(True)
    assert not torch.equal(want["ssm_state"], case["ssm_state"])
    kept = 5 if num_draft else 4  # (a due flush leaves the row with 1 pending, as the empty ring)
    assert torch.equal(got["ssm_state"][:, kept], case["ssm_state"][:, kept])
    assert torch.equal(got["cursor"][4].cpu(), torch.tensor([2, 1] if num_draft else [3, 0], dtype=got["cursor"].dtype))
    scale = want["ssm_state"].abs().max().item()
    assert (got["ssm_state"] - want["ssm_state"]).abs().max().item() <= 2e-5 * scale
    for name in ("conv_state", "cursor", "rows", "gates"):
        assert torch.equal(got[name], want[name]), name
    assert_same_untouched(case, want, got)


if HAS_TRITON:
    import triton
    import triton.language as tl

    _softplus = triton_kernels()._common.softplus

    @triton.jit
    def _softplus_kernel(x_ptr, y_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(y_ptr + i, _softplus(tl.load(x_ptr + i)))


@pytest.mark.parametrize("device", DEVICES)
def test_softplus_within_float32_rounding(device):
    """The kernels' softplus (dt's, every Mamba2 kernel and capture_gates) within 4e-6 of float64's
    relative to it, over [-40, 40] -- where log(1 + exp(x)) would lose it all for x below about -17;
    exp(-40) is off by up to 2e-6 on the GPU, its exponent's float32 rounding."""
    x = torch.linspace(-40.0, 40.0, 4096, device=device)
    y = torch.empty_like(x)
    _softplus_kernel[(1,)](x, y, 4096)
    exact = torch.nn.functional.softplus(x.double())
    assert ((y.double() - exact).abs() / exact).max().item() <= 4e-6
