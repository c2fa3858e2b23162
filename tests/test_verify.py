"""convwin.capture and convwin.causal_conv1d_verify against the loop oracles.

Captured buffers are copies: compared with torch.equal over the WHOLE storage of the buffer, for
every layout (dense, channel_major, token_major), strided tensors, dtype casts, padded and
out-of-range rows, chains (parents=None) and random trees with and without broken links. Outputs
are arithmetic: compared with a float64 token-by-token decode within the output dtype's tolerance,
and every entry the op must not write is compared exactly. Then the end-to-end properties: capture
+ commit is what decoding the accepted tokens one at a time leaves in the conv state, and a tree
committed from deduplicated rows equals the dense fallback, bit for bit.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import sgl_convwin
from sgl_convwin import reference
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
# (rtol, atol) of an output stored in this dtype (the conv accumulates in float32)
TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


@st.composite
def verify_cases(draw, exact_casts_only):
    layers = draw(st.integers(1, 3))
    num_buffer = draw(st.integers(1, 4))
    num_state = draw(st.integers(1, 5))
    num_nodes = draw(st.integers(1, 16))
    kernel_size = draw(st.integers(2, 5))
    x_dtype, state_dtype, buffer_dtype, out_dtype, weight_dtype = (
        draw(st.sampled_from(CACHE_DTYPES)) for _ in range(5)
    )
    if exact_casts_only and not (exact_cast(x_dtype, buffer_dtype) and exact_cast(state_dtype, buffer_dtype)):
        buffer_dtype = torch.float32
    tree_mode = draw(st.sampled_from(["chain", "trees", "broken"]))
    free_buffer_slots = draw(st.permutations(range(num_buffer)))
    entries = []  # (buffer slot, state slot, parents)
    for kind in draw(st.lists(st.sampled_from(["active", "active", "skip", "out_of_range"]), max_size=6)):
        state_slot = draw(st.integers(0, num_state - 1))
        parents = draw(trees(num_nodes))
        if tree_mode == "broken" and draw(st.booleans()):
            parents = list(parents)
            victim = draw(st.integers(0, num_nodes - 1))
            parents[victim] = draw(st.sampled_from([victim, victim + 1 + draw(st.integers(0, 5)), -2, -100]))
        if kind == "active" and free_buffer_slots:
            entries.append((free_buffer_slots.pop(), state_slot, parents))
        elif kind == "skip":  # padding: a negative slot on either side
            if draw(st.booleans()):
                entries.append((-draw(st.integers(1, 3)), state_slot, parents))
            else:
                entries.append((draw(st.integers(0, num_buffer - 1)), -1, parents))
        elif kind == "out_of_range":
            if draw(st.booleans()):
                entries.append((num_buffer + draw(st.integers(0, 50)), state_slot, parents))
            else:
                entries.append((draw(st.integers(0, num_buffer - 1)), num_state + draw(st.integers(0, 50)), parents))
    return dict(
        layers=layers, num_buffer=num_buffer, num_state=num_state, num_nodes=num_nodes,
        kernel_size=kernel_size, dim=draw(st.integers(1, 40)), layer=draw(st.integers(0, layers - 1)),
        layout=draw(st.sampled_from(sgl_convwin.LAYOUTS)),
        state_layout=draw(st.sampled_from(sgl_convwin.STATE_LAYOUTS)),
        x_dtype=x_dtype, state_dtype=state_dtype, buffer_dtype=buffer_dtype, out_dtype=out_dtype,
        weight_dtype=weight_dtype, tree_mode=tree_mode, entries=entries,
        bias=draw(st.booleans()), activation=draw(st.sampled_from([None, "silu"])),
        variants=[draw(st.sampled_from(VARIANTS)) for _ in range(4)],  # buffer, state, x, out
        index_dtypes=[draw(st.sampled_from([torch.int32, torch.int64])) for _ in range(3)],
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def build(case, device):
    generator = torch.Generator().manual_seed(case["seed"])
    L, N, K, dim = case["layers"], case["num_nodes"], case["kernel_size"], case["dim"]
    buffer_variant, state_variant, x_variant, out_variant = case["variants"]
    physical = sgl_convwin.physical_shape(case["layout"], L, case["num_buffer"], dim, N, K)
    entries = case["entries"]
    B = len(entries)
    buffer_dtype, state_dtype, parents_dtype = case["index_dtypes"]
    args = dict(
        buffer=strided_tensor(physical, case["buffer_dtype"], device, generator, buffer_variant),
        conv_state=make_state(case["state_layout"], L, case["num_state"], dim, K - 1, case["state_dtype"],
                              device, generator, state_variant),
        x=strided_tensor((B, N, dim), case["x_dtype"], device, generator, x_variant),
        buffer_slots=torch.tensor([e[0] for e in entries], dtype=buffer_dtype, device=device),
        state_slots=torch.tensor([e[1] for e in entries], dtype=state_dtype, device=device),
        layer=case["layer"],
        parents=None if case["tree_mode"] == "chain" else
        torch.tensor([e[2] for e in entries], dtype=parents_dtype, device=device).reshape(B, N),
    )
    conv = dict(
        out=strided_tensor((B, N, dim), case["out_dtype"], device, generator, out_variant),
        weight=random_weight(dim, K, case["weight_dtype"], device, generator),
        bias=strided_tensor((dim,), case["weight_dtype"], device, generator, "offset") if case["bias"] else None,
    )
    return args, conv


def random_weight(dim, kernel_size, dtype, device, generator):
    return (torch.randn(dim, kernel_size, generator=generator) / kernel_size**0.5).to(dtype=dtype, device=device)


def call_capture(impl, args, layout, state_layout):
    impl.capture(args["buffer"], args["conv_state"], args["x"], args["buffer_slots"], args["state_slots"],
                 args["layer"], args["parents"], layout=layout, state_layout=state_layout)


def call_verify(impl, args, conv, layout, state_layout, activation):
    impl.causal_conv1d_verify(
        conv["out"], args["buffer"], args["conv_state"], args["x"], conv["weight"], conv["bias"],
        args["buffer_slots"], args["state_slots"], args["layer"], args["parents"],
        layout=layout, activation=activation, state_layout=state_layout,
    )


def snapshot(*tensors):
    return [whole_storage(t).clone() for t in tensors if t is not None]


def unchanged(tensors, before):
    return all(torch.equal(whole_storage(t), b) for t, b in zip([t for t in tensors if t is not None], before))


def expected_buffer(args, layout, state_layout):
    return reference.capture_reference(
        args["buffer"], args["conv_state"], args["x"], args["buffer_slots"].cpu(), args["state_slots"].cpu(),
        args["layer"], layout, None if args["parents"] is None else args["parents"].cpu(), state_layout,
    )


def check_outputs(out, out_before, expected, written):
    """Written entries within tolerance of the float64 oracle; everything else of out's storage,
    inside the view and around it, exactly as it was."""
    rtol, atol = TOLERANCE[out.dtype]
    got = out.detach().cpu().double()
    torch.testing.assert_close(got[written], expected[written], rtol=rtol, atol=atol)
    restored = whole_storage(out).clone()
    view = restored.as_strided(out.shape, out.stride(), out.storage_offset())
    view[written.to(out.device)] = out_before.as_strided(out.shape, out.stride(), out.storage_offset())[written.to(out.device)]
    assert torch.equal(restored, out_before), "out changed where it must not be written"


def launch_and_check(args, weight, bias, layout, tuning, plan_check=None):
    """One launch of the Triton verify launcher with ``tuning`` on ``args`` (dim_major state, SiLU,
    a float32 out): the whole buffer equal to the capture oracle, out within tolerance of the
    float64 oracle where it writes and untouched elsewhere. plan_check(kernel, plan), if given,
    sees the launch's plan first. Returns the oracle's mask of written outputs."""
    from sgl_convwin._kernels import triton_kernels

    kernels = triton_kernels()
    x, parents = args["x"], args["parents"]
    want = expected_buffer(args, layout, "dim_major")
    out = torch.zeros(x.shape, device=x.device)
    out_before = whole_storage(out).clone()
    expected, written = reference.causal_conv1d_verify_reference(
        out, args["conv_state"].cpu(), x.cpu(), weight.cpu(), None if bias is None else bias.cpu(),
        args["buffer_slots"].cpu(), args["state_slots"].cpu(), args["buffer"].shape[1], args["layer"],
        None if parents is None else parents.cpu(), "silu")
    kernel_args, kernel_kwargs = sgl_convwin.causal_conv1d_verify.kernel_arguments(
        out, args["buffer"], args["conv_state"], x, weight.to(x.device), None if bias is None else bias.to(x.device),
        args["buffer_slots"], args["state_slots"], args["layer"], parents, layout=layout, activation="silu")
    if plan_check is not None:
        kernel, _, _, plan = kernels.verify._plan(*kernel_args[:8], kernel_args[9], kernel_kwargs["dense"],
                                                  kernel_kwargs["silu"], tuning)
        plan_check(kernel, plan)
    kernels.launch_causal_conv1d_verify(*kernel_args, **kernel_kwargs, **tuning)
    assert torch.equal(args["buffer"].cpu(), want), "buffer"
    check_outputs(out, out_before, expected, written)
    return written


@pytest.mark.parametrize("impl", impl_params())
def test_capture_fuzz(impl):
    @given(case=verify_cases(exact_casts_only=impl.exact_casts_only))
    def fuzz(case):
        args, _ = build(case, impl.device)
        layout, state_layout = case["layout"], case["state_layout"]
        want = expected_storage(args["buffer"], expected_buffer(args, layout, state_layout))
        inputs = (args["conv_state"], args["x"], args["parents"])
        before = snapshot(*inputs)
        call_capture(impl, args, layout, state_layout)
        assert torch.equal(whole_storage(args["buffer"]), want)
        assert unchanged(inputs, before), "capture must not write its inputs"

    fuzz()


@pytest.mark.parametrize("impl", impl_params())
def test_verify_fuzz(impl):
    @given(case=verify_cases(exact_casts_only=impl.exact_casts_only))
    def fuzz(case):
        args, conv = build(case, impl.device)
        layout, state_layout, activation = case["layout"], case["state_layout"], case["activation"]
        buffer_for_capture = args["buffer"].clone()
        want = expected_storage(args["buffer"], expected_buffer(args, layout, state_layout))
        expected, written = reference.causal_conv1d_verify_reference(
            conv["out"], args["conv_state"], args["x"], conv["weight"], conv["bias"],
            args["buffer_slots"].cpu(), args["state_slots"].cpu(), case["num_buffer"], args["layer"],
            None if args["parents"] is None else args["parents"].cpu(), activation, state_layout,
        )
        inputs = (args["conv_state"], args["x"], args["parents"], conv["weight"], conv["bias"])
        before = snapshot(*inputs)
        out_before = whole_storage(conv["out"]).clone()
        call_verify(impl, args, conv, layout, state_layout, activation)
        assert torch.equal(whole_storage(args["buffer"]), want)
        check_outputs(conv["out"], out_before, expected, written)
        assert unchanged(inputs, before), "verify must not write its inputs"
        # the fused pass captures exactly what the capture op does
        captured = dict(args, buffer=buffer_for_capture)
        call_capture(impl, captured, layout, state_layout)
        assert torch.equal(buffer_for_capture, args["buffer"])

    fuzz()


# the verify launcher's tuning keywords that force each kernel and each of its variants, by test id
KERNEL_TUNINGS = {
    "tile-or-any-width": dict(node_loop=False, preload=False, early=False),
    "tile-early": dict(node_loop=False, preload=False, early=True),
    "tile-preloaded": dict(node_loop=False, preload=True, early=False),
    "tile-preloaded-early": dict(node_loop=False, preload=True, early=True),
    "tile-one-store": dict(node_loop=False, preload=False, one_store=True),
    "tile-preloaded-one-store": dict(node_loop=False, preload=True, one_store=True),
    "node-loop": dict(node_loop=True, prefetch=0),
    "node-loop-prefetch-1": dict(node_loop=True, prefetch=1),
    "node-loop-prefetch-2": dict(node_loop=True, prefetch=2),
    "node-loop-prefetch-3": dict(node_loop=True, prefetch=3),
    "node-loop-prefetch-4": dict(node_loop=True, prefetch=4),
    "tile-or-any-width-blocks-first": dict(node_loop=False, preload=True, early=True, blocks_first=True),
    "node-loop-blocks-first": dict(node_loop=True, blocks_first=True),
    "tile-or-any-width-requests-first": dict(node_loop=False, preload=True, early=True, blocks_first=False),
    "node-loop-requests-first": dict(node_loop=True, blocks_first=False),
    "node-loop-64-2": dict(node_loop=True, block=64, num_warps=2),
    "tile-preloaded-gather-links": dict(node_loop=False, preload=True, gather_links=True),
    "tile-gather-links": dict(node_loop=False, preload=False, gather_links=True),
    "tile-preloaded-one-store-pairs": dict(node_loop=False, preload=True, one_store=True, pairs=True),
    "tile-one-store-pairs-gather-links": dict(node_loop=False, preload=False, one_store=True, pairs=True,
                                              gather_links=True),
    "small-tree": dict(small_tree=True),
    "small-tree-64-2": dict(small_tree=True, block=64, num_warps=2),
    "small-tree-slots-as-masks": dict(small_tree=True, slots_as_masks=True),
    "small-tree-int64-offsets": dict(small_tree=True, offsets32=False),
    "small-tree-slots-as-masks-int64-offsets": dict(small_tree=True, slots_as_masks=True, offsets32=False),
    "node-loop-int64-offsets": dict(node_loop=True, offsets32=False),
    "node-loop-prefetch-4-int32-offsets": dict(node_loop=True, prefetch=4, offsets32=True),
    "small-tree-no-runs": dict(small_tree=True, runs=False),
    "small-tree-runs-slots-by-branch": dict(small_tree=True, runs=True, slots_as_masks=False),
    "small-tree-runs-slots-as-masks": dict(small_tree=True, runs=True, slots_as_masks=True),
    "small-tree-packed-links": dict(small_tree=True, packed_links=True),
    "small-tree-links-by-select": dict(small_tree=True, packed_links=False),
    "small-tree-by-column": dict(small_tree=True, lane_runs=False),
}


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda", slow=True))
@pytest.mark.parametrize("tuning", list(KERNEL_TUNINGS.values()), ids=list(KERNEL_TUNINGS))
def test_verify_fuzz_each_kernel(impl, tuning):
    """Each verify kernel on every layout, whichever the launcher would pick for the shape: the
    node loop (K <= 5; rows or dense windows) with each node's input loaded 0 to 4 nodes ahead,
    the rows tile with and without its 2-D preload, with its slot-free loads before or after the
    slots and its rows stored as one tile or row by row, the any-width dense kernel, each on a grid
    of requests first or of channel blocks first, and the node loop at one channel per lane (dense
    chains' choice from 8 requests), the tile with a tree's links walked in registers and with its
    one store two rows per lane, and the unrolled small-tree kernel (trees of up to 8 nodes, K <= 5;
    larger ones take the others), its tree links packed into one integer and selected one by one,
    its committed inputs and weights as runs and by column, the node loops also with the
    per-element offsets their rule does not pick (int64; int32 four nodes ahead), against the same
    oracles as test_verify_fuzz."""
    from sgl_convwin._kernels import triton_kernels

    launch = triton_kernels().launch_causal_conv1d_verify

    @given(case=verify_cases(exact_casts_only=impl.exact_casts_only))
    def fuzz(case):
        args, conv = build(case, impl.device)
        layout, state_layout, activation = case["layout"], case["state_layout"], case["activation"]
        want = expected_storage(args["buffer"], expected_buffer(args, layout, state_layout))
        expected, written = reference.causal_conv1d_verify_reference(
            conv["out"], args["conv_state"], args["x"], conv["weight"], conv["bias"],
            args["buffer_slots"].cpu(), args["state_slots"].cpu(), case["num_buffer"], args["layer"],
            None if args["parents"] is None else args["parents"].cpu(), activation, state_layout,
        )
        out_before = whole_storage(conv["out"]).clone()
        kernel_args, kernel_kwargs = sgl_convwin.causal_conv1d_verify.kernel_arguments(
            conv["out"], args["buffer"], args["conv_state"], args["x"], conv["weight"], conv["bias"],
            args["buffer_slots"], args["state_slots"], args["layer"], args["parents"],
            layout=layout, activation=activation, state_layout=state_layout)
        launch(*kernel_args, **kernel_kwargs, **tuning)
        assert torch.equal(whole_storage(args["buffer"]), want)
        check_outputs(conv["out"], out_before, expected, written)

    fuzz()


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda", slow=True))
@pytest.mark.parametrize("tuning", list(KERNEL_TUNINGS.values()), ids=list(KERNEL_TUNINGS))
@pytest.mark.parametrize("tree", (False, True), ids=("chain", "tree"))
def test_each_kernel_skips_padding_and_slots_out_of_range(impl, tuning, tree):
    """Every kernel, every layout: requests whose buffer slot is negative (padding) or past the
    buffer, or whose state slot is negative or past the state, write nothing at all -- neither
    their outputs nor any buffer slot -- while the valid requests around them are served. Four
    nodes (a power of two; channel_major rows in pairs), then three (the kernels' node tiles
    padded, an odd row count)."""
    generator = torch.Generator().manual_seed(60)
    L, M, K, dim, num_state = 2, 3, 4, 20, 3
    buffer_slots = torch.tensor([1, -1, 3, 0, 2, 1])
    state_slots = torch.tensor([0, 1, 2, -1, 1, 7])  # rows 0 and 4 are the valid ones
    B = len(buffer_slots)
    for N, layout in [(N, layout) for N in (4, 3) for layout in sgl_convwin.LAYOUTS]:
        parents = torch.tensor([[-1, 0, 0, 1][:N]] * B) if tree else None
        buffer = torch.randn(sgl_convwin.physical_shape(layout, L, M, dim, N, K), generator=generator)
        conv_state = torch.randn(L, num_state, dim, K - 1, generator=generator)
        x = torch.randn(B, N, dim, generator=generator)
        weight = random_weight(dim, K, torch.float32, "cpu", generator)
        args = dict(buffer=buffer.to(impl.device), conv_state=conv_state.to(impl.device), x=x.to(impl.device),
                    buffer_slots=buffer_slots.to(impl.device), state_slots=state_slots.to(impl.device), layer=1,
                    parents=None if parents is None else parents.to(impl.device))
        written = launch_and_check(args, weight, None, layout, tuning)
        assert written[[0, 4]].all() and not written[[1, 2, 3, 5]].any(), (layout, N)


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda", slow=True))
@pytest.mark.parametrize("buffer_dtype", (torch.bfloat16, torch.float32), ids=("bf16", "fp32"))
@pytest.mark.parametrize("slots_as_masks", (False, True), ids=("slots-by-branch", "slots-as-masks"))
@pytest.mark.parametrize("tree", (False, True), ids=("chain", "tree"))
@pytest.mark.parametrize("layout", ("channel_major", "dense"))
def test_small_tree_stores_runs(impl, layout, buffer_dtype, slots_as_masks, tree):
    """The small-tree kernel's channel_major rows and dense windows stored as runs (a group's rows
    or window columns reordered in registers, stored lane by lane along the run): every K <= 5 and
    node count up to 8 (runs of even and odd length), the launcher's channels per program (128 on
    rows: 4 channels a lane; 64 on dense windows: 2) over two blocks, the second with 8 channels, a
    padded request, one whose state slot is out of range and, on trees, a bad link beside the
    served ones."""
    from sgl_convwin._kernels import triton_kernels

    small_tree_kernel = triton_kernels().verify._verify_small_tree_kernel
    generator = torch.Generator().manual_seed(80)
    L, M, dim, num_state = 2, 4, 136, 3
    buffer_slots = torch.tensor([2, -1, 0, 3])
    state_slots = torch.tensor([1, 0, 2, 5])  # rows 0 and 2 are served
    B = len(buffer_slots)
    tuning = dict(small_tree=True, runs=True, block=64 if layout == "dense" else 128, slots_as_masks=slots_as_masks)
    every = [(K, N) for K in (2, 3, 4, 5) for N in (1, 3, 4, 5, 8) if N + K > 3]  # (one row: token_major)
    # the interpreter, slow, takes runs of 2-11 rows, even and odd, each K once at least
    some = [(2, 3), (2, 8), (3, 1), (3, 4), (4, 3), (4, 4), (5, 5), (5, 8)]
    for K, N in every if impl.device == "cuda" else some:
        parents = torch.tensor([[-1, 0, 0, 1, 2, 2, 4, 3][:N], [-1, -1, 1, 0, 3, 1, 5, 6][:N],
                                [-1, 0, 0, 1, 7, 2, 4, 3][:N], [-1, 0, 0, 1, 2, 2, 4, 3][:N]]) if tree else None
        buffer = torch.randn(sgl_convwin.physical_shape(layout, L, M, dim, N, K), generator=generator)
        args = dict(buffer=buffer.to(buffer_dtype).to(impl.device),
                    conv_state=torch.randn(L, num_state, dim, K - 1, generator=generator).to(impl.device),
                    x=torch.randn(B, N, dim, generator=generator).to(buffer_dtype).to(impl.device),
                    buffer_slots=buffer_slots.to(impl.device), state_slots=state_slots.to(impl.device), layer=1,
                    parents=None if parents is None else parents.to(impl.device))
        args["conv_state"] = args["conv_state"].to(buffer_dtype)
        weight = random_weight(dim, K, torch.float32, "cpu", generator)
        run = K - 1 if layout == "dense" else N + K - 2

        def stores_runs(kernel, plan):
            assert kernel is small_tree_kernel and plan["RUN"] == run, (K, N)

        launch_and_check(args, weight, None, layout, tuning, stores_runs)


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda"))
@pytest.mark.parametrize("gather_links", (True, False), ids=("links-in-registers", "links-loaded-per-step"))
@pytest.mark.parametrize("kernel_size", (6, 7))
def test_wide_conv_trees_on_the_tile(impl, gather_links, kernel_size):
    """Convs wider than the fuzz draws (K = 6, 7: no preload, no node loop) on trees, rows layouts,
    the tile's links walked both ways, with a padded request and a link reaching the history."""
    generator = torch.Generator().manual_seed(70 + kernel_size)
    M, N, dim, K = 4, 6, 10, kernel_size
    parents = torch.tensor([[-1, 0, 0, 1, 3, 2], [-1, -1, 1, 5, 2, 4], [-1, 0, 1, 2, 3, 4]])
    buffer_slots, state_slots = torch.tensor([2, 0, -1]), torch.tensor([1, 3, 0])
    B = len(buffer_slots)
    for layout in ("token_major", "channel_major"):
        conv_state = torch.randn(1, 4, dim, K - 1, generator=generator)
        x = torch.randn(B, N, dim, generator=generator)
        weight = random_weight(dim, K, torch.float32, "cpu", generator)
        bias = torch.randn(dim, generator=generator)
        args = dict(buffer=torch.zeros(sgl_convwin.physical_shape(layout, 1, M, dim, N, K), device=impl.device),
                    conv_state=conv_state.to(impl.device), x=x.to(impl.device),
                    buffer_slots=buffer_slots.to(impl.device), state_slots=state_slots.to(impl.device), layer=0,
                    parents=parents.to(impl.device))
        launch_and_check(args, weight, bias, layout, dict(node_loop=False, gather_links=gather_links))


@pytest.mark.parametrize("impl", impl_params())
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
@pytest.mark.parametrize("kernel_size", (2, 3, 4, 5))
def test_chain_parents_equal_no_parents(impl, layout, kernel_size):
    """parents=None is a chain: the same outputs and buffer as explicit chain parents, bit for bit."""
    generator = torch.Generator().manual_seed(kernel_size)
    L, M, N, dim, B = 2, 3, 5, 19, 3
    conv_state = torch.randn(L, 4, dim, kernel_size - 1, generator=generator).to(impl.device)
    x = torch.randn(B, N, dim, generator=generator).to(torch.bfloat16).to(impl.device)
    weight = random_weight(dim, kernel_size, torch.float32, impl.device, generator)
    bias = torch.randn(dim, generator=generator).to(impl.device)
    slots = (torch.tensor([2, 0, -1], device=impl.device), torch.tensor([1, 3, 0], device=impl.device))
    physical = sgl_convwin.physical_shape(layout, L, M, dim, N, kernel_size)
    results = []
    for parents in (None, torch.tensor([chain_parents(N)] * B, device=impl.device)):
        buffer = torch.zeros(physical, dtype=torch.bfloat16, device=impl.device)
        out = torch.zeros(B, N, dim, dtype=torch.bfloat16, device=impl.device)
        impl.causal_conv1d_verify(out, buffer, conv_state, x, weight, bias, *slots, 1, parents,
                                  layout=layout, activation="silu")
        results.append((out, buffer))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("impl", impl_params(slow=True))
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_links_beyond_int32_are_bad_links(impl, layout):
    """An int64 parent link outside int32's range is a bad link (its node and the nodes within
    K-1 below it write no output), never the in-range link its low 32 bits spell: 2**32 is not 0,
    -2**32 - 1 is not -1; and so are a node's own index, a later node's (also one a packed link
    could not hold) and -2. Each kernel that serves trees of this size, through the launcher's
    tuning keywords where there is a choice."""
    generator = torch.Generator().manual_seed(50)
    L, M, N, K, dim = 1, 5, 6, 4, 24
    parents = torch.tensor([[-1, 0, 2**32, 1, 3, 2], [-1, 0, 1, -(2**32) - 1, 3, 0], [-1, 1, 0, 5, 2, 3],
                            [-1, 0, -2, 1, 15, 2]], dtype=torch.int64)
    B = parents.shape[0]
    conv_state = torch.randn(L, 4, dim, K - 1, generator=generator).to(impl.device)
    x = torch.randn(B, N, dim, generator=generator).to(impl.device)
    weight = random_weight(dim, K, torch.float32, impl.device, generator)
    slots = (torch.tensor([2, 0, 4, 1], device=impl.device), torch.tensor([1, 0, 3, 2], device=impl.device))
    expected, written = reference.causal_conv1d_verify_reference(
        torch.zeros(B, N, dim), conv_state.cpu(), x.cpu(), weight.cpu(), None, slots[0].cpu(), slots[1].cpu(), M, 0,
        parents, "silu")
    bad = [(0, 2), (1, 3), (2, 1), (2, 3), (3, 2), (3, 4)]
    assert not any(bool(written[row, node].any()) for row, node in bad)  # the oracle calls them bad
    runs = [lambda *args: impl.causal_conv1d_verify(*args, layout=layout, activation="silu")]
    if impl.name in ("triton_interpret", "cuda"):  # the Triton kernels, each one
        from sgl_convwin._kernels import triton_kernels

        def kernel(**tuning):
            def run(*args):
                kernel_args, kernel_kwargs = sgl_convwin.causal_conv1d_verify.kernel_arguments(
                    *args, layout=layout, activation="silu")
                triton_kernels().launch_causal_conv1d_verify(*kernel_args, **kernel_kwargs, **tuning)
            return run

        runs += [kernel(node_loop=True), kernel(node_loop=False, preload=True),
                 kernel(node_loop=False, preload=False), kernel(node_loop=False, gather_links=True),
                 kernel(small_tree=True), kernel(node_loop=True, offsets32=False),
                 kernel(small_tree=True, offsets32=False), kernel(small_tree=True, packed_links=True),
                 kernel(small_tree=True, packed_links=False)]
    for run in runs:
        buffer = torch.zeros(sgl_convwin.physical_shape(layout, L, M, dim, N, K), device=impl.device)
        out = torch.zeros(B, N, dim, device=impl.device)
        out_before = whole_storage(out).clone()
        run(out, buffer, conv_state, x, weight, None, *slots, 0, parents.to(impl.device))
        check_outputs(out, out_before, expected, written)


def decode_state(history, tokens):
    """The conv state after feeding ``tokens`` one at a time into a K-1 shift register."""
    state = list(history)
    for token in tokens:
        state = state[1:] + [token]
    return torch.stack(state, dim=-1)  # [dim, K-1]


@pytest.mark.parametrize("impl", impl_params())
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
@pytest.mark.parametrize("kernel_size", (2, 3, 4, 5))
def test_capture_then_commit_is_sequential_decode(impl, layout, kernel_size):
    """Chain: capture, then commit step t, leaves the state that decoding x[b, 0..t] would."""
    generator = torch.Generator().manual_seed(10 + kernel_size)
    L, M, N, dim, width = 2, 3, 4, 9, kernel_size - 1
    conv_state = torch.randn(L, 3, dim, width, generator=generator).to(impl.device)
    x = torch.randn(2, N, dim, generator=generator).to(impl.device)
    buffer = sgl_convwin.alloc_windows(L, M, dim, N, kernel_size, layout=layout, dtype=torch.float32,
                                       device=impl.device)
    buffer_slots, state_slots = torch.tensor([2, 0], device=impl.device), torch.tensor([1, 2], device=impl.device)
    for layer in range(L):
        impl.capture(buffer, conv_state, x, buffer_slots, state_slots, layer, layout=layout)
    windows = sgl_convwin.window_view(buffer, layout, N, kernel_size)
    for step in range(N):
        committed = conv_state.clone()
        steps = torch.tensor([step, N - 1 - step], device=impl.device)
        impl.scatter(committed, windows, state_slots, buffer_slots, steps)
        for b, accepted in enumerate((step, N - 1 - step)):
            for layer in range(L):
                history = list(conv_state[layer, int(state_slots[b])].cpu().unbind(-1))
                want = decode_state(history, list(x[b, : accepted + 1].cpu().unbind(0)))
                assert torch.equal(committed[layer, int(state_slots[b])].cpu(), want)
        assert torch.equal(committed[:, 0], conv_state[:, 0]), "an untouched slot changed"


@pytest.mark.parametrize("impl", impl_params(slow=True))
@pytest.mark.parametrize("rows_layout", ("token_major", "channel_major"))
@pytest.mark.parametrize("kernel_size", (2, 3, 4, 5))
def test_tree_rows_commit_equals_dense_fallback(impl, rows_layout, kernel_size):
    """A tree captured into deduplicated rows and committed with scatter_tree leaves the same
    state as today's dense fallback (dense windows along parent links, then scatter), bit for
    bit, for every node of an EAGLE-like tree and a random one."""
    generator = torch.Generator().manual_seed(20 + kernel_size)
    L, M, dim = 2, 2, 11
    eagle = [-1, -1, -1, 0, 0, 0, 1, 1, 3, 3, 6]  # topk 3, then deeper branches
    random_tree = [-1, 0, 0, -1, 2, 1, 4, 4, 7, 3, 9]
    N, B = len(eagle), 2
    parents = torch.tensor([eagle, random_tree], device=impl.device)
    conv_state = torch.randn(L, 3, dim, kernel_size - 1, generator=generator).to(torch.bfloat16).to(impl.device)
    x = torch.randn(B, N, dim, generator=generator).to(torch.bfloat16).to(impl.device)
    rows_buffer = sgl_convwin.alloc_windows(L, M, dim, N, kernel_size, layout=rows_layout, device=impl.device)
    dense = sgl_convwin.alloc_windows(L, M, dim, N, kernel_size, layout="dense", device=impl.device)
    buffer_slots, state_slots = torch.tensor([1, 0], device=impl.device), torch.tensor([2, 0], device=impl.device)
    for layer in range(L):
        impl.capture(rows_buffer, conv_state, x, buffer_slots, state_slots, layer, parents, layout=rows_layout)
        impl.capture(dense, conv_state, x, buffer_slots, state_slots, layer, parents, layout="dense")
    rows = rows_buffer if rows_layout == "token_major" else rows_buffer.transpose(-1, -2)
    for node in range(N):
        nodes = torch.tensor([node, N - 1 - node], device=impl.device)
        from_rows, from_dense = conv_state.clone(), conv_state.clone()
        impl.scatter_tree(from_rows, rows, state_slots, buffer_slots, nodes, parents)
        impl.scatter(from_dense, dense, state_slots, buffer_slots, nodes)
        assert torch.equal(from_rows, from_dense)
        assert not torch.equal(from_rows, conv_state)


@pytest.mark.parametrize("impl", impl_params())
def test_empty_batch(impl):
    buffer = torch.randn(2, 3, 6, 8, device=impl.device)
    before = buffer.clone()
    conv_state = torch.randn(2, 3, 8, 3, device=impl.device)
    empty = torch.empty(0, dtype=torch.int64, device=impl.device)
    out = torch.empty(0, 4, 8, device=impl.device)
    impl.capture(buffer, conv_state, torch.empty(0, 4, 8, device=impl.device), empty, empty, 0)
    impl.causal_conv1d_verify(out, buffer, conv_state, torch.empty(0, 4, 8, device=impl.device),
                              torch.randn(8, 4, device=impl.device), None, empty, empty, 1)
    assert torch.equal(buffer, before)


@pytest.mark.parametrize("impl", impl_params(slow=True))
@pytest.mark.parametrize("num_nodes, dim", ((3, 700), (40, 50)), ids=("wide", "large-tree"))
def test_channels_span_several_blocks(impl, num_nodes, dim):
    """Several channel blocks per request; with 40 nodes the rows kernel's tile takes fewer
    channels per program (16), so 50 channels are four blocks, the last one partly masked."""
    generator = torch.Generator().manual_seed(30)
    L, M, N, K, B = 2, 2, num_nodes, 4, 2
    parents = [[-1, 0, 0], [-1, -1, 1]] if N == 3 else [
        [-1] + [int(torch.randint(-1, n, (1,), generator=generator)) for n in range(1, N)] for _ in range(B)]
    for layout in sgl_convwin.LAYOUTS:
        buffer = torch.randn(sgl_convwin.physical_shape(layout, L, M, dim, N, K), generator=generator).to(impl.device)
        conv_state = torch.randn(L, 3, dim, K - 1, generator=generator).to(impl.device)
        x = torch.randn(B, N, dim, generator=generator).to(impl.device)
        weight = random_weight(dim, K, torch.float32, impl.device, generator)
        out = torch.zeros(B, N, dim, device=impl.device)
        args = dict(buffer=buffer, conv_state=conv_state, x=x, buffer_slots=torch.tensor([1, 0], device=impl.device),
                    state_slots=torch.tensor([0, 2], device=impl.device), layer=1,
                    parents=torch.tensor(parents, device=impl.device))
        want = expected_buffer(args, layout, "dim_major")
        expected, written = reference.causal_conv1d_verify_reference(
            out, conv_state, x, weight, None, args["buffer_slots"].cpu(), args["state_slots"].cpu(), M, 1,
            args["parents"].cpu(),
        )
        call_verify(impl, args, dict(out=out, weight=weight, bias=None), layout, "dim_major", None)
        assert torch.equal(buffer.cpu(), want)
        assert bool(written.all())
        torch.testing.assert_close(out.cpu().double(), expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda", slow=True))
@pytest.mark.parametrize("tree", (False, True), ids=("chain", "tree"))
def test_launcher_defaults_at_64_requests(impl, tree):
    """The launcher's default kernels at 64 requests, where it switches (token_major chains: the node
    loop; trees and every channel_major and dense launch under a conv: the small-tree kernel, the
    latter two storing runs), on every layout: 40 channels (one block of 64, its last 24 channels
    masked; runs in groups of 2 channels), most requests padded so the interpreter stays quick;
    buffer and outputs against the oracles."""
    generator = torch.Generator().manual_seed(64)
    L, M, dim, N, K, B = 2, 8, 40, 8 if tree else 4, 4, 64
    buffer_slots = torch.full((B,), -1)
    state_slots = torch.zeros(B, dtype=torch.int64)
    active = torch.randperm(B, generator=generator)[:4]
    buffer_slots[active] = torch.tensor([5, 0, 7, 2])
    state_slots[active] = torch.tensor([1, 3, 0, 2])
    parents = torch.tensor([[-1, -1, -1, 0, 0, 0, 1, 1]] * B) if tree else None
    for layout in sgl_convwin.LAYOUTS:
        buffer = torch.randn(sgl_convwin.physical_shape(layout, L, M, dim, N, K), generator=generator)
        args = dict(buffer=buffer.to(impl.device),
                    conv_state=torch.randn(L, 4, dim, K - 1, generator=generator).to(impl.device),
                    x=torch.randn(B, N, dim, generator=generator).to(impl.device),
                    buffer_slots=buffer_slots.to(impl.device), state_slots=state_slots.to(impl.device), layer=1,
                    parents=None if parents is None else parents.to(impl.device))
        weight = random_weight(dim, K, torch.float32, "cpu", generator)
        written = launch_and_check(args, weight, torch.randn(dim, generator=generator), layout, {})
        assert int(written.sum()) == 4 * N, layout  # (request, node) pairs: only the 4 served requests


# node-loop kernels whose committed inputs and weights come in as runs: (tuning, channels a lane holds)
LANE_RUNS = {
    "node-loop-4-a-lane": (dict(node_loop=True, block=128, num_warps=1), 4),
    "node-loop-2-a-lane": (dict(node_loop=True, block=64, num_warps=1), 2),
    "node-loop-4-a-lane-2-warps": (dict(node_loop=True, block=256, num_warps=2), 4),
    "small-tree-4-a-lane": (dict(small_tree=True, block=128, num_warps=1, lane_runs=True), 4),
}


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda", slow=True))
@pytest.mark.parametrize("config", list(LANE_RUNS))
@pytest.mark.parametrize("kernel_size", (3, 4, 5))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_committed_inputs_and_weights_as_runs(impl, config, kernel_size, dtype):
    """The node loops with their committed inputs and weights loaded as runs (each lane's channels'
    K-1 inputs and K taps at once, split in registers), at 2 and 4 channels a lane, K = 3 .. 5 (runs
    of 4 to 20 elements, padded to whole vectors), state, buffer, inputs and weights in float32 and bfloat16,
    200 channels (the last block partly masked), a chain and a tree on every layout: buffer and
    outputs against the oracles, and the plan does take the runs."""
    tuning, group = LANE_RUNS[config]
    generator = torch.Generator().manual_seed(kernel_size)
    L, M, dim, N, K, B = 2, 4, 200, 4, kernel_size, 3

    def plan_check(kernel, plan):
        assert plan["LANE_GROUP"] == group

    for layout in sgl_convwin.LAYOUTS:
        for parents in (None, torch.tensor([[-1, 0, 0, 1], [-1, -1, 1, 2], [-1, 0, 1, 2]])):
            buffer = torch.randn(sgl_convwin.physical_shape(layout, L, M, dim, N, K), generator=generator)
            args = dict(buffer=buffer.to(dtype).to(impl.device),
                        conv_state=torch.randn(L, 3, dim, K - 1, generator=generator).to(dtype).to(impl.device),
                        x=torch.randn(B, N, dim, generator=generator).to(dtype).to(impl.device),
                        buffer_slots=torch.tensor([2, -1, 0], device=impl.device),
                        state_slots=torch.tensor([1, 0, 2], device=impl.device), layer=1,
                        parents=None if parents is None else parents.to(impl.device))
            weight = random_weight(dim, K, dtype, "cpu", generator)
            written = launch_and_check(args, weight, torch.randn(dim, generator=generator), layout, tuning,
                                       plan_check)
            assert int(written.sum()) == 2 * N, (layout, parents)  # (request, node) pairs of the requests with a slot


@pytest.mark.gpu
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
@pytest.mark.parametrize("tree", (False, True))
def test_model_sized_cuda_matches_cpu(layout, tree):
    """Qwen3-Next TP4-sized layer (dim 2048, K=4), 64 requests: the CUDA kernel and the CPU
    implementation capture identical buffers; outputs agree to bf16 rounding. The capture alone
    too, of all 64 requests and of the first 8 (channel_major captures take runs from 8)."""
    generator = torch.Generator().manual_seed(40)
    L, M, dim, K, B = 3, 80, 2048, 4, 64
    N = 8 if tree else 4
    conv_state = torch.randn(L, 96, dim, K - 1, generator=generator).to(torch.bfloat16)
    x = torch.randn(B, N, dim, generator=generator).to(torch.bfloat16)
    weight = random_weight(dim, K, torch.bfloat16, "cpu", generator)
    bias = torch.randn(dim, generator=generator).to(torch.bfloat16)
    buffer_slots = torch.randperm(M, generator=generator)[:B]
    buffer_slots[::9] = -1
    state_slots = torch.randperm(96, generator=generator)[:B]
    parents = torch.tensor([[-1, -1, -1, 0, 0, 0, 1, 1]] * B) if tree else None
    results = {}
    for device in ("cpu", "cuda"):
        buffer = torch.zeros(sgl_convwin.physical_shape(layout, L, M, dim, N, K), dtype=torch.bfloat16, device=device)
        out = torch.zeros(B, N, dim, dtype=torch.bfloat16, device=device)
        move = (lambda t: None if t is None else t.to(device))
        sgl_convwin.causal_conv1d_verify(
            out, buffer, conv_state.to(device), x.to(device), weight.to(device), bias.to(device),
            buffer_slots.to(device), state_slots.to(device), 2, move(parents), layout=layout, activation="silu",
        )
        captured = []
        for rows in (B, 8):
            alone = torch.zeros_like(buffer)
            sgl_convwin.capture(alone, conv_state.to(device), x[:rows].to(device), buffer_slots[:rows].to(device),
                                state_slots[:rows].to(device), 2, move(None if parents is None else parents[:rows]),
                                layout=layout)
            captured.append(alone.cpu())
        results[device] = (out.cpu(), buffer.cpu(), *captured)
    for cpu, cuda in zip(results["cpu"][1:], results["cuda"][1:]):
        assert torch.equal(cpu, cuda)
    torch.testing.assert_close(results["cuda"][0].float(), results["cpu"][0].float(), rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("conv", (False, True), ids=("capture", "conv"))
@pytest.mark.parametrize("tree", (False, True), ids=("chain", "tree"))
@pytest.mark.parametrize("layout", ("channel_major", "dense"))
def test_runs_match_the_default_stores_on_cuda_at_qwen3next_size(layout, conv, tree):
    """The small-tree kernel's runs (channel_major rows, dense windows) at the Qwen3-Next TP1 shape
    (dim 8192, K = 4, bf16, 8 requests, one padded) at every channels-per-program / warps the sweep
    times, slots by masks and by a branch: the buffer (whole) and the outputs equal those of the
    stores without runs (the rows tile; dense windows' default kernel) bit for bit. (At two warps
    the launcher stores without runs: Triton 3.6 compiled the runs' joins there to out-of-bounds
    shared-memory reads.)"""
    from sgl_convwin._kernels import triton_kernels

    kernels = triton_kernels()
    generator = torch.Generator().manual_seed(90)
    B, N, dim, K = 8, 8 if tree else 4, 8192, 4
    buffer = torch.zeros(sgl_convwin.physical_shape(layout, 2, 12, dim, N, K), dtype=torch.bfloat16, device="cuda")
    state = torch.randn(2, 10, dim, K - 1, generator=generator).to(torch.bfloat16).cuda()
    x = torch.randn(B, N, dim, generator=generator).to(torch.bfloat16).cuda()
    weight = random_weight(dim, K, torch.bfloat16, "cpu", generator).cuda()
    bias = torch.randn(dim, generator=generator).to(torch.bfloat16).cuda()
    out = torch.zeros(B, N, dim, dtype=torch.bfloat16, device="cuda")
    buffer_slots = torch.tensor([3, 0, 11, -1, 7, 5, 1, 9], device="cuda")
    state_slots = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8], device="cuda")
    parents = torch.tensor([[-1, -1, -1, 0, 0, 0, 1, 1]] * B, device="cuda") if tree else None
    dense = layout == "dense"
    dest = buffer if dense else buffer.transpose(-1, -2)

    def run(**tuning):
        buffer.zero_()
        out.zero_()
        if conv:
            kernels.launch_causal_conv1d_verify(out, dest, state, x, weight, bias, buffer_slots, state_slots, 1,
                                                parents, dense=dense, silu=True, **tuning)
        else:
            kernels.launch_capture(dest, state, x, buffer_slots, state_slots, 1, parents, dense=dense, **tuning)
        return buffer.clone(), out.clone()

    want_buffer, want_out = run(runs=False) if dense else run(small_tree=False)
    assert want_buffer.any()
    for block, warps in ((64, 1), (128, 1), (256, 1), (128, 2), (256, 2)):
        for masks in (False, True):
            got_buffer, got_out = run(small_tree=True, runs=True, block=block, num_warps=warps, slots_as_masks=masks)
            assert torch.equal(got_buffer, want_buffer), (block, warps, masks)
            assert torch.equal(got_out, want_out), (block, warps, masks)


def test_parameter_weights_take_the_eager_path(monkeypatch):
    """Conv weights are nn.Parameters in a model: eager calls still skip the dispatcher."""
    def dispatcher_called(*args, **kwargs):
        raise AssertionError("the eager call went through the dispatcher")

    # (the op the public function calls for the dispatcher's route: the one it bound when declared)
    monkeypatch.setitem(sgl_convwin.causal_conv1d_verify.__globals__, "_packet", dispatcher_called)
    with pytest.raises(AssertionError, match="went through the dispatcher"):  # the patch is the one taken
        sgl_convwin.causal_conv1d_verify(torch.zeros(2, 3, 8).requires_grad_(), None, None, None, None, None, None,
                                         None, 0)
    weight = torch.nn.Parameter(torch.randn(8, 4))
    bias = torch.nn.Parameter(torch.randn(8))
    out = torch.zeros(2, 3, 8)
    buffer = sgl_convwin.alloc_windows(1, 2, 8, 3, 4, dtype=torch.float32)
    slots = torch.tensor([0, 1])
    sgl_convwin.causal_conv1d_verify(out, buffer, torch.randn(1, 2, 8, 3), torch.randn(2, 3, 8), weight, bias,
                                     slots, slots, 0, activation="silu")
    assert out.any() and buffer.any()
