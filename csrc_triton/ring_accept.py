"""ring_accept's kernels: acceptance moves each row's cursor and, for a tree, makes the accepted
path's rows and gates contiguous after the pending ones, every layer.

For row b with (start, pending) = cursor[ring_slots[b]] (C = capacity + N ring rows):
  1. the fold rule: if pending + T > capacity (the verify folded; T = tree_depth, else N:
     gdn_ring_verify.verify_rule), start = (start + pending) % C and pending = 0;
  2. the accepted path: steps[b] in [0, N) and every link met walking up from it in [-1, m-1]
     (parents None: the chain 0..steps[b]); otherwise nothing is accepted. With the path's nodes
     root first p_0 < p_1 < ... < p_{len-1}, for a tree the row and gates of ring row
     (start + pending + p_j) % C go to (start + pending + j) % C, every layer;
  3. cursor = (start, pending + len).
The moves read the cursor, so the cursor is written by a second launch after them
(_ring_cursor_kernel, one program per row). A move program reads every source row of its path
before it writes any (path order would do too: p_j >= j, so no write lands on a row still to be
read). A row is left alone unless its ring slot is in range and its cursor a ring position
(0 <= start < C, 0 <= pending <= capacity), as cpu_ring._live_rows.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import MAX_GRID_Y, KernelCall, cdiv, next_power_of_2, planned_calls
from .gdn_ring_verify import verify_rule
from .ring_conv import ring_row_state
from .verify import _narrow_link

MOVE_BLOCK = 128  # elements (channels, or gates) per program of the moves (unmeasured)
MOVE_WARPS = 1


@triton.jit
def _accepted_path(steps_ptr, parents_ptr, row, steps_stride, parents_stride_row, parents_stride_node, live,
                   NUM_NODES: tl.constexpr, NODES: tl.constexpr, TREE: tl.constexpr):
    """Row ``row``'s accepted path: (walk, length), ``walk`` (trees; () for a chain, which moves
    nothing) a tuple of NUM_NODES int32 scalars, the path's nodes newest first (walk[i] =
    p_{length-1-i}; -1 past the root), ``length`` 0 when
    nothing is accepted (the row not ``live``, its step outside [0, N), or a bad link met on the
    walk up, as cpu._accepted_paths). A tree's links come in as one [NODES] load and are walked in
    registers."""
    step = tl.load(steps_ptr + row * steps_stride).to(tl.int64)
    accepted = live & (step >= 0) & (step < NUM_NODES)
    current = tl.where(accepted, step, -1).to(tl.int32)
    walk = ()
    if TREE:
        node = tl.arange(0, NODES)
        links = tl.load(parents_ptr + row * parents_stride_row + node * parents_stride_node,
                        mask=tl.where(accepted, node < NUM_NODES, False), other=-1)
        links = _narrow_link(links).to(tl.int32)
        links_ok = accepted
        length = current * 0
        for _ in tl.static_range(NUM_NODES):  # a path has at most N nodes
            walk = walk + (current,)
            on_path = current >= 0
            length += on_path.to(tl.int32)
            parent = tl.sum(tl.where(node == current, links, 0))
            good = (parent >= -1) & (parent < current)
            links_ok = links_ok & (good | (current < 0))
            current = tl.where(on_path & good, parent, -1)
        length = tl.where(links_ok, length, 0)
    else:
        length = current + 1
    return walk, length


@triton.jit
def _ring_move_kernel(
    rows_ptr, gates_ptr, cursor_ptr, ring_slots_ptr, steps_ptr, parents_ptr,
    num_ring_slots, dim, num_gates, num_gate_heads,
    rows_stride_layer, rows_stride_slot, rows_stride_row, rows_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_row, gates_stride_gate, gates_stride_head,
    cursor_stride_slot, cursor_stride_field, ring_slots_stride, steps_stride, parents_stride_row, parents_stride_node,
    NUM_NODES: tl.constexpr, CAPACITY: tl.constexpr, NODES: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program: elements block*BLOCK.. of one row of one layer -- channels of the rows, and
    (g, head) pairs of the gates flattened gate-major -- for every node of the accepted path;
    grid (blocks over max(dim, G*H), rows, layers)."""
    RING_ROWS: tl.constexpr = CAPACITY + NUM_NODES
    element = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    row = tl.program_id(1).to(tl.int64)
    layer = tl.program_id(2).to(tl.int64)
    ring = tl.load(ring_slots_ptr + row * ring_slots_stride).to(tl.int64)
    ring, start, pending, live = ring_row_state(cursor_ptr, ring, ring >= 0, num_ring_slots, cursor_stride_slot,
                                                cursor_stride_field, RING_ROWS, CAPACITY)
    walk, length = _accepted_path(steps_ptr, parents_ptr, row, steps_stride, parents_stride_row, parents_stride_node,
                                  live, NUM_NODES, NODES, True)
    if length > 0:
        first = start + pending  # path node 0's row: the same whether the fold moved start past the pending rows
        gate = element // num_gate_heads
        head = element - gate * num_gate_heads
        chan_ok = element < dim
        gate_ok = element < num_gates * num_gate_heads
        rows_base = (rows_ptr + layer * rows_stride_layer + ring * rows_stride_slot + element * rows_stride_dim)
        gates_base = (gates_ptr + layer * gates_stride_layer + ring * gates_stride_slot + gate * gates_stride_gate
                      + head * gates_stride_head)
        moved_rows = ()
        moved_gates = ()
        for i in tl.static_range(NUM_NODES):  # every source first
            move = (walk[i] >= 0) & (walk[i] != length - 1 - i)
            source = (first + tl.maximum(walk[i], 0)) % RING_ROWS
            moved_rows = moved_rows + (tl.load(rows_base + source * rows_stride_row,
                                               mask=tl.where(move, chan_ok, False)),)
            moved_gates = moved_gates + (tl.load(gates_base + source * gates_stride_row,
                                                 mask=tl.where(move, gate_ok, False)),)
        for i in tl.static_range(NUM_NODES):
            move = (walk[i] >= 0) & (walk[i] != length - 1 - i)
            target = (first + tl.maximum(length - 1 - i, 0)) % RING_ROWS
            tl.store(rows_base + target * rows_stride_row, moved_rows[i], mask=tl.where(move, chan_ok, False))
            tl.store(gates_base + target * gates_stride_row, moved_gates[i], mask=tl.where(move, gate_ok, False))


@triton.jit
def _ring_cursor_kernel(
    cursor_ptr, ring_slots_ptr, steps_ptr, parents_ptr,
    num_ring_slots, cursor_stride_slot, cursor_stride_field, ring_slots_stride, steps_stride, parents_stride_row,
    parents_stride_node,
    NUM_NODES: tl.constexpr, CAPACITY: tl.constexpr, FOLD_ABOVE: tl.constexpr, NODES: tl.constexpr,
    TREE: tl.constexpr,
):
    """One program per row: its cursor after the fold rule (pending + N > FOLD_ABOVE, the verify's)
    and the accepted path (after the moves)."""
    RING_ROWS: tl.constexpr = CAPACITY + NUM_NODES
    row = tl.program_id(0).to(tl.int64)
    ring = tl.load(ring_slots_ptr + row * ring_slots_stride).to(tl.int64)
    ring, start, pending, live = ring_row_state(cursor_ptr, ring, ring >= 0, num_ring_slots, cursor_stride_slot,
                                                cursor_stride_field, RING_ROWS, CAPACITY)
    walk, length = _accepted_path(steps_ptr, parents_ptr, row, steps_stride, parents_stride_row, parents_stride_node,
                                  live, NUM_NODES, NODES, TREE)
    folded = pending + NUM_NODES > FOLD_ABOVE
    start = tl.where(folded, (start + pending) % RING_ROWS, start)
    pending = tl.where(folded, 0, pending) + length
    cursor = cursor_ptr + ring * cursor_stride_slot
    tl.store(cursor, start.to(cursor_ptr.dtype.element_ty), mask=live)
    tl.store(cursor + cursor_stride_field, pending.to(cursor_ptr.dtype.element_ty), mask=live)


def ring_accept_calls(cursor, rows, gates, ring_slots, steps, parents, *, num_draft, tree_depth=None, block=None,
                      num_warps=MOVE_WARPS) -> tuple[KernelCall, ...]:
    """The launches of launch_ring_accept: for a tree the moves, then the cursors; () with no rows."""
    num_rows = ring_slots.shape[0]
    num_layers, num_ring_slots, ring_rows, dim = rows.shape
    if num_rows == 0:
        return ()
    if num_rows > MAX_GRID_Y or num_layers > MAX_GRID_Y:
        raise ValueError(f"convwin.ring_accept accepts at most {MAX_GRID_Y} rows and layers per call, got {num_rows} "
                         f"rows and {num_layers} layers; split the batch")
    capacity, nodes = ring_rows - num_draft, next_power_of_2(num_draft)
    links = (ring_slots if parents is None else parents,
             *((0, 0) if parents is None else parents.stride()))
    calls = []
    if parents is not None:
        num_gates, num_gate_heads = gates.shape[3], gates.shape[4]
        elements = max(dim, num_gates * num_gate_heads)
        block = block or min(MOVE_BLOCK, next_power_of_2(elements))
        calls.append(KernelCall(
            _ring_move_kernel, (cdiv(elements, block), num_rows, num_layers),
            (rows, gates, cursor, ring_slots, steps, links[0]),
            (num_ring_slots, dim, num_gates, num_gate_heads, *rows.stride(), *gates.stride(), *cursor.stride(),
             ring_slots.stride(0), steps.stride(0), *links[1:]),
            dict(NUM_NODES=num_draft, CAPACITY=capacity, NODES=nodes, BLOCK=block, num_warps=num_warps),
        ))
    calls.append(KernelCall(
        _ring_cursor_kernel, (num_rows,), (cursor, ring_slots, steps, links[0]),
        (num_ring_slots, *cursor.stride(), ring_slots.stride(0), steps.stride(0), *links[1:]),
        dict(NUM_NODES=num_draft, CAPACITY=capacity, NODES=nodes, TREE=parents is not None, num_warps=1,
             FOLD_ABOVE=verify_rule(ring_rows, num_draft, tree_depth)["fold_above"]),
    ))
    return tuple(calls)


def launch_ring_accept(cursor, rows, gates, ring_slots, steps, parents, *, num_draft, tree_depth=None,
                       **tuning) -> None:
    """ops_ring.ring_accept's arguments as its prepare gives them: cursor [M, 2], rows [L, M, C,
    dim], gates [L, M, C, G, H] (any strides), ring_slots / steps [B], parents [B, N] or None.
    Two launches for a tree (the moves, grid (element blocks, rows, layers), then the cursors,
    grid (rows,)), one for a chain; no host sync, no allocation. tuning: ``block``, ``num_warps``
    of the moves."""
    for call in ring_accept_calls(cursor, rows, gates, ring_slots, steps, parents, num_draft=num_draft,
                                  tree_depth=tree_depth, **tuning):
        call.launch()


def planned_ring_accept(*args, **kwargs):
    """launch_ring_accept fixed for these shapes, strides, dtypes and arguments (_common.planned_calls)."""
    return planned_calls(ring_accept_calls, *args, **kwargs)
