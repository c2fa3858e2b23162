"""Tree commit kernel: rebuild the accepted node's window from parent links and write it into the
conv state, all layers at once.

Rows buffer ``[L, M, N+K-2, dim]`` (any strides): per slot, K-2 history rows (the newest committed
inputs, oldest first) then one row per draft node, row K-2+n holding node n's conv input. Node n's
window is the last K-1 inputs on the path history -> root -> ... -> n. Call a row's index in
that buffer its position: node n sits at K-2+n, and the history row before position p < K-2 is
p-1. Walking up from a node: position K-2+n -> K-2+parents[n] (-1, "hangs off the history", lands
on the last history row). For a chain (parents[n] = n-1) this is window n of the sequence, which is
what makes this equal to convwin.scatter bit for bit on chains.

One program copies a block of channels of one window for one (row, layer): grid (blocks, B, L). It
finds the window's K-1 rows once, as scalars -- walking the K-2 nearest ancestors link by link (one
dependent load each), or, for trees of up to 32 nodes, from the row's N parent links loaded up
front with the indices (a select tree per link, no dependent load) -- then copies by window column:
column j of the destination is a segment of ONE source row, so each thread loads a vector of VEC
channels (16 bytes) from each of the K-1 rows. Into a dim-major state window ([dim, K-1], one
block) the thread interleaves its VEC x (K-1) values in registers (splits and joins: register
renaming and byte permutes), and the window leaves as rows of one vector, consecutive rows from
consecutive lanes (a shared-memory exchange Triton inserts), so that each store instruction writes
one contiguous span; into any other state each column is stored through the state's strides (a
window-major state: contiguous vectors too). A row is skipped -- every load and store masked off --
when its node, source or destination slot is out of range, or when a parent it reads lies outside
[-1, n-1].
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
    cdiv,
    checked_step,
    commit_grid,
    fixed_launch,
    join_columns,
    next_power_of_2,
    nothing_to_do,
    row_indices,
    tile_columns,
)


@triton.jit
def _interleave(columns, GROUPS: tl.constexpr, VEC: tl.constexpr, WIDTH: tl.constexpr, WIDTH_P2: tl.constexpr):
    """[GROUPS, WIDTH_P2, VEC] from columns[j][k] (window column j of channel k of each group):
    element (q, e) is the group's [VEC, WIDTH] window flattened, f = q*VEC + e -> columns[f % WIDTH]
    [f // WIDTH]; rows q >= WIDTH are padding. Built by joins, so it stays in registers."""
    leaves = ()
    for f in tl.static_range(WIDTH_P2 * VEC):
        if f < WIDTH * VEC:
            leaves = leaves + (columns[f % WIDTH][f // WIDTH],)
        else:
            leaves = leaves + (columns[0][0],)
    return tl.reshape(join_columns(leaves, WIDTH_P2 * VEC), [GROUPS, WIDTH_P2, VEC])


@triton.jit
def _pick(links, index, NUM_NODES: tl.constexpr):
    """links[index] for a scalar index, by a select tree on its bits: no memory access, any value."""
    bits = index.to(tl.int32)
    choices = links
    for level in tl.static_range((NUM_NODES - 1).bit_length()):
        take_odd = ((bits >> level) & 1) != 0
        picked = ()
        for i in tl.static_range(0, len(choices), 2):
            if i + 1 < len(choices):
                picked = picked + (tl.where(take_odd, choices[i + 1], choices[i]),)
            else:
                picked = picked + (choices[i],)
        choices = picked
    return choices[0]


@triton.jit
def _walk(node, parents_row, parents_stride_node, links, WIDTH: tl.constexpr, NUM_NODES: tl.constexpr):
    """The window's K-1 positions (oldest first, scalars) by walking up from ``node`` (in range, or
    the positions are unused), and whether every link met lies in [-1, n-1]. NUM_NODES > 0: each
    link is picked from the row's links already in registers (links[n], int64); 0: one dependent
    load per link."""
    HISTORY: tl.constexpr = WIDTH - 1
    pos = node  # a node index; < 0: a history row, -1 the newest
    positions = (HISTORY + pos,)
    links_ok = node >= 0  # a scalar True
    for older in tl.static_range(1, WIDTH):
        if NUM_NODES:
            parent = _pick(links, pos, NUM_NODES)
        else:
            parent = tl.load(parents_row + pos * parents_stride_node, mask=pos >= 0, other=-1).to(tl.int64)
        pos, links_ok = checked_step(pos, parent, (parent >= -1) & (parent < pos), links_ok)
        positions = (HISTORY + pos,) + positions
    return positions, links_ok


@triton.jit
def _copy_window(
    state, source, positions, go, block, dim, rows_stride_pos, rows_stride_dim, state_stride_dim, state_stride_win,
    WIDTH: tl.constexpr, WIDTH_P2: tl.constexpr, GROUPS: tl.constexpr, VEC: tl.constexpr, INTERLEAVE: tl.constexpr,
    LANE_ROWS: tl.constexpr,
):
    """One block of GROUPS*VEC channels of the window, column j from row positions[j] of source;
    nothing is read or written unless ``go``."""
    # Per-element offsets are int32 (the launcher checks that one slot's span fits); the int64 row
    # bases are scalars. Masks are per vector: VEC divides dim.
    first = block * (GROUPS * VEC)
    group_chan = first + tl.arange(0, GROUPS)[:, None] * VEC  # [GROUPS, 1]
    chan = group_chan + tl.arange(0, VEC)[None, :]
    mask = tl.where(go, group_chan < dim, False)
    source_offsets = chan * rows_stride_dim
    if INTERLEAVE:
        columns = ()
        for j in tl.static_range(WIDTH):
            values = tl.load(source + (positions[j].to(tl.int32) * rows_stride_pos + source_offsets), mask=mask)
            columns = columns + (tile_columns(values.to(state.dtype.element_ty), GROUPS, VEC),)
        window = _interleave(columns, GROUPS, VEC, WIDTH, WIDTH_P2)
        if LANE_ROWS:
            # the window as [GROUPS*WIDTH_P2, VEC] rows of one vector each, stored in a layout that
            # gives consecutive rows to consecutive lanes (Triton exchanges them through shared
            # memory): each store instruction writes one contiguous span, not a vector every K-1
            r = tl.arange(0, GROUPS * WIDTH_P2)[:, None]
            q = r % WIDTH_P2
            offsets = first * WIDTH + (r // WIDTH_P2) * (WIDTH * VEC) + q * VEC + tl.arange(0, VEC)[None, :]
            rows_mask = tl.where(go, (q < WIDTH) & (first + (r // WIDTH_P2) * VEC < dim), False)
            tl.store(state + offsets, tl.reshape(window, [GROUPS * WIDTH_P2, VEC]), mask=rows_mask)
        else:
            q = tl.arange(0, WIDTH_P2)[None, :, None]
            offsets = first * WIDTH + tl.arange(0, GROUPS)[:, None, None] * (WIDTH * VEC) + q * VEC
            offsets += tl.arange(0, VEC)[None, None, :]
            tl.store(state + offsets, window, mask=(q < WIDTH) & mask[:, :, None])
    else:
        for j in tl.static_range(WIDTH):
            values = tl.load(source + (positions[j].to(tl.int32) * rows_stride_pos + source_offsets), mask=mask)
            tl.store(state + chan * state_stride_dim + j * state_stride_win, values.to(state.dtype.element_ty),
                     mask=mask)


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
    WIDTH_P2: tl.constexpr,
    GROUPS: tl.constexpr,  # channel vectors per program
    VEC: tl.constexpr,  # channels per vector, a divisor of dim
    INTERLEAVE: tl.constexpr,  # the state window is one [dim, K-1] block: interleave in registers
    PRELOADED_NODES: tl.constexpr,  # N: load the row's parent links with the indices; 0: link by link
    LANE_ROWS: tl.constexpr,  # interleaved windows stored a contiguous span per instruction (_copy_window)
):
    block = tl.program_id(0)
    row = tl.program_id(1)
    layer = tl.program_id(2).to(tl.int64)

    parents_row = parents_ptr + row.to(tl.int64) * parents_stride_row
    links = ()
    if PRELOADED_NODES:  # independent loads, in flight with the index loads (parents is [B, N])
        for n in tl.static_range(PRELOADED_NODES):
            links = links + (tl.load(parents_row + n * parents_stride_node).to(tl.int64),)
    node, dst, src, active = row_indices(
        row, nodes_ptr, nodes_stride, num_nodes, dst_slots_ptr, dst_slots_stride, num_state_slots,
        src_slots_ptr, src_slots_stride, num_src_slots,
    )
    source = rows_ptr + layer * rows_stride_layer + src * rows_stride_slot
    state = state_ptr + layer * state_stride_layer + dst * state_stride_slot
    if PRELOADED_NODES:
        # walked for every row and copied under a mask, with no branch: the compiler computes the
        # addresses while the index loads are in flight, and only selects lie between them and the data
        positions, links_ok = _walk(node, parents_row, parents_stride_node, links, WIDTH, PRELOADED_NODES)
        _copy_window(state, source, positions, active & links_ok, block, dim, rows_stride_pos, rows_stride_dim,
                     state_stride_dim, state_stride_win, WIDTH, WIDTH_P2, GROUPS, VEC, INTERLEAVE, LANE_ROWS)
    elif active:  # (each link load needs an in-range node)
        positions, links_ok = _walk(node, parents_row, parents_stride_node, links, WIDTH, 0)
        _copy_window(state, source, positions, links_ok, block, dim, rows_stride_pos, rows_stride_dim,
                     state_stride_dim, state_stride_win, WIDTH, WIDTH_P2, GROUPS, VEC, INTERLEAVE, LANE_ROWS)


def launch_scatter_tree(
    state: torch.Tensor,
    rows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    nodes: torch.Tensor,
    parents: torch.Tensor,
    *,
    channels: int | None = None,
    num_warps: int | None = None,
    vec: int | None = None,
    preload_parents: bool | None = None,
    lane_rows: bool | None = None,
) -> None:
    """``state[:, dst_slots[b]] = window of node nodes[b] in rows[:, src_slots[b]]``, every active b.

    state: [L, N_state, dim, K-1], any strides (a window-major state is passed transposed).
    rows: [L, M, N+K-2, dim], any strides. dst_slots, src_slots, nodes: [B]; parents: [B, N];
    int32 or int64, any strides.
    channels, num_warps, vec, preload_parents, lane_rows: channels per program, warps per program,
    channels per thread vector, whether each program loads its row's N parent links up front, and
    whether an interleaved window is stored as lane rows (tuning only; defaults: tree_launch_choices).
    """
    index_strides = (dst_slots.stride(0), src_slots.stride(0), nodes.stride(0), parents.stride())
    key = (
        state.shape, state.stride(), rows.shape, rows.stride(), rows.dtype, nodes.shape[0], parents.shape[1],
        index_strides, channels, num_warps, vec, preload_parents, lane_rows,
    )
    plan = _PLANS.get(key, MISSING)
    if plan is MISSING:
        plan = _PLANS.add(key, _plan_scatter_tree(state, rows, nodes.shape[0], parents.shape[1], index_strides,
                                                  channels, num_warps, vec, preload_parents, lane_rows))
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
    plan = _plan_scatter_tree(state, rows, nodes.shape[0], parents.shape[1], index_strides)
    if plan is None:
        return nothing_to_do
    grid, scalars, kwargs = plan
    return fixed_launch(_scatter_tree_kernel, grid, scalars, kwargs, num_tensors=6)


TREE_CHANNELS = 512  # channels per program
# Up to this many programs (about what an H100/H200 holds at once in one-warp programs: 32 per SM,
# 132 SMs) each thread copies two channel vectors (bf16: one warp a program); beyond, one (two warps)
# so that the SMs' 32-program limit does not cap their warps.
TREE_TWO_VECTOR_PROGRAMS = 4608
VECTOR_BYTES = 16  # one LDG.128 / STG.128
MAX_INTERLEAVE = 64  # window elements one thread interleaves in registers (next_power_of_2(K-1) * vec)
PRELOAD_MAX_NODES = 32  # trees up to this many nodes may load their parent links up front


def tree_launch_choices(
    num_nodes: int, num_rows: int, num_layers: int, dim: int, width: int, element_size: int,
    state_interleaved: bool, channels: int | None = None, num_warps: int | None = None, vec: int | None = None,
    preload_parents: bool | None = None, lane_rows: bool | None = None,
) -> tuple[int, int, int, bool, bool, bool]:
    """(channels, num_warps, vec, interleave, lane_rows, preload_parents) of a tree commit; the
    arguments given are kept.

    vec: channels per thread vector: 16 bytes of the rows' dtype, halved until it divides dim (the
    masks are per vector) and until one thread's interleaved window fits MAX_INTERLEAVE elements.
    interleave: the state window is one [dim, K-1] block (K > 2), so each thread interleaves its
    vec channels' K-1 columns in registers; else each column is stored through the state's strides.
    lane_rows: an interleaved window is stored as rows of one vector, consecutive rows in
    consecutive lanes, so each store instruction writes one contiguous span (instead of each thread
    storing its own K-1 vectors). channels: TREE_CHANNELS, never more than dim needs.
    num_warps: one thread per two vectors in grids of up to TREE_TWO_VECTOR_PROGRAMS programs, one
    per vector beyond, at most DEFAULT_WARPS (docs/benchmarks.md, "Tree commit"). preload_parents:
    for trees of at most PRELOAD_MAX_NODES nodes (no dependent link load on a program's path to its
    data; never slower on the H200).
    """
    width_p2 = next_power_of_2(width)
    interleave = state_interleaved and width > 1 and width_p2 <= MAX_INTERLEAVE
    if vec is None:
        vec = max(1, VECTOR_BYTES // element_size)
        if interleave:
            vec = max(1, min(vec, MAX_INTERLEAVE // width_p2))
    while dim % vec:
        vec //= 2
    if lane_rows is None:
        lane_rows = interleave
    if channels is None:
        channels = TREE_CHANNELS
    if preload_parents is None:
        preload_parents = num_nodes <= PRELOAD_MAX_NODES
    elif preload_parents and num_nodes > PRELOAD_MAX_NODES:
        raise ValueError(f"convwin.scatter_tree: parent links are loaded up front for at most {PRELOAD_MAX_NODES} "
                         f"nodes, got {num_nodes}")
    channels = max(vec, min(channels, next_power_of_2(dim)))
    if num_warps is None:
        programs = cdiv(dim, channels) * num_rows * num_layers
        vectors_per_thread = 2 if programs <= TREE_TWO_VECTOR_PROGRAMS else 1
        num_warps = max(1, min(DEFAULT_WARPS, channels // (vec * 32 * vectors_per_thread)))
    return channels, num_warps, vec, interleave, lane_rows and interleave, preload_parents


def _plan_scatter_tree(state, rows, num_rows, num_nodes, index_strides, channels=None, num_warps=None, vec=None,
                       preload_parents=None, lane_rows=None):
    """(grid, scalar arguments, constexpr kwargs) for these shapes and strides, or None."""
    num_layers, num_state_slots, dim, width = state.shape
    window_numel = dim * width
    if num_rows == 0 or window_numel == 0 or num_layers == 0 or rows.shape[1] == 0:
        return None
    for name, value in (("channels", channels), ("vec", vec)):
        if value is not None and (value < 1 or value & (value - 1)):
            raise ValueError(f"convwin.scatter_tree: {name} must be a power of two, got {value}")
    state_strides, rows_strides = state.stride(), rows.stride()
    interleaved = state_strides[3] == 1 and (state_strides[2] == width or dim == 1)
    channels, num_warps, vec, interleave, lane_rows, preload_parents = tree_launch_choices(
        num_nodes, num_rows, num_layers, dim, width, rows.element_size(), interleaved, channels, num_warps, vec,
        preload_parents, lane_rows)
    grid = commit_grid("convwin.scatter_tree", num_rows, num_layers, window_numel, channels * width)
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
        WIDTH_P2=next_power_of_2(width),
        GROUPS=channels // vec,
        VEC=vec,
        INTERLEAVE=interleave,
        PRELOADED_NODES=num_nodes if preload_parents else 0,
        LANE_ROWS=lane_rows,
        num_warps=num_warps,
    )
    return grid, scalars, kwargs


_PLANS = LaunchPlans()
