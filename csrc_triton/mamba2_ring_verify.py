"""mamba2_ring_verify's and mamba2_ring_flush's kernels: the ring's pending tokens replayed from the
checkpoint and this step's drafts decoded, in the chunked (SSD) form of csrc_triton/mamba2_verify.py,
from one read of the checkpoint tile.

Per row b and head h (group h // (H / G)), with (start, pending) = cursor[ring_slots[b]], P =
pending, a program's stack holds the P pending tokens (stack rows 0..P-1, ring rows (start + j) % C)
then the N drafts (rows P..P+N-1): a pending token's x and B are its conv over the ring's rows (the
checkpoint's window before the first; SiLU), its d the dt the ring keeps; a draft's are given (d =
dt (+ dt_bias), softplus'd). With L_t the cumulative d A along stack row t's ancestors (a pending
token: the pending tokens up to it; a draft: every pending token and its tree path),

    y_n  = exp(L_n) C_n S0^T + sum_{t in anc(n)} exp(L_n - L_t) d_t (C_n . B_t) x_t  (+ D x_n) (* silu z_n)
    S_P  = exp(L_P) S0 + sum_{j < P} exp(L_P - L_j) d_j x_j B_j^T                  (the fold)

Two launches, each program one [Ns, BLOCK_P] tile of S0^T of HEADS_PER_PROGRAM heads of a group of
one row (what the group's heads share, once; the fold's programs fewer heads): first the fold of the
rows that fold (pending > 0 and pending + T > capacity, gdn_ring_verify.verify_rule; a flush: every
row with pending tokens, or with num_draft those) -- one [Ns, P] x [P, BLOCK_P] product written over
the tile it read -- then every row's verify, a folded row's from its new checkpoint with nothing
pending: C S0^T products with the stack's C (zero but at the drafts) over chunks of state rows,
their loads pipelined through shared memory, the intra-chunk term one [stack, stack] x [stack,
BLOCK_P] product. For a float32 checkpoint the fold multiplies in 3xTF32 (fold_precision_for: it
must keep float32's accuracy over many folds), the verify's C S0^T in tf32 with operands rounded to
nearest and its other products in 3xTF32 (every product in tf32 missed mamba2_verify's tolerance,
2e-3 x max |y|, over the 1,000-step test). The verify's programs then move the folded rows' conv
windows (FUSED_WINDOW; else gdn_ring_verify's window launch, mixer-free, last).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (KernelCall, cdiv, floored_log_decay, gdc_launch_dependents, gdc_wait, interpreted,
                      next_power_of_2, pdl_device, planned_calls, programs_walking)
from .gdn_ring_verify import (_ring_row, flush_cursor_call, flush_rule, fold_precision_for, verify_rule,
                              pending_conv, window_after, window_call)
from .gdn_verify import MIN_DOT, VERIFY_PROGRAMS, _dot, spread_block
from .mamba2_verify import _step_sizes, state_chunk
from .ring_conv import check_ring_grid

# (The module constants below, as gdn_ring_verify's, are read when a launch is built: an eager plan
# keeps what they were when its signature was first called.)
# Head-dim rows per tile (fewer for small batches: gdn_verify.spread_block), warps, and the heads of
# a group a program takes (group_share): the H200 sweep's fastest (docs/benchmarks.md, "Ring").
RING_BLOCK_P = 64
MAMBA2_RING_WARPS = 4
RING_STAGES = 1
RING_VERIFY_MAXNREG = 128  # the verify launch's register cap (four programs an SM)
# The fold launch's heads a program, at most (a divisor of a group's): few, since a step's folding
# rows are few (each acceptance its own) and a program walking a group's 16 heads left most SMs idle.
FOLD_HEADS_PER_PROGRAM = 4
FOLD_MAXNREG = 168  # the fold launch's register cap (0: none): three programs an SM
# The verify's C S0^T over chunks of RING_CHUNK_N state rows, RING_CHUNK_STAGES in flight (0: whole)
RING_CHUNK_N = 32
RING_CHUNK_STAGES = 3
# The folded rows' conv windows moved by the verify launch's programs instead of a launch of their own
FUSED_WINDOW = True
# The verify's loop over a program's heads and its loop over their state chunks flattened into one
# pipelined loop (tl.range's flatten): the chunks' loads never drain between heads (not yet timed
# on a GPU)
FLATTEN_HEADS = False
# The folding rows' drafts verified by the folds' launch, from the tile each program folds and stores
# (read back from L2: the verify kernel's ROWS 1), the others' by a launch of their own: a fold
# step's state passes 3 -> 2, but whole steps without the due flush slower than with it
# (docs/benchmarks.md, Rejected designs)
FOLD_VERIFY = False
# With FOLD_VERIFY (and the windows' own launch): the others' verify a programmatic dependent launch
# of the folds' (sm_90+), running beside their latency-bound wave (slower steps too)
PDL = False
# The verify's C S0^T in tf32, its operands rounded to nearest, for a float32 checkpoint (its other
# products and the fold's stay in 3xTF32: tf32 ones missed 2e-3 x max |y| over the 1,000-step test).
STATE_PRECISION = "tf32"


def group_share(tiles_per_head: int, num_heads: int, num_groups: int) -> int:
    """Heads per program: the most of a group's heads (a divisor of H / G) that still leaves
    VERIFY_PROGRAMS programs, each head's ``tiles_per_head`` tiles (rows x layers x column blocks)."""
    per_group = num_heads // num_groups
    for share in range(per_group, 1, -1):
        if per_group % share == 0 and tiles_per_head * (num_heads // share) >= VERIFY_PROGRAMS:
            return share
    return 1


@triton.jit
def _program_tile(program, HEAD_DIM: tl.constexpr, BLOCK_P: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr,
                  NUM_HEADS: tl.constexpr, NUM_GROUPS: tl.constexpr):
    """(first head, its group, the tile's head-dim rows pp, pp's mask, the tile's column block) of
    program ``program`` along the grid's first axis."""
    P_BLOCKS: tl.constexpr = (HEAD_DIM + BLOCK_P - 1) // BLOCK_P
    first_head = (program // P_BLOCKS) * HEADS_PER_PROGRAM
    p_block = program % P_BLOCKS
    pp = p_block * BLOCK_P + tl.arange(0, BLOCK_P)
    return first_head, first_head // (NUM_HEADS // NUM_GROUPS), pp, pp < HEAD_DIM, p_block


@triton.jit
def _folded_tile(state_t, b, x, step, a, pending_rows, FOLD_PRECISION: tl.constexpr):
    """S_P^T of one head's tile: S0^T [Ns, P] after the pending tokens (rows ``pending_rows`` of b
    [T, Ns], x [T, P], their step sizes ``step`` [T]; a = the head's A), in float32."""
    logs = floored_log_decay(step * a.to(tl.float32))
    cumulative = tl.cumsum(logs, axis=0)  # L_j (zero beyond the pending tokens)
    total = tl.sum(logs, axis=0)  # L_P
    weights = tl.where(pending_rows, tl.exp(total - cumulative) * step, 0.0)
    return tl.exp(total) * state_t + _dot(tl.trans(b * weights[:, None]), x, FOLD_PRECISION)


@triton.jit
def _mamba2_ring_fold_kernel(
    a_ptr, ssm_ptr, conv_ptr, rows_ptr, gates_ptr, cursor_ptr, weight_ptr, bias_ptr, ring_slots_ptr, state_slots_ptr,
    layer, num_state_slots, num_ring_slots,
    a_stride_layer, a_stride,
    ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_p, ssm_stride_n,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    rows_stride_layer, rows_stride_slot, rows_stride_row, rows_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_row, gates_stride_head,
    cursor_stride_slot, cursor_stride_field, weight_stride_layer, weight_stride_dim, weight_stride_tap,
    bias_stride_layer, bias_stride, ring_slots_stride, state_slots_stride,
    NUM_NODES: tl.constexpr, RING_ROWS: tl.constexpr, MAX_PENDING: tl.constexpr, FOLD_ABOVE: tl.constexpr,
    STACK: tl.constexpr, KERNEL_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_GROUPS: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_STATE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, FOLD_PRECISION: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr,
    TILES_A_PROGRAM: tl.constexpr,
):
    """The fold of layer ``layer`` + program_id(2): a program of a row that folds (live, pending > 0
    and pending + N > FOLD_ABOVE) stores its tiles after the pending tokens, S_P^T over S0^T; the
    others return at once. A row is live when both its slots are in range and its cursor a ring
    position (pending <= MAX_PENDING). With TILES_A_PROGRAM > 1 a program folds that many of its
    row's program tiles, program_id(0) * TILES_A_PROGRAM onwards, one after another: fewer programs
    where few rows fold (all of a row's, after a due flush: its launch is a wave)."""
    if TILES_A_PROGRAM == 1:
        tile = _program_tile(tl.program_id(0), HEAD_DIM, BLOCK_P, HEADS_PER_PROGRAM, NUM_HEADS, NUM_GROUPS)
    row = tl.program_id(1).to(tl.int64)
    layer = (layer + tl.program_id(2)).to(tl.int64)
    ring, slot, start, pending, live = _ring_row(row, ring_slots_ptr, state_slots_ptr, cursor_ptr, num_state_slots,
                                                 num_ring_slots, ring_slots_stride, state_slots_stride,
                                                 cursor_stride_slot, cursor_stride_field, RING_ROWS, MAX_PENDING)
    if live & (pending > 0) & (pending + NUM_NODES > FOLD_ABOVE):
        first = start.to(tl.int32)
        count = pending.to(tl.int32)
        weight_ptr += layer * weight_stride_layer
        bias_ptr += layer * bias_stride_layer
        rows_base = rows_ptr + layer * rows_stride_layer + ring * rows_stride_slot
        window_base = conv_ptr + layer * conv_stride_layer + slot * conv_stride_slot
        gates_row = gates_ptr + layer * gates_stride_layer + ring * gates_stride_slot
        for t in range(TILES_A_PROGRAM):
            if TILES_A_PROGRAM > 1:
                tile = _program_tile(tl.program_id(0) * TILES_A_PROGRAM + t, HEAD_DIM, BLOCK_P, HEADS_PER_PROGRAM,
                                     NUM_HEADS, NUM_GROUPS)
            _fold_program_tile(tile, a_ptr, ssm_ptr, rows_base, window_base, weight_ptr, bias_ptr, gates_row, layer,
                               slot, first, count, a_stride_layer, a_stride, ssm_stride_layer, ssm_stride_slot,
                               ssm_stride_head, ssm_stride_p, ssm_stride_n, conv_stride_dim, conv_stride_win,
                               rows_stride_row, rows_stride_dim, gates_stride_row, gates_stride_head,
                               weight_stride_dim, weight_stride_tap, bias_stride, RING_ROWS, STACK, KERNEL_SIZE,
                               NUM_HEADS, NUM_GROUPS, HEAD_DIM, D_STATE, BLOCK_P, BLOCK_N, HAS_BIAS, FOLD_PRECISION,
                               HEADS_PER_PROGRAM)


@triton.jit
def _fold_program_tile(tile, a_ptr, ssm_ptr, rows_base, window_base, weight_ptr, bias_ptr, gates_row, layer, slot,
                       first, count, a_stride_layer, a_stride, ssm_stride_layer, ssm_stride_slot, ssm_stride_head,
                       ssm_stride_p, ssm_stride_n, conv_stride_dim, conv_stride_win, rows_stride_row, rows_stride_dim,
                       gates_stride_row, gates_stride_head, weight_stride_dim, weight_stride_tap, bias_stride,
                       RING_ROWS: tl.constexpr, STACK: tl.constexpr, KERNEL_SIZE: tl.constexpr,
                       NUM_HEADS: tl.constexpr, NUM_GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr,
                       D_STATE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
                       FOLD_PRECISION: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr):
    """The fold of program tile ``tile`` (_program_tile's) of a row that folds (its first pending
    token's ring row ``first``, ``count`` pending): each of its heads' tiles after the pending
    tokens, stored."""
    first_head, group, pp, p_ok, p_block = tile
    nn = tl.arange(0, BLOCK_N)
    n_ok = nn < D_STATE
    j = tl.arange(0, STACK)
    j_pending = j < count
    b = pending_conv(rows_base, window_base, weight_ptr, bias_ptr, j, j_pending, first, count,
                     NUM_HEADS * HEAD_DIM + group * D_STATE + nn, n_ok, rows_stride_row, rows_stride_dim,
                     conv_stride_dim, conv_stride_win, weight_stride_dim, weight_stride_tap, bias_stride, RING_ROWS,
                     KERNEL_SIZE, HAS_BIAS)
    ring_j = (first + j) % RING_ROWS
    tile_ok = n_ok[:, None] & p_ok[None, :]
    for head in range(first_head, first_head + HEADS_PER_PROGRAM):
        state = (ssm_ptr + layer * ssm_stride_layer + slot * ssm_stride_slot + head * ssm_stride_head
                 + (nn * ssm_stride_n)[:, None] + (pp * ssm_stride_p)[None, :])
        state_t = tl.load(state, mask=tile_ok, other=0.0).to(tl.float32)  # S0^T, the long read first
        x = pending_conv(rows_base, window_base, weight_ptr, bias_ptr, j, j_pending, first, count,
                         head * HEAD_DIM + pp, p_ok, rows_stride_row, rows_stride_dim, conv_stride_dim,
                         conv_stride_win, weight_stride_dim, weight_stride_tap, bias_stride, RING_ROWS, KERNEL_SIZE,
                         HAS_BIAS)
        step = tl.load(gates_row + head * gates_stride_head + ring_j * gates_stride_row, mask=j_pending,
                       other=0.0).to(tl.float32)
        folded = _folded_tile(state_t, b, x, step, tl.load(a_ptr + layer * a_stride_layer + head * a_stride),
                              j_pending, FOLD_PRECISION)
        tl.store(state, folded.to(ssm_ptr.dtype.element_ty), mask=tile_ok)


@triton.jit
def _mamba2_ring_verify_kernel(
    out_ptr, x_ptr, dt_ptr, b_ptr, c_ptr, z_ptr, a_ptr, d_ptr, dt_bias_ptr, ssm_ptr, conv_ptr, rows_ptr, gates_ptr,
    cursor_ptr, weight_ptr, bias_ptr, ring_slots_ptr, state_slots_ptr, parents_ptr,
    layer, num_state_slots, num_ring_slots,
    out_stride_row, out_stride_node, out_stride_head, out_stride_p,
    x_stride_row, x_stride_node, x_stride_head, x_stride_p,
    dt_stride_row, dt_stride_node, dt_stride_head,
    b_stride_row, b_stride_node, b_stride_group, b_stride_n,
    c_stride_row, c_stride_node, c_stride_group, c_stride_n,
    z_stride_row, z_stride_node, z_stride_head, z_stride_p,
    a_stride, d_stride, dt_bias_stride,
    ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_p, ssm_stride_n,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    rows_stride_layer, rows_stride_slot, rows_stride_row, rows_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_row, gates_stride_head,
    cursor_stride_slot, cursor_stride_field, weight_stride_dim, weight_stride_tap, bias_stride,
    ring_slots_stride, state_slots_stride, parents_stride_row, parents_stride_node,
    NUM_NODES: tl.constexpr, RING_ROWS: tl.constexpr, MAX_PENDING: tl.constexpr, FOLD_ABOVE: tl.constexpr,
    STACK: tl.constexpr, KERNEL_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_GROUPS: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_STATE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, TREE: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, STATE_PRECISION: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr,
    CHUNK_N: tl.constexpr, CHUNK_STAGES: tl.constexpr, FUSED_WINDOW: tl.constexpr, WIDTH: tl.constexpr,
    WINDOW: tl.constexpr, FLATTEN: tl.constexpr, ROWS: tl.constexpr, FOLD_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """The drafts' outputs of layer ``layer`` and their d beside their ring rows. A row that folds
    (the fold launch, before this one, brought its checkpoint past the pending tokens) is verified
    from start + pending with nothing pending; with FUSED_WINDOW its programs then move its conv
    window past the folded tokens (nothing in this launch reads a folded row's window), each its
    heads' x channels, a group's first program its B and C. A row is left alone unless live
    (_mamba2_ring_fold_kernel); its outputs also need every parent link in [-1, n-1].
    ROWS 0: every row, as above. ROWS 1: the rows that fold only, with no fold launch before: each
    head's tile folded here at FOLD_PRECISION and stored, then read back (from L2) for the drafts'
    verify as ROWS 0 reads a folded row's (no FLATTEN: a head's reads would start before its fold).
    ROWS 2: the rows that do not fold only (beside a ROWS 1 launch). With PDL (sm_90+) a ROWS 1
    launch lets the next launch start at once, and a ROWS 2 launch -- that next one, a
    programmatic dependent launch reading nothing the folds write -- has its last program wait for
    the folds before ending, so that what follows both sees both."""
    if PDL and ROWS == 1:
        gdc_launch_dependents()
    first_head, group, pp, p_ok, p_block = _program_tile(tl.program_id(0), HEAD_DIM, BLOCK_P, HEADS_PER_PROGRAM,
                                                         NUM_HEADS, NUM_GROUPS)
    row = tl.program_id(1).to(tl.int64)
    layer = (layer + tl.program_id(2)).to(tl.int64)  # (one layer: a grid of depth 1)
    ring, slot, start, pending, live = _ring_row(row, ring_slots_ptr, state_slots_ptr, cursor_ptr, num_state_slots,
                                                 num_ring_slots, ring_slots_stride, state_slots_stride,
                                                 cursor_stride_slot, cursor_stride_field, RING_ROWS, MAX_PENDING)
    fold = live & (pending > 0) & (pending + NUM_NODES > FOLD_ABOVE)
    if ROWS == 1:
        live = fold
        if not fold:  # (most rows: none of this launch's work, not even the stack's)
            return
    elif ROWS == 2:
        live = live & ~fold
    folded_start, folded = start, pending  # (the window's move, with FUSED_WINDOW; the folds of ROWS 1)
    start = tl.where(fold, (start + pending) % RING_ROWS, start).to(tl.int32)
    pending = tl.where(fold, 0, pending).to(tl.int32)

    # the stack: pending tokens (rows < pending), then the drafts (row pending + n: draft n)
    s = tl.arange(0, STACK)
    s_pending = s < pending  # (pending is 0 for a row left alone)
    s_draft = s - pending
    s_drafted = tl.where(live, (s_draft >= 0) & (s_draft < NUM_NODES), False)
    sd = tl.where(s_drafted, s_draft, 0).to(tl.int64)
    nn = tl.arange(0, BLOCK_N)
    n_ok = nn < D_STATE
    rows_base = rows_ptr + layer * rows_stride_layer + ring * rows_stride_slot
    window_base = conv_ptr + layer * conv_stride_layer + slot * conv_stride_slot
    b = tl.load(b_ptr + row * b_stride_row + group * b_stride_group + (sd * b_stride_node)[:, None]
                + (nn * b_stride_n)[None, :], mask=s_drafted[:, None] & n_ok[None, :], other=0.0).to(tl.float32)
    if pending > 0:  # (none in a row that just folded, nor in verify-only steps)
        b_pending = pending_conv(rows_base, window_base, weight_ptr, bias_ptr, s, s_pending, start, pending,
                                 NUM_HEADS * HEAD_DIM + group * D_STATE + nn, n_ok, rows_stride_row, rows_stride_dim,
                                 conv_stride_dim, conv_stride_win, weight_stride_dim, weight_stride_tap, bias_stride,
                                 RING_ROWS, KERNEL_SIZE, HAS_BIAS)
        b = tl.where(s_pending[:, None], b_pending, b)
    c_base = c_ptr + row * c_stride_row + group * c_stride_group
    c = tl.load(c_base + (sd * c_stride_node)[:, None] + (nn * c_stride_n)[None, :],
                mask=s_drafted[:, None] & n_ok[None, :], other=0.0).to(tl.float32)
    scores = _dot(c, tl.trans(b), PRECISION)  # C_r . B_t [STACK, STACK] (zero in the pending rows)

    if TREE:  # path[r, t]: draft t on draft r's root path
        links = parents_ptr + row * parents_stride_row
        node_ok = s < NUM_NODES
        link = tl.load(links + tl.where(node_ok, s, 0) * parents_stride_node, mask=node_ok, other=-1)
        links_ok = tl.sum(tl.where(node_ok & ((link < -1) | (link >= s)), 1, 0)) == 0
        up = tl.where(s_drafted, s_draft, -1)
        path = (up[:, None] == s_draft[None, :]) & s_drafted[None, :]
        for _ in tl.static_range(NUM_NODES - 1):  # the links looked up in registers (link: node n's at n)
            climbing = tl.where(links_ok, up >= 0, False)
            up = tl.where(climbing, tl.gather(link, tl.where(climbing, up, 0).to(tl.int32), 0), -1)
            path |= (up[:, None] == s_draft[None, :]) & (up >= 0)[:, None] & s_drafted[None, :]
        ancestry = (s_pending[None, :] & (s_drafted[:, None] | (s_pending[:, None] & (s[None, :] <= s[:, None])))
                    | (s_drafted[:, None] & path))
    else:  # a chain: the stack's real rows up to r
        links_ok = live
        real = s_pending | s_drafted
        ancestry = real[:, None] & real[None, :] & (s[None, :] <= s[:, None])

    gates_row = gates_ptr + layer * gates_stride_layer + ring * gates_stride_slot
    ring_s = (start + s) % RING_ROWS
    # ROWS 1: the folds' keys, the pending tokens' B from the old cursor (a group's, once), in two
    # halves of the state rows: a head's tile is folded a half at a time (its registers, not the verify's)
    HALF_N: tl.constexpr = BLOCK_N // 2 if BLOCK_N >= 32 else BLOCK_N  # (tl.dot: 16 rows or more)
    nh = tl.arange(0, HALF_N)
    if ROWS == 1:
        b_fold_lo = pending_conv(rows_base, window_base, weight_ptr, bias_ptr, s, s < folded, folded_start.to(tl.int32),
                                 folded.to(tl.int32), NUM_HEADS * HEAD_DIM + group * D_STATE + nh, nh < D_STATE,
                                 rows_stride_row, rows_stride_dim, conv_stride_dim, conv_stride_win, weight_stride_dim,
                                 weight_stride_tap, bias_stride, RING_ROWS, KERNEL_SIZE, HAS_BIAS)
        b_fold_hi = b_fold_lo  # (no second half below 32 rows)
        if HALF_N < BLOCK_N:
            b_fold_hi = pending_conv(rows_base, window_base, weight_ptr, bias_ptr, s, s < folded,
                                     folded_start.to(tl.int32), folded.to(tl.int32),
                                     NUM_HEADS * HEAD_DIM + group * D_STATE + HALF_N + nh, HALF_N + nh < D_STATE,
                                     rows_stride_row, rows_stride_dim, conv_stride_dim, conv_stride_win,
                                     weight_stride_dim, weight_stride_tap, bias_stride, RING_ROWS, KERNEL_SIZE,
                                     HAS_BIAS)
    out_ok = tl.where(links_ok, s_drafted[:, None] & p_ok[None, :], False)
    tile_ok = tl.where(live, n_ok[:, None] & p_ok[None, :], False)
    # with FLATTEN the heads' and their chunks' loops one pipelined loop: the next head's first chunks
    # in flight while this one's outputs are computed
    # (ROWS 2: no head at all in a row the ROWS 1 launch took; its programs still reach the windows' move)
    heads = HEADS_PER_PROGRAM * live.to(tl.int32) if ROWS == 2 else HEADS_PER_PROGRAM
    for head in tl.range(first_head, first_head + heads, flatten=FLATTEN):
        state_base = ssm_ptr + layer * ssm_stride_layer + slot * ssm_stride_slot + head * ssm_stride_head
        if ROWS == 1:  # the tile folded first and stored: the verify below reads the new checkpoint back
            old_rows = s < folded
            x_fold = pending_conv(rows_base, window_base, weight_ptr, bias_ptr, s, old_rows, folded_start.to(tl.int32),
                                  folded.to(tl.int32), head * HEAD_DIM + pp, p_ok, rows_stride_row, rows_stride_dim,
                                  conv_stride_dim, conv_stride_win, weight_stride_dim, weight_stride_tap, bias_stride,
                                  RING_ROWS, KERNEL_SIZE, HAS_BIAS)
            step_fold = tl.load(gates_row + head * gates_stride_head
                                + ((folded_start + s) % RING_ROWS) * gates_stride_row, mask=old_rows,
                                other=0.0).to(tl.float32)
            for half in tl.static_range(BLOCK_N // HALF_N):
                nf = half * HALF_N + nh
                tile = state_base + (nf * ssm_stride_n)[:, None] + (pp * ssm_stride_p)[None, :]
                half_ok = tl.where(live, (nf < D_STATE)[:, None] & p_ok[None, :], False)
                folded_t = _folded_tile(tl.load(tile, mask=half_ok, other=0.0).to(tl.float32),
                                        b_fold_lo if half == 0 else b_fold_hi, x_fold, step_fold,
                                        tl.load(a_ptr + head * a_stride), old_rows, FOLD_PRECISION)
                tl.store(tile, folded_t.to(ssm_ptr.dtype.element_ty), mask=half_ok)
            tl.debug_barrier()  # every thread's part stored before any thread reads the tile back (from L2)
        gates_base = gates_row + head * gates_stride_head
        # the head's x and d (a pending token's: its conv) before its state's loads, their latency under the state's
        x = tl.load(x_ptr + row * x_stride_row + head * x_stride_head + (sd * x_stride_node)[:, None]
                    + (pp * x_stride_p)[None, :], mask=s_drafted[:, None] & p_ok[None, :], other=0.0).to(tl.float32)
        dt_base = dt_ptr + row * dt_stride_row + head * dt_stride_head
        step = _step_sizes(dt_base, sd, s_drafted, dt_stride_node, dt_bias_ptr + head * dt_bias_stride,
                           HAS_DT_BIAS, DT_SOFTPLUS)
        step = tl.where(s_drafted, step, 0.0)
        if pending > 0:
            x_pending = pending_conv(rows_base, window_base, weight_ptr, bias_ptr, s, s_pending, start, pending,
                                     head * HEAD_DIM + pp, p_ok, rows_stride_row, rows_stride_dim, conv_stride_dim,
                                     conv_stride_win, weight_stride_dim, weight_stride_tap, bias_stride, RING_ROWS,
                                     KERNEL_SIZE, HAS_BIAS)
            x = tl.where(s_pending[:, None], x_pending, x)
            step_ring = tl.load(gates_base + ring_s * gates_stride_row, mask=s_pending, other=0.0).to(tl.float32)
            step = tl.where(s_pending, step_ring, step)
        # S0^T: whole, or C S0^T now over CHUNK_N state rows at a time, their loads pipelined through
        # shared memory (cp.async) rather than held in registers
        if CHUNK_N == 0:
            state_t = tl.load(state_base + (nn * ssm_stride_n)[:, None] + (pp * ssm_stride_p)[None, :], mask=tile_ok,
                              other=0.0).to(tl.float32)
        else:
            read = tl.zeros([STACK, BLOCK_P], tl.float32)
            for n0 in tl.range(0, BLOCK_N, CHUNK_N, num_stages=CHUNK_STAGES):
                nc = n0 + tl.arange(0, CHUNK_N)
                chunk = tl.load(state_base + (nc * ssm_stride_n)[:, None] + (pp * ssm_stride_p)[None, :],
                                mask=tl.where(live, (nc < D_STATE)[:, None] & p_ok[None, :], False), other=0.0)
                c_chunk = tl.load(c_base + (sd * c_stride_node)[:, None] + (nc * c_stride_n)[None, :],
                                  mask=s_drafted[:, None] & (nc < D_STATE)[None, :], other=0.0)
                read += _dot(c_chunk.to(tl.float32), chunk.to(tl.float32), STATE_PRECISION)

        logs = floored_log_decay(step * tl.load(a_ptr + head * a_stride).to(tl.float32))
        cumulative = tl.sum(tl.where(ancestry, logs[None, :], 0.0), axis=1)  # L_r
        decay = tl.where(ancestry, tl.exp(tl.where(ancestry, cumulative[:, None] - cumulative[None, :], 0.0)), 0.0)
        mix = decay * step[None, :] * scores  # M [STACK, STACK]
        if CHUNK_N == 0:
            read = _dot(c, state_t, STATE_PRECISION)  # C S0^T (a tf32 state rounded to nearest: unbiased)
        y = tl.exp(cumulative)[:, None] * read + _dot(mix, x, PRECISION)
        if HAS_D:
            y += tl.load(d_ptr + head * d_stride).to(tl.float32) * x  # (x: the drafts' own in their rows)
        if HAS_Z:
            gate = tl.load(z_ptr + row * z_stride_row + head * z_stride_head + (sd * z_stride_node)[:, None]
                           + (pp * z_stride_p)[None, :], mask=s_drafted[:, None] & p_ok[None, :], other=0.0)
            gate = gate.to(tl.float32)
            y *= gate / (1.0 + tl.exp(-gate))
        dst = (out_ptr + row * out_stride_row + head * out_stride_head + (sd * out_stride_node)[:, None]
               + (pp * out_stride_p)[None, :])
        tl.store(dst, y.to(out_ptr.dtype.element_ty), mask=out_ok)
        tl.store(gates_base + ring_s * gates_stride_row, step, mask=s_drafted & (p_block == 0))

    if FUSED_WINDOW:
        if fold:
            for head in range(first_head, first_head + HEADS_PER_PROGRAM):
                chan = head * HEAD_DIM + pp
                window_after(window_base + chan * conv_stride_dim, rows_base + chan * rows_stride_dim, p_ok,
                             folded_start, folded, conv_stride_win, rows_stride_row, RING_ROWS, WIDTH, WINDOW)
            if (first_head % (NUM_HEADS // NUM_GROUPS) == 0) & (p_block == 0):
                for part in tl.static_range(2):  # B, then C
                    chan = NUM_HEADS * HEAD_DIM + (part * NUM_GROUPS + group) * D_STATE + nn
                    window_after(window_base + chan * conv_stride_dim, rows_base + chan * rows_stride_dim, n_ok,
                                 folded_start, folded, conv_stride_win, rows_stride_row, RING_ROWS, WIDTH, WINDOW)
    if PDL and ROWS == 2:
        last = ((tl.program_id(0) == tl.num_programs(0) - 1) & (tl.program_id(1) == tl.num_programs(1) - 1)
                & (tl.program_id(2) == tl.num_programs(2) - 1))
        if last:  # (this launch cannot end before this program, nor this program before the folds' launch)
            gdc_wait()


def state_precision_for(ssm) -> str:
    """The verify's C S0^T's precision by default: STATE_PRECISION for a float32 checkpoint, else
    fold_precision_for's."""
    return STATE_PRECISION if ssm.dtype == torch.float32 else fold_precision_for(ssm)


def _tiling(num_rows, num_layers, heads, block_p, heads_per_program):
    """(block_p, heads_per_program, grid) of the ring's Mamba2 launches over rows x layers."""
    num_heads, head_dim, num_groups, _ = heads
    check_ring_grid(num_rows, num_layers)
    if block_p is None:
        block_p = spread_block(RING_BLOCK_P, num_rows, num_heads, head_dim)
    if heads_per_program is None:
        heads_per_program = group_share(num_rows * num_layers * cdiv(head_dim, block_p), num_heads, num_groups)
    elif (num_heads // num_groups) % heads_per_program:
        raise ValueError(f"heads_per_program must divide the {num_heads // num_groups} heads of a group, "
                         f"got {heads_per_program}")
    return block_p, heads_per_program, (num_heads // heads_per_program * cdiv(head_dim, block_p), num_rows, num_layers)


def _fold_call(ssm, conv, rows, gates, cursor, weight, bias, A, ring_slots, state_slots, *, layer, num_layers,
               num_nodes, heads, max_pending, fold_above, block_p=None, num_warps=None, precision=None,
               fold_precision=None, heads_per_program=None, num_stages=None, maxnreg=None, tiles_a_program=1):
    """The fold launch over rows x layers layer .. layer + num_layers - 1; weight [L, dim, K], bias
    [L, dim] and A [L, H] every layer's (a flush), or one layer's [dim, K], [dim], [H] (a verify).
    maxnreg: a register cap (None: FOLD_MAXNREG; 0: none); a program folding tiles_a_program of its
    row's program tiles one after another (0: all of them, one program a row and layer). num_warps,
    num_stages None: MAMBA2_RING_WARPS, RING_STAGES."""
    num_heads, head_dim, num_groups, d_state = heads
    block_p, share, grid = _tiling(ring_slots.shape[0], num_layers, heads, block_p, heads_per_program)
    tiles_a_program, programs = programs_walking("mamba2_ring_verify", grid[0], tiles_a_program)
    grid = (programs, *grid[1:])
    stacked = weight.dim() == 3
    layered = (lambda t: t.stride()) if stacked else (lambda t: (0, *t.stride()))
    bias_strides = (0, 0) if bias is None else layered(bias)
    gates_strides = (*gates.stride()[:3], gates.stride(4))
    scalars = (layer, ssm.shape[1], rows.shape[1], *layered(A), *ssm.stride(), *conv.stride(),
               *rows.stride(), *gates_strides, *cursor.stride(), *layered(weight), *bias_strides,
               ring_slots.stride(0), state_slots.stride(0))
    ring_rows = rows.shape[2]
    constexprs = dict(
        NUM_NODES=num_nodes, RING_ROWS=ring_rows, MAX_PENDING=max_pending, FOLD_ABOVE=fold_above,
        STACK=max(MIN_DOT, next_power_of_2(max_pending)), KERNEL_SIZE=conv.shape[3] + 1, NUM_HEADS=num_heads,
        NUM_GROUPS=num_groups, HEAD_DIM=head_dim, D_STATE=d_state, BLOCK_P=block_p,
        BLOCK_N=max(MIN_DOT, next_power_of_2(d_state)), HAS_BIAS=bias is not None,
        FOLD_PRECISION=fold_precision or precision or fold_precision_for(ssm), HEADS_PER_PROGRAM=share,
        TILES_A_PROGRAM=tiles_a_program, num_warps=num_warps or MAMBA2_RING_WARPS,
        num_stages=RING_STAGES if num_stages is None else num_stages)
    cap = FOLD_MAXNREG if maxnreg is None else maxnreg
    if cap:
        constexprs["maxnreg"] = cap
    tensors = (A, ssm, conv, rows, gates, cursor, weight, ssm if bias is None else bias, ring_slots, state_slots)
    return KernelCall(_mamba2_ring_fold_kernel, grid, tensors, scalars, constexprs)


def _verify_call(out, x, dt, A, B, C, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots, layer,
                 parents, D, z, dt_bias, *, dt_softplus, heads, max_pending, fold_above, block_p=None,
                 num_warps=None, precision=None, state_precision=None, heads_per_program=None, num_stages=None,
                 maxnreg=None, chunk_n=None, chunk_stages=None, fused_window=False, flatten=None, row_kind=0,
                 fold_precision=None, pdl=False):
    """The verify launch over the rows of layer ``layer`` (weight [dim, K], bias [dim], A [H]: its own).
    chunk_n: C S0^T over chunks of that many state rows (0: the whole tile), chunk_stages of them
    in flight; fused_window: the folded rows' conv windows moved here too; flatten: the heads' loop and
    the chunks' one pipelined loop (None: FLATTEN_HEADS; never with row_kind 1); row_kind,
    fold_precision and pdl: the kernel's ROWS (1: the folding rows, folded here), FOLD_PRECISION
    (None: fold_precision_for's) and PDL (a ROWS 2 launch then a programmatic dependent one).
    None: the module's constant (read here, at each launch built: MAMBA2_RING_WARPS, RING_STAGES,
    RING_VERIFY_MAXNREG -- 0, no cap --, RING_CHUNK_N, RING_CHUNK_STAGES)."""
    if row_kind == 1 and fused_window:  # (its windows would move while other programs' folds read them)
        raise ValueError("mamba2_ring_verify: the folds' verify launch (row_kind 1) never moves windows")
    num_rows, num_nodes, num_heads, head_dim = x.shape
    _, _, num_groups, d_state = heads
    block_p, share, grid = _tiling(num_rows, 1, heads, block_p, heads_per_program)
    num_warps = num_warps or MAMBA2_RING_WARPS
    num_stages = RING_STAGES if num_stages is None else num_stages
    maxnreg = RING_VERIFY_MAXNREG if maxnreg is None else maxnreg
    chunk_stages = RING_CHUNK_STAGES if chunk_stages is None else chunk_stages
    block_n = max(MIN_DOT, next_power_of_2(d_state))
    chunk_n = state_chunk(RING_CHUNK_N if chunk_n is None else chunk_n, block_n, "mamba2_ring_verify")
    strides = lambda t, n: (0,) * n if t is None else t.stride()  # noqa: E731 -- absent: never read
    scalars = (layer, ssm.shape[1], rows.shape[1], *out.stride(), *x.stride(), *dt.stride(), *B.stride(), *C.stride(),
               *strides(z, 4), A.stride(0), *strides(D, 1), *strides(dt_bias, 1),
               *ssm.stride(), *conv.stride(), *rows.stride(), *gates.stride()[:3], gates.stride(4), *cursor.stride(),
               *weight.stride(), 0 if bias is None else bias.stride(0), ring_slots.stride(0), state_slots.stride(0),
               *((0, 0) if parents is None else parents.stride()))
    constexprs = dict(
        NUM_NODES=num_nodes, RING_ROWS=rows.shape[2], MAX_PENDING=max_pending, FOLD_ABOVE=fold_above,
        STACK=max(MIN_DOT, next_power_of_2(max(fold_above, num_nodes))), KERNEL_SIZE=conv.shape[3] + 1,
        NUM_HEADS=num_heads, NUM_GROUPS=num_groups, HEAD_DIM=head_dim, D_STATE=d_state, BLOCK_P=block_p,
        BLOCK_N=block_n, TREE=parents is not None, HAS_D=D is not None,
        HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=bool(dt_softplus), HAS_BIAS=bias is not None,
        PRECISION=precision or fold_precision_for(ssm),
        STATE_PRECISION=state_precision or precision or state_precision_for(ssm),
        HEADS_PER_PROGRAM=share, CHUNK_N=chunk_n, CHUNK_STAGES=chunk_stages, FUSED_WINDOW=bool(fused_window),
        WIDTH=conv.shape[3], WINDOW=max(2, next_power_of_2(conv.shape[3])),
        FLATTEN=bool(FLATTEN_HEADS if flatten is None else flatten) and row_kind != 1, ROWS=row_kind,
        FOLD_PRECISION=fold_precision or precision or fold_precision_for(ssm),
        PDL=bool(pdl) and not interpreted(),  # (the interpreter has no griddepcontrol, and runs launches in turn)
        **({"launch_pdl": True} if pdl and row_kind == 2 else {}), num_warps=num_warps,
        num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    tensors = tuple(ssm if t is None else t for t in (  # (an absent tensor: one the kernel never reads)
        out, x, dt, B, C, z, A, D, dt_bias, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots,
        parents))
    return KernelCall(_mamba2_ring_verify_kernel, (grid[0], grid[1], 1), tensors, scalars, constexprs)


def _fold_share(num_heads: int, num_groups: int) -> int:
    """The fold launch's heads a program: the largest divisor of a group's heads up to
    FOLD_HEADS_PER_PROGRAM."""
    per_group = num_heads // num_groups
    return max(share for share in range(1, min(FOLD_HEADS_PER_PROGRAM, per_group) + 1) if per_group % share == 0)


def _ring_calls(out, x, dt, A, B, C, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots, layer,
                parents, D, z, dt_bias, *, dt_softplus, **tuning):
    """mamba2_ring_verify's launches -- the folds, every row's verify, then the folded windows' unless
    the verify moves them -- or () with no rows. tuning: block_p, num_warps, heads_per_program,
    num_stages (both launches'), precision (the verify's products, and the fold's without
    fold_precision), state_precision and maxnreg, chunk_n, chunk_stages and flatten (the verify's
    C S0^T's, its register cap (0: none), its chunks of state rows, its heads' and chunks' loops as
    one), fold_precision, fold_warps, fold_heads_per_program, fold_maxnreg and fold_tiles (the fold's;
    fold_tiles: _fold_call's tiles_a_program, 0 -- a row's -- with the op's after_due_flush),
    fused_window (the folded windows moved by the verify launch, no window launch; FUSED_WINDOW),
    tree_depth (the fold rule's T: verify_rule), fold_verify (FOLD_VERIFY: the folding rows' drafts
    verified by the folds' launch -- the verify kernel's ROWS 1 -- from the tile it folds, the
    others' by a ROWS 2 launch), pdl (PDL, with fold_verify, sm_90+: that second launch a
    programmatic dependent of the first; the windows then in their own launch)."""
    num_rows, num_nodes, num_heads, head_dim = x.shape
    if num_rows == 0:
        return ()
    heads = (num_heads, head_dim, B.shape[2], B.shape[3])
    ring_rows = rows.shape[2]
    capacity = verify_rule(ring_rows, num_nodes, tuning.pop("tree_depth", None))
    verify_only = {name: tuning.pop(name) for name in ("state_precision", "maxnreg", "chunk_n", "chunk_stages",
                                                        "flatten")
                   if name in tuning}
    fused = tuning.pop("fused_window", None)  # (its programs cover x, B and C: the rows' whole width)
    fold_precision, fold_warps = tuning.pop("fold_precision", None), tuning.pop("fold_warps", None)  # (the fold's)
    fold_cap = tuning.pop("fold_maxnreg", None)
    fold_tiles = tuning.pop("fold_tiles", 1)
    fold_verify = tuning.pop("fold_verify", None)
    fold_verify = FOLD_VERIFY if fold_verify is None else fold_verify
    pdl = tuning.pop("pdl", None)
    pdl = PDL if pdl is None else pdl
    if pdl and not (fold_verify and fused is not True):
        raise ValueError("mamba2_ring_verify: pdl overlaps the folds' launch with the others' verify: it needs "
                         "fold_verify and the windows' own launch (fused_window=False)")
    fused = (FUSED_WINDOW and not pdl) if fused is None else fused
    pdl = pdl and gdc_wait is not None and pdl_device(ssm)
    fold_share = tuning.pop("fold_heads_per_program", None) or _fold_share(num_heads, heads[2])
    fold_tuning = dict(tuning, fold_precision=fold_precision, heads_per_program=fold_share, maxnreg=fold_cap,
                       num_warps=fold_warps or tuning.get("num_warps", MAMBA2_RING_WARPS))
    verify_args = (out, x, dt, A, B, C, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots, layer,
                   parents, D, z, dt_bias)
    if fold_verify:
        fold_tuning["maxnreg"] = FOLD_MAXNREG if fold_cap is None else fold_cap
        fold = _verify_call(*verify_args, dt_softplus=dt_softplus, heads=heads, **capacity, row_kind=1, pdl=pdl,
                            **{name: value for name, value in verify_only.items()
                               if name in ("state_precision", "chunk_n", "chunk_stages")}, **fold_tuning)
    else:
        fold = _fold_call(ssm, conv, rows, gates, cursor, weight, bias, A, ring_slots, state_slots, layer=layer,
                          num_layers=1, num_nodes=num_nodes, heads=heads, **capacity, **fold_tuning,
                          tiles_a_program=fold_tiles)
    verify = _verify_call(*verify_args, dt_softplus=dt_softplus, heads=heads, **capacity, fused_window=fused,
                          row_kind=2 if fold_verify else 0, pdl=pdl, **verify_only, **tuning)
    if fused:
        return fold, verify
    window = window_call(conv, rows, cursor, ring_slots, state_slots, num_state_slots=ssm.shape[1], layer=layer,
                         num_layers=1, num_nodes=num_nodes, **capacity)
    return fold, verify, window


def launch_mamba2_ring_verify(out, x, dt, A, B, C, ssm, conv, rows, gates, cursor, weight, bias, ring_slots,
                              state_slots, layer, parents, D, z, dt_bias, *, dt_softplus, **tuning):
    """ops_ring_mamba2.mamba2_ring_verify's arguments as its prepare gives them (ssm [L, S, H, P, Ns],
    conv [L, S, dim, K-1], rows [L, M, C, dim], gates [L, M, C, 1, H], cursor [M, 2]; any strides).
    Two launches: the folds, then every row's verify moving the folded conv windows (fused_window=False:
    the windows in a third)."""
    for call in _ring_calls(out, x, dt, A, B, C, ssm, conv, rows, gates, cursor, weight, bias, ring_slots,
                            state_slots, layer, parents, D, z, dt_bias, dt_softplus=dt_softplus, **tuning):
        call.launch()


def planned_mamba2_ring_verify(*args, **kwargs):
    """launch_mamba2_ring_verify fixed for these shapes, strides, dtypes and arguments (_common.planned_calls)."""
    return planned_calls(_ring_calls, *args, **kwargs)


def _flush_calls(ssm, conv, cursor, rows, gates, weight, bias, A, ring_slots, state_slots, *, num_heads, head_dim,
                 n_groups, d_state, num_draft=None, tree_depth=None, **tuning):
    """mamba2_ring_flush's three launches (every layer's fold, every layer's window, the cursors), or
    (): every row with pending tokens, or with num_draft those the next verify would fold
    (gdn_ring_verify.flush_rule; then at the verify's fold tiles, _fold_share). tuning: the fold
    kernel's (_fold_call's; fold_tiles its tiles_a_program)."""
    num_rows = ring_slots.shape[0]
    if num_rows == 0:
        return ()
    ring_rows = rows.shape[2]
    rule = flush_rule(ring_rows, num_draft, tree_depth)
    heads = (num_heads, head_dim, n_groups, d_state)
    if num_draft is not None:  # a step's few folding rows: the verify's fold tiles
        tuning = {"heads_per_program": _fold_share(num_heads, n_groups), **tuning}
    tuning["tiles_a_program"] = tuning.pop("fold_tiles", 1)
    fold = _fold_call(ssm, conv, rows, gates, cursor, weight, bias, A, ring_slots, state_slots, layer=0,
                      num_layers=ssm.shape[0], num_nodes=0, heads=heads, **rule, **tuning)
    window = window_call(conv, rows, cursor, ring_slots, state_slots, num_state_slots=ssm.shape[1], layer=0,
                         num_layers=ssm.shape[0], num_nodes=0, **rule)
    cursors = flush_cursor_call(cursor, ring_slots, state_slots, num_state_slots=ssm.shape[1],
                                num_ring_slots=rows.shape[1], ring_rows=ring_rows, **rule)
    return fold, window, cursors


def launch_mamba2_ring_flush(ssm, conv, cursor, rows, gates, weight, bias, A, ring_slots, state_slots, **kwargs):
    """ops_ring_mamba2.mamba2_ring_flush's arguments as its prepare gives them (weight [L, dim, K], bias
    [L, dim] or None, A [L, H]). Three launches: every layer's fold, every layer's window, the cursors."""
    for call in _flush_calls(ssm, conv, cursor, rows, gates, weight, bias, A, ring_slots, state_slots, **kwargs):
        call.launch()


def planned_mamba2_ring_flush(*args, **kwargs):
    """launch_mamba2_ring_flush fixed for these shapes, strides, dtypes and arguments (_common.planned_calls)."""
    return planned_calls(_flush_calls, *args, **kwargs)
