"""Verify-pass kernel: capture one layer's conv inputs into the window buffer and, fused in the same
pass, run the depthwise causal conv1d of the draft tokens.

For request b the conv of node n sees the K inputs of its path, oldest first: the committed
inputs of conv_state slot state_slots[b] (K-1 columns, oldest first) followed by the draft tokens
on the way from the root to n (a chain: nodes 0..n; a tree: parents[b] links). Walking up from n
one step is "node -> its parent" and, once in the history, "column -> the column before it".

One program handles one block of channels of one request, for every node: grid
(B, cdiv(dim, BLOCK)). It writes
  - rows layouts (token_major, or channel_major seen transposed, [L, M, N+K-2, dim]): the K-2
    newest committed inputs, then x[b, n] at row K-2+n -- parents do not matter;
  - dense ([L, M, N, dim, K-1]): window n = the K-1 inputs of node n's path ending at n;
  - with HAS_CONV: out[b, n] = act(bias + sum_k weight[:, k] * input k), in float32.
A request whose slot is out of range (negative: padding) writes nothing; a node with a parent
link outside [-1, m-1] among the K-1 links above it writes neither its output nor its dense
window. Inputs are re-read per tap from L1/L2; each is fetched from DRAM once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INT32_MAX, cdiv, next_power_of_2

VERIFY_BLOCK = 256  # channels per program
VERIFY_WARPS = 2


@triton.jit
def _step_up(pos, parents_row, parents_stride_node, HAS_PARENTS: tl.constexpr):
    """One step up the path from ``pos``: a node (>= 0) goes to its parent, a committed input
    (-1 the newest, -2 the one before, ...) to the one before it. A bad link leads to -1, which
    keeps every later read in bounds; the caller checks the links first (_links_ok) and writes
    nothing for such a node."""
    if HAS_PARENTS:
        is_node = pos >= 0
        parent = tl.load(parents_row + pos * parents_stride_node, mask=is_node, other=-1).to(tl.int64)
        parent = tl.where((parent >= -1) & (parent < pos), parent, -1)
        return tl.where(is_node, parent, pos - 1)
    else:
        return pos - 1  # a chain: node n's parent is n-1


@triton.jit
def _links_ok(node, parents_row, parents_stride_node, WIDTH: tl.constexpr):
    """Whether every parent link among the K-1 above ``node`` lies in [-1, m-1]."""
    ok = node >= 0
    pos = node
    for _ in tl.static_range(WIDTH):
        is_node = pos >= 0
        parent = tl.load(parents_row + pos * parents_stride_node, mask=is_node, other=-1).to(tl.int64)
        parent_ok = (parent >= -1) & (parent < pos)
        ok &= parent_ok | (pos < 0)
        pos = tl.where(is_node, tl.where(parent_ok, parent, -1), pos - 1)  # next read in bounds
    return ok


@triton.jit
def _capture_verify_kernel(
    dest_ptr,
    state_ptr,
    x_ptr,
    out_ptr,
    weight_ptr,
    bias_ptr,
    buffer_slots_ptr,
    state_slots_ptr,
    parents_ptr,
    dest_layer_offset,  # layer * dest.stride(0), computed on the host (may exceed int32)
    state_layer_offset,
    num_buffer_slots,
    num_state_slots,
    num_nodes,
    dim,
    dest_stride_slot,
    dest_stride_row,  # rows: position; dense: node
    dest_stride_dim,
    dest_stride_win,  # dense only
    state_stride_slot,
    state_stride_dim,
    state_stride_win,
    x_stride_row,
    x_stride_node,
    x_stride_dim,
    out_stride_row,
    out_stride_node,
    out_stride_dim,
    weight_stride_dim,
    weight_stride_tap,
    bias_stride,
    buffer_slots_stride,
    state_slots_stride,
    parents_stride_row,
    parents_stride_node,
    KERNEL_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
    DENSE: tl.constexpr,
    HAS_PARENTS: tl.constexpr,
    HAS_CONV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
):
    WIDTH: tl.constexpr = KERNEL_SIZE - 1
    row = tl.program_id(0).to(tl.int64)
    chan = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = chan < dim
    chan = chan.to(tl.int64)

    dst = tl.load(buffer_slots_ptr + row * buffer_slots_stride).to(tl.int64)
    src = tl.load(state_slots_ptr + row * state_slots_stride).to(tl.int64)
    # Index values are never trusted: a slot out of range skips the request.
    if (dst >= 0) & (dst < num_buffer_slots) & (src >= 0) & (src < num_state_slots):
        dest = dest_ptr + dest_layer_offset + dst * dest_stride_slot + chan * dest_stride_dim
        state = state_ptr + state_layer_offset + src * state_stride_slot + chan * state_stride_dim
        xs = x_ptr + row * x_stride_row + chan * x_stride_dim
        parents_row = parents_ptr + row * parents_stride_row
        if not DENSE:  # rows 0 .. K-3: the K-2 newest committed inputs
            for h in tl.static_range(WIDTH - 1):
                # (not named like the loop's `value`: Triton rejects a loop-carried dtype change)
                committed = tl.load(state + (h + 1) * state_stride_win, mask=cmask)
                tl.store(dest + h * dest_stride_row, committed.to(dest_ptr.dtype.element_ty), mask=cmask)
        for node in range(num_nodes):
            token = tl.load(xs + node * x_stride_node, mask=cmask)
            if not DENSE:
                tl.store(
                    dest + (WIDTH - 1 + node) * dest_stride_row,
                    token.to(dest_ptr.dtype.element_ty),
                    mask=cmask,
                )
            if DENSE or HAS_CONV:
                pos = tl.cast(node, tl.int64)
                write = cmask
                if HAS_PARENTS:  # a bad link among the K-1 above the node skips its writes
                    write = tl.where(_links_ok(pos, parents_row, parents_stride_node, WIDTH), write, False)
                window = dest + node * dest_stride_row
                if DENSE:  # column K-2 of window `node` is the node's own input
                    tl.store(window + (WIDTH - 1) * dest_stride_win, token.to(dest_ptr.dtype.element_ty), mask=write)
                if HAS_CONV:  # explicit fma: the same rounding whatever the layout specialisation
                    if HAS_BIAS:
                        acc = tl.load(bias_ptr + chan * bias_stride, mask=cmask).to(tl.float32)
                    else:
                        acc = tl.zeros([BLOCK], dtype=tl.float32)
                    newest = tl.load(weight_ptr + chan * weight_stride_dim + WIDTH * weight_stride_tap, mask=cmask)
                    acc = tl.fma(newest.to(tl.float32), token.to(tl.float32), acc)
                for up in tl.static_range(1, KERNEL_SIZE):
                    pos = _step_up(pos, parents_row, parents_stride_node, HAS_PARENTS)
                    is_token = pos >= 0
                    # (tl.where, not &: Triton's interpreter mistypes a vector & scalar mask)
                    from_x = tl.load(xs + pos * x_stride_node, mask=tl.where(is_token, write, False))
                    from_state = tl.load(
                        state + (WIDTH + pos) * state_stride_win, mask=tl.where(is_token, False, write)
                    )
                    value = tl.where(is_token, from_x, from_state)
                    if DENSE:
                        if up < WIDTH:
                            tl.store(
                                window + (WIDTH - 1 - up) * dest_stride_win,
                                value.to(dest_ptr.dtype.element_ty),
                                mask=write,
                            )
                    if HAS_CONV:
                        tap = tl.load(
                            weight_ptr + chan * weight_stride_dim + (WIDTH - up) * weight_stride_tap,
                            mask=cmask,
                        ).to(tl.float32)
                        acc = tl.fma(tap, value.to(tl.float32), acc)
                if HAS_CONV:
                    if SILU:
                        acc = acc * tl.sigmoid(acc)
                    out = out_ptr + row * out_stride_row + node * out_stride_node + chan * out_stride_dim
                    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=write)


def _launch(
    out, dest, state, x, weight, bias, buffer_slots, state_slots, layer, parents,
    *, dense, silu, block, num_warps,
) -> None:
    num_rows, num_nodes, dim = x.shape
    if num_rows == 0 or dim == 0 or dest.shape[1] == 0 or state.shape[1] == 0:
        return
    if num_rows > INT32_MAX:
        raise ValueError(f"convwin verify: {num_rows} requests is too large a grid")
    kernel_size = state.shape[3] + 1
    dest_strides = dest.stride() if dense else (*dest.stride(), 0)
    has_conv = out is not None
    has_parents = parents is not None
    block = min(block, next_power_of_2(dim))
    _capture_verify_kernel[(num_rows, cdiv(dim, block))](
        dest,
        state,
        x,
        out if has_conv else x,  # placeholders are never read
        weight if has_conv else x,
        bias if bias is not None else x,
        buffer_slots,
        state_slots,
        parents if has_parents else buffer_slots,
        layer * dest.stride(0),
        layer * state.stride(0),
        dest.shape[1],
        state.shape[1],
        num_nodes,
        dim,
        *dest_strides[1:],
        *state.stride()[1:],
        *x.stride(),
        *(out.stride() if has_conv else (0, 0, 0)),
        *(weight.stride() if has_conv else (0, 0)),
        bias.stride(0) if bias is not None else 0,
        buffer_slots.stride(0),
        state_slots.stride(0),
        *(parents.stride() if has_parents else (0, 0)),
        KERNEL_SIZE=kernel_size,
        BLOCK=block,
        DENSE=dense,
        HAS_PARENTS=has_parents,
        HAS_CONV=has_conv,
        HAS_BIAS=bias is not None,
        SILU=silu,
        num_warps=num_warps,
    )


def launch_capture(
    dest: torch.Tensor,
    state: torch.Tensor,
    x: torch.Tensor,
    buffer_slots: torch.Tensor,
    state_slots: torch.Tensor,
    layer: int,
    parents: torch.Tensor | None,
    *,
    dense: bool,
    block: int = VERIFY_BLOCK,
    num_warps: int = VERIFY_WARPS,
) -> None:
    """Write layer ``layer`` of every active request's buffer slot (see the module docstring).

    dest: rows [L, M, N+K-2, dim] or, if dense, windows [L, M, N, dim, K-1]; any strides.
    state: [L, N_state, dim, K-1], any strides. x: [B, N, dim], any strides. Slots: [B];
    parents: [B, N] or None for a chain; int32 or int64, any strides.
    """
    _launch(
        None, dest, state, x, None, None, buffer_slots, state_slots, layer, parents,
        dense=dense, silu=False, block=block, num_warps=num_warps,
    )


def launch_causal_conv1d_verify(
    out: torch.Tensor,
    dest: torch.Tensor,
    state: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    buffer_slots: torch.Tensor,
    state_slots: torch.Tensor,
    layer: int,
    parents: torch.Tensor | None,
    *,
    dense: bool,
    silu: bool,
    block: int = VERIFY_BLOCK,
    num_warps: int = VERIFY_WARPS,
) -> None:
    """launch_capture, fused with out[b, n] = act(bias + sum_k weight[:, k] * input k of node n).

    out: [B, N, dim], weight: [dim, K], bias: [dim] or None; any strides.
    """
    _launch(
        out, dest, state, x, weight, bias, buffer_slots, state_slots, layer, parents,
        dense=dense, silu=silu, block=block, num_warps=num_warps,
    )
