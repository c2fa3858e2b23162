"""convwin.scatter against the loop oracle, over the WHOLE destination storage (torch.equal).

Runs on every implementation this machine has: the CPU kernel, the Triton kernel (interpreted
without a GPU) and CUDA. Covers every layout, index dtype, skipped and out-of-range rows, dtype
casts, every step (partial acceptance), window-major states, storage offsets, permuted strides
and B = 0.
"""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import sgl_convwin
from sgl_convwin import ops, reference
from sgl_convwin._kernels import triton_kernels
from support import (
    CACHE_DTYPES,
    exact_cast,
    expected_storage,
    impl_params,
    make_state,
    strided_tensor,
    whole_storage,
)

VARIANTS = ("contiguous", "offset", "permuted", "sliced")


def make_windows(layout, shape, dtype, device, generator, variant):
    """A window view of a random physical buffer of ``layout`` (memory layout ``variant``)."""
    layers, slots, num_draft, dim, width = shape
    physical = sgl_convwin.physical_shape(layout, layers, slots, dim, num_draft, width + 1)
    buffer = strided_tensor(physical, dtype, device, generator, variant)
    return sgl_convwin.window_view(buffer, layout, num_draft, width + 1)


def check_scatter(impl, conv_state, windows, dst, src, steps, state_layout):
    """Run impl.scatter (an Impl, or any module with a scatter function) and compare the whole
    storage of conv_state with the oracle's."""
    expected = reference.scatter_reference(conv_state, windows, dst, src, steps, state_layout)
    want = expected_storage(conv_state, expected)
    windows_before = whole_storage(windows).clone()
    impl.scatter(conv_state, windows, dst, src, steps, state_layout=state_layout)
    assert torch.equal(whole_storage(conv_state), want)
    assert torch.equal(whole_storage(windows), windows_before), "windows must not be written"


@st.composite
def scatter_cases(draw, exact_casts_only):
    layers = draw(st.integers(1, 3))
    num_src = draw(st.integers(1, 4))
    num_state = draw(st.integers(1, 5))
    num_draft = draw(st.integers(1, 8))
    kernel_size = draw(st.integers(2, 5))
    dim = draw(st.integers(1, 40))
    window_dtype = draw(st.sampled_from(CACHE_DTYPES))
    state_dtype = draw(st.sampled_from(CACHE_DTYPES))
    if exact_casts_only and not exact_cast(window_dtype, state_dtype):
        state_dtype = window_dtype
    # Rows: active ones commit into distinct slots; the rest are skipped (negative step or
    # destination) or carry an out-of-range index, which must be skipped without any access.
    free_slots = draw(st.permutations(range(num_state)))
    rows = []
    for kind in draw(st.lists(st.sampled_from(["active", "skip", "out_of_range"]), max_size=6)):
        src = draw(st.integers(0, num_src - 1))
        step = draw(st.integers(0, num_draft - 1))  # every step: partial acceptance
        if kind == "active" and free_slots:
            rows.append((free_slots.pop(), src, step))
        elif kind == "skip":
            dst = draw(st.integers(-3, num_state - 1))
            rows.append((dst, src, step) if dst < 0 else (dst, src, -draw(st.integers(1, 3))))
        else:
            which = draw(st.sampled_from(["dst", "src", "step", "src_negative"]))
            dst = draw(st.integers(0, num_state - 1))
            if which == "dst":
                dst = num_state + draw(st.integers(0, 1000))
            elif which == "src":
                src = num_src + draw(st.integers(0, 1000))
            elif which == "src_negative":
                src = -draw(st.integers(1, 1000))
            else:
                step = num_draft + draw(st.integers(0, 1000))
            rows.append((dst, src, step))
    return dict(
        layers=layers,
        num_src=num_src,
        num_state=num_state,
        num_draft=num_draft,
        kernel_size=kernel_size,
        dim=dim,
        window_dtype=window_dtype,
        state_dtype=state_dtype,
        rows=rows,
        layout=draw(st.sampled_from(sgl_convwin.LAYOUTS)),
        state_layout=draw(st.sampled_from(sgl_convwin.STATE_LAYOUTS)),
        window_variant=draw(st.sampled_from(VARIANTS)),
        state_variant=draw(st.sampled_from(VARIANTS)),
        index_dtypes=[draw(st.sampled_from([torch.int32, torch.int64])) for _ in range(3)],
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def run_case(impl, case):
    generator = torch.Generator().manual_seed(case["seed"])
    width = case["kernel_size"] - 1
    shape = (case["layers"], case["num_src"], case["num_draft"], case["dim"], width)
    windows = make_windows(
        case["layout"], shape, case["window_dtype"], impl.device, generator, case["window_variant"]
    )
    conv_state = make_state(
        case["state_layout"], case["layers"], case["num_state"], case["dim"], width,
        case["state_dtype"], impl.device, generator, case["state_variant"],
    )
    columns = list(zip(*case["rows"])) if case["rows"] else [(), (), ()]
    dst, src, steps = (
        torch.tensor(list(col), dtype=dtype, device=impl.device)
        for col, dtype in zip(columns, case["index_dtypes"])
    )
    check_scatter(impl, conv_state, windows, dst, src, steps, case["state_layout"])


@pytest.mark.parametrize("impl", impl_params())
def test_scatter_fuzz(impl):
    @given(case=scatter_cases(exact_casts_only=impl.exact_casts_only))
    def fuzz(case):
        run_case(impl, case)

    fuzz()


@pytest.mark.parametrize("impl", impl_params())
@pytest.mark.parametrize("state_layout", ("dim_major", "window_major"))
@pytest.mark.parametrize("layout", ("dense", "channel_major", "token_major"))
def test_every_step_partial_acceptance(impl, layout, state_layout):
    """Accept each step in turn (and a different step per row) on a chain's sequence."""
    num_draft, kernel_size, dim, layers = 5, 4, 19, 2
    generator = torch.Generator().manual_seed(11)
    sequences = torch.randn(layers, 3, num_draft + kernel_size - 2, dim, generator=generator)
    buffer = reference.pack_sequences(sequences, layout, num_draft, kernel_size).to(impl.device)
    windows = sgl_convwin.window_view(buffer, layout, num_draft, kernel_size)
    width = kernel_size - 1
    for step in range(num_draft):
        conv_state = make_state(state_layout, layers, 4, dim, width, torch.float32, impl.device, generator, "contiguous")
        dst = torch.tensor([2, 0, -1], device=impl.device)
        src = torch.tensor([1, 2, 0], device=impl.device)
        steps = torch.tensor([step, (step + 2) % num_draft, step], device=impl.device)
        before = conv_state.clone()
        check_scatter(impl, conv_state, windows, dst, src, steps, state_layout)
        # and from first principles: slot 2 now holds inputs step .. step+K-2 of slot 1
        accepted = sequences[:, 1, step : step + width]  # [L, K-1, dim]
        got = conv_state[:, 2] if state_layout == "window_major" else conv_state[:, 2].transpose(-1, -2)
        assert torch.equal(got.cpu(), accepted)
        assert torch.equal(conv_state[:, 1], before[:, 1]) and torch.equal(conv_state[:, 3], before[:, 3])


@pytest.mark.parametrize("impl", impl_params())
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64))
def test_empty_batch_writes_nothing(impl, index_dtype):
    generator = torch.Generator().manual_seed(0)
    windows = make_windows("token_major", (2, 2, 3, 8, 3), torch.float32, impl.device, generator, "contiguous")
    conv_state = make_state("dim_major", 2, 3, 8, 3, torch.float32, impl.device, generator, "offset")
    empty = torch.empty(0, dtype=index_dtype, device=impl.device)
    before = whole_storage(conv_state).clone()
    impl.scatter(conv_state, windows, empty, empty, empty)
    assert torch.equal(whole_storage(conv_state), before)


@pytest.mark.parametrize("impl", impl_params())
def test_all_rows_skipped(impl):
    generator = torch.Generator().manual_seed(1)
    windows = make_windows("channel_major", (2, 4, 4, 8, 3), torch.bfloat16, impl.device, generator, "offset")
    conv_state = make_state("dim_major", 2, 4, 8, 3, torch.bfloat16, impl.device, generator, "offset")
    dst = torch.tensor([-1, 3, 0, -5], device=impl.device)
    src = torch.tensor([0, 1, 2, 3], device=impl.device)
    steps = torch.tensor([2, -1, -2, 0], device=impl.device)
    before = whole_storage(conv_state).clone()
    impl.scatter(conv_state, windows, dst, src, steps)
    assert torch.equal(whole_storage(conv_state), before)


@pytest.mark.parametrize("impl", impl_params())
@pytest.mark.parametrize("window_dtype", CACHE_DTYPES)
@pytest.mark.parametrize("state_dtype", CACHE_DTYPES)
def test_dtype_casts(impl, window_dtype, state_dtype):
    if impl.exact_casts_only and not exact_cast(window_dtype, state_dtype):
        pytest.skip("Triton's interpreter truncates float downcasts; the GPU rounds (tested on CUDA)")
    generator = torch.Generator().manual_seed(2)
    windows = make_windows("token_major", (2, 3, 4, 33, 3), window_dtype, impl.device, generator, "contiguous")
    conv_state = make_state("dim_major", 2, 3, 33, 3, state_dtype, impl.device, generator, "contiguous")
    dst = torch.tensor([1, 2, 0], device=impl.device)
    src = torch.tensor([0, 0, 2], device=impl.device)
    steps = torch.tensor([3, 1, 0], device=impl.device)
    check_scatter(impl, conv_state, windows, dst, src, steps, "dim_major")


@pytest.mark.parametrize("impl", impl_params())
def test_index_tensors_with_strides(impl):
    """Index tensors may be strided views (e.g. columns of one [B, 3] tensor)."""
    generator = torch.Generator().manual_seed(3)
    windows = make_windows("token_major", (1, 3, 4, 16, 3), torch.float32, impl.device, generator, "contiguous")
    conv_state = make_state("dim_major", 1, 3, 16, 3, torch.float32, impl.device, generator, "contiguous")
    table = torch.tensor([[2, 1, 3], [0, 2, 0], [-1, 0, 1]], dtype=torch.int32, device=impl.device)
    dst, src, steps = table[:, 0], table[:, 1], table[:, 2]
    assert dst.stride(0) == 3
    check_scatter(impl, conv_state, windows, dst, src, steps, "dim_major")


@pytest.mark.parametrize("impl", impl_params())
@pytest.mark.parametrize("state_layout", ("dim_major", "window_major"))
@pytest.mark.parametrize("layout", ("dense", "channel_major", "token_major"))
def test_windows_span_several_blocks(impl, layout, state_layout):
    """dim large enough that one window takes several kernel programs (and a ragged last one)."""
    generator = torch.Generator().manual_seed(4)
    windows = make_windows(layout, (2, 3, 3, 700, 3), torch.float32, impl.device, generator, "contiguous")
    conv_state = make_state(state_layout, 2, 4, 700, 3, torch.float32, impl.device, generator, "contiguous")
    dst = torch.tensor([3, 0, -1], device=impl.device)
    src = torch.tensor([1, 2, 0], device=impl.device)
    steps = torch.tensor([2, 0, 1], device=impl.device)
    check_scatter(impl, conv_state, windows, dst, src, steps, state_layout)


def _triton_scatter_forcing(**launch_kwargs):
    """ops' Triton scatter, with these launcher arguments forced (paths the defaults never take at
    test sizes)."""

    def scatter(conv_state, windows, dst, src, steps, *, state_layout="dim_major"):
        def launch(*args):
            triton_kernels().launch_scatter(*args, **launch_kwargs)

        ops._run_scatter(launch, conv_state, windows, dst, src, steps, state_layout)

    return scatter


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda", slow=True))
@pytest.mark.parametrize("wide_offsets, flat_stores", ((True, None), (False, True), (False, False)))
@pytest.mark.parametrize("layout", ("dense", "channel_major", "token_major"))
def test_launcher_choices(impl, layout, wide_offsets, flat_stores):
    """Every path the launcher may choose gives the oracle's result: int64 per-element offsets
    (taken only when a window spans >= 2**31 elements) and int32 ones; flat (vectorised) and
    strided stores into a contiguous destination. On every layout: contiguous and gathered
    sources, contiguous and strided destinations, dim- and window-major states."""
    generator = torch.Generator().manual_seed(6)
    scatter = _triton_scatter_forcing(wide_offsets=wide_offsets, flat_stores=flat_stores, block=256)
    cases = [(w, s, v) for w in ("contiguous", "sliced") for s in ("dim_major", "window_major")
             for v in ("contiguous", "permuted")]
    for window_variant, state_layout, state_variant in cases:
        windows = make_windows(layout, (2, 3, 3, 300, 3), torch.float32, impl.device, generator, window_variant)
        conv_state = make_state(state_layout, 2, 4, 300, 3, torch.float32, impl.device, generator, state_variant)
        dst = torch.tensor([3, 0, -1, 1], device=impl.device)
        src = torch.tensor([1, 2, 0, 0], device=impl.device)
        steps = torch.tensor([2, 0, 1, 1], device=impl.device)
        check_scatter(SimpleNamespace(scatter=scatter), conv_state, windows, dst, src, steps, state_layout)


@pytest.mark.gpu
@pytest.mark.parametrize("state_layout", ("dim_major", "window_major"))
@pytest.mark.parametrize("layout", ("dense", "channel_major", "token_major"))
@pytest.mark.parametrize("dtype", CACHE_DTYPES)
def test_model_sized_commit_on_cuda(layout, state_layout, dtype):
    """A Qwen3-Next-like shape (dim 8192, K=4, D=4), a padded batch of 64 rows, on the GPU."""
    generator = torch.Generator().manual_seed(5)
    layers, slots, num_draft, dim = 4, 96, 4, 8192
    windows = make_windows(layout, (layers, slots, num_draft, dim, 3), dtype, "cuda", generator, "contiguous")
    conv_state = make_state(state_layout, layers, 128, dim, 3, torch.bfloat16, "cuda", generator, "offset")
    perm = torch.randperm(128, generator=generator)
    dst = torch.where(torch.arange(64) % 7 == 3, -1, perm[:64]).cuda()
    src = torch.randint(0, slots, (64,), generator=generator).cuda()
    steps = torch.randint(0, num_draft, (64,), generator=generator).cuda()
    check_scatter(sgl_convwin, conv_state, windows, dst, src, steps, state_layout)
