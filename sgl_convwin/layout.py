"""Layout math of the speculative conv-window cache. No kernels, no op registration.

For L layers, M slots, D draft steps, ``dim`` channels and conv kernel width K, write W = K-1 for
the window width and S = D+K-2 for the length of one slot's input sequence
``[x_{-(K-2)} .. x_{-1}, x_0 .. x_{D-1}]`` (the last K-2 committed inputs, then the drafts).
Window t (the conv state after consuming draft t) is inputs t .. t+K-2 of that sequence.

Physical buffers, one per layout::

    "dense"          [L, M, D, dim, K-1]   one window per step (what engines fall back to)
    "channel_major"  [L, M, dim, D+K-2]    each channel's sequence is one row (SGLang's layout)
    "token_major"    [L, M, D+K-2, dim]    one row per input token; window t is rows t .. t+K-2,
                                           a contiguous block of (K-1)*dim elements

Every layout is read through the same logical view ``[L, M, D, dim, K-1]`` (see window_view), in
which ``view[l, m, t, :, w]`` is input ``t + w`` of slot m's sequence.
"""

from __future__ import annotations

from fractions import Fraction

import torch

DENSE = "dense"
CHANNEL_MAJOR = "channel_major"
TOKEN_MAJOR = "token_major"
LAYOUTS = (DENSE, CHANNEL_MAJOR, TOKEN_MAJOR)
DEFAULT_LAYOUT = TOKEN_MAJOR

# How the engine's conv state stores one slot: [dim, K-1] (SGLang, vLLM) or [K-1, dim] (Kimi/KDA).
DIM_MAJOR = "dim_major"
WINDOW_MAJOR = "window_major"
STATE_LAYOUTS = (DIM_MAJOR, WINDOW_MAJOR)

CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def check_sizes(num_layers: int, num_slots: int, dim: int, num_draft: int, kernel_size: int) -> None:
    """Raise ValueError unless the cache sizes describe a real cache."""
    for name, value, least in (
        ("num_layers", num_layers, 1),
        ("num_slots", num_slots, 1),
        ("dim", dim, 1),
        ("num_draft", num_draft, 1),
        ("kernel_size", kernel_size, 2),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < least:
            raise ValueError(f"{name} must be >= {least}, got {value}")


def sequence_length(num_draft: int, kernel_size: int) -> int:
    """S = D+K-2: inputs one slot's windows are cut from."""
    return num_draft + kernel_size - 2


def physical_shape(
    layout: str, num_layers: int, num_slots: int, dim: int, num_draft: int, kernel_size: int
) -> tuple[int, ...]:
    """Shape of the physical buffer of ``layout`` (module docstring)."""
    check_layout(layout)
    check_sizes(num_layers, num_slots, dim, num_draft, kernel_size)
    return physical_shape_unchecked(layout, num_layers, num_slots, dim, num_draft, kernel_size)


# Each layout's physical buffer in words, with ``{n}`` for the draft length or node count.
PHYSICAL_SHAPE_TEXT = {
    DENSE: "[L, M, {n}, dim, K-1]",
    CHANNEL_MAJOR: "[L, M, dim, {n}+K-2]",
    TOKEN_MAJOR: "[L, M, {n}+K-2, dim]",
}


def physical_shape_unchecked(
    layout: str, num_layers: int, num_slots: int, dim: int, num_draft: int, kernel_size: int
) -> tuple[int, ...]:
    """physical_shape for arguments already known to be valid (the ops' per-call checks)."""
    if layout == DENSE:
        return (num_layers, num_slots, num_draft, dim, kernel_size - 1)
    seq = sequence_length(num_draft, kernel_size)
    if layout == CHANNEL_MAJOR:
        return (num_layers, num_slots, dim, seq)
    return (num_layers, num_slots, seq, dim)


def physical_nbytes(
    layout: str,
    num_layers: int,
    num_slots: int,
    dim: int,
    num_draft: int,
    kernel_size: int,
    dtype: torch.dtype = torch.bfloat16,
) -> int:
    """Bytes the buffer of ``layout`` really occupies (the logical view over-reports)."""
    numel = 1
    for size in physical_shape(layout, num_layers, num_slots, dim, num_draft, kernel_size):
        numel *= size
    return numel * torch.empty((), dtype=dtype).element_size()


def dedup_ratio(num_draft: int, kernel_size: int) -> Fraction:
    """Physical size of a deduplicated layout over the dense one: exactly (D+K-2) / (D*(K-1))."""
    check_sizes(1, 1, 1, num_draft, kernel_size)
    return Fraction(sequence_length(num_draft, kernel_size), num_draft * (kernel_size - 1))


def dim_per_rank(dim: int, tp_size: int) -> int:
    """conv_dim held by each of ``tp_size`` tensor-parallel ranks.

    Engines split the conv channels evenly across ranks (GDN: the q, k and v parts each by heads;
    Mamba2: x, B and C each). The conv is depthwise, so each rank's cache is just this package's
    cache with dim = dim_per_rank(conv_dim, tp): allocate, capture and commit it with the rank's
    own channels; no op communicates.
    """
    if tp_size < 1 or dim % tp_size:
        raise ValueError(f"conv_dim {dim} cannot be split evenly across {tp_size} tensor-parallel ranks")
    return dim // tp_size


def window_view(buffer: torch.Tensor, layout: str, num_draft: int, kernel_size: int) -> torch.Tensor:
    """The logical windows ``[L, M, D, dim, K-1]`` of a physical buffer, as a view (no copy).

    ``view[l, m, t, d, w]`` is input ``t + w`` of channel d in slot m. For the deduplicated
    layouts neighbouring windows overlap in K-2 columns, so the view must not be written through
    with different values for the same input. Works for a buffer with any strides and storage
    offset, and inside torch.compile(fullgraph=True) (it is an ``unfold``, a plain view op).

    A tensor does not record its layout: a token_major buffer read as channel_major (or the
    reverse) is refused only when its shape gives it away; when dim == D+K-2 it is read transposed,
    silently. Keep the layout with the buffer (``ConvWindowCache`` does).
    """
    check_layout(layout)
    if not isinstance(buffer, torch.Tensor):
        raise TypeError(f"buffer must be a Tensor, got {type(buffer).__name__}")
    check_sizes(1, 1, 1, num_draft, kernel_size)
    width, seq = kernel_size - 1, sequence_length(num_draft, kernel_size)
    expected = PHYSICAL_SHAPE_TEXT[layout].format(n="N")
    rank = 5 if layout == DENSE else 4
    if buffer.dim() != rank:
        raise ValueError(
            f"a {layout} buffer must be {rank}-D {expected}, got shape {tuple(buffer.shape)}"
        )
    if layout == DENSE:
        if buffer.shape[2] != num_draft or buffer.shape[4] != width:
            raise ValueError(
                f"a dense buffer for num_draft={num_draft}, kernel_size={kernel_size} must be "
                f"[L, M, {num_draft}, dim, {width}], got shape {tuple(buffer.shape)}"
            )
        return buffer.view(buffer.shape)
    seq_axis = 3 if layout == CHANNEL_MAJOR else 2
    if buffer.shape[seq_axis] != seq:
        raise ValueError(
            f"a {layout} buffer for num_draft={num_draft}, kernel_size={kernel_size} must be "
            f"{expected} with N+K-2 = {seq}, got shape {tuple(buffer.shape)}"
        )
    # unfold(axis, K-1, 1) adds a trailing window axis of stride 1 sequence step: [..., D, K-1].
    windows = buffer.unfold(seq_axis, width, 1)
    if layout == CHANNEL_MAJOR:  # [L, M, dim, D, K-1] -> [L, M, D, dim, K-1]
        windows = windows.transpose(2, 3)
    return windows


def token_views(buffer: torch.Tensor, layout: str, kernel_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The replay's layout-free views of a physical buffer (no copy): ``tokens [L, M, D, dim]``,
    draft token (or tree node) n's conv input, and ``history [L, M, D, dim, K-2]``, the K-2 newest
    committed inputs (oldest first) as node n's window holds them -- token_major and channel_major
    keep them once per slot (node stride 0), a dense buffer in every window."""
    check_layout(layout)
    history_rows = kernel_size - 2
    if layout == DENSE:  # [L, M, D, dim, K-1]: a window's newest column is its node's input
        return buffer[..., history_rows], buffer[..., :history_rows]
    rows = buffer.transpose(-1, -2) if layout == CHANNEL_MAJOR else buffer  # [L, M, D+K-2, dim]
    num_layers, num_slots, seq, dim = rows.shape
    history = rows[:, :, :history_rows].transpose(-1, -2).unsqueeze(2)
    return rows[:, :, history_rows:], history.expand(num_layers, num_slots, seq - history_rows, dim, history_rows)
