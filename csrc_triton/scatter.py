"""Commit kernel: copy the accepted window of every row into the conv state, all layers at once.

One program copies one block of one window for one (row, layer): grid (blocks, B, L). Index
values are read on the device; a row whose step or destination slot is negative, or whose index is
out of range, writes nothing.

A program walks its window FLAT, in the order of the destination when the destination window is
one contiguous block (it almost always is: [dim, K-1] or [K-1, dim] per slot), so stores are
contiguous and vectorised; the source is gathered through its strides, which makes any layout
(dense, channel_major, token_major views, permuted, offset) plain data. When the source block has
the same contiguous order too (dense windows into a dim-major state, token_major windows into a
window-major state) the loads are contiguous as well: a straight copy. Measured on the H200
(docs/benchmarks.md): walking the destination flat (4096-element blocks when gathering, 2048 when
copying, 4 warps) beat a 2-D (column, channel) tile, walking the source flat, one row per window
column, and several layers per program, for token_major and channel_major windows; int32
per-element offsets beat int64 (B = 8 token_major: 6.4 vs 7.3 us); and when the gathered source
channels lie STRIDED_GATHER_BYTES or more apart (channel_major windows of long drafts) storing
through the destination's strides beats flat stores (D = 16, B = 256: 710 vs 877 us), because
loads and stores then share one register layout. A launch too small to fill the GPU (B = 1, or
B = 8 at narrow shapes) is latency: it gathers in smaller blocks, with strided stores from
channels that are not adjacent (TP4, B = 8: 3.1 vs 4.1 us).
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from ._common import (
    COPY_BLOCK,
    DEFAULT_WARPS,
    GATHER_BLOCK,
    INT32_MAX,
    MISSING,
    SMALL_GRID_PROGRAMS,
    STRIDED_GATHER_BYTES,
    LaunchPlans,
    cdiv,
    commit_grid,
    contiguous_order,
    fixed_launch,
    gather_block,
    next_power_of_2,
    nothing_to_do,
    row_indices,
    window_block,
)


@triton.jit
def _scatter_windows_kernel(
    state_ptr,
    windows_ptr,
    dst_slots_ptr,
    src_slots_ptr,
    steps_ptr,
    num_state_slots,
    num_src_slots,
    num_draft,
    dim,
    state_stride_layer,
    state_stride_slot,
    state_stride_dim,
    state_stride_win,
    windows_stride_layer,
    windows_stride_slot,
    windows_stride_step,
    windows_stride_dim,
    windows_stride_win,
    dst_slots_stride,
    src_slots_stride,
    steps_stride,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
    WINDOW_MAJOR_ORDER: tl.constexpr,  # walk the window as [K-1, dim] (else [dim, K-1])
    DST_CONTIGUOUS: tl.constexpr,  # the destination is one block in that order, addressed flat
    SRC_CONTIGUOUS: tl.constexpr,  # so is the source window
    WIDE_OFFSETS: tl.constexpr,  # per-element offsets in int64 (a window spans >= 2**31 elements)
):
    block = tl.program_id(0)
    row = tl.program_id(1)
    layer = tl.program_id(2).to(tl.int64)

    step, dst, src, active = row_indices(
        row, steps_ptr, steps_stride, num_draft, dst_slots_ptr, dst_slots_stride, num_state_slots,
        src_slots_ptr, src_slots_stride, num_src_slots,
    )
    if active:
        # Per-element offsets are int32 unless one window spans >= 2**31 elements (the launcher
        # decides); the int64 bases are scalars. Measured on the H200 (docs/benchmarks.md).
        flat, mask, chan, col = window_block(block, dim, WIDTH, BLOCK, WINDOW_MAJOR_ORDER)
        if WIDE_OFFSETS:
            flat, chan, col = flat.to(tl.int64), chan.to(tl.int64), col.to(tl.int64)
        if SRC_CONTIGUOUS:
            src_offsets = flat
        else:
            src_offsets = chan * windows_stride_dim + col * windows_stride_win
        if DST_CONTIGUOUS:
            dst_offsets = flat
        else:
            dst_offsets = chan * state_stride_dim + col * state_stride_win
        window = (
            windows_ptr
            + layer * windows_stride_layer
            + src * windows_stride_slot
            + step * windows_stride_step
        )
        values = tl.load(window + src_offsets, mask=mask)
        state = state_ptr + layer * state_stride_layer + dst * state_stride_slot
        tl.store(state + dst_offsets, values.to(state_ptr.dtype.element_ty), mask=mask)


def scatter_launch_args(
    state: torch.Tensor,
    windows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    steps: torch.Tensor,
    *,
    block: int | None = None,
    num_warps: int = DEFAULT_WARPS,
    wide_offsets: bool | None = None,
    flat_stores: bool | None = None,
) -> tuple[tuple[int, int, int], tuple, dict] | None:
    """(grid, args, kwargs) of the kernel launch for launch_scatter, or None if there is nothing
    to do. Split out so benchmarks can time the bare Triton launch of exactly the same call. The
    kwargs dict is the cached plan's own: copy it before changing it."""
    index_strides = (dst_slots.stride(0), src_slots.stride(0), steps.stride(0))
    key = (
        state.shape, state.stride(), windows.shape, windows.stride(), windows.dtype, steps.shape[0],
        index_strides, block, num_warps, wide_offsets, flat_stores,
    )
    plan = _PLANS.get(key, MISSING)
    if plan is MISSING:
        plan = _PLANS.add(key, _plan_scatter(state, windows, steps.shape[0], index_strides, block, num_warps,
                                             wide_offsets, flat_stores))
    if plan is None:
        return None
    grid, scalars, kwargs = plan
    return grid, (state, windows, dst_slots, src_slots, steps, *scalars), kwargs


def _plan_scatter(state, windows, num_rows, index_strides, block, num_warps, wide_offsets, flat_stores):
    """(grid, scalar arguments, constexpr kwargs) for these shapes and strides, or None."""
    num_layers, num_state_slots, dim, width = state.shape
    window_numel = dim * width
    if num_rows == 0 or window_numel == 0 or num_layers == 0 or windows.shape[1] == 0:
        return None
    state_strides, window_strides = state.stride(), windows.stride()
    dst_order = contiguous_order(state_strides[2], state_strides[3], dim, width)
    src_order = contiguous_order(window_strides[3], window_strides[4], dim, width)
    order = dst_order or src_order or "dim_major"
    gather = src_order != order
    small_grid = gather and num_rows * num_layers * cdiv(window_numel, GATHER_BLOCK) < SMALL_GRID_PROGRAMS
    if block is None:  # measured best on the H200: straight copies 2048, gathers 4096 (smaller if few)
        block = gather_block(num_rows, num_layers, window_numel) if gather else COPY_BLOCK
    block = min(block, next_power_of_2(window_numel))
    grid = commit_grid("convwin.scatter", num_rows, num_layers, window_numel, block)
    needs_wide = max(  # int32 per-element offsets whenever one window's span fits
        (dim - 1) * state_strides[2] + (width - 1) * state_strides[3],
        (dim - 1) * window_strides[3] + (width - 1) * window_strides[4],
    ) > INT32_MAX
    if wide_offsets is None:
        wide_offsets = needs_wide
    elif needs_wide and not wide_offsets:
        raise ValueError("convwin.scatter: a window spans 2**31 elements or more; int32 offsets cannot address it")
    dst_flat = dst_order == order
    if flat_stores is None and dst_flat and gather:
        # Gathering from channels STRIDED_GATHER_BYTES or more apart (channel_major windows of
        # long drafts), or from channels that are not adjacent in a small grid: address the
        # destination through its strides too, so loads and stores share one register layout (a
        # warp's load then spans ~11 channels, not ~85).
        source_channel_bytes = window_strides[3] * windows.element_size()
        strided = source_channel_bytes >= STRIDED_GATHER_BYTES or (small_grid and window_strides[3] != 1)
        flat_stores = not strided
    if flat_stores is False:
        dst_flat = False
    scalars = (
        num_state_slots,
        windows.shape[1],
        windows.shape[2],
        dim,
        *state_strides,
        *window_strides,
        *index_strides,
    )
    kwargs = dict(
        WIDTH=width,
        BLOCK=block,
        WINDOW_MAJOR_ORDER=order == "window_major",
        DST_CONTIGUOUS=dst_flat,
        SRC_CONTIGUOUS=src_order == order,
        WIDE_OFFSETS=wide_offsets,
        num_warps=num_warps,
    )
    return grid, scalars, kwargs


_PLANS = LaunchPlans()


def planned_scatter(
    state: torch.Tensor,
    windows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    steps: torch.Tensor,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]:
    """launch_scatter with its plan fixed: a function of the five tensors that launches the kernel
    as launch_scatter would for THESE shapes, strides, dtypes and device, skipping the plan lookup
    and, once compiled, Triton's per-call binder (_common.fixed_launch). For callers that key their
    own cache by at least that signature (the eager fast path in sgl_convwin.ops); with other
    shapes or strides it would launch a wrong plan."""
    launch = scatter_launch_args(state, windows, dst_slots, src_slots, steps)
    if launch is None:
        return nothing_to_do
    grid, args, kwargs = launch
    return fixed_launch(_scatter_windows_kernel, grid, args[5:], kwargs, num_tensors=5)


def launch_scatter(
    state: torch.Tensor,
    windows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    steps: torch.Tensor,
    *,
    block: int | None = None,
    num_warps: int = DEFAULT_WARPS,
    wide_offsets: bool | None = None,
    flat_stores: bool | None = None,
) -> None:
    """``state[:, dst_slots[b]] = windows[:, src_slots[b], steps[b]]`` for every active row b.

    state: [L, N, dim, K-1], any strides (a window-major state is passed transposed).
    windows: [L, M, D, dim, K-1], any strides. Indices: [B], int32 or int64, any stride.
    block, num_warps: elements per program and warps per program (tuning only; default block:
    2048 for a straight copy, 4096 for a gather, down to 1024 for a gather whose grid would be too
    small to fill the GPU).
    wide_offsets: int64 per-element offsets (default: only when a window spans >= 2**31 elements).
    flat_stores: address a contiguous destination flat, with vectorised stores (default: unless
    the source is gathered from channels STRIDED_GATHER_BYTES or more apart, or from channels that
    are not adjacent in a small grid). Both are measured choices; forcing them is for tests and
    benchmarks.
    """
    launch = scatter_launch_args(
        state, windows, dst_slots, src_slots, steps, block=block, num_warps=num_warps,
        wide_offsets=wide_offsets, flat_stores=flat_stores,
    )
    if launch is not None:
        grid, args, kwargs = launch
        _scatter_windows_kernel[grid](*args, **kwargs)
