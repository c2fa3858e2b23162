"""Commit kernel: copy the accepted window of every row into the conv state, all layers at once.

One program copies one block of one window for one (row, layer): grid (B * blocks, L). Index
values are read on the device; a row whose step or destination slot is negative, or whose index is
out of range, writes nothing. Every stride is an argument, so any layout (dense, channel_major,
token_major windows; dim-major or window-major conv state) is just data. Triton specialises
strides equal to 1 at compile time, which is what makes the common layouts' loads and stores
contiguous and vectorised.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_MAX_GRID_Y = 65535
_INT32_MAX = 2**31 - 1


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
    num_blocks,
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
    WIDTH_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    FLAT: tl.constexpr,
):
    pid = tl.program_id(0)
    row = pid // num_blocks
    block = pid % num_blocks
    layer = tl.program_id(1).to(tl.int64)

    step = tl.load(steps_ptr + row * steps_stride).to(tl.int64)
    dst = tl.load(dst_slots_ptr + row * dst_slots_stride).to(tl.int64)
    src = tl.load(src_slots_ptr + row * src_slots_stride).to(tl.int64)
    # Index values are never trusted: anything out of range skips the row.
    active = (step >= 0) & (step < num_draft)
    active &= (dst >= 0) & (dst < num_state_slots)
    active &= (src >= 0) & (src < num_src_slots)
    if active:
        state_base = state_ptr + layer * state_stride_layer + dst * state_stride_slot
        window_base = (
            windows_ptr
            + layer * windows_stride_layer
            + src * windows_stride_slot
            + step * windows_stride_step
        )
        if FLAT:
            # Source and destination windows are the same contiguous block: a flat copy.
            offsets = block * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < dim * WIDTH
            values = tl.load(window_base + offsets, mask=mask)
            tl.store(state_base + offsets, values.to(state_ptr.dtype.element_ty), mask=mask)
        else:
            # A [K-1, BLOCK] tile of (window column, channel); each side uses its own strides.
            chan = (block * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
            col = tl.arange(0, WIDTH_PAD).to(tl.int64)
            mask = (col[:, None] < WIDTH) & (chan[None, :] < dim)
            values = tl.load(
                window_base
                + col[:, None] * windows_stride_win
                + chan[None, :] * windows_stride_dim,
                mask=mask,
            )
            tl.store(
                state_base + col[:, None] * state_stride_win + chan[None, :] * state_stride_dim,
                values.to(state_ptr.dtype.element_ty),
                mask=mask,
            )


def _is_flat_pair(state: torch.Tensor, windows: torch.Tensor, dim: int, width: int) -> bool:
    """Both windows are the same contiguous [dim, K-1] or [K-1, dim] block."""
    state_strides = (state.stride(2), state.stride(3))
    window_strides = (windows.stride(3), windows.stride(4))
    if state_strides != window_strides or dim * width > _INT32_MAX:
        return False
    dim_stride, win_stride = state_strides
    dim_major = win_stride == 1 and (dim_stride == width or dim == 1)
    window_major = dim_stride == 1 and (win_stride == dim or width == 1)
    return dim_major or window_major


def launch_scatter(
    state: torch.Tensor,
    windows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    steps: torch.Tensor,
) -> None:
    """``state[:, dst_slots[b]] = windows[:, src_slots[b], steps[b]]`` for every active row b.

    state: [L, N, dim, K-1], any strides (a window-major state is passed transposed).
    windows: [L, M, D, dim, K-1], any strides. Indices: [B], int32 or int64, any stride.
    """
    num_layers, num_state_slots, dim, width = state.shape
    num_src_slots, num_draft = windows.shape[1], windows.shape[2]
    num_rows = steps.shape[0]
    if num_rows == 0 or state.numel() == 0 or windows.numel() == 0:
        return
    if num_layers > _MAX_GRID_Y:
        raise ValueError(f"convwin.scatter supports at most {_MAX_GRID_Y} layers, got {num_layers}")
    flat = _is_flat_pair(state, windows, dim, width)
    width_pad = triton.next_power_of_2(width)
    if flat:
        block = min(2048, triton.next_power_of_2(dim * width))
        num_blocks = triton.cdiv(dim * width, block)
    else:
        block = min(max(1024 // width_pad, 16), triton.next_power_of_2(dim))
        num_blocks = triton.cdiv(dim, block)
    if num_rows * num_blocks > _INT32_MAX:
        raise ValueError(f"convwin.scatter: {num_rows} rows x {num_blocks} blocks is too large a grid")
    _scatter_windows_kernel[(num_rows * num_blocks, num_layers)](
        state,
        windows,
        dst_slots,
        src_slots,
        steps,
        num_state_slots,
        num_src_slots,
        num_draft,
        dim,
        num_blocks,
        *state.stride(),
        *windows.stride(),
        dst_slots.stride(0),
        src_slots.stride(0),
        steps.stride(0),
        WIDTH=width,
        WIDTH_PAD=width_pad,
        BLOCK=block,
        FLAT=flat,
        num_warps=4,
    )
