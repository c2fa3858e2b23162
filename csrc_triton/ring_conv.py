"""ring_conv1d_verify's kernel: causal_conv1d_verify whose history is the checkpoint's window
followed by the ring's pending rows; the drafts' inputs go into the ring.

For row b with (start, pending) = cursor[ring_slots[b]] (P = pending, C = capacity + N ring rows),
the inputs before the drafts are, oldest first, the checkpoint's window conv_state[layer,
state_slots[b]] (K-1 columns) and the P pending rows rows[layer, ring_slots[b], (start + j) % C].
Walking up node n's path as verify.py's kernels do (a node to its parent, then history position -1
the newest input before the drafts, -2 the one before, ...), history position -i is

    logical = P - i:   ring row (start + logical) % C   if logical >= 0,
                       window column K-1 + logical        otherwise,

and a walk from a node reaches no further back than -(K-1). Then, in float32 and by fma in
verify.py's order (bias, then the taps from the newest input up), so that the outputs are the bits
causal_conv1d_verify's kernels compute from the same inputs:

    out[b, n] = act(bias + w[K-1] x[b, n] + w[K-2] input_1 + ... + w[0] input_{K-1})

A node with a parent link outside [-1, m-1] among the K-1 above it gets no output; every node's
x[b, n] is stored, cast to the ring's dtype, at row (start + P + n) % C. The pending rows (logical
0..P-1) and the drafts' rows (P..P+N-1, P + N <= C) never share a ring row, so one launch reads
and writes the ring without a race. A row is left alone unless both slots are in range and its
cursor is a ring position (0 <= start < C, 0 <= pending <= capacity), as cpu_ring._live_rows.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ._common import MAX_GRID_Y, KernelCall, cdiv, next_power_of_2, planned_calls
from .verify import _links_ok, _silu, _step_up

# channels per program and warps: the fastest of the tiles swept (docs/benchmarks.md, "Ring"; 256 / 4
# ties at B = 256)
RING_CONV_BLOCK = 64
RING_CONV_WARPS = 1
TUNING = ("block", "num_warps")


def check_ring_grid(num_rows: int, num_layers: int) -> None:
    """A ring kernel's grid takes rows and layers on its y and z axes: at most MAX_GRID_Y each."""
    if num_rows > MAX_GRID_Y or num_layers > MAX_GRID_Y:
        raise ValueError(f"convwin ring kernels take at most {MAX_GRID_Y} rows and layers per call, got {num_rows} "
                         f"and {num_layers}; split the batch")


@triton.jit
def ring_row_state(cursor_ptr, ring, slots_ok, num_ring_slots, cursor_stride_slot, cursor_stride_field,
                   RING_ROWS: tl.constexpr, CAPACITY: tl.constexpr):
    """(ring slot, start, pending) as int64 and whether the row is live: ``slots_ok`` (its other
    slot in range, or True), its ring slot (int64) in range and its cursor a ring position,
    compared in int64 (an int64 start of 2**32 is no ring row). Zeros where not live."""
    live = slots_ok & (ring >= 0) & (ring < num_ring_slots)
    ring = tl.where(live, ring, 0)
    start = tl.load(cursor_ptr + ring * cursor_stride_slot, mask=live, other=0).to(tl.int64)
    pending = tl.load(cursor_ptr + ring * cursor_stride_slot + cursor_stride_field, mask=live, other=0).to(tl.int64)
    live = live & (start >= 0) & (start < RING_ROWS) & (pending >= 0) & (pending <= CAPACITY)
    return ring, tl.where(live, start, 0), tl.where(live, pending, 0), live


@triton.jit
def _history_at(pos, rows_base, window_base, start, pending, chan, write, rows_stride_row, rows_stride_dim,
                window_stride_dim, window_stride_win, RING_ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """[NODES, BLOCK] float32: history input -pos (pos [NODES], -WIDTH <= pos < 0 where it is used)
    from the ring row or the window column it lies in, wherever ``write``; zeros elsewhere."""
    logical = pending + pos  # P - i
    in_ring = logical >= 0
    ring_row = (start + tl.maximum(logical, 0)) % RING_ROWS
    column = WIDTH + tl.minimum(logical, 0)
    is_history = pos < 0
    from_ring = tl.load(rows_base + (ring_row * rows_stride_row)[:, None] + (chan * rows_stride_dim)[None, :],
                        mask=(is_history & in_ring)[:, None] & write, other=0.0)
    from_window = tl.load(window_base + (column * window_stride_win)[:, None] + (chan * window_stride_dim)[None, :],
                          mask=(is_history & (logical < 0))[:, None] & write, other=0.0)
    return tl.where(in_ring[:, None], from_ring.to(tl.float32), from_window.to(tl.float32))


@triton.jit
def _ring_conv1d_verify_kernel(
    out_ptr, rows_ptr, conv_ptr, x_ptr, weight_ptr, bias_ptr, ring_slots_ptr, state_slots_ptr, cursor_ptr,
    parents_ptr,
    rows_layer_offset,  # layer * rows.stride(0), computed on the host (may exceed int32)
    conv_layer_offset,  # layer * conv.stride(0)
    num_ring_slots, num_state_slots, dim,
    out_stride_row, out_stride_node, out_stride_dim,
    rows_stride_slot, rows_stride_row, rows_stride_dim,
    conv_stride_slot, conv_stride_dim, conv_stride_win,
    x_stride_row, x_stride_node, x_stride_dim,
    weight_stride_dim, weight_stride_tap, bias_stride,
    ring_slots_stride, state_slots_stride, cursor_stride_slot, cursor_stride_field,
    parents_stride_row, parents_stride_node,
    NUM_NODES: tl.constexpr, CAPACITY: tl.constexpr, KERNEL_SIZE: tl.constexpr, NODES: tl.constexpr,
    BLOCK: tl.constexpr, HAS_PARENTS: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
    FAST_DIVIDE: tl.constexpr,
):
    """One program: BLOCK channels of one row, all its nodes as one [NODES, BLOCK] tile; grid
    (channel blocks, rows). The drafts' inputs and the newest tap's weights are loaded before the
    slots and the cursor, which they do not need (every row's, live or not: x has them all)."""
    WIDTH: tl.constexpr = KERNEL_SIZE - 1
    RING_ROWS: tl.constexpr = CAPACITY + NUM_NODES
    chan = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    row = tl.program_id(1).to(tl.int64)
    cmask = chan < dim
    node = tl.arange(0, NODES)
    nmask = node < NUM_NODES
    xs = x_ptr + row * x_stride_row + chan * x_stride_dim  # [BLOCK]
    tile_mask = nmask[:, None] & cmask[None, :]
    tokens = tl.load(xs[None, :] + (node * x_stride_node)[:, None], mask=tile_mask)
    newest = tl.load(weight_ptr + chan * weight_stride_dim + WIDTH * weight_stride_tap, mask=cmask)

    ring = tl.load(ring_slots_ptr + row * ring_slots_stride).to(tl.int64)
    slot = tl.load(state_slots_ptr + row * state_slots_stride).to(tl.int64)
    ring, start, pending, live = ring_row_state(cursor_ptr, ring, (slot >= 0) & (slot < num_state_slots),
                                                num_ring_slots, cursor_stride_slot, cursor_stride_field, RING_ROWS,
                                                CAPACITY)
    if live:
        rows_base = rows_ptr + rows_layer_offset + ring * rows_stride_slot
        window_base = conv_ptr + conv_layer_offset + slot * conv_stride_slot
        # every node's input into the ring, whatever its links
        draft_row = (start + pending + node) % RING_ROWS
        tl.store(rows_base + (draft_row * rows_stride_row)[:, None] + (chan * rows_stride_dim)[None, :],
                 tokens.to(rows_ptr.dtype.element_ty), mask=tile_mask)

        pos = tl.where(nmask, node, -1)
        parents_row = parents_ptr + row * parents_stride_row
        if HAS_PARENTS:  # a bad link among the K-1 above a node skips its output
            write = _links_ok(pos, parents_row, parents_stride_node, WIDTH)[:, None] & cmask[None, :]
        else:
            write = tile_mask
        if HAS_BIAS:
            bias = tl.load(bias_ptr + chan * bias_stride, mask=cmask).to(tl.float32)
            acc = tl.zeros([NODES, BLOCK], dtype=tl.float32) + bias[None, :]
        else:
            acc = tl.zeros([NODES, BLOCK], dtype=tl.float32)
        acc = tl.fma(newest.to(tl.float32)[None, :], tokens.to(tl.float32), acc)
        for up in tl.static_range(1, KERNEL_SIZE):
            pos = _step_up(pos, parents_row, parents_stride_node, HAS_PARENTS)
            from_x = tl.load(xs[None, :] + (tl.maximum(pos, 0) * x_stride_node)[:, None],
                             mask=(pos >= 0)[:, None] & write)
            from_history = _history_at(pos, rows_base, window_base, start, pending, chan, write, rows_stride_row,
                                       rows_stride_dim, conv_stride_dim, conv_stride_win, RING_ROWS, WIDTH)
            value = tl.where((pos >= 0)[:, None], from_x.to(tl.float32), from_history)
            tap = tl.load(weight_ptr + chan * weight_stride_dim + (WIDTH - up) * weight_stride_tap, mask=cmask)
            acc = tl.fma(tap.to(tl.float32)[None, :], value, acc)
        if SILU:
            acc = _silu(acc, FAST_DIVIDE)
        out = out_ptr + row * out_stride_row + (node * out_stride_node)[:, None] + (chan * out_stride_dim)[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=write)


# SiLU's approximate divide on the GPU (verify.py's choice); the interpreter runs no libdevice call
FAST_DIVIDE = not isinstance(_ring_conv1d_verify_kernel, InterpretedFunction)


def ring_conv1d_verify_call(out, rows, conv, x, weight, bias, ring_slots, state_slots, cursor, layer, parents, *,
                            silu, **tuning) -> KernelCall | None:
    """The one launch of launch_ring_conv1d_verify, or None with no rows. tuning: ``block``
    (channels per program, a power of two), ``num_warps``."""
    if not tuning.keys() <= set(TUNING):
        raise TypeError(f"convwin.ring_conv1d_verify: unknown tuning {sorted(tuning.keys() - set(TUNING))}; "
                        f"known: {TUNING}")
    num_rows, num_nodes, dim = x.shape
    if num_rows == 0:
        return None
    if num_rows > MAX_GRID_Y:
        raise ValueError(f"convwin.ring_conv1d_verify verifies at most {MAX_GRID_Y} rows per call, got {num_rows}; "
                         "split the batch")
    block = tuning.get("block") or min(RING_CONV_BLOCK, next_power_of_2(dim))
    tensors = (out, rows, conv, x, weight, x if bias is None else bias, ring_slots, state_slots, cursor,
               ring_slots if parents is None else parents)
    scalars = (layer * rows.stride(0), layer * conv.stride(0), rows.shape[1], conv.shape[1], dim, *out.stride(),
               *rows.stride()[1:], *conv.stride()[1:], *x.stride(), *weight.stride(),
               0 if bias is None else bias.stride(0), ring_slots.stride(0), state_slots.stride(0), *cursor.stride(),
               *((0, 0) if parents is None else parents.stride()))
    constexprs = dict(
        NUM_NODES=num_nodes, CAPACITY=rows.shape[2] - num_nodes, KERNEL_SIZE=conv.shape[3] + 1,
        NODES=next_power_of_2(num_nodes), BLOCK=block, HAS_PARENTS=parents is not None, HAS_BIAS=bias is not None,
        SILU=bool(silu), FAST_DIVIDE=FAST_DIVIDE, num_warps=tuning.get("num_warps") or RING_CONV_WARPS,
    )
    return KernelCall(_ring_conv1d_verify_kernel, (cdiv(dim, block), num_rows), tensors, scalars, constexprs)


def launch_ring_conv1d_verify(out, rows, conv, x, weight, bias, ring_slots, state_slots, cursor, layer, parents, *,
                              silu, **tuning) -> None:
    """ops_ring.ring_conv1d_verify's arguments as its prepare gives them: out [B, N, dim] (the
    layer's), rows [L, M, C, dim], conv [L, S, dim, K-1] (the kernel view), x [B, N, dim], weight
    [dim, K], bias [dim] or None, ring_slots / state_slots [B], cursor [M, 2], parents [B, N] or
    None; any strides. One launch, grid (channel blocks, rows); no host sync, no allocation."""
    call = ring_conv1d_verify_call(out, rows, conv, x, weight, bias, ring_slots, state_slots, cursor, layer, parents,
                                   silu=silu, **tuning)
    if call is not None:
        call.launch()


def planned_ring_conv1d_verify(*args, **kwargs):
    """launch_ring_conv1d_verify fixed for these shapes, strides, dtypes and arguments (_common.planned_calls)."""
    return planned_calls(ring_conv1d_verify_call, *args, **kwargs)
