"""Tree commit kernel: rebuild the accepted node's window from parent links and write it into the
conv state, all layers at once.

Rows buffer ``[L, M, N+K-2, dim]`` (any strides): per slot, K-2 history rows (the newest committed
inputs, oldest first) then one row per draft node, row K-2+n holding node n's conv input. Node n's
window is the last K-1 inputs on the path history -> root -> ... -> n. Call a row's index in
that buffer its position: node n sits at K-2+n, and the history row before position p < K-2 is
p-1. Walking up from a node: position K-2+n -> K-2+parents[n] (-1, "hangs off the history", lands
on the last history row). For a chain (parents[n] = n-1) this is window n of the sequence, which is
what makes this equal to convwin.scatter bit for bit on chains.

One program copies one block of one window for one (row, layer): grid (blocks, B, L). It first
walks the K-2 nearest ancestors (K-2 scalar loads of parents), then copies like the chain kernel:
destination walked flat, source gathered through its strides, with int32 per-element offsets. A row is skipped when its node,
source or destination slot is out of range, or when a parent it reads lies outside [-1, n-1].
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from ._common import (
    DEFAULT_WARPS,
    INT32_MAX,
    MISSING,
    LaunchPlans,
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
def _scatter_tree_kernel(
    state_ptr,
    rows_ptr,
    dst_slots_ptr,
    src_slots_ptr,
    nodes_ptr,
    parents_ptr,
    num_state_slots,
    num_src_slots,
    num_nodes,
    dim,
    state_stride_layer,
    state_stride_slot,
    state_stride_dim,
    state_stride_win,
    rows_stride_layer,
    rows_stride_slot,
    rows_stride_pos,
    rows_stride_dim,
    dst_slots_stride,
    src_slots_stride,
    nodes_stride,
    parents_stride_row,
    parents_stride_node,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
    WINDOW_MAJOR_ORDER: tl.constexpr,
    DST_CONTIGUOUS: tl.constexpr,
):
    HISTORY: tl.constexpr = WIDTH - 1  # K-2 history rows
    block = tl.program_id(0)
    row = tl.program_id(1)
    layer = tl.program_id(2).to(tl.int64)

    node, dst, src, active = row_indices(
        row, nodes_ptr, nodes_stride, num_nodes, dst_slots_ptr, dst_slots_stride, num_state_slots,
        src_slots_ptr, src_slots_stride, num_src_slots,
    )
    if active:
        # Per-element offsets are int32 (the launcher checks that one slot's span fits); the
        # int64 bases are scalars. Measured on the H200 (docs/benchmarks.md): int64 offsets
        # made this kernel integer-bound at 55% of the copy ceiling.
        flat, mask, chan, col = window_block(block, dim, WIDTH, BLOCK, WINDOW_MAJOR_ORDER)
        # Column K-2 (the newest) is the node itself; walk up for the older columns, picking
        # each element's source row among K-1 scalar row offsets.
        pos = HISTORY + node
        row_offset = tl.zeros([BLOCK], dtype=tl.int32) + (pos * rows_stride_pos).to(tl.int32)
        links_ok = node >= 0  # a scalar True
        parents_row = parents_ptr + row.to(tl.int64) * parents_stride_row
        for older in tl.static_range(1, WIDTH):
            is_node = pos >= HISTORY
            parent = tl.load(
                parents_row + (pos - HISTORY) * parents_stride_node, mask=is_node, other=-1
            ).to(tl.int64)
            parent_ok = (parent >= -1) & (parent < pos - HISTORY)
            links_ok &= parent_ok | (pos < HISTORY)
            pos = tl.where(is_node & parent_ok, HISTORY + parent, pos - 1)
            row_offset = tl.where(col == WIDTH - 1 - older, (pos * rows_stride_pos).to(tl.int32), row_offset)
        if links_ok:
            src_offsets = row_offset + chan * rows_stride_dim
            if DST_CONTIGUOUS:
                dst_offsets = flat
            else:
                dst_offsets = chan * state_stride_dim + col * state_stride_win
            source = rows_ptr + layer * rows_stride_layer + src * rows_stride_slot
            values = tl.load(source + src_offsets, mask=mask)
            state = state_ptr + layer * state_stride_layer + dst * state_stride_slot
            tl.store(state + dst_offsets, values.to(state_ptr.dtype.element_ty), mask=mask)


def launch_scatter_tree(
    state: torch.Tensor,
    rows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    nodes: torch.Tensor,
    parents: torch.Tensor,
    *,
    block: int | None = None,
    num_warps: int = DEFAULT_WARPS,
) -> None:
    """``state[:, dst_slots[b]] = window of node nodes[b] in rows[:, src_slots[b]]``, every active b.

    state: [L, N_state, dim, K-1], any strides (a window-major state is passed transposed).
    rows: [L, M, N+K-2, dim], any strides. dst_slots, src_slots, nodes: [B]; parents: [B, N];
    int32 or int64, any strides.
    block, num_warps: elements per program and warps per program (tuning only; default block:
    a gather's, _common.gather_block: 4096, down to 1024 for a grid too small to fill the GPU).
    """
    index_strides = (dst_slots.stride(0), src_slots.stride(0), nodes.stride(0), parents.stride())
    key = (
        state.shape, state.stride(), rows.shape, rows.stride(), nodes.shape[0], parents.shape[1],
        index_strides, block, num_warps,
    )
    plan = _PLANS.get(key, MISSING)
    if plan is MISSING:
        plan = _PLANS.add(key, _plan_scatter_tree(state, rows, nodes.shape[0], parents.shape[1], index_strides,
                                                  block, num_warps))
    if plan is not None:
        grid, scalars, kwargs = plan
        _scatter_tree_kernel[grid](state, rows, dst_slots, src_slots, nodes, parents, *scalars, **kwargs)


def planned_scatter_tree(
    state: torch.Tensor,
    rows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    nodes: torch.Tensor,
    parents: torch.Tensor,
) -> Callable[..., None]:
    """launch_scatter_tree with its plan fixed: a function of the six tensors that launches the
    kernel as launch_scatter_tree would for THESE shapes, strides, dtypes and device, skipping the
    plan lookup and, once compiled, Triton's per-call binder (_common.fixed_launch). For callers
    that key their own cache by at least that signature (the eager fast path in sgl_convwin.ops)."""
    index_strides = (dst_slots.stride(0), src_slots.stride(0), nodes.stride(0), parents.stride())
    plan = _plan_scatter_tree(state, rows, nodes.shape[0], parents.shape[1], index_strides, None, DEFAULT_WARPS)
    if plan is None:
        return nothing_to_do
    grid, scalars, kwargs = plan
    return fixed_launch(_scatter_tree_kernel, grid, scalars, kwargs, num_tensors=6)


def _plan_scatter_tree(state, rows, num_rows, num_nodes, index_strides, block, num_warps):
    """(grid, scalar arguments, constexpr kwargs) for these shapes and strides, or None."""
    num_layers, num_state_slots, dim, width = state.shape
    window_numel = dim * width
    if num_rows == 0 or window_numel == 0 or num_layers == 0 or rows.shape[1] == 0:
        return None
    state_strides = state.stride()
    dst_order = contiguous_order(state_strides[2], state_strides[3], dim, width)
    order = dst_order or "dim_major"
    if block is None:
        block = gather_block(num_rows, num_layers, window_numel)
    block = min(block, next_power_of_2(window_numel))
    grid = commit_grid("convwin.scatter_tree", num_rows, num_layers, window_numel, block)
    rows_strides = rows.stride()
    slot_span = max(
        (rows.shape[2] - 1) * rows_strides[2] + (dim - 1) * rows_strides[3],
        (dim - 1) * state_strides[2] + (width - 1) * state_strides[3],
    )
    if slot_span > INT32_MAX:
        raise ValueError(f"convwin.scatter_tree: one slot spans {slot_span + 1} elements; at most 2**31 are supported")
    scalars = (
        num_state_slots,
        rows.shape[1],
        num_nodes,
        dim,
        *state_strides,
        *rows_strides,
        *index_strides[:3],
        *index_strides[3],
    )
    kwargs = dict(
        WIDTH=width,
        BLOCK=block,
        WINDOW_MAJOR_ORDER=order == "window_major",
        DST_CONTIGUOUS=dst_order == order,
        num_warps=num_warps,
    )
    return grid, scalars, kwargs


_PLANS = LaunchPlans()
