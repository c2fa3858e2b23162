"""Verify-pass kernels: capture one layer's conv inputs into the window buffer and, fused in the
same pass, run the depthwise causal conv1d of the draft tokens.

For request b the conv of node n sees the K inputs of its path, oldest first: the committed
inputs of conv_state slot state_slots[b] (K-1 columns, oldest first) followed by the draft tokens
on the way from the root to n (a chain: nodes 0..n; a tree: parents[b] links). Walking up from n
one step is "node -> its parent" and, once in the history, "column -> the column before it".

Every kernel here gives one program one block of channels of one request, all its nodes: grid
(B, cdiv(dim, BLOCK)), or (cdiv(dim, BLOCK), B) with BLOCKS_FIRST (_blocks_first). They write
  - rows layouts (token_major, or channel_major seen transposed, [L, M, N+K-2, dim]): the K-2
    newest committed inputs, then x[b, n] at row K-2+n -- parents do not matter;
  - dense ([L, M, N, dim, K-1]): window n = the K-1 inputs of node n's path ending at n;
  - with HAS_CONV: out[b, n] = act(bias + sum_k weight[:, k] * input k), in float32, by fma in a
    fixed order (bias, then the taps from the newest input up), so all of them round alike.
A request whose slot is out of range (negative: padding) writes nothing; a node with a parent
link outside [-1, m-1] among the K-1 links above it writes neither its output nor its dense
window.

_verify_rows_kernel (rows layouts) holds all N nodes as one [nodes, channels] tile: the positions
of every node's k-th input come from one vectorised step up the links, so each tap is one tile
load (from x, or the state for positions in the history) and each weight column is read once;
for K <= 5 (PRELOAD) the committed inputs and the weights come in as one [channels, 4] load each,
split in registers, rather than one strided load per tap; with ONE_STORE (channel_major rows at
128 channels) the committed rows and the nodes' rows go out as one [rows, channels] store, two
rows of a channel per lane (ROWS_ALIGN) where the rows' strides and count allow; a tree's links
come in as one [nodes] load with the slots and are walked in registers (GATHER_LINKS, tl.gather);
per-element offsets are int32 (the launcher checks one slot's span).

_verify_node_loop_kernel loops over the nodes instead, one [channels] vector at a time, with the
committed inputs, the weights and (chains) the previous inputs in registers, for K <= 5, writing
dense windows or rows, each node's own input loaded two to four nodes ahead of its use; where a
lane holds adjacent channels whose committed inputs and weights are contiguous, those come in as
runs of vectors split in registers (_lane_columns, LANE_GROUP).
_verify_small_tree_kernel unrolls that loop for trees of up to 8 nodes: every node's input and link
are loaded up front (they need no slot), and the walks up run on the links in registers (on
token_major rows and dense windows packed into one int32, a step one shift: _packed_links), so no
input load waits on a link (a chain's inputs above a node are those registers); on channel_major rows
(chains too) it stores each program's rows as one run, neighbouring lanes writing neighbouring 16
bytes (_store_runs), and so, under a conv from 64 requests, dense windows.
_verify_dense_any_width_kernel, for wider dense windows, reloads each input per tap. The node loops
address elements by int32 offsets from int64 bases where the launcher found every span below 2**31
and _offsets32 chose them, else by int64 offsets. Which kernel serves a launch, and with how many
channels per program, was measured on the H200 (_node_loop, _node_loop_config, _node_loop_prefetch,
_offsets32, _runs, _small_tree, _small_tree_masks, _run_length, _run_layout, _rows_block, _one_store,
_lane_runs, _packed_links, _lane_group; docs/benchmarks.md, "Verify kernel").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.runtime.interpreter import InterpretedFunction

from ._common import (
    INT32_MAX,
    MAX_GRID_Y,
    MISSING,
    KernelCall,
    LaunchPlans,
    cdiv,
    checked_step,
    join_columns,
    next_power_of_2,
    planned_launch,
    tile_columns,
)

ROWS_WARPS = 1  # the rows kernel's channels per program depend on the node count and the grid: _rows_block
ROWS_EARLY = True  # the rows kernel loads the inputs, the bias and the weights before the slots (they need none)
ROWS_WIDE_BLOCK = 128  # its channels per program, up to 8 nodes, from ROWS_WIDE_MIN_ROWS requests
ROWS_WIDE_MIN_ROWS = 64
ROWS_PAIRS = True  # the rows kernel's one store covers two of a channel's rows per lane where strides allow
ROWS_GATHER_LINKS = True  # the rows kernel walks a tree's links in registers from one load of them
NODE_LOOP_WARPS = 1  # the node-loop kernel (K <= 5): channels per program and warps from _node_loop_config
DENSE_CHAIN_WARPS = 2  # dense chains from DENSE_CHAIN_MIN_ROWS requests: 64 channels over 2 warps
DENSE_CHAIN_MIN_ROWS = 8
NODE_LOOP_PREFETCH = 2  # the node-loop kernel loads each node's input this many nodes ahead (_node_loop_prefetch)
NODE_LOOP_PREFETCH_CHAIN = 4  # chains from NODE_LOOP_PREFETCH_CHAIN_MIN_ROWS requests: up to 4 nodes ahead
NODE_LOOP_PREFETCH_CHAIN_MIN_ROWS = 128
NODE_LOOP_MIN_ROWS = 32  # token_major chains take the node loop from this many requests (_node_loop)
NODE_LOOP_MIN_ROWS_TREE = 128  # token_major trees of more than 8 nodes from this many
SMALL_TREE_BLOCK_DENSE = 64  # the small-tree kernel's channels per program (_small_tree, _small_tree_config)
SMALL_TREE_BLOCK_ROWS = 128
SMALL_TREE_BLOCK_DENSE_RUNS = 128  # dense windows as runs: trees, and chains from DENSE_RUNS_WIDE_CHAIN_MIN_ROWS
DENSE_RUNS_WIDE_CHAIN_MIN_ROWS = 256
RUNS_CAPTURE_MIN_ROWS = 8  # channel_major captures stored as runs from this many requests (_small_tree)
DENSE_ANY_WIDTH_BLOCK = 256  # channels per program of the dense kernel for K > 5
DENSE_ANY_WIDTH_WARPS = 2
# The launchers' tuning keywords (None or absent: the measured default): channels per program,
# warps, the node-loop kernel or not, the rows tile's 2-D preload, how many nodes ahead the node
# loop loads inputs, the rows tile's slot-free loads first, its rows as one store, the grid's
# order (a request's channel blocks first), the rows tile's tree links walked in registers, its
# one store two rows per lane where the strides allow it, the unrolled small-tree kernel (by default
# only when node_loop is not given either), that kernel's bad slots skipped by masks instead of
# a branch, the node loops' int32 per-element offsets (where every span fits), that kernel's
# runs where they fit: channel_major rows and dense windows (by default: _runs), and the node
# loops' committed inputs and weights loaded as runs where they are contiguous (_lane_group), a
# cap on the registers a thread may hold (Triton's maxnreg; None: the compiler's choice), and the
# small-tree kernel's links packed into one integer (_packed_links).
TUNING = ("block", "num_warps", "node_loop", "preload", "prefetch", "early", "one_store", "blocks_first",
          "gather_links", "pairs", "small_tree", "slots_as_masks", "offsets32", "runs", "lane_runs", "maxnreg",
          "packed_links")


@triton.jit
def _silu(acc, FAST_DIVIDE: tl.constexpr):
    """acc * sigmoid(acc) = acc / (1 + 2 ** (-acc * log2(e))) in float32: one exp2 (no guards for
    denormals) and one divide, with FAST_DIVIDE libdevice's approximate one (within 2 ulp; 0 where
    acc < -87, whose true value is below 1e-36 in magnitude), which Triton's interpreter cannot
    run (FAST_DIVIDE). tl.sigmoid guards its exp and its divide: a fifth of a tree's instructions."""
    denominator = 1.0 + tl.math.exp2(acc * -1.4426950408889634)
    if FAST_DIVIDE:
        return libdevice.fast_dividef(acc, denominator)
    else:
        return acc / denominator


@triton.jit
def _program_coordinates(BLOCKS_FIRST: tl.constexpr):
    """(request, channel block) of this program: the grid is (B, channel blocks), or with
    BLOCKS_FIRST (channel blocks, B), so that programs are dispatched a request's channels first."""
    if BLOCKS_FIRST:
        return tl.program_id(1), tl.program_id(0)
    else:
        return tl.program_id(0), tl.program_id(1)


@triton.jit
def _narrow_link(link):
    """A parent link clamped into [-2, 2**31 - 1] in its own dtype, so that narrowing it to int32
    turns no bad int64 link into a good one (2**32 is not node 0; -2 stays bad)."""
    return tl.minimum(tl.maximum(link, -2), 2147483647)


@triton.jit
def _parent_link(pos, parents_row, parents_stride_node, links, GATHER: tl.constexpr):
    """The parent link of node ``pos`` (a scalar or a vector of positions; -1 where pos < 0),
    unchecked: read from parents_row, or with GATHER picked from ``links`` (the request's [NODES]
    links in registers; pos < NODES)."""
    if GATHER:
        parent = tl.where(pos >= 0, tl.gather(links, tl.maximum(pos, 0), 0), -1)
    else:
        parent = tl.load(parents_row + pos * parents_stride_node, mask=pos >= 0, other=-1)
    return _narrow_link(parent).to(pos.dtype)


@triton.jit
def _step_up(pos, parents_row, parents_stride_node, HAS_PARENTS: tl.constexpr, links=None,
             GATHER: tl.constexpr = False):
    """One step up the path from ``pos`` (a scalar or a vector of positions, int32 or int64): a
    node (>= 0) goes to its parent, a committed input (-1 the newest, -2 the one before, ...) to
    the one before it. A bad link leads to -1, which keeps every later read in bounds; the caller
    checks the links first (_links_ok) and writes nothing for such a node. links, GATHER: as
    _parent_link's."""
    if HAS_PARENTS:
        parent = _parent_link(pos, parents_row, parents_stride_node, links, GATHER)
        parent = tl.where((parent >= -1) & (parent < pos), parent, -1)
        return tl.where(pos >= 0, parent, pos - 1)
    else:
        return pos - 1  # a chain: node n's parent is n-1


@triton.jit
def _links_ok(node, parents_row, parents_stride_node, WIDTH: tl.constexpr, links=None,
              GATHER: tl.constexpr = False):
    """Whether ``node`` >= 0 and every parent link among the K-1 above it lies in [-1, m-1].
    links, GATHER: as _parent_link's."""
    ok = node >= 0
    pos = node
    for _ in tl.static_range(WIDTH):
        parent = _parent_link(pos, parents_row, parents_stride_node, links, GATHER)
        pos, ok = checked_step(pos, parent, (parent >= -1) & (parent < pos), ok)
    return ok


@triton.jit
def _columns(base, chan, cmask, stride_row, stride_col, NUM: tl.constexpr):
    """Columns 0..NUM-1 (NUM <= 4) of the [rows, NUM] block at ``base`` (row r at chan[r]) as
    [channels] vectors in the block's dtype, zeros past NUM: one 2-D load, so neighbouring lanes
    read neighbouring elements whichever axis is contiguous, then split in registers."""
    tl.static_assert(NUM <= 4, "_columns reads at most 4 columns")
    col = tl.arange(0, 4)
    block = tl.load(base + (chan * stride_row)[:, None] + (col * stride_col)[None, :],
                    mask=cmask[:, None] & (col < NUM)[None, :], other=0.0)
    even, odd = tl.split(tl.reshape(block, [chan.shape[0], 2, 2]))  # columns (0, 2) and (1, 3)
    c0, c2 = tl.split(even)
    c1, c3 = tl.split(odd)
    return c0, c1, c2, c3


@triton.jit
def _newest_first(oldest_first, NUM: tl.constexpr, pad=None):
    """Four values, newest first: columns NUM-1, NUM-2, .. 0 of ``oldest_first`` (e.g. h1 .. h4
    from the committed inputs' columns), then the columns past NUM (_columns gives four, zeros past
    NUM); with ``pad``, the columns in pad's dtype, then pad."""
    newest_first = ()
    for k in tl.static_range(1, 5):
        if k <= NUM and pad is None:
            newest_first = newest_first + (oldest_first[NUM - k],)
        elif k <= NUM:
            newest_first = newest_first + (oldest_first[NUM - k].to(pad.dtype),)
        elif pad is None:
            newest_first = newest_first + (oldest_first[k - 1],)
        else:
            newest_first = newest_first + (pad,)
    return newest_first


@triton.jit
def _committed_at(pos, h1, h2, h3, h4, REACH: tl.constexpr = 4):
    """Committed input -pos from the registers, h1 the newest, for pos in -REACH..-1 (a walk's
    REACH-th step up from a node gets no further back): REACH - 1 selects."""
    value = h1
    if REACH >= 2:
        value = tl.where(pos == -2, h2, value)
    if REACH >= 3:
        value = tl.where(pos == -3, h3, value)
    if REACH >= 4:
        value = tl.where(pos == -4, h4, value)
    return value


@triton.jit
def _preloaded_taps(weight_ptr, chan, cmask, weight_stride_dim, weight_stride_tap, KERNEL_SIZE: tl.constexpr):
    """The conv's K <= 5 taps of each channel as a tuple, taps[t] the oldest input's for t = 0: the
    first (up to) four as one [channels, 4] load."""
    if KERNEL_SIZE > 4:
        taps = _columns(weight_ptr, chan, cmask, weight_stride_dim, weight_stride_tap, 4)
        taps = taps + (tl.load(weight_ptr + chan * weight_stride_dim + 4 * weight_stride_tap, mask=cmask),)
    else:
        taps = _columns(weight_ptr, chan, cmask, weight_stride_dim, weight_stride_tap, KERNEL_SIZE)
    return taps


@triton.jit
def _verify_rows_kernel(
    rows_ptr,
    state_ptr,
    x_ptr,
    out_ptr,
    weight_ptr,
    bias_ptr,
    buffer_slots_ptr,
    state_slots_ptr,
    parents_ptr,
    rows_layer_offset,  # layer * rows.stride(0), computed on the host (may exceed int32)
    state_layer_offset,
    num_buffer_slots,
    num_state_slots,
    num_nodes,
    dim,
    rows_stride_slot,
    rows_stride_pos,
    rows_stride_dim,
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
    NODES: tl.constexpr,  # next power of two >= num_nodes
    KERNEL_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_PARENTS: tl.constexpr,
    HAS_CONV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    PRELOAD: tl.constexpr = False,  # K <= 5: the committed inputs and the weights as one 2-D load each
    EARLY: tl.constexpr = False,  # the inputs, the bias and the preloaded weights before the slots (they need none)
    ONE_STORE: tl.constexpr = False,  # the committed rows and the nodes' rows as one [ROW_TILE, channels] store
    ROW_TILE: tl.constexpr = 1,  # next power of two >= NODES + K - 2
    BLOCKS_FIRST: tl.constexpr = False,
    GATHER_LINKS: tl.constexpr = False,  # a tree's links as one [NODES] load, its walks in registers
    ROWS_ALIGN: tl.constexpr = 1,  # ONE_STORE: the rows' channel stride and stored row count are multiples of this
    FAST_DIVIDE: tl.constexpr = False,  # SiLU's divide approximate (_silu)
):
    WIDTH: tl.constexpr = KERNEL_SIZE - 1
    request, block = _program_coordinates(BLOCKS_FIRST)
    row = request.to(tl.int64)
    chan = block * BLOCK + tl.arange(0, BLOCK)  # int32 from here on; bases are int64
    cmask = chan < dim
    xs = x_ptr + row * x_stride_row
    x_chan = (chan * x_stride_dim)[None, :]
    node = tl.arange(0, NODES)
    nmask = node < num_nodes
    tile_mask = nmask[:, None] & cmask[None, :]

    dst = tl.load(buffer_slots_ptr + row * buffer_slots_stride).to(tl.int64)
    src = tl.load(state_slots_ptr + row * state_slots_stride).to(tl.int64)
    links = node  # (a placeholder unless GATHER_LINKS)
    if GATHER_LINKS and HAS_PARENTS and HAS_CONV:  # the links need no slot: loaded with the slots
        links = tl.load(parents_ptr + row * parents_stride_row + node * parents_stride_node, mask=nmask, other=-1)
    if EARLY:
        tokens = tl.load(xs + (node * x_stride_node)[:, None] + x_chan, mask=tile_mask)
        if HAS_CONV and HAS_BIAS:
            bias = tl.load(bias_ptr + chan * bias_stride, mask=cmask).to(tl.float32)
        if HAS_CONV and PRELOAD:
            taps = _preloaded_taps(weight_ptr, chan, cmask, weight_stride_dim, weight_stride_tap, KERNEL_SIZE)
    # Index values are never trusted: a slot out of range skips the request.
    if (dst >= 0) & (dst < num_buffer_slots) & (src >= 0) & (src < num_state_slots):
        rows = rows_ptr + rows_layer_offset + dst * rows_stride_slot
        state = state_ptr + state_layer_offset + src * state_stride_slot
        parents_row = parents_ptr + row * parents_stride_row
        rows_chan = (chan * rows_stride_dim)[None, :]
        if ROWS_ALIGN > 1:  # (then each lane's store covers ROWS_ALIGN of a channel's rows)
            rows_chan = tl.multiple_of(rows_chan, [ROWS_ALIGN, ROWS_ALIGN])
        state_chan = (chan * state_stride_dim)[None, :]
        if PRELOAD:
            tl.static_assert(KERNEL_SIZE <= 5, "PRELOAD holds at most 4 committed inputs and 5 taps")
            history = _columns(state, chan, cmask, state_stride_dim, state_stride_win, WIDTH)  # oldest first
            h1, h2, h3, h4 = _newest_first(history, WIDTH)
        if not EARLY:
            tokens = tl.load(xs + (node * x_stride_node)[:, None] + x_chan, mask=tile_mask)
        if ONE_STORE:  # rows 0 .. K-3 (the K-2 newest committed inputs) and K-2+n (node n) as one tile
            r = tl.arange(0, ROW_TILE)
            n_of_r = r - (WIDTH - 1)
            is_x = (n_of_r >= 0) & (n_of_r < num_nodes)
            tile = tl.load(xs + (tl.maximum(n_of_r, 0) * x_stride_node)[:, None] + x_chan,
                           mask=is_x[:, None] & cmask[None, :]).to(rows_ptr.dtype.element_ty)
            if PRELOAD:
                for k in tl.static_range(WIDTH - 1):
                    tile = tl.where((r == k)[:, None], history[k + 1].to(rows_ptr.dtype.element_ty)[None, :], tile)
            else:
                committed = tl.load(state + ((tl.minimum(r, WIDTH - 2) + 1) * state_stride_win)[:, None] + state_chan,
                                    mask=(r < WIDTH - 1)[:, None] & cmask[None, :])
                tile = tl.where((r < WIDTH - 1)[:, None], committed.to(rows_ptr.dtype.element_ty), tile)
            if ROWS_ALIGN > 1:
                row_ok = r // ROWS_ALIGN < (WIDTH - 1 + num_nodes) // ROWS_ALIGN
            else:
                row_ok = r < WIDTH - 1 + num_nodes
            tl.store(rows + (r * rows_stride_pos)[:, None] + rows_chan, tile,
                     mask=row_ok[:, None] & cmask[None, :])
        else:
            if PRELOAD:
                for k in tl.static_range(1, WIDTH):  # rows K-3 .. 0: the K-2 newest committed inputs, newest first
                    tl.store(rows + (WIDTH - 1 - k) * rows_stride_pos + rows_chan,
                             history[WIDTH - k].to(rows_ptr.dtype.element_ty)[None, :], mask=cmask[None, :])
            else:
                for h in tl.static_range(WIDTH - 1):  # rows 0 .. K-3: the K-2 newest committed inputs
                    committed = tl.load(state + (h + 1) * state_stride_win + state_chan, mask=cmask[None, :])
                    tl.store(rows + h * rows_stride_pos + rows_chan, committed.to(rows_ptr.dtype.element_ty),
                             mask=cmask[None, :])
            tl.store(rows + ((WIDTH - 1 + node) * rows_stride_pos)[:, None] + rows_chan,
                     tokens.to(rows_ptr.dtype.element_ty), mask=tile_mask)  # row K-2+n: node n's input
        if HAS_CONV:
            pos = tl.where(nmask, node, -1)
            if HAS_PARENTS:  # a bad link among the K-1 above a node skips its output
                links_ok = _links_ok(pos, parents_row, parents_stride_node, WIDTH, links, GATHER_LINKS)
                write = links_ok[:, None] & cmask[None, :]
            else:
                write = tile_mask
            if HAS_BIAS:
                if not EARLY:
                    bias = tl.load(bias_ptr + chan * bias_stride, mask=cmask).to(tl.float32)
                acc = tl.zeros([NODES, BLOCK], dtype=tl.float32) + bias[None, :]
            else:
                acc = tl.zeros([NODES, BLOCK], dtype=tl.float32)
            if PRELOAD:
                if not EARLY:
                    taps = _preloaded_taps(weight_ptr, chan, cmask, weight_stride_dim, weight_stride_tap, KERNEL_SIZE)
                newest = taps[WIDTH]
            else:
                newest = tl.load(weight_ptr + chan * weight_stride_dim + WIDTH * weight_stride_tap, mask=cmask)
            acc = tl.fma(newest.to(tl.float32)[None, :], tokens.to(tl.float32), acc)
            for up in tl.static_range(1, KERNEL_SIZE):
                pos = _step_up(pos, parents_row, parents_stride_node, HAS_PARENTS, links, GATHER_LINKS)
                is_token = (pos >= 0)[:, None]
                from_x = tl.load(xs + (pos * x_stride_node)[:, None] + x_chan, mask=is_token & write)
                if PRELOAD:  # (pos >= -up for every node; the rows past them write nothing)
                    from_state = _committed_at(pos[:, None], h1.to(tl.float32)[None, :], h2.to(tl.float32)[None, :],
                                               h3.to(tl.float32)[None, :], h4.to(tl.float32)[None, :], up)
                    tap = taps[WIDTH - up]
                else:
                    from_state = tl.load(state + ((WIDTH + pos) * state_stride_win)[:, None] + state_chan,
                                         mask=(~is_token) & write)
                    tap = tl.load(weight_ptr + chan * weight_stride_dim + (WIDTH - up) * weight_stride_tap,
                                  mask=cmask)
                value = tl.where(is_token, from_x.to(tl.float32), from_state.to(tl.float32))
                acc = tl.fma(tap.to(tl.float32)[None, :], value, acc)
            if SILU:
                acc = _silu(acc, FAST_DIVIDE)
            out = out_ptr + row * out_stride_row + (node * out_stride_node)[:, None] + (chan * out_stride_dim)[None, :]
            tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=write)


@triton.jit
def _input_at(pos, xs, x_stride_node, h1, h2, h3, h4, cmask, REACH: tl.constexpr = 4):
    """The input at path position ``pos`` (>= -REACH) in float32: node pos's token from x, or
    committed input -pos from the registers (h1 the newest)."""
    # (tl.where, not &: Triton's interpreter mistypes a vector & scalar mask)
    token = tl.load(xs + tl.maximum(pos, 0) * x_stride_node, mask=tl.where(pos >= 0, cmask, False))
    committed = _committed_at(pos, h1, h2, h3, h4, REACH)
    return tl.where(pos >= 0, token.to(tl.float32), committed)


@triton.jit
def _offsets_dtype(request, chan, OFFSETS32: tl.constexpr):
    """The node loops' channels and a zero (n0) in their offsets' dtype: int32 with OFFSETS32 (the
    launcher found every span below 2**31), else int64 (a factor times an int32 stride may pass
    2**31); offsets built from n0 and chan keep that dtype."""
    if OFFSETS32:
        n0 = request * 0
    else:
        chan = chan.to(tl.int64)
        n0 = request.to(tl.int64) * 0
    return chan, n0


@triton.jit
def _lane_columns(base, chan0, dim, COUNT: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """Columns 0 .. COUNT-1 of the contiguous [dim, COUNT] block at ``base`` for channels chan0 ..
    chan0 + BLOCK - 1, each [BLOCK] in the block's dtype (zeros past dim, a multiple of GROUP): the
    GROUP adjacent channels a lane holds have their GROUP * COUNT elements adjacent, so they come in
    as vectors and are split in registers, where a load per column would read a strided scalar per
    channel."""
    RUN: tl.constexpr = GROUP * COUNT
    BYTES: tl.constexpr = base.dtype.element_ty.primitive_bitwidth // 8
    VEC: tl.constexpr = min(RUN & (-RUN), 16 // BYTES)  # elements per vector: a power of two dividing the run
    VECTORS: tl.constexpr = 1 << (RUN // VEC - 1).bit_length()  # a run's vectors, padded to a power of two
    GROUPS: tl.constexpr = BLOCK // GROUP
    # [group, vector, element]: Triton lays the groups over the lanes before the vectors (both
    # strided), so one lane holds all of its group's vectors and neighbouring lanes neighbouring groups
    g = tl.arange(0, GROUPS)[:, None, None]
    v = tl.arange(0, VECTORS)[None, :, None]
    e = tl.arange(0, VEC)[None, None, :]
    tile = tl.load(base + chan0 * COUNT + g * RUN + v * VEC + e, mask=(v < RUN // VEC) & (chan0 + g * GROUP < dim),
                   other=0.0)
    elements = tile_columns(tl.reshape(tile, [GROUPS, VECTORS * VEC]), GROUPS, VECTORS * VEC)  # each lane's run
    columns = ()
    for col in tl.static_range(COUNT):
        channels = ()
        for c in tl.static_range(GROUP):
            channels = channels + (elements[c * COUNT + col],)
        columns = columns + (tl.reshape(join_columns(channels, GROUP), [BLOCK]),)
    return columns


@triton.jit
def _newest_columns(base, stride_col, n0, cmask, NUM: tl.constexpr, zero):
    """Columns NUM-1, NUM-2, .. 0 (NUM <= 4) of the block at ``base`` (channels' pointers) in
    float32, one load each, then ``zero`` past NUM: the committed inputs or taps, newest first."""
    columns = ()
    for col in tl.static_range(NUM):
        columns = columns + (tl.load(base + (n0 + col) * stride_col, mask=cmask),)
    return _newest_first(columns, NUM, zero)


@triton.jit
def _committed_and_weights(windows, state_base, weight_ptr, bias_ptr, chan, cmask, n0, chan0, dim,
                           windows_stride_node, state_stride_dim, state_stride_win, weight_stride_dim,
                           weight_stride_tap, bias_stride, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
                           HAS_CONV: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr,
                           LANE_GROUP: tl.constexpr = 0):
    """The node loops' registers: the K-1 committed inputs (h1 the newest) and, with HAS_CONV, the
    bias and the taps (w_x the node's own input's, w_1 the newest committed one's ...) in float32,
    zeros past K-1; with ROWS, rows 0 .. K-3 (the K-2 newest committed inputs) are stored too.
    Offsets in n0's dtype (an int32 or int64 zero: the kernel's choice of offsets). LANE_GROUP > 0:
    the committed inputs ([dim, K-1]) and the weights ([dim, K]) are contiguous and a lane holds
    LANE_GROUP adjacent channels: both come in as runs (_lane_columns); dim is a multiple of it."""
    zero = tl.zeros([BLOCK], dtype=tl.float32)
    if LANE_GROUP > 0:
        h1, h2, h3, h4 = _newest_first(_lane_columns(state_base, chan0, dim, WIDTH, BLOCK, LANE_GROUP), WIDTH, zero)
    else:
        h1, h2, h3, h4 = _newest_columns(state_base + chan * state_stride_dim, state_stride_win, n0, cmask, WIDTH,
                                         zero)
    bias = zero
    w_x = zero
    w_1 = zero
    w_2 = zero
    w_3 = zero
    w_4 = zero
    if HAS_CONV:
        if HAS_BIAS:
            bias = tl.load(bias_ptr + chan * bias_stride, mask=cmask).to(tl.float32)
        if LANE_GROUP > 0:
            taps = _lane_columns(weight_ptr, chan0, dim, WIDTH + 1, BLOCK, LANE_GROUP)  # oldest input's first
            w_x = taps[WIDTH].to(tl.float32)
            w_1, w_2, w_3, w_4 = _newest_first(taps, WIDTH, zero)
        else:
            taps = weight_ptr + chan * weight_stride_dim
            w_x = tl.load(taps + (n0 + WIDTH) * weight_stride_tap, mask=cmask).to(tl.float32)
            w_1, w_2, w_3, w_4 = _newest_columns(taps, weight_stride_tap, n0, cmask, WIDTH, zero)
    if ROWS:  # rows 0 .. K-3: the K-2 newest committed inputs, oldest first
        if WIDTH >= 2:
            tl.store(windows + (n0 + WIDTH - 2) * windows_stride_node, h1.to(windows.dtype.element_ty), mask=cmask)
        if WIDTH >= 3:
            tl.store(windows + (n0 + WIDTH - 3) * windows_stride_node, h2.to(windows.dtype.element_ty), mask=cmask)
        if WIDTH >= 4:
            tl.store(windows + (n0 + WIDTH - 4) * windows_stride_node, h3.to(windows.dtype.element_ty), mask=cmask)
    return h1, h2, h3, h4, bias, w_x, w_1, w_2, w_3, w_4


@triton.jit
def _store_node(windows, out_ptr, row, chan, node, raw, p1, p2, p3, p4, bias, w_x, w_1, w_2, w_3, w_4, live,
                write, n0, windows_stride_node, windows_stride_win, out_stride_row, out_stride_node, out_stride_dim,
                WIDTH: tl.constexpr, HAS_CONV: tl.constexpr, SILU: tl.constexpr, ROWS: tl.constexpr, token=None,
                STORE: tl.constexpr = True, FAST_DIVIDE: tl.constexpr = False):
    """What the node loops write for node ``node`` (in the offsets' dtype), its own input ``raw``
    (as stored; in float32 ``token``, converted here if None) and the inputs above it p1 (its
    parent's) .. p4 (float32): with ROWS its row K-2+n, wherever ``live``; else its window (not
    with STORE False: the caller stores rows or windows as runs); and out[node] = act(bias + the
    taps from the newest input up) -- the rows kernel's fma order -- both wherever ``write`` (its
    links are good)."""
    if ROWS:  # row K-2+n: node n's input, whatever its links
        if STORE:
            tl.store(windows + (WIDTH - 1 + node) * windows_stride_node, raw.to(windows.dtype.element_ty),
                     mask=live)
    elif STORE:
        window = windows + node * windows_stride_node
        # column K-2 of window `node` is the node's own input, the columns before it its path's
        tl.store(window + (n0 + WIDTH - 1) * windows_stride_win, raw.to(windows.dtype.element_ty), mask=write)
        if WIDTH >= 2:
            tl.store(window + (n0 + WIDTH - 2) * windows_stride_win, p1.to(windows.dtype.element_ty), mask=write)
        if WIDTH >= 3:
            tl.store(window + (n0 + WIDTH - 3) * windows_stride_win, p2.to(windows.dtype.element_ty), mask=write)
        if WIDTH >= 4:
            tl.store(window + (n0 + WIDTH - 4) * windows_stride_win, p3.to(windows.dtype.element_ty), mask=write)
    if HAS_CONV:
        if token is None:
            token = raw.to(tl.float32)
        acc = tl.fma(w_x, token, bias)
        acc = tl.fma(w_1, p1, acc)
        if WIDTH >= 2:
            acc = tl.fma(w_2, p2, acc)
        if WIDTH >= 3:
            acc = tl.fma(w_3, p3, acc)
        if WIDTH >= 4:
            acc = tl.fma(w_4, p4, acc)
        if SILU:
            acc = _silu(acc, FAST_DIVIDE)
        out = out_ptr + row * out_stride_row + node * out_stride_node + chan * out_stride_dim
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=write)


@triton.jit
def _verify_node_loop_kernel(
    windows_ptr,
    state_ptr,
    x_ptr,
    out_ptr,
    weight_ptr,
    bias_ptr,
    buffer_slots_ptr,
    state_slots_ptr,
    parents_ptr,
    windows_layer_offset,  # layer * windows.stride(0), computed on the host (may exceed int32)
    state_layer_offset,
    num_buffer_slots,
    num_state_slots,
    num_nodes,
    dim,
    windows_stride_slot,
    windows_stride_node,
    windows_stride_dim,
    windows_stride_win,
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
    HAS_PARENTS: tl.constexpr,
    HAS_CONV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    ROWS: tl.constexpr = False,
    PREFETCH: tl.constexpr = 0,
    BLOCKS_FIRST: tl.constexpr = False,
    OFFSETS32: tl.constexpr = False,  # per-element offsets in int32 (the launcher checked every span); bases int64
    LANE_GROUP: tl.constexpr = 0,  # > 0: committed inputs and weights loaded as runs (_committed_and_weights)
    FAST_DIVIDE: tl.constexpr = False,  # SiLU's divide approximate (_silu)
):
    """Dense windows for K <= 5: the K-1 committed inputs and the conv's weights stay in registers,
    a chain's previous inputs roll along in registers (each node loads only its own input), and a
    tree node's inputs come from one walk up its links, which also checks them. With ROWS, the
    same walk writes rows instead (windows_stride_node: the rows' position stride; no window
    stride). PREFETCH (0-4): each node's own input is loaded this many nodes ahead of its use, the
    first ones before the slots are read (x needs no slot)."""
    tl.static_assert(PREFETCH <= 4, "_verify_node_loop_kernel loads at most 4 nodes ahead")
    WIDTH: tl.constexpr = KERNEL_SIZE - 1
    tl.static_assert(WIDTH <= 4, "_verify_node_loop_kernel holds at most 4 committed inputs")
    request, block = _program_coordinates(BLOCKS_FIRST)
    row = request.to(tl.int64)
    chan = block * BLOCK + tl.arange(0, BLOCK)
    cmask = chan < dim
    chan, n0 = _offsets_dtype(request, chan, OFFSETS32)
    xs = x_ptr + row * x_stride_row + chan * x_stride_dim
    # ahead_1 .. ahead_PREFETCH: the inputs of the next PREFETCH nodes, ahead_1 the next one's
    if PREFETCH >= 1:
        ahead_1 = tl.load(xs, mask=tl.where(num_nodes > 0, cmask, False))
    if PREFETCH >= 2:
        ahead_2 = tl.load(xs + x_stride_node, mask=tl.where(num_nodes > 1, cmask, False))
    if PREFETCH >= 3:
        ahead_3 = tl.load(xs + (n0 + 2) * x_stride_node, mask=tl.where(num_nodes > 2, cmask, False))
    if PREFETCH >= 4:
        ahead_4 = tl.load(xs + (n0 + 3) * x_stride_node, mask=tl.where(num_nodes > 3, cmask, False))

    dst = tl.load(buffer_slots_ptr + row * buffer_slots_stride).to(tl.int64)
    src = tl.load(state_slots_ptr + row * state_slots_stride).to(tl.int64)
    # Index values are never trusted: a slot out of range skips the request.
    if (dst >= 0) & (dst < num_buffer_slots) & (src >= 0) & (src < num_state_slots):
        windows = windows_ptr + windows_layer_offset + dst * windows_stride_slot + chan * windows_stride_dim
        state = state_ptr + state_layer_offset + src * state_stride_slot
        parents_row = parents_ptr + row * parents_stride_row
        h1, h2, h3, h4, bias, w_x, w_1, w_2, w_3, w_4 = _committed_and_weights(
            windows, state, weight_ptr, bias_ptr, chan, cmask, n0, n0 + block * BLOCK, dim, windows_stride_node,
            state_stride_dim, state_stride_win, weight_stride_dim, weight_stride_tap, bias_stride, WIDTH, BLOCK,
            HAS_CONV, HAS_BIAS, ROWS, LANE_GROUP)
        p1, p2, p3, p4 = h1, h2, h3, h4  # the node's previous inputs, p1 the newest
        for node32 in range(num_nodes):
            node = n0 + node32
            if PREFETCH == 0:
                raw = tl.load(xs + node * x_stride_node, mask=cmask)
            else:
                raw = ahead_1
                later = tl.load(xs + (node + PREFETCH) * x_stride_node,
                                mask=tl.where(node + PREFETCH < num_nodes, cmask, False))
                if PREFETCH == 1:
                    ahead_1 = later
                if PREFETCH == 2:
                    ahead_1, ahead_2 = ahead_2, later
                if PREFETCH == 3:
                    ahead_1, ahead_2, ahead_3 = ahead_2, ahead_3, later
                if PREFETCH == 4:
                    ahead_1, ahead_2, ahead_3, ahead_4 = ahead_2, ahead_3, ahead_4, later
            token = raw.to(tl.float32)
            write = cmask
            if HAS_PARENTS and (HAS_CONV or not ROWS):  # walk up once: the inputs above the node, and
                pos = node                               # whether every link is in range (rows need neither)
                ok = pos >= 0
                above = ()
                for up in tl.static_range(1, KERNEL_SIZE):
                    parent = tl.load(parents_row + pos * parents_stride_node, mask=pos >= 0, other=-1)
                    parent = _narrow_link(parent).to(pos.dtype)  # (no bad int64 link narrows to a good one)
                    pos, ok = checked_step(pos, parent, (parent >= -1) & (parent < pos), ok)
                    above = above + (_input_at(pos, xs, x_stride_node, h1, h2, h3, h4, cmask, up),)  # pos >= -up
                above = above + (h4, h4, h4)  # (past K-1: read by no tap)
                p1, p2, p3, p4 = above[0], above[1], above[2], above[3]
                write = tl.where(ok, cmask, False)  # a bad link among the K-1 above skips the node
            _store_node(windows, out_ptr, row, chan, node, raw, p1, p2, p3, p4, bias, w_x, w_1, w_2, w_3, w_4,
                        cmask, write, n0, windows_stride_node, windows_stride_win, out_stride_row, out_stride_node,
                        out_stride_dim, WIDTH, HAS_CONV, SILU, ROWS, token, FAST_DIVIDE=FAST_DIVIDE)
            if not HAS_PARENTS:
                p4, p3, p2, p1 = p3, p2, p1, token


@triton.jit
def _store_runs(base, rows, chan0, dim, live, RUN: tl.constexpr, GROUP: tl.constexpr, VEC: tl.constexpr,
                VECTORS: tl.constexpr, BLOCK: tl.constexpr):
    """Runs of BLOCK channels stored as one: rows[j] ([BLOCK] in the destination's dtype) is element
    j of channels chan0 .., and channel chan0 + c's RUN elements go to base + c * RUN + j (wherever
    ``live`` and the channel's group is below dim, a multiple of GROUP). Each group of GROUP
    adjacent channels (the channels one lane holds) fills a whole number of VEC-element vectors (at
    most VECTORS, a power of two); a group's elements are reordered in registers and stored one
    vector per row of a [groups * VECTORS, VEC] tile, which Triton lays out lane by lane along the
    run, so neighbouring lanes write neighbouring vectors (storing from the channels' own lanes
    would leave every warp store a fraction of each line)."""
    GROUPS: tl.constexpr = BLOCK // GROUP
    USED: tl.constexpr = GROUP * RUN  # elements of a group's runs: a multiple of VEC
    columns = ()  # columns[j][i]: row j of channel g * GROUP + i
    for j in tl.static_range(RUN):
        columns = columns + (tile_columns(tl.reshape(rows[j], [GROUPS, GROUP]), GROUPS, GROUP),)
    pad = tl.zeros([GROUPS], dtype=base.dtype.element_ty)
    elements = ()  # element f of every group's run: row f % RUN of its channel f // RUN
    for f in tl.static_range(VECTORS * VEC):
        if f < USED:
            elements = elements + (columns[f % RUN][f // RUN],)
        else:
            elements = elements + (pad,)
    # one row per vector, (group, vector) flattened: rows whose pointers run on from the row before
    # get neighbouring lanes (a [groups, VECTORS, VEC] store would keep a group's vectors in one lane)
    runs = tl.reshape(join_columns(elements, VECTORS * VEC), [GROUPS * VECTORS, VEC])
    vector = tl.arange(0, GROUPS * VECTORS)[:, None]
    group = vector // VECTORS
    position = (vector % VECTORS) * VEC + tl.arange(0, VEC)[None, :]
    mask = tl.where(live, (position < USED) & (chan0 + group * GROUP < dim), False)
    tl.store(base + group * USED + position, runs, mask=mask)


BAD_LINK: tl.constexpr = tl.constexpr(15)  # a packed link outside [-1, n-1] (_verify_small_tree_kernel)


@triton.jit
def _parent_in(packed, pos):
    """Node pos's parent (pos >= 0; anything where pos < 0) from the small-tree kernel's links packed
    into one int32 (4 bits a node: the parent + 1, or BAD_LINK, which gives BAD_LINK - 1)."""
    return ((packed >> (4 * tl.maximum(pos, 0))) & 15) - 1


@triton.jit
def _verify_small_tree_kernel(
    windows_ptr,
    state_ptr,
    x_ptr,
    out_ptr,
    weight_ptr,
    bias_ptr,
    buffer_slots_ptr,
    state_slots_ptr,
    parents_ptr,
    windows_layer_offset,  # layer * windows.stride(0), computed on the host (may exceed int32)
    state_layer_offset,
    num_buffer_slots,
    num_state_slots,
    num_nodes,
    dim,
    windows_stride_slot,
    windows_stride_node,
    windows_stride_dim,
    windows_stride_win,
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
    HAS_PARENTS: tl.constexpr,
    HAS_CONV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    NODES: tl.constexpr,  # next power of two >= num_nodes, at most 8
    ROWS: tl.constexpr = False,
    BLOCKS_FIRST: tl.constexpr = False,
    SLOTS_AS_MASKS: tl.constexpr = False,  # a bad slot skips the request by masks, not a branch
    OFFSETS32: tl.constexpr = False,  # per-element offsets in int32 (the launcher checked every span); bases int64
    RUN: tl.constexpr = 0,  # runs (_run_length): channel_major rows num_nodes + K - 2, dense windows K - 1; else 0
    RUN_GROUP: tl.constexpr = 1,  # _store_runs: channels per group, elements per vector, vectors per group
    RUN_VEC: tl.constexpr = 1,
    RUN_VECTORS: tl.constexpr = 1,
    LANE_GROUP: tl.constexpr = 0,  # > 0: committed inputs and weights loaded as runs (_committed_and_weights)
    FAST_DIVIDE: tl.constexpr = False,  # SiLU's divide approximate (_silu)
    PACKED_LINKS: tl.constexpr = False,  # trees: the links in one int32, a step up one shift (_parent_in)
):
    """A tree of up to 8 nodes (or a chain), dense windows or rows, K <= 5, the node loop unrolled:
    every node's input and parent link is loaded up front (they need no slot), and the walk up
    from each node picks links from those registers (scalar selects, or with PACKED_LINKS one
    shift), so the loads of the inputs above the nodes wait on no link. With RUN, channel_major
    rows whose RUN rows are all a channel holds (channel stride RUN, row stride 1) go out at the
    end as one run per program, dense windows ([dim, K-1] contiguous) as one run per node
    (_store_runs)."""
    tl.static_assert(NODES <= 8, "_verify_small_tree_kernel holds at most 8 nodes")
    WIDTH: tl.constexpr = KERNEL_SIZE - 1
    tl.static_assert(WIDTH <= 4, "_verify_small_tree_kernel holds at most 4 committed inputs")
    request, block = _program_coordinates(BLOCKS_FIRST)
    row = request.to(tl.int64)
    chan = block * BLOCK + tl.arange(0, BLOCK)
    cmask = chan < dim
    chan, n0 = _offsets_dtype(request, chan, OFFSETS32)
    xs = x_ptr + row * x_stride_row + chan * x_stride_dim
    parents_row = parents_ptr + row * parents_stride_row
    inputs = ()  # node n's input, as stored
    links = ()  # node n's parent link (int32; -1 past the nodes)
    # PACKED_LINKS: node n's link in bits 4n .. 4n+3 of one int32, as its parent + 1 where that
    # lies in [-1, n-1] (0 past the nodes), else BAD_LINK
    packed = tl.cast(0, tl.int32)
    for n in tl.static_range(NODES):
        inputs = inputs + (tl.load(xs + (n0 + n) * x_stride_node, mask=tl.where(n < num_nodes, cmask, False)),)
        if HAS_PARENTS:
            link = tl.load(parents_row + (n0 + n) * parents_stride_node, mask=n < num_nodes, other=-1)
            if PACKED_LINKS:
                packed = packed | (tl.where((link >= -1) & (link < n), link + 1, BAD_LINK).to(tl.int32) << (4 * n))
            else:
                links = links + (_narrow_link(link).to(tl.int32),)

    dst = tl.load(buffer_slots_ptr + row * buffer_slots_stride).to(tl.int64)
    src = tl.load(state_slots_ptr + row * state_slots_stride).to(tl.int64)
    # Index values are never trusted: a slot out of range skips the request.
    valid = (dst >= 0) & (dst < num_buffer_slots) & (src >= 0) & (src < num_state_slots)
    if SLOTS_AS_MASKS:  # (every load and store below is masked by cmask; the slots are clamped in range)
        dst = tl.where(valid, dst, 0)
        src = tl.where(valid, src, 0)
        cmask = tl.where(valid, cmask, False)
        go = True
    else:
        go = valid
    if go:
        windows = windows_ptr + windows_layer_offset + dst * windows_stride_slot + chan * windows_stride_dim
        state = state_ptr + state_layer_offset + src * state_stride_slot
        STORE: tl.constexpr = RUN == 0
        h1, h2, h3, h4, bias, w_x, w_1, w_2, w_3, w_4 = _committed_and_weights(
            windows, state, weight_ptr, bias_ptr, chan, cmask, n0, n0 + block * BLOCK, dim, windows_stride_node,
            state_stride_dim, state_stride_win, weight_stride_dim, weight_stride_tap, bias_stride, WIDTH, BLOCK,
            HAS_CONV, HAS_BIAS, ROWS and STORE, LANE_GROUP)
        if RUN > 0 and not ROWS:  # node 0's window at this block's first channel
            chan0 = (block * BLOCK).to(tl.int64)
            run_base = windows_ptr + windows_layer_offset + dst * windows_stride_slot + chan0 * RUN
        zero = tl.zeros([BLOCK], dtype=tl.float32)
        for n in tl.static_range(NODES):
            live = tl.where(n < num_nodes, cmask, False)
            raw = inputs[n]
            # walk up once: the inputs above the node, and whether every link is in range
            pos = tl.cast(n, tl.int32)
            ok = n < num_nodes
            if not HAS_PARENTS:  # a chain: nodes n-1 .. 0, then the committed inputs, all in registers already
                newest = (h1, h2, h3, h4)
                above = ()
                for up in tl.static_range(1, KERNEL_SIZE):
                    if n - up >= 0:
                        above = above + (inputs[n - up].to(tl.float32),)
                    else:
                        above = above + (newest[up - n - 1],)
            else:
                above = ()
                for up in tl.static_range(1, KERNEL_SIZE):
                    if PACKED_LINKS:  # one shift, the links checked as they were packed
                        parent = _parent_in(packed, pos)
                        parent_ok = parent != BAD_LINK - 1
                    else:  # a scalar select per node it may be
                        parent = pos * 0 - 1
                        for i in tl.static_range(n + 1):  # pos <= n
                            parent = tl.where(pos == i, links[i], parent)
                        parent_ok = (parent >= -1) & (parent < pos)
                    pos, ok = checked_step(pos, parent, parent_ok, ok)
                    above = above + (_input_at(pos.to(n0.dtype), xs, x_stride_node, h1, h2, h3, h4, live, up),)
            above = above + (zero, zero, zero)  # (past K-1: read by no tap)
            p1, p2, p3, p4 = above[0], above[1], above[2], above[3]
            write = tl.where(ok, live, False)  # a bad link among the K-1 above skips the node
            _store_node(windows, out_ptr, row, chan, n0 + n, raw, p1, p2, p3, p4, bias, w_x, w_1, w_2, w_3, w_4,
                        live, write, n0, windows_stride_node, windows_stride_win, out_stride_row,
                        out_stride_node, out_stride_dim, WIDTH, HAS_CONV, SILU, ROWS, STORE=STORE,
                        FAST_DIVIDE=FAST_DIVIDE)
            if RUN > 0 and not ROWS:  # window n's K-1 columns, oldest first (its path's inputs, then its own)
                newest_first = (raw, p1, p2, p3)
                columns = ()
                for w in tl.static_range(WIDTH):
                    columns = columns + (newest_first[WIDTH - 1 - w].to(windows_ptr.dtype.element_ty),)
                _store_runs(run_base + (n0 + n) * windows_stride_node, columns, chan0, dim, ok & valid, RUN, RUN_GROUP,
                            RUN_VEC, RUN_VECTORS, BLOCK)
        if RUN > 0 and ROWS:  # rows 0 .. K-3 the committed inputs oldest first, then the nodes' inputs
            newest_first = (h1, h2, h3, h4)
            rows = ()
            for j in tl.static_range(WIDTH - 1):
                rows = rows + (newest_first[WIDTH - 2 - j].to(windows_ptr.dtype.element_ty),)
            for n in tl.static_range(RUN - WIDTH + 1):
                rows = rows + (inputs[n].to(windows_ptr.dtype.element_ty),)
            # (not hoisted beside the windows' base: live across the node loop, it costs chains registers)
            chan0 = (block * BLOCK).to(tl.int64)
            run_base = windows_ptr + windows_layer_offset + dst * windows_stride_slot + chan0 * RUN
            _store_runs(run_base, rows, chan0, dim, valid, RUN, RUN_GROUP, RUN_VEC, RUN_VECTORS, BLOCK)


@triton.jit
def _verify_dense_any_width_kernel(
    windows_ptr,
    state_ptr,
    x_ptr,
    out_ptr,
    weight_ptr,
    bias_ptr,
    buffer_slots_ptr,
    state_slots_ptr,
    parents_ptr,
    windows_layer_offset,  # layer * windows.stride(0), computed on the host (may exceed int32)
    state_layer_offset,
    num_buffer_slots,
    num_state_slots,
    num_nodes,
    dim,
    windows_stride_slot,
    windows_stride_node,
    windows_stride_dim,
    windows_stride_win,
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
    HAS_PARENTS: tl.constexpr,
    HAS_CONV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BLOCKS_FIRST: tl.constexpr = False,
    FAST_DIVIDE: tl.constexpr = False,  # SiLU's divide approximate (_silu)
):
    WIDTH: tl.constexpr = KERNEL_SIZE - 1
    request, block = _program_coordinates(BLOCKS_FIRST)
    row = request.to(tl.int64)
    chan = block * BLOCK + tl.arange(0, BLOCK)
    cmask = chan < dim
    chan = chan.to(tl.int64)

    dst = tl.load(buffer_slots_ptr + row * buffer_slots_stride).to(tl.int64)
    src = tl.load(state_slots_ptr + row * state_slots_stride).to(tl.int64)
    # Index values are never trusted: a slot out of range skips the request.
    if (dst >= 0) & (dst < num_buffer_slots) & (src >= 0) & (src < num_state_slots):
        windows = windows_ptr + windows_layer_offset + dst * windows_stride_slot + chan * windows_stride_dim
        state = state_ptr + state_layer_offset + src * state_stride_slot + chan * state_stride_dim
        xs = x_ptr + row * x_stride_row + chan * x_stride_dim
        parents_row = parents_ptr + row * parents_stride_row
        for node in range(num_nodes):
            token = tl.load(xs + node * x_stride_node, mask=cmask)
            pos = tl.cast(node, tl.int64)
            write = cmask
            if HAS_PARENTS:  # a bad link among the K-1 above the node skips its writes
                write = tl.where(_links_ok(pos, parents_row, parents_stride_node, WIDTH), write, False)
            window = windows + node * windows_stride_node
            # column K-2 of window `node` is the node's own input
            tl.store(window + (WIDTH - 1) * windows_stride_win, token.to(windows_ptr.dtype.element_ty), mask=write)
            if HAS_CONV:
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
                # (not named like a value before the loop: Triton rejects a loop-carried dtype change)
                value = tl.where(is_token, from_x.to(tl.float32), from_state.to(tl.float32))
                if up < WIDTH:
                    tl.store(
                        window + (WIDTH - 1 - up) * windows_stride_win,
                        value.to(windows_ptr.dtype.element_ty),
                        mask=write,
                    )
                if HAS_CONV:
                    tap = tl.load(
                        weight_ptr + chan * weight_stride_dim + (WIDTH - up) * weight_stride_tap, mask=cmask
                    )
                    acc = tl.fma(tap.to(tl.float32), value, acc)
            if HAS_CONV:
                if SILU:
                    acc = _silu(acc, FAST_DIVIDE)
                out = out_ptr + row * out_stride_row + node * out_stride_node + chan * out_stride_dim
                tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=write)


def _node_loop(dense: bool, contiguous: bool, num_rows: int, nodes: int, tree: bool) -> bool:
    """Whether the node-loop kernel serves this launch (K <= 5 aside; nodes: the node count's next
    power of two). Measured on the H200 (docs/benchmarks.md, "Verify kernel"): always for dense
    windows; for rows whose channels are contiguous (token_major), chains from 32 requests up,
    where it moves the bytes faster than the tile (below, the tile's many small programs start
    sooner), and trees of more than 8 nodes from 128 up (smaller trees: the tile at 128 channels
    beat it at 64 to 256 requests); never for channel_major rows, whose per-node stores the loop
    would stride."""
    if dense:
        return True
    if not contiguous:
        return False
    if not tree:
        return num_rows >= NODE_LOOP_MIN_ROWS
    return nodes > 8 and num_rows >= NODE_LOOP_MIN_ROWS_TREE


def _node_loop_config(dense: bool, num_rows: int, tree: bool) -> tuple[int, int]:
    """(channels per program, warps) of the node-loop kernel, measured on the H200 (docs/benchmarks.md,
    "Verify kernel"): rows 128 / 1; dense windows 32 / 1 below 64 requests (more programs to fill
    the GPU), else 64 / 1 -- but dense chains from 8 requests 64 / 2, one channel per lane (3-14%
    faster per layer there, most at 8 and 64 requests; trees took 1.4x as long that way)."""
    if not dense:
        return 128, NODE_LOOP_WARPS
    if not tree and num_rows >= DENSE_CHAIN_MIN_ROWS:
        return 64, DENSE_CHAIN_WARPS
    return (32 if num_rows < 64 else 64), NODE_LOOP_WARPS


def _node_loop_prefetch(num_rows: int, tree: bool) -> int:
    """How many nodes ahead the node loop loads each node's input, measured on the H200
    (docs/benchmarks.md, "Verify kernel"): 2; chains from 128 requests 4 (a D = 4 chain's inputs
    all come with the committed inputs instead of half of them a round trip later: 22.5 vs 23.6 us
    on token_major rows, 33.6 vs 34.6 on dense windows at 256 requests; level or slower at 64
    requests; trees of 8 nodes mixed, so trees keep 2)."""
    if not tree and num_rows >= NODE_LOOP_PREFETCH_CHAIN_MIN_ROWS:
        return NODE_LOOP_PREFETCH_CHAIN
    return NODE_LOOP_PREFETCH


def _offsets32(small_tree: bool, prefetch: int | None) -> bool:
    """Whether the node loops address elements by int32 offsets from int64 bases (where every span
    fits; else int64), measured on the H200 (docs/benchmarks.md, "Verify kernel"): the small-tree
    kernel (token_major and dense trees 4-5% faster at 64 and 256 requests) and the node loop
    loading fewer than 4 nodes ahead (2 by default: dense chains at 64 requests 6% faster); not the
    node loop loading 4 ahead (chains from 128 requests): dense chains took 42.8 instead of 33.3 us
    at 256 requests, token_major ones level."""
    return small_tree or prefetch < NODE_LOOP_PREFETCH_CHAIN


def _rows_block(nodes: int, num_rows: int) -> int:
    """Channels per program of the rows kernel for a [nodes, channels] tile (nodes a power of two),
    measured best on the H200 (one warp, docs/benchmarks.md, "Verify kernel"): up to 8 nodes,
    ROWS_WIDE_BLOCK from 64 requests (fewer, longer programs once the grid is full), else 64 for 4
    nodes and 32 for 8; 32 for up to 32 nodes (16 and 64 were slower at B >= 64). Above 32 nodes,
    not timed: 16, to keep the tile's registers in bounds."""
    if nodes > 32:
        return 16
    if nodes <= 8 and num_rows >= ROWS_WIDE_MIN_ROWS:
        return ROWS_WIDE_BLOCK
    return 64 if nodes <= 4 else 32


def _one_store(contiguous: bool, block: int) -> bool:
    """Whether the rows kernel stores its committed rows and node rows as one tile: for channel_major
    rows at 128 channels or more, where a warp's stores then cover whole channels' rows (12 bytes
    each at D = 4, K = 4) instead of 2 bytes every 12; measured on the H200 (docs/benchmarks.md,
    "Verify kernel"): slower or level at 32 and 64 channels, and on token_major rows."""
    return not contiguous and block >= ROWS_WIDE_BLOCK


def _runs(dense: bool, conv: bool, num_rows: int) -> bool:
    """Whether the small-tree kernel stores its rows or windows as runs where they fit, measured on
    the H200 (docs/benchmarks.md, "Verify kernel"): channel_major rows always (where the small-tree
    kernel serves them: _small_tree); dense windows with the conv from ROWS_WIDE_MIN_ROWS requests
    (trees 60.3 vs 76.4 us at 256, 17.3 vs 21.5 at 64; chains 30.1 vs 33.6 at 256, 7.5 vs 7.8 at
    64), not below (level or slower at 8) nor for a capture alone (not timed)."""
    return not dense or (conv and num_rows >= ROWS_WIDE_MIN_ROWS)


def _small_tree(dense: bool, contiguous: bool, num_rows: int, tree: bool, runs: bool, conv: bool) -> bool:
    """Whether the unrolled small-tree kernel serves up to 8 nodes (K <= 5), measured on the H200
    (docs/benchmarks.md, "Verify kernel"): trees on dense windows always (12% faster than the node
    loop at 256 requests, 24% at 8), on token_major rows from ROWS_WIDE_MIN_ROWS requests (12%
    faster than the tile at 256; below, the tile's many small programs start sooner); rows or
    windows that go out as runs (``runs``), chains too, with the conv from ROWS_WIDE_MIN_ROWS
    requests (channel_major trees 41.0 vs 58.0 us at 256, chains 23.4 vs 26.9; level or slower at
    8), a capture from RUNS_CAPTURE_MIN_ROWS (channel_major trees 2.0 vs 2.8 us at 8, chains 14.9 vs
    16.5 at 256); row by row its per-node stores would stride channel_major rows, 2-6x slower than
    the tile."""
    if runs and num_rows >= (ROWS_WIDE_MIN_ROWS if conv else RUNS_CAPTURE_MIN_ROWS):
        return True
    if not tree:
        return False
    return dense or (contiguous and num_rows >= ROWS_WIDE_MIN_ROWS)


def _small_tree_config(dense: bool, num_rows: int, tree: bool, runs: bool) -> tuple[int, int]:
    """(channels per program, warps) of the small-tree kernel, measured best on the H200
    (docs/benchmarks.md, "Verify kernel"): rows 128 / 1; dense windows 64 / 1, but 32 / 1 below
    8 requests (more programs to fill the GPU: 3.1 vs 3.8 us for one request); dense windows as
    runs from ROWS_WIDE_MIN_ROWS requests 128 / 1 for trees (60.3 vs 70.2 us at 256, 17.3 vs 20.1 at
    64) and for chains from DENSE_RUNS_WIDE_CHAIN_MIN_ROWS (30.1 vs 32.5 at 256; 8.8 vs 7.5 at 64)."""
    if not dense:
        return SMALL_TREE_BLOCK_ROWS, 1
    wide_from = ROWS_WIDE_MIN_ROWS if tree else DENSE_RUNS_WIDE_CHAIN_MIN_ROWS
    if runs and num_rows >= wide_from:
        return SMALL_TREE_BLOCK_DENSE_RUNS, 1
    return (SMALL_TREE_BLOCK_DENSE if num_rows >= 8 else SMALL_TREE_BLOCK_DENSE // 2), 1


def _small_tree_masks(dense: bool, tree: bool) -> bool:
    """Whether the small-tree kernel skips a bad slot by masks rather than a branch, measured on the
    H200 (docs/benchmarks.md, "Verify kernel"): trees on rows (4% faster at 256 requests on
    token_major rows, 96 instead of 118 registers; channel_major runs 41.0 vs 58.1 us); not dense
    windows (5% slower at 256 requests) nor channel_major chains (7.0 vs 6.5 us at 64 requests,
    level at 256)."""
    return tree and not dense


def _run_length(dest: torch.Tensor, num_nodes: int, kernel_size: int, dense: bool) -> int | None:
    """The run of the small-tree kernel's run store (_store_runs) in channel_major rows ``dest``
    ([L, M, rows, dim], row stride 1: a channel's N+K-2 rows) or dense windows ([L, M, N, dim, K-1]:
    a channel's K-1 columns), or None where runs are not contiguous (rows: fewer nodes than the
    buffer holds, so the channel stride exceeds the run)."""
    if dense:
        run = kernel_size - 1
        return run if dest.stride(4) == 1 and dest.stride(3) == run else None
    run = num_nodes + kernel_size - 2
    return run if dest.stride(2) == 1 and dest.stride(3) == run else None


def _channels_per_lane(block: int, num_warps: int) -> int:
    """The adjacent channels one lane holds of a [block] vector: Triton lays it out over the
    num_warps warps' lanes in order, block / (32 * num_warps) channels a lane (at least one)."""
    return max(block // (32 * num_warps), 1)


def _run_layout(run: int, block: int, num_warps: int, element_size: int, dim: int) -> tuple[int, int, int] | None:
    """(RUN_GROUP, RUN_VEC, RUN_VECTORS) of _store_runs for runs of ``run`` elements: a group is the
    channels one lane holds (_channels_per_lane), whose runs go out in vectors of the largest power
    of two dividing them, up to 16 bytes; None where dim is no multiple of the group, or at more
    than one warp (Triton 3.6 compiled the joins of a two-warp program to shared-memory reads out of
    bounds: compute-sanitizer memcheck, a tree's capture at 128 channels)."""
    group = _channels_per_lane(block, num_warps)
    if num_warps != 1 or dim % group:
        return None
    used = group * run
    vec = min(16 // element_size, used & -used)
    return group, vec, next_power_of_2(used // vec)


def _lane_runs(dense: bool, tree: bool, conv: bool) -> bool:
    """Whether the node loops load the committed inputs and weights as runs where they can
    (_lane_group), measured on the H200 (docs/benchmarks.md, "Verify kernel"): yes (token_major
    chains 20.5 vs 22.5 us at 256 requests, 5.0 vs 6.6 at 64; channel_major trees 9.9 / 37.6 vs
    11.2 / 38.8 at 64 / 256), but not for a capture of dense trees (58.0 vs 56.3 us at 256)."""
    return not (dense and tree and not conv)


def _packed_links(dense: bool, contiguous: bool) -> bool:
    """Whether the small-tree kernel walks a tree on its links packed into one int32 (one shift a
    step, against a scalar select per node it may be), measured on the H200 (docs/benchmarks.md,
    "Verify kernel"): on token_major rows and dense windows (trees at 64 / 128 / 256 requests:
    token_major 8.6 / 18.5 / 34.2 vs 9.1 / 20.0 / 34.7 us, dense 14.0 / 29.1 / 55.1 vs 14.8 / 29.8 /
    56.8), not on channel_major rows (37.6 vs 39.5 at 256, 21.1 vs 22.3 at 128, 9.9 both at 64)."""
    return dense or contiguous


def _lane_group(state: torch.Tensor, weight: torch.Tensor | None, block: int, num_warps: int) -> int:
    """The adjacent channels a lane of the node loops holds (_channels_per_lane), where their
    committed inputs and weights can come in as runs (_lane_columns): at least two channels a lane
    (one went through shared memory, offline sm_90 SASS), state [L, M, dim, K-1] and weight [dim, K]
    contiguous per channel, dim a multiple of the group; else 0 (a strided load per column)."""
    width, dim = state.shape[3], state.shape[2]
    group = _channels_per_lane(block, num_warps)
    if group < 2 or block % (32 * num_warps) or dim % group:
        return 0
    if state.stride(3) != 1 or state.stride(2) != width:
        return 0
    if weight is not None and (weight.stride(1) != 1 or weight.stride(0) != width + 1):
        return 0
    return group


def _blocks_first(dense: bool, contiguous: bool) -> bool:
    """Whether the grid dispatches a request's channel blocks first (else the requests of one
    channel block first): for dense windows and channel_major rows, up to 5% faster at 64 and 256
    requests on the H200 and within 0.1 us at 8; token_major rows were level or slower at 256
    (docs/benchmarks.md, "Verify kernel")."""
    return dense or not contiguous


def _verify_tensors(out, dest, state, x, weight, bias, buffer_slots, state_slots, parents):
    """The kernels' tensor arguments: placeholders, never read, for what a capture, a conv without
    bias or a chain does not have."""
    return (
        dest,
        state,
        x,
        x if out is None else out,
        x if weight is None else weight,
        x if bias is None else bias,
        buffer_slots,
        state_slots,
        buffer_slots if parents is None else parents,
    )


def _verify_call(
    out, dest, state, x, weight, bias, buffer_slots, state_slots, layer, parents, *, dense, silu, **tuning,
) -> KernelCall | None:
    """The launch of launch_capture / launch_causal_conv1d_verify (``out`` None: a capture) and
    of their planners, or None if there is nothing to do. Its plan comes from _PLANS; ``tuning``:
    keywords named in TUNING."""
    if not tuning.keys() <= set(TUNING):
        raise TypeError(f"convwin verify: unknown tuning {sorted(tuning.keys() - set(TUNING))}; known: {TUNING}")
    has_conv = out is not None
    key = (
        dense, silu, tuple(tuning.get(name) for name in TUNING), dest.shape, dest.stride(), dest.element_size(),
        state.shape, state.stride(), x.shape, x.stride(), out.stride() if has_conv else None,
        weight.stride() if has_conv else None, None if bias is None else bias.stride(), buffer_slots.stride(0),
        state_slots.stride(0),
        None if parents is None else parents.stride(),
    )
    plan = _PLANS.get(key, MISSING)
    if plan is MISSING:
        plan = _PLANS.add(key, _plan(out, dest, state, x, weight, bias, buffer_slots, state_slots, parents,
                                     dense, silu, tuning))
    if plan is None:
        return None
    kernel, grid, scalars, flags = plan
    tensors = _verify_tensors(out, dest, state, x, weight, bias, buffer_slots, state_slots, parents)
    return KernelCall(kernel, grid, tensors, (layer * dest.stride(0), layer * state.stride(0), *scalars), flags)


def _plan(out, dest, state, x, weight, bias, buffer_slots, state_slots, parents, dense, silu, tuning):
    """(kernel, grid, scalar arguments after the layer offsets, constexprs), or None if there is
    nothing to do; raises for what the kernels cannot address. Depends only on _verify_call's key
    (``tuning``: its keywords, a dict)."""
    (block, num_warps, node_loop, preload, prefetch, early, one_store, blocks_first, gather_links, pairs,
     small_tree, slots_as_masks, offsets32, runs, lane_runs, maxnreg, packed_links) = (
        tuning.get(name) for name in TUNING)
    num_rows, num_nodes, dim = x.shape
    if num_rows == 0 or dim == 0 or dest.shape[1] == 0 or state.shape[1] == 0:
        return None
    if num_rows > INT32_MAX:
        raise ValueError(f"convwin verify: {num_rows} requests is too large a grid")
    has_conv = out is not None
    has_parents = parents is not None
    nodes = next_power_of_2(max(num_nodes, 1))
    contiguous = dest.stride(-1) == 1  # rows whose channels are adjacent: token_major
    kernel_size = state.shape[3] + 1
    node_loop_asked = node_loop
    if node_loop is None:
        node_loop = _node_loop(dense, contiguous, num_rows, nodes, has_parents)
    node_loop = node_loop and kernel_size <= 5  # wider: the rows tile, or dense windows' any-width kernel
    runs = _runs(dense, has_conv, num_rows) if runs is None else runs
    run = _run_length(dest, num_nodes, kernel_size, dense) if runs and (dense or not contiguous) else None
    # whether the runs fit the small-tree kernel's default configuration for runs (else its row-by-row one)
    runs_fit = run is not None and _run_layout(run, *_small_tree_config(dense, num_rows, has_parents, True),
                                               dest.element_size(), dim) is not None
    if small_tree is None:  # (an explicit node_loop choice asks for the loop or the tile)
        small_tree = node_loop_asked is None and _small_tree(dense, contiguous, num_rows, has_parents, runs_fit,
                                                             has_conv)
    small_tree = small_tree and nodes <= 8 and kernel_size <= 5
    if small_tree:
        kernel = _verify_small_tree_kernel
        default_block, default_warps = _small_tree_config(dense, num_rows, has_parents, runs_fit)
    elif dense and not node_loop:
        kernel, default_block = _verify_dense_any_width_kernel, DENSE_ANY_WIDTH_BLOCK
        default_warps = DENSE_ANY_WIDTH_WARPS
    elif node_loop:
        kernel = _verify_node_loop_kernel
        default_block, default_warps = _node_loop_config(dense, num_rows, has_parents)
    else:
        kernel, default_warps = _verify_rows_kernel, ROWS_WARPS
        default_block = _rows_block(nodes, num_rows)
    block = default_block if block is None else block
    num_warps = default_warps if num_warps is None else num_warps
    block = min(block, next_power_of_2(dim))
    num_blocks = cdiv(dim, block)
    if num_blocks > MAX_GRID_Y:
        raise ValueError(f"convwin verify: dim {dim} needs {num_blocks} channel blocks; at most {MAX_GRID_Y}")
    if blocks_first is None:
        blocks_first = _blocks_first(dense, contiguous)
    blocks_first = blocks_first and num_rows <= MAX_GRID_Y  # (the requests then go on the grid's y axis)
    grid = (num_blocks, num_rows) if blocks_first else (num_rows, num_blocks)
    scalars = (
        dest.shape[1],
        state.shape[1],
        num_nodes,
        dim,
        *dest.stride()[1:],
        *((0,) if kernel is not _verify_rows_kernel and not dense else ()),  # rows have no window stride
        *state.stride()[1:],
        *x.stride(),
        *(out.stride() if has_conv else (0, 0, 0)),
        *(weight.stride() if has_conv else (0, 0)),
        bias.stride(0) if bias is not None else 0,
        buffer_slots.stride(0),
        state_slots.stride(0),
        *(parents.stride() if has_parents else (0, 0)),
    )
    flags = dict(
        KERNEL_SIZE=kernel_size,
        BLOCK=block,
        HAS_PARENTS=has_parents,
        HAS_CONV=has_conv,
        HAS_BIAS=bias is not None,
        SILU=silu,
        BLOCKS_FIRST=blocks_first,
        FAST_DIVIDE=FAST_DIVIDE,
        num_warps=num_warps,
    )
    if maxnreg is not None:
        flags.update(maxnreg=maxnreg)
    if kernel is _verify_node_loop_kernel:
        prefetch = _node_loop_prefetch(num_rows, has_parents) if prefetch is None else prefetch
        if not 0 <= prefetch <= 4:
            raise ValueError(f"convwin verify: prefetch {prefetch}: the node loop loads 0 to 4 nodes ahead")
        flags.update(PREFETCH=prefetch)
    if kernel in (_verify_node_loop_kernel, _verify_small_tree_kernel):
        offsets32 = _offsets32(kernel is _verify_small_tree_kernel, prefetch) if offsets32 is None else offsets32
        flags.update(ROWS=not dense, OFFSETS32=offsets32 and _span_too_large(dest, state, x, out, weight, bias,
                                                                               parents) is None)
        lane_runs = _lane_runs(dense, has_parents, has_conv) if lane_runs is None else lane_runs
        flags.update(LANE_GROUP=_lane_group(state, weight if has_conv else None, block, num_warps) if lane_runs else 0)
    if kernel is _verify_node_loop_kernel:
        return kernel, grid, scalars, flags
    if kernel is _verify_small_tree_kernel:
        slots_as_masks = _small_tree_masks(dense, has_parents) if slots_as_masks is None else slots_as_masks
        packed_links = _packed_links(dense, contiguous) if packed_links is None else packed_links
        layout = None if run is None else _run_layout(run, block, num_warps, dest.element_size(), dim)
        run_group, run_vec, run_vectors = (1, 1, 1) if layout is None else layout
        return kernel, grid, scalars, dict(flags, NODES=nodes, SLOTS_AS_MASKS=slots_as_masks,
                                           RUN=0 if layout is None else run, RUN_GROUP=run_group, RUN_VEC=run_vec,
                                           RUN_VECTORS=run_vectors, PACKED_LINKS=packed_links and has_parents)
    if kernel is _verify_rows_kernel:
        _check_rows_spans(dest, state, x, out, weight, bias, parents)
        preload = kernel_size <= 5 if preload is None else preload and kernel_size <= 5
        early = ROWS_EARLY if early is None else early
        one_store = _one_store(contiguous, block) if one_store is None else one_store
        gather_links = ROWS_GATHER_LINKS if gather_links is None else gather_links
        pairs = ROWS_PAIRS if pairs is None else pairs
        # two rows per lane: a channel's rows start at an even element and the stored rows pair up
        paired = pairs and one_store and dest.stride(-1) % 2 == 0 and (kernel_size - 2 + num_nodes) % 2 == 0
        return kernel, grid, scalars, dict(flags, NODES=nodes, PRELOAD=preload, EARLY=early, ONE_STORE=one_store,
                                           ROW_TILE=next_power_of_2(nodes + kernel_size - 2),
                                           GATHER_LINKS=gather_links and has_parents, ROWS_ALIGN=2 if paired else 1)
    return kernel, grid, scalars, flags


def _span(tensor: torch.Tensor | None, start_dim: int) -> int:
    """The largest element offset within one index of dim start_dim-1 (one slot, one request)."""
    if tensor is None:
        return 0
    return sum((size - 1) * stride for size, stride in zip(tensor.shape[start_dim:], tensor.stride()[start_dim:]))


def _span_too_large(rows, state, x, out, weight, bias, parents) -> str | None:
    """What spans 2**31 elements or more, of what int32 per-element offsets address (bases are
    int64): one buffer slot, one state slot, one request's x / out / parents, the weights, the
    bias; None if nothing. Any span lies inside its tensor's storage, so storages below 2**31
    elements (the usual case, and a cheap test) need no more."""
    tensors = (rows, state, x, out, weight, bias, parents)
    if all(t is None or t.untyped_storage().nbytes() // t.element_size() <= INT32_MAX for t in tensors):
        return None
    spans = {
        "a buffer slot": _span(rows, 2),
        "a conv_state slot": _span(state, 2),
        "x[b]": _span(x, 1),
        "out[b]": _span(out, 1),
        "weight": _span(weight, 0),
        "bias": _span(bias, 0),
        "parents[b]": _span(parents, 1),
    }
    for name, span in spans.items():
        if span > INT32_MAX:
            return f"{name} spans {span + 1} elements"
    return None


def _check_rows_spans(rows, state, x, out, weight, bias, parents) -> None:
    """The rows kernel's per-element offsets are int32: raises if a span does not fit."""
    too_large = _span_too_large(rows, state, x, out, weight, bias, parents)
    if too_large is not None:
        raise ValueError(f"convwin verify: {too_large}; at most 2**31 are supported")


_PLANS = LaunchPlans()
FAST_DIVIDE = not isinstance(_verify_rows_kernel, InterpretedFunction)  # (the interpreter runs no libdevice call)


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
    **tuning,
) -> None:
    """Write layer ``layer`` of every active request's buffer slot (see the module docstring).

    dest: rows [L, M, N+K-2, dim] or, if dense, windows [L, M, N, dim, K-1]; any strides.
    state: [L, N_state, dim, K-1], any strides. x: [B, N, dim], any strides. Slots: [B];
    parents: [B, N] or None for a chain; int32 or int64, any strides. tuning: keywords named in
    TUNING, for the measured defaults when absent.
    """
    call = _verify_call(None, dest, state, x, None, None, buffer_slots, state_slots, layer, parents,
                        dense=dense, silu=False, **tuning)
    if call is not None:
        call.launch()


def planned_capture(dest, state, x, buffer_slots, state_slots, layer, parents, *, dense):
    """launch_capture with its plan fixed for THESE shapes, strides, dtypes, device, layer and
    layout: a function of the same arguments (_common.planned_launch)."""
    launch = planned_launch(_verify_call(None, dest, state, x, None, None, buffer_slots, state_slots, layer, parents,
                                         dense=dense, silu=False))

    def run(dest, state, x, buffer_slots, state_slots, layer, parents, **flags):  # layer, flags: the plan's
        launch(*_verify_tensors(None, dest, state, x, None, None, buffer_slots, state_slots, parents))

    return run


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
    **tuning,
) -> None:
    """launch_capture, fused with out[b, n] = act(bias + sum_k weight[:, k] * input k of node n).

    out: [B, N, dim], weight: [dim, K], bias: [dim] or None; any strides. tuning: as launch_capture's.
    """
    call = _verify_call(out, dest, state, x, weight, bias, buffer_slots, state_slots, layer, parents,
                        dense=dense, silu=silu, **tuning)
    if call is not None:
        call.launch()


def planned_causal_conv1d_verify(out, dest, state, x, weight, bias, buffer_slots, state_slots, layer, parents,
                                 *, dense, silu):
    """launch_causal_conv1d_verify with its plan fixed for THESE shapes, strides, dtypes, device,
    layer, layout and activation: a function of the same arguments (_common.planned_launch)."""
    launch = planned_launch(_verify_call(out, dest, state, x, weight, bias, buffer_slots, state_slots, layer, parents,
                                         dense=dense, silu=silu))

    def run(out, dest, state, x, weight, bias, buffer_slots, state_slots, layer, parents, **flags):
        launch(*_verify_tensors(out, dest, state, x, weight, bias, buffer_slots, state_slots, parents))

    return run
