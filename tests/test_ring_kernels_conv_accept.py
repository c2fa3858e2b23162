"""ring_conv1d_verify's and ring_accept's Triton kernels against the ring ops' PyTorch code
(cpu_ring.py, itself held to the float64 oracle by test_ring.py), under Triton's interpreter and on
the GPU.

One call at a time from random ring states: every cursor a ring position (pending rows wrapping the
ring's end, pending tokens shorter than the window, full rings, folds), cursors that are no ring
position, padded and out-of-range slots, chains and trees with bad links, K = 2..5, window-major
conv_state (the kernels get the op's kernel view), permuted, offset and sliced strides. The whole
storage of everything the op writes is compared: bit for bit where the op copies (the ring's rows,
its gates, the cursor, the outputs a row or node must not get); the conv's outputs within float32
rounding of the PyTorch code (it sums the products, the kernel fmas them in verify.py's order) and
bit for bit against causal_conv1d_verify's own kernel fed the same inputs as one window.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sgl_convwin
from sgl_convwin import cpu_ring
from sgl_convwin._kernels import triton_kernels
from support import HAS_TRITON, INTERPRET, ring_pytorch_code, strided_tensor, trees, whole_storage

FILL = 7.0

interpreted = pytest.mark.skipif(not (INTERPRET and HAS_TRITON), reason="Triton's interpreter runs on the CPU only")
DEVICES = [pytest.param("cpu", marks=interpreted), pytest.param("cuda", marks=pytest.mark.gpu)]


def twin(t):
    """A copy of ``t`` with its strides and storage offset, in a copy of its whole storage."""
    if t is None:
        return None
    return whole_storage(t).clone().as_strided(t.shape, t.stride(), t.storage_offset())


def every_cursor(capacity, num_nodes):
    """[(capacity + 1) * C, 2]: every ring position (start, pending) once."""
    ring_rows = capacity + num_nodes
    return torch.cartesian_prod(torch.arange(ring_rows), torch.arange(capacity + 1))


def bf16_exact(t):
    """t (in place, its layout kept) holding values a bfloat16 holds: the interpreter truncates a
    float downcast where the GPU and PyTorch round, so only exact casts compare bit for bit."""
    return t.copy_(t.to(torch.bfloat16))


def on(t, device):
    """``t`` on ``device`` with its strides and storage offset (a copy of its whole storage)."""
    return whole_storage(t).to(device).as_strided(t.shape, t.stride(), t.storage_offset())


# ---------------------------------------------------------------------------------------------
# ring_conv1d_verify
# ---------------------------------------------------------------------------------------------


def conv_case(*, cursors, capacity, ring_slots=None, state_slots=None, num_nodes=3, kernel_size=4, dim=12, layers=2,
              num_state_slots=None, parents=None, rows_dtype=torch.float32, conv_dtype=torch.float32,
              x_dtype=torch.float32, out_dtype=torch.float32, state_layout="dim_major", variant="contiguous",
              bias=True, device="cpu", seed=0):
    """ring_conv1d_verify's arguments (cursor [M, 2]: M ring slots, C = M's capacity + N rows);
    ``variant`` (support.strided_tensor's) lays out rows, conv_state, x and out."""
    gen = torch.Generator().manual_seed(seed)
    num_ring_slots = cursors.shape[0]
    ring_rows = capacity + num_nodes
    num_state_slots = num_state_slots or num_ring_slots
    if ring_slots is None:
        ring_slots = torch.randperm(num_ring_slots, generator=gen)
    ring_slots = torch.as_tensor(ring_slots)
    num_rows = ring_slots.shape[0]
    if state_slots is None:
        state_slots = torch.randperm(num_state_slots, generator=gen)[:num_rows]
    width = kernel_size - 1
    conv_shape = (layers, num_state_slots, dim, width) if state_layout == "dim_major" else \
        (layers, num_state_slots, width, dim)
    rows = strided_tensor((layers, num_ring_slots, ring_rows, dim), rows_dtype, "cpu", gen, variant)
    x = strided_tensor((num_rows, num_nodes, dim), x_dtype, "cpu", gen, variant)
    if rows_dtype != x_dtype and rows_dtype != torch.float32:
        bf16_exact(x)
    out = strided_tensor((num_rows, num_nodes, dim), out_dtype, "cpu", gen, variant).fill_(FILL)
    tensors = dict(
        out=out, rows=rows, conv_state=strided_tensor(conv_shape, conv_dtype, "cpu", gen, variant), x=x,
        weight=torch.randn(dim, kernel_size, generator=gen) * 0.5,
        bias=torch.randn(dim, generator=gen) * 0.1 if bias else None,
        ring_slots=ring_slots, state_slots=torch.as_tensor(state_slots), cursor=cursors.to(torch.int32),
        parents=None if parents is None else torch.as_tensor(parents).expand(num_rows, -1).contiguous(),
    )
    return {name: None if t is None else on(t, device) for name, t in tensors.items()}, state_layout


def conv_args(case, layer):
    c = case
    return (c["out"], c["rows"], c["conv_state"], c["x"], c["weight"], c["bias"], c["ring_slots"], c["state_slots"],
            c["cursor"], layer, c["parents"])


def run_conv(case, state_layout, *, layer=1, silu=True, **tuning):
    """(PyTorch code's tensors, kernel's tensors) after one call each on twins of ``case``."""
    activation = "silu" if silu else None
    worlds = []
    for kernel in (False, True):
        mine = {name: twin(t) for name, t in case.items()}
        if kernel:
            args, kwargs = sgl_convwin.ring_conv1d_verify.kernel_arguments(
                *conv_args(mine, layer), activation=activation, state_layout=state_layout)
            triton_kernels().launch_ring_conv1d_verify(*args, **kwargs, **tuning)
        else:
            ring_pytorch_code("ring_conv1d_verify")(*conv_args(mine, layer), activation=activation,
                                                    state_layout=state_layout)
        worlds.append(mine)
    return worlds


def same_bits_as_verify_kernel(case, state_layout, got, *, layer=1, silu=True):
    """The kernel's outputs are causal_conv1d_verify's kernel's bits for the same inputs: each live
    row's window (checkpoint then pending rows, in a dtype holding both) as its conv_state."""
    c = case
    kernel_state = c["conv_state"].transpose(2, 3) if state_layout == "window_major" else c["conv_state"]
    ring_rows, num_nodes = c["rows"].shape[2], c["x"].shape[1]
    live = cpu_ring._live_rows(c["ring_slots"], c["cursor"], c["rows"].shape[1], ring_rows, ring_rows - num_nodes,
                               c["state_slots"], kernel_state.shape[1])
    if live is None:
        return
    rows, ring, state, start, pending = live
    window = cpu_ring._window_before_drafts(kernel_state, c["rows"], layer, ring, state, start, pending)
    out = torch.full(c["x"].shape, FILL, dtype=c["out"].dtype, device=c["x"].device)
    dest = torch.empty(1, rows.shape[0], num_nodes + kernel_state.shape[3] - 1, c["x"].shape[2],
                       dtype=window.dtype, device=window.device)
    slots = torch.full((c["x"].shape[0],), -1, dtype=torch.long, device=rows.device)
    slots[rows] = torch.arange(rows.shape[0], device=rows.device)
    triton_kernels().launch_causal_conv1d_verify(out, dest, window[None], c["x"], c["weight"], c["bias"], slots, slots,
                                                 0, c["parents"], dense=False, silu=silu)
    assert torch.equal(got["out"], out)


def assert_conv_agree(want, got, tol=2e-6):
    """The ring's rows (whole storage) bit for bit; out: the same entries written, within tol x its
    largest magnitude (float32 rounding of K products and a sum), its storage elsewhere untouched."""
    assert torch.equal(whole_storage(got["rows"]), whole_storage(want["rows"]))
    written = want["out"] != FILL
    assert torch.equal(got["out"] != FILL, written)
    scale = want["out"].float().abs().max().item()
    error = (got["out"].float() - want["out"].float()).abs().max().item()
    assert error <= tol * max(scale, 1.0), (error, scale)
    outside = torch.ones_like(whole_storage(want["out"]), dtype=torch.bool)
    outside.as_strided(want["out"].shape, want["out"].stride(), want["out"].storage_offset()).fill_(False)
    assert torch.equal(whole_storage(got["out"])[outside], whole_storage(want["out"])[outside])


# C = 7 (capacity 4, N = 3), K = 4: pending rows wrapping the end, fewer pending than the window, a
# full ring, an empty one; then no ring positions (start >= C, pending > capacity, negatives)
CURSORS = torch.tensor([[5, 4], [6, 2], [1, 1], [0, 0], [3, 4], [6, 3], [7, 0], [2, 5], [-1, 1], [0, -1]])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel_size", [2, 3, 4, 5])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_conv_matches_pytorch_code(device, kernel_size, tree):
    """Every kind of cursor at once, a padded row, an out-of-range ring slot, a row whose state slot
    alone is bad; trees with a bad link on one row (its nodes below it get no output)."""
    ring_slots = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, -1, 10]
    state_slots = [3, 0, 4, 1, -3, 5, 6, 7, 8, 9, 2, 0]  # row 4: a live ring slot, a bad state slot
    parents = [-1, 0, 0] if tree else None
    case, layout = conv_case(cursors=CURSORS, capacity=4, ring_slots=ring_slots, state_slots=state_slots,
                             kernel_size=kernel_size, parents=parents, device=device, seed=kernel_size)
    if tree:
        case["parents"][1] = torch.tensor([-1, 0, 2])  # node 2's link points at itself
        case["parents"][2] = torch.tensor([-1, -5, 1])  # node 1's link below -1: nodes 1 and 2 (K > 2) bad
    want, got = run_conv(case, layout)
    live = torch.tensor([0, 1, 2, 3, 5])
    assert (want["out"][live, 0] != FILL).all()
    assert (want["out"].flatten(1) == FILL).all(1).sum() == 12 - live.numel()
    assert_conv_agree(want, got)
    same_bits_as_verify_kernel(case, layout, got)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_conv_every_cursor(device, tree):
    """Every ring position of a small ring, one row each (C = 6, N = 2, K = 5: 5 pending rows wrap
    a window of 4), no activation."""
    cursors = every_cursor(capacity=4, num_nodes=2)
    case, layout = conv_case(cursors=cursors, capacity=4, num_nodes=2, kernel_size=5, dim=5,
                             parents=[-1, -1] if tree else None, device=device, seed=11)
    want, got = run_conv(case, layout, silu=False)
    assert (want["out"] != FILL).all()
    assert_conv_agree(want, got)
    same_bits_as_verify_kernel(case, layout, got, silu=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["offset", "permuted", "sliced"])
@pytest.mark.parametrize("state_layout", ["dim_major", "window_major"])
def test_conv_layouts(device, variant, state_layout):
    """Window-major conv_state (the kernel reads the op's transposed view), and rows, conv_state, x,
    out at a storage offset, with their last two axes swapped in memory, or sliced."""
    case, layout = conv_case(cursors=CURSORS[:6], capacity=4, num_nodes=3, kernel_size=4, dim=9, parents=[-1, 0, 1],
                             state_layout=state_layout, variant=variant, device=device, seed=2)
    want, got = run_conv(case, layout)
    assert_conv_agree(want, got)
    same_bits_as_verify_kernel(case, layout, got)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.float32, torch.float32, torch.bfloat16),
                                    (torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.float32),
                                    (torch.float32, torch.bfloat16, torch.float16, torch.float32)],
                         ids=["bf16-rows", "bf16-all", "fp32-rows-fp16-x"])
def test_conv_dtypes(device, dtypes):
    """bf16 rows beside a float32 checkpoint and x (x holding bf16 values: the cast into the ring
    is then exact), all bf16, float32 rows with a bf16 checkpoint and fp16 drafts; bf16 outputs."""
    rows_dtype, conv_dtype, x_dtype, out_dtype = dtypes
    case, layout = conv_case(cursors=CURSORS[:6], capacity=4, num_nodes=3, kernel_size=4, dim=12, parents=[-1, 0, 0],
                             rows_dtype=rows_dtype, conv_dtype=conv_dtype, x_dtype=x_dtype, out_dtype=out_dtype,
                             bias=out_dtype == torch.float32, device=device, seed=4)
    want, got = run_conv(case, layout)
    # a bf16 output differs where the float32 values straddle a rounding boundary (and under the
    # interpreter, which truncates): one bf16 ulp
    assert_conv_agree(want, got, tol=2e-6 if out_dtype == torch.float32 else 2 ** -7)
    if INTERPRET and out_dtype != torch.float32:
        return  # (the verify kernel rounds alike, but compare float32 outputs only under the interpreter)
    same_bits_as_verify_kernel(case, layout, got)


def draw_rows(data, num_nodes, capacity, num_state_slots=4):
    """(cursors [M, 2], ring_slots [B], state_slots [B]) for a fuzz test: mostly ring positions and
    slots in range, sometimes a cursor that is no ring position, a padded or out-of-range slot."""
    ring_rows = capacity + num_nodes
    num_slots = data.draw(st.integers(1, 5), label="ring slots")
    cursors = torch.stack([torch.tensor(data.draw(st.lists(st.integers(0, ring_rows - 1), min_size=num_slots,
                                                           max_size=num_slots), label="starts")),
                           torch.tensor(data.draw(st.lists(st.integers(0, capacity), min_size=num_slots,
                                                           max_size=num_slots), label="pending"))], dim=1)
    if data.draw(st.booleans(), label="a bad cursor"):
        cursors[data.draw(st.integers(0, num_slots - 1))] = torch.tensor(
            data.draw(st.sampled_from([(ring_rows, 0), (0, capacity + 1), (-1, 1), (1, -1)])))
    num_rows = data.draw(st.integers(1, num_slots), label="rows")
    ring_slots = data.draw(st.permutations(range(num_slots)), label="ring slots")[:num_rows]
    state_slots = data.draw(st.lists(st.integers(0, num_state_slots - 1), min_size=num_rows, max_size=num_rows))
    if data.draw(st.booleans(), label="a padded row"):
        row = data.draw(st.integers(0, num_rows - 1))
        ring_slots[row], state_slots[row] = data.draw(st.sampled_from([(-1, -1), (num_slots, 0), (0, num_state_slots),
                                                                      (-1, 0)]))
        if ring_slots.count(ring_slots[row]) > 1:  # (rows own their ring slots)
            ring_slots[row] = -1
    return cursors, ring_slots, state_slots


def corrupt_a_link(data, parents, num_nodes):
    """Now and then one bad link on the first row of a tree."""
    if parents is not None and data.draw(st.booleans(), label="bad link"):
        node = data.draw(st.integers(0, num_nodes - 1))
        parents[0, node] = data.draw(st.sampled_from([-2, node, num_nodes + 3]))


@interpreted
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_conv_fuzz_interpreted(data):
    """Random rings, drafts, trees (bad links too), conv widths, layouts, dtypes and padding."""
    num_nodes = data.draw(st.integers(1, 4), label="nodes")
    capacity = data.draw(st.integers(num_nodes, 6), label="capacity")
    cursors, ring_slots, state_slots = draw_rows(data, num_nodes, capacity)
    case, layout = conv_case(
        cursors=cursors, capacity=capacity, ring_slots=ring_slots, state_slots=state_slots, num_nodes=num_nodes,
        num_state_slots=4, kernel_size=data.draw(st.integers(2, 5), label="K"),
        dim=data.draw(st.integers(1, 20), label="dim"), parents=data.draw(st.one_of(st.none(), trees(num_nodes))),
        state_layout=data.draw(st.sampled_from(["dim_major", "window_major"])),
        variant=data.draw(st.sampled_from(["contiguous", "offset", "permuted"])),
        rows_dtype=data.draw(st.sampled_from([torch.float32, torch.bfloat16])), seed=data.draw(st.integers(0, 99)))
    corrupt_a_link(data, case["parents"], num_nodes)
    silu = data.draw(st.booleans())
    want, got = run_conv(case, layout, silu=silu, block=data.draw(st.sampled_from([None, 4, 16])))
    assert_conv_agree(want, got)
    same_bits_as_verify_kernel(case, layout, got, silu=silu)


# ---------------------------------------------------------------------------------------------
# ring_accept
# ---------------------------------------------------------------------------------------------


def accept_case(*, cursors, capacity, steps, ring_slots=None, num_nodes=3, dim=10, layers=3, num_gates=2,
                num_gate_heads=3, parents=None, rows_dtype=torch.bfloat16, variant="contiguous", device="cpu", seed=0):
    """ring_accept's arguments (cursor [M, 2]; C = capacity + N); ``variant`` lays out rows, gates."""
    gen = torch.Generator().manual_seed(seed)
    num_ring_slots = cursors.shape[0]
    ring_rows = capacity + num_nodes
    if ring_slots is None:
        ring_slots = torch.randperm(num_ring_slots, generator=gen)
    ring_slots = torch.as_tensor(ring_slots)
    num_rows = ring_slots.shape[0]
    tensors = dict(
        cursor=cursors.to(torch.int32),
        rows=strided_tensor((layers, num_ring_slots, ring_rows, dim), rows_dtype, "cpu", gen, variant),
        gates=strided_tensor((layers, num_ring_slots, ring_rows, num_gates, num_gate_heads), torch.float32, "cpu", gen,
                             variant),
        ring_slots=ring_slots, steps=torch.as_tensor(steps),
        parents=None if parents is None else torch.as_tensor(parents).expand(num_rows, -1).contiguous(),
    )
    return {name: None if t is None else on(t, device) for name, t in tensors.items()}


def run_accept(case, num_draft, **tuning):
    worlds = []
    for kernel in (False, True):
        mine = {name: twin(t) for name, t in case.items()}
        args = (mine["cursor"], mine["rows"], mine["gates"], mine["ring_slots"], mine["steps"], mine["parents"])
        if kernel:
            kernel_args, kwargs = sgl_convwin.ring_accept.kernel_arguments(*args, num_draft=num_draft)
            triton_kernels().launch_ring_accept(*kernel_args, **kwargs, **tuning)
        else:
            ring_pytorch_code("ring_accept")(*args, num_draft=num_draft)
        worlds.append(mine)
    return worlds


def assert_accept_agree(want, got):
    for name in ("cursor", "rows", "gates"):
        assert torch.equal(whole_storage(got[name]), whole_storage(want[name])), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("parents", [None, [-1, 0, 0], [-1, 0, 1], [-1, -1, 1]],
                         ids=["chain", "tree", "chain-as-tree", "two-roots"])
def test_accept_every_cursor(device, parents):
    """Every ring position (C = 8, N = 3, capacity 5: folds from 3 pending) with every step (-1 ..
    N: nothing, each node, out of range): the fold rule, paths after pending rows and wrapping the
    ring's end, rows and gates moved every layer."""
    num_nodes, capacity = 3, 5
    cursors = every_cursor(capacity, num_nodes)  # 48 slots
    steps = (torch.arange(cursors.shape[0]) % (num_nodes + 2) - 1).to(torch.int32)
    case = accept_case(cursors=cursors, capacity=capacity, steps=steps, num_nodes=num_nodes, parents=parents,
                       device=device, seed=1)
    want, got = run_accept(case, num_nodes)
    if parents == [-1, 0, 0]:
        assert not torch.equal(want["rows"], case["rows"])  # paths moved
    assert not torch.equal(want["cursor"], case["cursor"])
    assert_accept_agree(want, got)


@pytest.mark.parametrize("device", DEVICES)
def test_accept_skips_and_bad_links(device):
    """Cursors that are no ring position, padded and out-of-range ring slots (left alone), a path
    with a bad link (accepts nothing; the fold still moves start), a bad link off the path (does
    not matter), int64 links and steps that a narrowing would turn good (2**32 is not node 0)."""
    # C = 10 (capacity 6, N = 4): folds from 3 pending
    cursors = torch.tensor([[7, 4], [2, 3], [1, 2], [0, 4], [8, 0], [3, 7], [-1, 2], [0, -1], [6, 1], [5, 1]])
    ring_slots = [0, 1, 2, 3, 4, 5, 6, 7, -1, 10, 8, 9]
    steps = torch.tensor([3, 3, 2, 1, 0, 2, 1, 1, 2, 2, 2**32 + 1, 3], dtype=torch.int64)
    parents = torch.tensor([[-1, 0, 1, 1]] * 12, dtype=torch.int64)
    parents[1] = torch.tensor([-1, 0, 3, -3])  # node 3's link below -1: its path accepts nothing
    parents[2] = torch.tensor([-1, 0, 0, 3])  # node 3's (off the path of node 2) is bad
    parents[3] = torch.tensor([-1, 2**32, 0, 1])  # node 1's link narrowed would be 0
    parents[11] = torch.tensor([-1, 0, 1, 2**32 + 2])
    case = accept_case(cursors=cursors, capacity=6, steps=steps, ring_slots=ring_slots, num_nodes=4, parents=parents,
                       device=device, seed=3)
    case["cursor"] = case["cursor"].long()
    case["cursor"][4, 0] = 2**32  # start 0 once narrowed
    want, got = run_accept(case, 4)
    assert want["cursor"][1].tolist() == [5, 0] and want["cursor"][4].tolist() == [2**32, 0]  # folded; skipped
    assert_accept_agree(want, got)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["offset", "permuted", "sliced"])
def test_accept_layouts(device, variant):
    """rows and gates at a storage offset, with their last two axes swapped, or sliced; one gate
    (a gates buffer of G = 1); float32 rows."""
    cursors = torch.tensor([[5, 3], [0, 1], [6, 2], [2, 0]])
    case = accept_case(cursors=cursors, capacity=6, steps=[3, 2, 3, 1], num_nodes=4, num_gates=1, num_gate_heads=5,
                       parents=[-1, 0, 1, 1], rows_dtype=torch.float32, variant=variant, device=device, seed=5)
    want, got = run_accept(case, 4)
    assert not torch.equal(want["rows"], case["rows"])
    assert_accept_agree(want, got)


@interpreted
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_accept_fuzz_interpreted(data):
    """Random rings, steps, trees (bad links too; mostly trees: a chain moves no rows), gate shapes,
    layouts and block sizes."""
    num_nodes = data.draw(st.integers(2, 6), label="nodes")
    capacity = data.draw(st.integers(num_nodes, 7), label="capacity")
    cursors, ring_slots, _ = draw_rows(data, num_nodes, capacity)
    step = st.one_of(st.just(num_nodes - 1), st.integers(0, num_nodes - 1))  # (the last node: a long path)
    steps = data.draw(st.lists(step, min_size=len(ring_slots), max_size=len(ring_slots)), label="steps")
    if data.draw(st.booleans(), label="a step accepting nothing"):
        steps[data.draw(st.integers(0, len(steps) - 1))] = data.draw(st.sampled_from([-1, num_nodes]))
    case = accept_case(cursors=cursors, capacity=capacity, steps=steps, ring_slots=ring_slots, num_nodes=num_nodes,
                       dim=data.draw(st.integers(1, 12)), layers=data.draw(st.integers(1, 3)),
                       num_gates=data.draw(st.integers(1, 2)), num_gate_heads=data.draw(st.integers(1, 9)),
                       parents=data.draw(st.one_of(trees(num_nodes), trees(num_nodes), st.none()), label="parents"),
                       variant=data.draw(st.sampled_from(["contiguous", "offset", "permuted"])),
                       seed=data.draw(st.integers(0, 99)))
    corrupt_a_link(data, case["parents"], num_nodes)
    want, got = run_accept(case, num_nodes, block=data.draw(st.sampled_from([None, 2, 8])))
    assert_accept_agree(want, got)
