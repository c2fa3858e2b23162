"""Layout properties: every layout's view reconstructs the windows of its sequences."""

from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import sgl_convwin
from sgl_convwin import reference

DRAFTS = range(1, 9)
KERNELS = range(2, 6)


def sequences_for(num_draft, kernel_size, *, layers=2, slots=3, dim=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    seq_len = num_draft + kernel_size - 2
    return torch.randn(layers, slots, seq_len, dim, generator=generator)


@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
@pytest.mark.parametrize("kernel_size", KERNELS)
@pytest.mark.parametrize("num_draft", DRAFTS)
def test_view_reconstructs_windows(layout, num_draft, kernel_size):
    sequences = sequences_for(num_draft, kernel_size)
    buffer = reference.pack_sequences(sequences, layout, num_draft, kernel_size)
    view = sgl_convwin.window_view(buffer, layout, num_draft, kernel_size)
    expected = reference.windows_from_sequences(sequences, num_draft, kernel_size)
    assert view.shape == expected.shape
    assert torch.equal(view, expected)


@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
@pytest.mark.parametrize("kernel_size", KERNELS)
def test_token_views_are_the_windows_columns(layout, kernel_size):
    """token_views (checked against the windows of the oracle's sequences): node n's input is its
    window's newest column; the history, the first node's K-2 committed inputs, once per slot in
    the deduplicated layouts (every node the same), a dense buffer's node n its own window's
    first K-2 columns; a bad layout refused."""
    num_draft = 3
    sequences = sequences_for(num_draft, kernel_size, seed=4)
    buffer = reference.pack_sequences(sequences, layout, num_draft, kernel_size)
    tokens, history = sgl_convwin.token_views(buffer, layout, kernel_size)
    windows = reference.windows_from_sequences(sequences, num_draft, kernel_size)
    assert torch.equal(tokens, windows[..., -1])
    if layout == "dense":
        assert torch.equal(history, windows[..., :-1])
    else:
        assert torch.equal(history, windows[:, :, :1, :, :-1].expand_as(history)) and history.stride(2) == 0
    with pytest.raises(ValueError, match="layout must be one of"):
        sgl_convwin.token_views(buffer, "channel-major", kernel_size)


@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
@pytest.mark.parametrize("kernel_size", KERNELS)
@pytest.mark.parametrize("num_draft", DRAFTS)
def test_window_is_a_slice_of_the_sequence(layout, num_draft, kernel_size):
    sequences = sequences_for(num_draft, kernel_size, seed=1)
    buffer = reference.pack_sequences(sequences, layout, num_draft, kernel_size)
    view = sgl_convwin.window_view(buffer, layout, num_draft, kernel_size)
    width = kernel_size - 1
    for step in range(num_draft):
        # window t == inputs t .. t+K-2, as [dim, K-1]
        assert torch.equal(view[:, :, step], sequences[:, :, step : step + width].transpose(-1, -2))


@pytest.mark.parametrize("layout", (sgl_convwin.CHANNEL_MAJOR, sgl_convwin.TOKEN_MAJOR))
@pytest.mark.parametrize("kernel_size", range(3, 6))
@pytest.mark.parametrize("num_draft", range(2, 9))
def test_neighbouring_windows_share_memory(layout, num_draft, kernel_size):
    buffer = sgl_convwin.alloc_windows(2, 3, 5, num_draft, kernel_size, layout=layout, device="cpu")
    view = sgl_convwin.window_view(buffer, layout, num_draft, kernel_size)
    for step in range(num_draft - 1):
        older, newer = view[:, :, step, :, 1:], view[:, :, step + 1, :, :-1]
        # the same K-2 columns: same addresses, not just equal values
        assert older.shape == newer.shape and older.stride() == newer.stride()
        assert older.data_ptr() == newer.data_ptr()
    # writing one input shows up in every window that holds it
    buffer.zero_()
    position = min(num_draft - 1, kernel_size - 2)
    if layout == sgl_convwin.TOKEN_MAJOR:
        buffer[0, 1, position, 2] = 7.0
    else:
        buffer[0, 1, 2, position] = 7.0
    hits = (view[0, 1, :, 2, :] == 7.0).nonzero().tolist()
    assert hits == [[step, position - step] for step in range(num_draft) if 0 <= position - step < kernel_size - 1]


def test_dense_windows_do_not_share_memory():
    buffer = sgl_convwin.alloc_windows(1, 1, 4, 3, 4, layout="dense", device="cpu")
    view = sgl_convwin.window_view(buffer, "dense", 3, 4)
    assert view[0, 0, 0, :, 1:].data_ptr() != view[0, 0, 1, :, :-1].data_ptr()


@pytest.mark.parametrize("kernel_size", KERNELS)
@pytest.mark.parametrize("num_draft", DRAFTS)
def test_memory_ratio_is_exact(num_draft, kernel_size):
    ratio = sgl_convwin.dedup_ratio(num_draft, kernel_size)
    assert ratio == Fraction(num_draft + kernel_size - 2, num_draft * (kernel_size - 1))
    args = (36, 5, 8192, num_draft, kernel_size)
    dense = sgl_convwin.physical_nbytes("dense", *args, dtype=torch.bfloat16)
    assert dense == 36 * 5 * num_draft * 8192 * (kernel_size - 1) * 2
    for layout in (sgl_convwin.CHANNEL_MAJOR, sgl_convwin.TOKEN_MAJOR):
        dedup = sgl_convwin.physical_nbytes(layout, *args, dtype=torch.bfloat16)
        assert Fraction(dedup, dense) == ratio
        buffer = sgl_convwin.alloc_windows(2, 2, 3, num_draft, kernel_size, layout=layout, device="meta")
        assert buffer.numel() * buffer.element_size() == sgl_convwin.physical_nbytes(
            layout, 2, 2, 3, num_draft, kernel_size, dtype=torch.bfloat16
        )


def test_readme_ratios():
    assert [sgl_convwin.dedup_ratio(d, 4) for d in (2, 4, 8)] == [Fraction(2, 3), Fraction(1, 2), Fraction(5, 12)]


@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_alloc_windows(layout, dtype):
    buffer = sgl_convwin.alloc_windows(3, 4, 6, 4, 4, layout=layout, dtype=dtype, device="cpu")
    assert buffer.shape == sgl_convwin.physical_shape(layout, 3, 4, 6, 4, 4)
    assert buffer.dtype == dtype and buffer.device.type == "cpu" and buffer.is_contiguous()
    assert torch.equal(buffer, torch.zeros_like(buffer))
    meta = sgl_convwin.alloc_windows(3, 4, 6, 4, 4, layout=layout, dtype=dtype, device="meta")
    assert meta.shape == buffer.shape and meta.device.type == "meta"


def test_alloc_default_layout_is_token_major():
    buffer = sgl_convwin.alloc_windows(1, 2, 3, 4, 4, device="cpu")
    assert buffer.shape == (1, 2, 6, 3) and buffer.dtype == torch.bfloat16


@pytest.mark.gpu
def test_alloc_on_cuda():
    buffer = sgl_convwin.alloc_windows(2, 2, 8, 4, 4, device="cuda")
    assert buffer.is_cuda and torch.equal(buffer, torch.zeros_like(buffer))


@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_view_aliases_the_buffer(layout):
    buffer = sgl_convwin.alloc_windows(2, 3, 5, 4, 4, layout=layout, dtype=torch.float32, device="cpu")
    view = sgl_convwin.window_view(buffer, layout, 4, 4)
    assert view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    buffer.fill_(3.0)
    assert torch.equal(view, torch.full_like(view, 3.0))


@given(
    layout=st.sampled_from(sgl_convwin.LAYOUTS),
    num_draft=st.integers(1, 8),
    kernel_size=st.integers(2, 5),
    offset=st.integers(0, 9),
    permute=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_view_of_strided_buffers(layout, num_draft, kernel_size, offset, permute, seed):
    """A buffer inside a larger storage, or with permuted strides, is read correctly."""
    sequences = sequences_for(num_draft, kernel_size, seed=seed)
    packed = reference.pack_sequences(sequences, layout, num_draft, kernel_size)
    if permute:  # the same values, last two axes swapped in memory
        packed = packed.transpose(-1, -2).contiguous().transpose(-1, -2)
    storage = torch.randn(packed.numel() + offset + 5)
    buffer = storage.as_strided(packed.shape, packed.stride(), offset)
    buffer.copy_(packed)
    view = sgl_convwin.window_view(buffer, layout, num_draft, kernel_size)
    assert torch.equal(view, reference.windows_from_sequences(sequences, num_draft, kernel_size))


@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_view_under_compile(layout):
    sequences = sequences_for(4, 4, seed=3)
    buffer = reference.pack_sequences(sequences, layout, 4, 4)

    @torch.compile(fullgraph=True, backend="inductor")
    def windows_times_two(buf):
        return sgl_convwin.window_view(buf, layout, 4, 4) * 2

    assert torch.equal(windows_times_two(buffer), reference.windows_from_sequences(sequences, 4, 4) * 2)


@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_alloc_under_compile(layout):
    @torch.compile(fullgraph=True)
    def fresh_plus_one():
        return sgl_convwin.alloc_windows(2, 3, 4, 4, 4, layout=layout, dtype=torch.float32, device="cpu") + 1

    out = fresh_plus_one()
    assert out.shape == sgl_convwin.physical_shape(layout, 2, 3, 4, 4, 4)
    assert torch.equal(out, torch.ones_like(out))


def test_physical_shapes():
    assert sgl_convwin.physical_shape("dense", 36, 8, 8192, 4, 4) == (36, 8, 4, 8192, 3)
    assert sgl_convwin.physical_shape("channel_major", 36, 8, 8192, 4, 4) == (36, 8, 8192, 6)
    assert sgl_convwin.physical_shape("token_major", 36, 8, 8192, 4, 4) == (36, 8, 6, 8192)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_view_on_cuda(layout):
    sequences = sequences_for(4, 4, seed=5)
    buffer = reference.pack_sequences(sequences, layout, 4, 4).cuda()
    view = sgl_convwin.window_view(buffer, layout, 4, 4)
    assert torch.equal(view.cpu(), reference.windows_from_sequences(sequences, 4, 4))
