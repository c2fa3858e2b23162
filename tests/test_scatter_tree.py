"""convwin.scatter_tree against the loop oracle, over the WHOLE destination storage.

Random trees (chains, stars, k-ary, random), every node accepted in turn (partial acceptance),
padded and out-of-range rows, broken parent links, every rows layout the op accepts (token_major,
channel_major seen transposed, strided), both state layouts, dtype casts, int32/int64 -- and the
chain special case equals convwin.scatter bit for bit.
"""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import sgl_convwin
from sgl_convwin import reference
from sgl_convwin._kernels import triton_kernels
from support import (
    CACHE_DTYPES,
    chain_parents,
    exact_cast,
    expected_storage,
    impl_params,
    make_state,
    strided_tensor,
    trees,
    whole_storage,
)

VARIANTS = ("contiguous", "offset", "permuted", "sliced")


def make_rows(rows_layout, layers, slots, num_nodes, kernel_size, dim, dtype, device, generator, variant):
    """A [L, M, N+K-2, dim] rows tensor: a token_major buffer, or a channel_major one transposed."""
    num_positions = num_nodes + kernel_size - 2
    if rows_layout == "token_major":
        return strided_tensor((layers, slots, num_positions, dim), dtype, device, generator, variant)
    buffer = strided_tensor((layers, slots, dim, num_positions), dtype, device, generator, variant)
    return buffer.transpose(-1, -2)


def check_scatter_tree(impl, conv_state, rows, dst, src, nodes, parents, state_layout):
    expected = reference.scatter_tree_reference(conv_state, rows, dst, src, nodes, parents, state_layout)
    want = expected_storage(conv_state, expected)
    rows_before = whole_storage(rows).clone()
    impl.scatter_tree(conv_state, rows, dst, src, nodes, parents, state_layout=state_layout)
    assert torch.equal(whole_storage(conv_state), want)
    assert torch.equal(whole_storage(rows), rows_before), "rows must not be written"


@st.composite
def tree_cases(draw, exact_casts_only):
    layers = draw(st.integers(1, 3))
    num_src = draw(st.integers(1, 4))
    num_state = draw(st.integers(1, 5))
    num_nodes = draw(st.integers(1, 16))
    kernel_size = draw(st.integers(2, 5))
    dim = draw(st.integers(1, 40))
    rows_dtype = draw(st.sampled_from(CACHE_DTYPES))
    state_dtype = draw(st.sampled_from(CACHE_DTYPES))
    if exact_casts_only and not exact_cast(rows_dtype, state_dtype):
        state_dtype = rows_dtype
    free_slots = draw(st.permutations(range(num_state)))
    entries = []  # (dst, src, node, parents)
    for kind in draw(st.lists(st.sampled_from(["active", "active", "skip", "out_of_range", "bad_link"]), max_size=6)):
        src = draw(st.integers(0, num_src - 1))
        node = draw(st.integers(0, num_nodes - 1))  # any node: partial acceptance
        parents = draw(trees(num_nodes))
        if kind == "active" and free_slots:
            entries.append((free_slots.pop(), src, node, parents))
        elif kind == "skip":
            dst = draw(st.integers(-3, num_state - 1))
            entries.append((dst, src, node, parents) if dst < 0 else (dst, src, -draw(st.integers(1, 3)), parents))
        elif kind == "out_of_range":
            which = draw(st.sampled_from(["dst", "src", "node"]))
            dst = draw(st.integers(0, num_state - 1))
            if which == "dst":
                dst = num_state + draw(st.integers(0, 100))
            elif which == "src":
                src = draw(st.sampled_from([-1, num_src + draw(st.integers(0, 100))]))
            else:
                node = num_nodes + draw(st.integers(0, 100))
            entries.append((dst, src, node, parents))
        elif kind == "bad_link" and free_slots:
            # break a link the walk reads: the node's own parent, or an ancestor's
            parents = list(parents)
            victim = node
            for _ in range(draw(st.integers(0, kernel_size - 3 if kernel_size > 2 else 0))):
                if parents[victim] < 0:
                    break
                victim = parents[victim]
            parents[victim] = draw(st.sampled_from([victim, victim + 1 + draw(st.integers(0, 5)), -2, -100]))
            entries.append((free_slots.pop(), src, node, parents))
    return dict(
        layers=layers, num_src=num_src, num_state=num_state, num_nodes=num_nodes,
        kernel_size=kernel_size, dim=dim, rows_dtype=rows_dtype, state_dtype=state_dtype,
        entries=entries,
        rows_layout=draw(st.sampled_from(["token_major", "channel_major"])),
        state_layout=draw(st.sampled_from(sgl_convwin.STATE_LAYOUTS)),
        rows_variant=draw(st.sampled_from(VARIANTS)),
        state_variant=draw(st.sampled_from(VARIANTS)),
        index_dtypes=[draw(st.sampled_from([torch.int32, torch.int64])) for _ in range(4)],
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def run_case(impl, case):
    generator = torch.Generator().manual_seed(case["seed"])
    K, N = case["kernel_size"], case["num_nodes"]
    rows = make_rows(case["rows_layout"], case["layers"], case["num_src"], N, K, case["dim"],
                     case["rows_dtype"], impl.device, generator, case["rows_variant"])
    conv_state = make_state(case["state_layout"], case["layers"], case["num_state"], case["dim"], K - 1,
                            case["state_dtype"], impl.device, generator, case["state_variant"])
    entries = case["entries"]
    dst_dtype, src_dtype, node_dtype, parent_dtype = case["index_dtypes"]
    dst = torch.tensor([e[0] for e in entries], dtype=dst_dtype, device=impl.device)
    src = torch.tensor([e[1] for e in entries], dtype=src_dtype, device=impl.device)
    nodes = torch.tensor([e[2] for e in entries], dtype=node_dtype, device=impl.device)
    parents = torch.tensor([e[3] for e in entries], dtype=parent_dtype, device=impl.device).reshape(len(entries), N)
    check_scatter_tree(impl, conv_state, rows, dst, src, nodes, parents, case["state_layout"])


@pytest.mark.parametrize("impl", impl_params())
def test_scatter_tree_fuzz(impl):
    @given(case=tree_cases(exact_casts_only=impl.exact_casts_only))
    def fuzz(case):
        run_case(impl, case)

    fuzz()


def _triton_scatter_tree_forcing(**launch_kwargs):
    """The Triton scatter_tree with these launcher arguments forced (paths the defaults never take
    at test sizes: link-by-link walks, several programs per window, narrow vectors)."""

    def scatter_tree(conv_state, rows, dst, src, nodes, parents, *, state_layout="dim_major"):
        args, kwargs = sgl_convwin.scatter_tree.kernel_arguments(conv_state, rows, dst, src, nodes, parents,
                                                                 state_layout=state_layout)
        triton_kernels().launch_scatter_tree(*args, **kwargs, **launch_kwargs)

    return scatter_tree


LAUNCHER_CHOICES = {
    "links-loaded-per-step": dict(preload_parents=False, channels=8),
    "links-preloaded": dict(preload_parents=True, channels=8),
    "own-vectors-stored": dict(lane_rows=False, channels=8),
    "two-vectors-per-thread": dict(vec=2, channels=128, num_warps=1),
    "one-channel-vectors": dict(preload_parents=False, vec=1, channels=4, num_warps=1),
    "wide-program": dict(preload_parents=True, vec=2, channels=64, num_warps=2),
}


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda", slow=True))
@pytest.mark.parametrize("choices", list(LAUNCHER_CHOICES))
def test_launcher_choices_fuzz(impl, choices):
    """The fuzz cases through every path the launcher may choose: the parent links walked with one
    load per link or loaded up front, interleaved windows stored as lane rows or each thread's own
    vectors, strided stores (every state layout), several programs per window with a ragged last
    one, one to eight channels per vector, one or two vectors per thread."""
    forced = SimpleNamespace(device=impl.device, scatter_tree=_triton_scatter_tree_forcing(**LAUNCHER_CHOICES[choices]))

    @given(case=tree_cases(exact_casts_only=impl.exact_casts_only))
    def fuzz(case):
        run_case(forced, case)

    fuzz()


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda"))
@pytest.mark.parametrize("kernel_size", (3, 4, 5, 6))
@pytest.mark.parametrize("channels", (16, 64))
def test_interleaved_windows_stay_in_their_slots(impl, kernel_size, channels):
    """A dim-major state window is stored interleaved, K-1 columns padded to a power of two per
    vector: the padding is never stored. Destinations are inner slots of a storage with sentinels
    after it, the window takes several programs and the last one is ragged (44 channels)."""
    generator = torch.Generator().manual_seed(kernel_size)
    dim, num_nodes = 44, 5
    rows = make_rows("token_major", 2, 2, num_nodes, kernel_size, dim, torch.float32, impl.device, generator,
                     "contiguous")
    dst, src, nodes = (torch.tensor(v, device=impl.device) for v in ([1, 2], [0, 1], [4, 3]))
    parents = torch.tensor([[-1, 0, 0, 1, 3], [-1, -1, 1, 2, 2]], device=impl.device)
    for preload in (False, True):  # each walk from the same state, not one the other already wrote
        conv_state = make_state("dim_major", 2, 4, dim, kernel_size - 1, torch.float32, impl.device,
                                torch.Generator().manual_seed(kernel_size), "offset")
        forced = SimpleNamespace(scatter_tree=_triton_scatter_tree_forcing(channels=channels, preload_parents=preload))
        check_scatter_tree(forced, conv_state, rows, dst, src, nodes, parents, "dim_major")


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda"))
@pytest.mark.parametrize("preload", [False, True])
def test_links_beyond_int32_are_bad_links(impl, preload):
    """int64 links that an int32 cast would turn into good ones (2**32 -> 0, 2**32 - 1 -> -1,
    1 - 2**32 -> 1) skip their row, on both walks; the rows beside them are written."""
    forced = SimpleNamespace(scatter_tree=_triton_scatter_tree_forcing(preload_parents=preload))
    generator = torch.Generator().manual_seed(3)
    rows = make_rows("token_major", 2, 2, 8, 4, 24, torch.float32, impl.device, generator, "contiguous")
    conv_state = make_state("dim_major", 2, 6, 24, 3, torch.float32, impl.device, generator, "contiguous")
    good = [-1, -1, -1, 0, 0, 0, 1, 1]
    bad_rows = []
    for victim, value in ((3, 2**32), (3, 2**32 - 1), (0, 2**32 - 1), (6, 1 - 2**32)):
        links = list(good)
        links[victim] = value
        bad_rows.append(links)
    parents = torch.tensor([good] + bad_rows, dtype=torch.int64, device=impl.device)
    nodes = torch.tensor([7, 3, 3, 0, 6], device=impl.device)
    dst = torch.arange(5, device=impl.device)
    src = torch.tensor([0, 1, 0, 1, 0], device=impl.device)
    before = conv_state.clone()
    check_scatter_tree(forced, conv_state, rows, dst, src, nodes, parents, "dim_major")
    assert not torch.equal(conv_state[:, 0], before[:, 0]) and torch.equal(conv_state[:, 1:], before[:, 1:])


@pytest.mark.parametrize(
    "node, parents, kernel_size, expected",
    [
        (0, [-1, 0, 1, 2], 4, [0, 1, 2]),  # chain: window 0 = both history rows, then node 0
        (2, [-1, 0, 1, 2], 4, [2, 3, 4]),  # chain: window 2 = nodes 0..2
        (3, [-1, -1, 0, 1], 4, [1, 3, 5]),  # newest history row, node 1, node 3
        (2, [-1, -1, 0, 1], 4, [1, 2, 4]),
        (1, [-1, -1], 5, [0, 1, 2, 4]),  # K=5: three history rows (positions 0..2), node 1 at 4
        (3, [-1, 0, 0, 2], 2, [3]),  # K=2: no history rows, the node itself
        (3, [-1, 0, 0, 3], 4, None),  # a node that is its own parent
        (3, [-1, 0, 7, 2], 4, None),  # a parent after the node, met on the walk
        (3, [-1, 0, 7, 0], 3, [1, 4]),  # ... not met: K=3 only reads node 3's own parent
    ],
)
def test_oracle_window_positions(node, parents, kernel_size, expected):
    assert reference.tree_window_positions(node, parents, kernel_size) == expected


@pytest.mark.parametrize("impl", impl_params(slow=True))
@pytest.mark.parametrize("state_layout", sgl_convwin.STATE_LAYOUTS)
@pytest.mark.parametrize("layout", ("token_major", "channel_major"))
@pytest.mark.parametrize("kernel_size", (2, 3, 4, 5))
def test_chain_equals_scatter_bit_for_bit(impl, layout, state_layout, kernel_size):
    """Chain parents: scatter_tree on the rows == scatter on the window view, every node."""
    num_nodes, layers, dim = 6, 2, 21
    generator = torch.Generator().manual_seed(kernel_size)
    physical = sgl_convwin.physical_shape(layout, layers, 3, dim, num_nodes, kernel_size)
    buffer = torch.randn(physical, generator=generator).to(torch.bfloat16).to(impl.device)
    windows = sgl_convwin.window_view(buffer, layout, num_nodes, kernel_size)
    rows = buffer if layout == "token_major" else buffer.transpose(-1, -2)
    width = kernel_size - 1
    dst = torch.tensor([3, 0, -1, 1], device=impl.device)
    src = torch.tensor([1, 2, 0, 0], device=impl.device)
    parents = torch.tensor([chain_parents(num_nodes)] * 4, device=impl.device)
    for node in range(num_nodes):
        nodes = torch.tensor([node, (node + 3) % num_nodes, node, num_nodes - 1 - node], device=impl.device)
        state_a = make_state(state_layout, layers, 4, dim, width, torch.float32, impl.device, generator, "contiguous")
        state_b = state_a.clone()
        impl.scatter(state_a, windows, dst, src, nodes, state_layout=state_layout)
        impl.scatter_tree(state_b, rows, dst, src, nodes, parents, state_layout=state_layout)
        assert torch.equal(state_a, state_b)


@pytest.mark.parametrize("impl", impl_params())
def test_every_node_of_a_tree(impl):
    """An EAGLE-like tree (topk 3, depth 2): accept each node in turn, from first principles."""
    dim, layers = 12, 2  # K = 4: two history rows
    parents_list = [-1, -1, -1, 0, 0, 0, 1, 1, 1]  # 3 roots, 3 children each under roots 0 and 1
    num_nodes = len(parents_list)
    generator = torch.Generator().manual_seed(7)
    rows = torch.randn(layers, 2, num_nodes + 2, dim, generator=generator).to(impl.device)
    parents = torch.tensor([parents_list], device=impl.device)
    for node in range(num_nodes):
        conv_state = torch.zeros(layers, 3, dim, 3, device=impl.device)
        impl.scatter_tree(conv_state, rows, torch.tensor([1], device=impl.device),
                          torch.tensor([1], device=impl.device), torch.tensor([node], device=impl.device), parents)
        parent = parents_list[node]
        if parent < 0:  # history x_-2, x_-1, then the root
            inputs = [0, 1, 2 + node]
        else:  # history x_-1, the root, the node
            inputs = [1, 2 + parent, 2 + node]
        assert torch.equal(conv_state[:, 1].cpu(), rows[:, 1, inputs].transpose(-1, -2).cpu())
        assert not conv_state[:, 0].any() and not conv_state[:, 2].any()


@pytest.mark.parametrize("impl", impl_params())
def test_empty_batch(impl):
    conv_state = torch.randn(2, 3, 8, 3, device=impl.device)
    rows = torch.randn(2, 2, 6, 8, device=impl.device)
    before = conv_state.clone()
    empty = torch.empty(0, dtype=torch.int64, device=impl.device)
    impl.scatter_tree(conv_state, rows, empty, empty, empty, torch.empty(0, 4, dtype=torch.int64, device=impl.device))
    assert torch.equal(conv_state, before)


@pytest.mark.parametrize("impl", impl_params())
def test_windows_span_several_blocks(impl):
    generator = torch.Generator().manual_seed(8)
    for state_layout in sgl_convwin.STATE_LAYOUTS:
        rows = make_rows("token_major", 2, 2, 5, 4, 1500, torch.float32, impl.device, generator, "contiguous")
        conv_state = make_state(state_layout, 2, 3, 1500, 3, torch.float32, impl.device, generator, "contiguous")
        dst = torch.tensor([2, 0], device=impl.device)
        src = torch.tensor([1, 0], device=impl.device)
        nodes = torch.tensor([4, 2], device=impl.device)
        parents = torch.tensor([[-1, 0, -1, 2, 3], [-1, -1, 1, 1, 0]], device=impl.device)
        check_scatter_tree(impl, conv_state, rows, dst, src, nodes, parents, state_layout)


@pytest.mark.parametrize("impl", impl_params())
@pytest.mark.parametrize("num_nodes", [3, 256, 257])
@pytest.mark.parametrize("kernel_size", [4, 5])
def test_random_trees_deep_nodes(impl, num_nodes, kernel_size):
    """Random trees up to 257 nodes (parents[b, n] uniform in [-1, n-1]), deep nodes, K = 4 and 5
    (two and three links walked), and one bad link."""
    generator = torch.Generator().manual_seed(num_nodes + kernel_size)
    layers, dim = 2, 8
    # parents[b, n] uniform in [-1, n-1]; row 3's last node links to itself (a bad link)
    parents = (torch.rand(4, num_nodes, generator=generator) * (torch.arange(num_nodes) + 1)).long() - 1
    parents[3, -1] = num_nodes - 1
    rows = make_rows("token_major", layers, 2, num_nodes, kernel_size, dim, torch.float32, impl.device, generator,
                     "contiguous")
    conv_state = make_state("dim_major", layers, 5, dim, kernel_size - 1, torch.float32, impl.device, generator,
                            "contiguous")
    dst, src = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 0, 1])
    nodes = torch.tensor([num_nodes - 1, num_nodes - 2, num_nodes // 2, num_nodes - 1])
    check_scatter_tree(impl, conv_state, rows, dst.to(impl.device), src.to(impl.device), nodes.to(impl.device),
                       parents.to(impl.device), "dim_major")
