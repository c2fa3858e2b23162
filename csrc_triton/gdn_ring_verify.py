"""gdn_ring_verify's kernels: the ring's pending tokens and this step's drafts as ONE chunk of the
chunked (UT) form of csrc_triton/gdn_verify.py, from one read of the checkpoint tile.

Per row b and value head h, with (start, pending) = cursor[ring_slots[b]], P = pending, the chunk's
key tokens are the P pending tokens (logical 0..P-1, ring rows (start + j) % C) then the N drafts
(P..P+N-1). A pending token's k and v are recomputed as gdn_commit replays a path token: the
depthwise conv over its last K inputs (ring rows, the checkpoint's window conv_state before the
first), SiLU, split, l2 norm; its g, beta are the ring's gates. Token t's ancestors are the
pending tokens up to t (a pending token) or every pending token plus its tree path (a draft); with
that mask the formulas of gdn_verify's docstring give U for every key token and O for the drafts'
queries. The stack's rows 0..C-1 are key rows (token r; P + N <= C of them real), rows C..C+N-1
the drafts' queries, NODES = C + N rounded up to a power of two (C = capacity + N, the ring's rows).

The fold (pending > 0 and pending + T > capacity, T = N or a tree's depth: verify_rule) stores
the tile after the pending tokens,

    S_P = exp(G_P) S0 + sum_{j < P} exp(G_P - G_j) k_j u_j^T       (G_P = g_0 + ... + g_{P-1})

one product of the key stack's transpose with U, into the same tile the program read: no other
program reads it. The folded conv window is stored by a second launch (_ring_window_kernel): every
program of the row reads the old window for the first pending tokens' conv.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (KernelCall, cdiv, floored_log_decay, next_power_of_2, pdl_device, planned_calls,
                      programs_walking)
from .gdn_verify import (MIN_DOT, _dot, _l2_normalised, _mma_kernel_runs_on, _operand, _unit_lower_inverse,
                         check_mma_tiles, spread_block, stack_rows, state_stages_for)
from .ring_conv import check_ring_grid, ring_row_state

# (The module constants below are read when a launch is built: an eager plan keeps what they were
# when its signature was first called.)
# The Triton kernel (every layer's fold at a flush; a verify the mma kernel cannot take): the fewest
# spills of the offline sm_90 compiles (Triton 3.6) at the default precision.
RING_BLOCK_V = 32
RING_WARPS = 8
WINDOW_BLOCK = 256  # channels per program of the window store
# gdn_ring_verify_mma's kernel, the verify's on sm_80+ with Triton 3.6: four warps side by side over
# 128 columns (its [32, 32] node matrices split between them, none repeated), state rows loaded 32
# at a time; C - T + N <= 32 stack rows (mma_verify_keys). The folds go first, in their own
# launch; then the rows that do not fold, capped at 128 registers (apart: the rows on the stack of
# 16 at the compiler's, about 120; docs/benchmarks.md, "Ring", has the caps' sweep).
RING_MMA_BLOCK_V = 128
RING_MMA_WARPS = 4
RING_MMA_NODES = 32
RING_MMA_SMALL_NODES = 16  # the stack of a row with few pending tokens (pending + 2 N <= 16)
RING_MMA_CHUNK_K = 32
RING_MMA_MAXNREG = (0, 128)  # (the small rows' cap, the other non-folding rows'); 0: none
RING_MMA_FOLD_MAXNREG = 168  # the fold launch's: three programs an SM, a step's few folds in one wave
# The folded rows' conv windows moved by the mma verify launches instead of a launch of their own
RING_MMA_FUSED_WINDOW = True
# The rows on the stack of 16 and the others verified by one launch (each kind its own code, the
# registers of the larger): one launch and one wave tail a layer fewer
RING_MMA_MERGED = True
# The state chunks through shared memory by cp.async, this many in flight from the program's start
# (0: through registers, one chunk ahead; docs/benchmarks.md, "Ring", has the sweep)
RING_MMA_STATE_STAGES = 2
# Small batches' tiles narrower (gdn_verify.spread_block: down to 32 columns while a launch would have
# fewer than VERIFY_PROGRAMS programs), the folds' too: more, shorter programs where a launch is one
# program's latency (not yet timed on a GPU)
RING_MMA_SPREAD = False
# The mma kernel's launches (the verifies', the folds', a due flush's) as programmatic dependents on
# sm_90+: each program's first read after the launch before has finished, its start under that
# launch's tail (gdn_verify's pdl 1: nothing a caller sees changes; 0: plain launches)
RING_MMA_PDL = 1
# The most blocks of rows the stack is staged in (8 rows a block at least), the first alone holding
# the pending tokens, whose k and v take the conv: 4 puts a tree's 8 pending tokens on 8 rows of a
# stack of 32, not 16 (offline 13% fewer instructions; not yet timed on a GPU)
RING_MMA_STACK_PARTS = 2
# The verifies' drafts' v rows prefetched into L2 at a program's start (evict_last: gdn_verify's
# prefetch_values), so that their load after the state's products finds them there (not yet timed on
# a GPU)
RING_MMA_PREFETCH_VALUES = False


def verify_rule(ring_rows: int, num_nodes: int, tree_depth: int | None = None) -> dict:
    """A verify's (max_pending, fold_above) for either mixer: a valid cursor holds at most the
    capacity R = C - N pending tokens, and a row folds when pending > 0 and pending + T > R (T =
    tree_depth, the most tokens a step accepts; None: N), i.e. pending + N > C - T."""
    return dict(max_pending=ring_rows - num_nodes, fold_above=ring_rows - (tree_depth or num_nodes))


def mma_verify_keys(ring_rows: int, num_nodes: int, tree_depth: int | None = None) -> int:
    """The key rows of gdn_ring_verify_mma's verify stack (its queries follow): C - T (verify_rule's
    fold_above; R for a chain), the most keys a row that does not fold can hold (pending + N <= C -
    T, and C - T >= N), not C: a stack of 16 rows where R + N <= 16, one level of (I + A)^-1 fewer
    at R = 16."""
    return verify_rule(ring_rows, num_nodes, tree_depth)["fold_above"]


def fold_precision_for(ssm) -> str:
    """tl.dot's input precision in a row that folds, and by default in every row: the fold writes
    the checkpoint, and a float32 one must keep float32's accuracy over many folds, which tf32
    products miss (docs/benchmarks.md). ``precision="tf32", fold_precision="tf32x3"`` keeps tf32 in
    the rows that do not fold (a runtime branch; not yet timed or tested on a GPU)."""
    return "tf32x3" if ssm.dtype == torch.float32 else "tf32"


@triton.jit
def _ring_row(row, ring_slots_ptr, state_slots_ptr, cursor_ptr, num_state_slots, num_ring_slots, ring_slots_stride,
              state_slots_stride, cursor_stride_slot, cursor_stride_field, RING_ROWS: tl.constexpr,
              MAX_PENDING: tl.constexpr):
    """(ring slot, state slot, start, pending, live) of batch row ``row`` (ring_conv.ring_row_state;
    a row not live reads slot 0 nowhere: every use is masked by live)."""
    ring = tl.load(ring_slots_ptr + row * ring_slots_stride).to(tl.int64)
    slot = tl.load(state_slots_ptr + row * state_slots_stride).to(tl.int64)
    ring, start, pending, live = ring_row_state(cursor_ptr, ring, (slot >= 0) & (slot < num_state_slots),
                                                num_ring_slots, cursor_stride_slot, cursor_stride_field, RING_ROWS,
                                                MAX_PENDING)
    return ring, tl.where(live, slot, 0), start, pending, live


@triton.jit
def pending_conv(rows_base, window_base, weight_ptr, bias_ptr, token, pending_row, start, pending, chan, chan_ok,
                 rows_stride_row, rows_stride_dim, window_stride_dim, window_stride_win, weight_stride_dim,
                 weight_stride_tap, bias_stride, RING_ROWS: tl.constexpr, KERNEL_SIZE: tl.constexpr,
                 HAS_BIAS: tl.constexpr):
    """[T, CH] fp32: silu(bias + sum_t w_t x_t) of the pending tokens ``token`` [T] (where
    ``pending_row``) at channels ``chan`` [CH]; zeros elsewhere. Token j's input at tap t is input
    i = j - (K-1) + t of the ring's history: ring row (start + i) % C for i >= 0, else the window's
    column K-1+i -- which only the first K-1 tokens reach."""
    if HAS_BIAS:
        acc = tl.load(bias_ptr + chan * bias_stride, mask=chan_ok, other=0.0).to(tl.float32)[None, :]
    else:
        acc = tl.zeros([1, chan.shape[0]], dtype=tl.float32)
    for tap in tl.static_range(KERNEL_SIZE):
        logical = token - (KERNEL_SIZE - 1) + tap
        in_ring = pending_row & (logical >= 0)
        ring_row = (start + tl.where(in_ring, logical, 0)) % RING_ROWS
        x = tl.load(rows_base + (ring_row * rows_stride_row)[:, None] + (chan * rows_stride_dim)[None, :],
                    mask=in_ring[:, None] & chan_ok[None, :], other=0.0).to(tl.float32)
        weight = tl.load(weight_ptr + chan * weight_stride_dim + tap * weight_stride_tap, mask=chan_ok,
                         other=0.0).to(tl.float32)
        acc = acc + weight[None, :] * x
    near = tl.zeros_like(acc)  # the window's part: token j < K-1 reads its columns j..K-2 at taps 0..K-2-j
    for first in tl.static_range(KERNEL_SIZE - 1):
        part = tl.zeros([chan.shape[0]], dtype=tl.float32)
        for tap in tl.static_range(KERNEL_SIZE - 1 - first):
            window = tl.load(window_base + chan * window_stride_dim + (first + tap) * window_stride_win,
                             mask=tl.where(pending > 0, chan_ok, False), other=0.0).to(tl.float32)
            weight = tl.load(weight_ptr + chan * weight_stride_dim + tap * weight_stride_tap, mask=chan_ok,
                             other=0.0).to(tl.float32)
            part += weight * window
        near = tl.where((token == first)[:, None], part[None, :], near)
    acc += near
    ok = pending_row[:, None] & chan_ok[None, :]
    return tl.where(ok, tl.fdiv(acc, 1.0 + tl.exp(-acc), ieee_rounding=False), 0.0)  # SiLU


@triton.jit
def _chunk(kq, state, v, beta, decay, cumulative, key_side, eye, RING_ROWS: tl.constexpr, PRECISION: tl.constexpr):
    """(O on query rows, U on key rows, kq as the products' operand) of the chunk, products in
    PRECISION: gdn_verify's UT form with the ring's key rows."""
    kq = _operand(kq, PRECISION)
    gram = tl.dot(kq, tl.trans(kq), input_precision=PRECISION)
    A = tl.where(key_side[:, None] & (eye < 0.5), beta[:, None] * decay * gram, 0.0)
    inverse = _unit_lower_inverse(A, eye, RING_ROWS, PRECISION)  # (I + A)^-1 on the key block
    grown = tl.exp(cumulative)[:, None]
    products = tl.dot(kq, state, input_precision=PRECISION)  # K S0 on key rows, Q S0 on query rows
    rhs = beta[:, None] * (v - grown * products)
    updates = _dot(inverse, rhs, PRECISION)  # U on key rows, zero on query rows
    o = tl.where(key_side[:, None], 0.0, grown) * products + _dot(tl.where(key_side[:, None], 0.0, decay * gram),
                                                                    updates, PRECISION)
    return o, updates, kq


@triton.jit
def _folded(kq, updates, state, g, cumulative, key_pending, PRECISION: tl.constexpr):
    """The tile after the pending tokens: exp(G_P) S0 + sum_j exp(G_P - G_j) k_j u_j^T."""
    total = tl.sum(tl.where(key_pending, g, 0.0))  # G_P
    weights = tl.where(key_pending, tl.exp(total - cumulative), 0.0)
    return tl.exp(total) * state + _dot(tl.trans(kq * weights[:, None]), updates, PRECISION)


@triton.jit
def _gdn_ring_verify_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, ssm_ptr, conv_ptr, rows_ptr, gates_ptr, cursor_ptr, weight_ptr,
    bias_ptr, ring_slots_ptr, state_slots_ptr, parents_ptr,
    layer, num_state_slots, num_ring_slots, scale,
    out_stride_row, out_stride_node, out_stride_head, out_stride_v,
    q_stride_row, q_stride_node, q_stride_head, q_stride_k,
    k_stride_row, k_stride_node, k_stride_head, k_stride_k,
    v_stride_row, v_stride_node, v_stride_head, v_stride_v,
    g_stride_row, g_stride_node, g_stride_head,
    beta_stride_row, beta_stride_node, beta_stride_head,
    ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_k, ssm_stride_v,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    rows_stride_layer, rows_stride_slot, rows_stride_row, rows_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_row, gates_stride_gate, gates_stride_head,
    cursor_stride_slot, cursor_stride_field, weight_stride_layer, weight_stride_dim, weight_stride_tap,
    bias_stride_layer, bias_stride, ring_slots_stride, state_slots_stride, parents_stride_row, parents_stride_node,
    NUM_NODES: tl.constexpr, RING_ROWS: tl.constexpr, MAX_PENDING: tl.constexpr, FOLD_ABOVE: tl.constexpr,
    NODES: tl.constexpr, KERNEL_SIZE: tl.constexpr,
    NUM_K_HEADS: tl.constexpr, NUM_V_HEADS: tl.constexpr, HEAD_K_DIM: tl.constexpr, HEAD_V_DIM: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, TREE: tl.constexpr, L2NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, FOLD_PRECISION: tl.constexpr,
):
    """One program: one [dk, BLOCK_V] checkpoint tile of one value head of one row, of layer
    ``layer`` + program_id(2). A row is left alone (nothing read past its indices, nothing written)
    unless both slots are in range and its cursor a ring position (pending <= MAX_PENDING); its
    outputs also need every parent link in [-1, n-1]. It folds when pending > 0 and pending + N >
    FOLD_ABOVE (the verify: C - T, verify_rule; a flush, no drafts: 0, or C - N - T for the due
    folds); a flush's program of a row that does not fold returns at once."""
    V_BLOCKS: tl.constexpr = (HEAD_V_DIM + BLOCK_V - 1) // BLOCK_V
    head = tl.program_id(0) // V_BLOCKS
    v_block = tl.program_id(0) % V_BLOCKS
    vv = v_block * BLOCK_V + tl.arange(0, BLOCK_V)
    row = tl.program_id(1).to(tl.int64)
    layer = (layer + tl.program_id(2)).to(tl.int64)  # layer * a pool's layer stride passes 2**31
    k_head = head // (NUM_V_HEADS // NUM_K_HEADS)
    weight_ptr += layer * weight_stride_layer
    bias_ptr += layer * bias_stride_layer

    ring, slot, start, pending, live = _ring_row(row, ring_slots_ptr, state_slots_ptr, cursor_ptr, num_state_slots,
                                                 num_ring_slots, ring_slots_stride, state_slots_stride,
                                                 cursor_stride_slot, cursor_stride_field, RING_ROWS, MAX_PENDING)
    start = start.to(tl.int32)
    pending = pending.to(tl.int32)
    fold = live & (pending > 0) & (pending + NUM_NODES > FOLD_ABOVE)
    if NUM_NODES == 0:  # a flush: nothing to do but the folds
        if not fold:
            return

    stack = tl.arange(0, NODES)
    key_side = stack < RING_ROWS
    draft = tl.where(key_side, stack - pending, stack - RING_ROWS)  # the draft of a draft key row or query row
    key_pending = key_side & (stack < pending)  # (pending is 0 for a row left alone)
    drafted = tl.where(live, (draft >= 0) & (draft < NUM_NODES), False)  # a draft's key or query row
    real = key_pending | drafted
    token = tl.where(key_side, stack, pending + draft)  # the chunk token of the row
    kk = tl.arange(0, BLOCK_K)
    k_ok = kk < HEAD_K_DIM
    columns = vv < HEAD_V_DIM

    tile = (ssm_ptr + layer * ssm_stride_layer + slot * ssm_stride_slot + head * ssm_stride_head
            + (kk * ssm_stride_k)[:, None] + (vv * ssm_stride_v)[None, :])
    tile_ok = tl.where(live, k_ok[:, None] & columns[None, :], False)
    state = tl.load(tile, mask=tile_ok, other=0.0).to(tl.float32)

    rows_base = rows_ptr + layer * rows_stride_layer + ring * rows_stride_slot
    window_base = conv_ptr + layer * conv_stride_layer + slot * conv_stride_slot
    gates_base = gates_ptr + layer * gates_stride_layer + ring * gates_stride_slot + head * gates_stride_head
    ring_row = (start + tl.where(key_pending, stack, 0)) % RING_ROWS
    # k and q: pending tokens' from their conv (k channels Hk*dk + k_head*dk + i), drafts' given
    k_chan = NUM_K_HEADS * HEAD_K_DIM + k_head * HEAD_K_DIM + kk
    conv_k = pending_conv(rows_base, window_base, weight_ptr, bias_ptr, stack, key_pending, start, pending, k_chan,
                          k_ok, rows_stride_row, rows_stride_dim, conv_stride_dim, conv_stride_win, weight_stride_dim,
                          weight_stride_tap, bias_stride, RING_ROWS, KERNEL_SIZE, HAS_BIAS)
    d = tl.where(drafted, draft, 0).to(tl.int64)
    keys = (k_ptr + row * k_stride_row + k_head * k_stride_head + (d * k_stride_node)[:, None]
            + (kk * k_stride_k)[None, :])
    queries = (q_ptr + row * q_stride_row + k_head * q_stride_head + (d * q_stride_node)[:, None]
               + (kk * q_stride_k)[None, :])
    given = stack_rows(keys, queries, key_side, drafted[:, None] & k_ok[None, :])
    kq = _l2_normalised(tl.where(key_pending[:, None], conv_k, given), L2NORM) * tl.where(key_side, 1.0, scale)[:, None]

    g_given = tl.load(g_ptr + row * g_stride_row + d * g_stride_node + head * g_stride_head, mask=drafted,
                      other=0.0).to(tl.float32)
    g_ring = tl.load(gates_base + ring_row * gates_stride_row, mask=key_pending, other=0.0).to(tl.float32)
    g = floored_log_decay(tl.where(key_pending, g_ring, g_given))
    beta_given = tl.load(beta_ptr + row * beta_stride_row + d * beta_stride_node + head * beta_stride_head,
                         mask=drafted & key_side, other=0.0).to(tl.float32)
    beta_ring = tl.load(gates_base + ring_row * gates_stride_row + gates_stride_gate, mask=key_pending,
                        other=0.0).to(tl.float32)
    beta = tl.where(key_pending, beta_ring, beta_given)  # zero on query rows: no update there

    # ancestry[r, c]: key token c is row r's token or one of its ancestors
    key_col = (key_side & real)[None, :]
    if TREE:
        links = parents_ptr + row * parents_stride_row
        up = tl.load(links + d * parents_stride_node, mask=drafted, other=-1)
        node = tl.arange(0, NODES)
        real_node = node < NUM_NODES
        all_up = tl.load(links + tl.where(real_node, node, 0) * parents_stride_node, mask=real_node, other=-1)
        links_ok = tl.sum(tl.where(real_node & ((all_up < -1) | (all_up >= node)), 1, 0)) == 0
        on_path = token[:, None] == stack[None, :]
        for _ in tl.static_range(NUM_NODES - 1):  # the links looked up in registers (all_up: node n's at n)
            on_path |= ((up + pending)[:, None] == stack[None, :]) & (up >= 0)[:, None]
            climbing = tl.where(links_ok, up >= 0, False)
            up = tl.where(climbing, tl.gather(all_up, tl.where(climbing, up, 0).to(tl.int32), 0), -1)
        ancestry = key_col & real[:, None] & ((stack[None, :] < pending) & (stack[None, :] <= token[:, None])
                                              | on_path & drafted[:, None])
    else:
        links_ok = live
        ancestry = key_col & real[:, None] & (stack[None, :] <= token[:, None])
    cumulative = tl.sum(tl.where(ancestry, g[None, :], 0.0), axis=1)  # G of the row's token
    decay = tl.where(ancestry, tl.exp(tl.where(ancestry, cumulative[:, None] - cumulative[None, :], 0.0)), 0.0)
    eye = (stack[:, None] == stack[None, :]).to(tl.float32)

    v_chan = 2 * NUM_K_HEADS * HEAD_K_DIM + head * HEAD_V_DIM + vv
    conv_v = pending_conv(rows_base, window_base, weight_ptr, bias_ptr, stack, key_pending, start, pending, v_chan,
                          columns, rows_stride_row, rows_stride_dim, conv_stride_dim, conv_stride_win,
                          weight_stride_dim, weight_stride_tap, bias_stride, RING_ROWS, KERNEL_SIZE, HAS_BIAS)
    v_given = tl.load(v_ptr + row * v_stride_row + head * v_stride_head + (d * v_stride_node)[:, None]
                      + (vv * v_stride_v)[None, :], mask=(drafted & key_side)[:, None] & columns[None, :],
                      other=0.0).to(tl.float32)
    v = tl.where(key_pending[:, None], conv_v, v_given)
    if FOLD_PRECISION == PRECISION:
        o, updates, kq = _chunk(kq, state, v, beta, decay, cumulative, key_side, eye, RING_ROWS, PRECISION)
        if fold:
            folded = _folded(kq, updates, state, g, cumulative, key_pending, PRECISION)
            tl.store(tile, folded.to(ssm_ptr.dtype.element_ty), mask=tile_ok)
    elif fold:  # the checkpoint written: the fold's precision, for this row only
        o, updates, kq = _chunk(kq, state, v, beta, decay, cumulative, key_side, eye, RING_ROWS, FOLD_PRECISION)
        folded = _folded(kq, updates, state, g, cumulative, key_pending, FOLD_PRECISION)
        tl.store(tile, folded.to(ssm_ptr.dtype.element_ty), mask=tile_ok)
    else:
        o, updates, kq = _chunk(kq, state, v, beta, decay, cumulative, key_side, eye, RING_ROWS, PRECISION)
    dst = (out_ptr + row * out_stride_row + head * out_stride_head + (d * out_stride_node)[:, None]
           + (vv * out_stride_v)[None, :])
    tl.store(dst, o.to(out_ptr.dtype.element_ty),
             mask=tl.where(links_ok, (drafted & (stack >= RING_ROWS))[:, None] & columns[None, :], False))

    if v_block == 0:  # the drafts' gates beside their rows, once per head
        draft_row = (start + pending + tl.where(drafted & key_side, draft, 0)) % RING_ROWS
        gate = gates_base + draft_row * gates_stride_row
        tl.store(gate, g_given, mask=drafted & key_side)  # as given: the floor is the sums' alone
        tl.store(gate + gates_stride_gate, beta, mask=drafted & key_side)


@triton.jit
def _ring_window_kernel(
    conv_ptr, rows_ptr, cursor_ptr, ring_slots_ptr, state_slots_ptr, layer, num_state_slots, num_ring_slots, dim,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    rows_stride_layer, rows_stride_slot, rows_stride_row, rows_stride_dim,
    cursor_stride_slot, cursor_stride_field, ring_slots_stride, state_slots_stride,
    NUM_NODES: tl.constexpr, RING_ROWS: tl.constexpr, MAX_PENDING: tl.constexpr, FOLD_ABOVE: tl.constexpr,
    WIDTH: tl.constexpr, WINDOW: tl.constexpr, BLOCK: tl.constexpr,
):
    """A folding row's conv window (of layer ``layer`` + program_id(2)) after its pending tokens:
    window column w holds logical input pending - (K-1) + w, a ring row if >= 0, else the old
    window's column (read before written). The rows and the fold rule of the verify kernel."""
    chan = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row = tl.program_id(1).to(tl.int64)
    layer = (layer + tl.program_id(2)).to(tl.int64)  # layer * a pool's layer stride passes 2**31
    ring, slot, start, pending, live = _ring_row(row, ring_slots_ptr, state_slots_ptr, cursor_ptr, num_state_slots,
                                                 num_ring_slots, ring_slots_stride, state_slots_stride,
                                                 cursor_stride_slot, cursor_stride_field, RING_ROWS, MAX_PENDING)
    fold = live & (pending > 0) & (pending + NUM_NODES > FOLD_ABOVE)
    if fold:
        window_after(conv_ptr + layer * conv_stride_layer + slot * conv_stride_slot + chan * conv_stride_dim,
                     rows_ptr + layer * rows_stride_layer + ring * rows_stride_slot + chan * rows_stride_dim,
                     chan < dim, start, pending, conv_stride_win, rows_stride_row, RING_ROWS, WIDTH, WINDOW)


@triton.jit
def window_after(window, rows, ok, start, pending, conv_stride_win, rows_stride_row, RING_ROWS: tl.constexpr,
                 WIDTH: tl.constexpr, WINDOW: tl.constexpr):
    """The conv window of channels ``window`` / ``rows`` (pointer vectors: a slot's window, its ring
    rows) rewritten past ``pending`` tokens from ring row ``start``: column w holds logical input
    pending - WIDTH + w, a ring row if >= 0, else the old window's column (read before written)."""
    column = tl.arange(0, WINDOW)
    old = tl.zeros([WINDOW, window.shape[0]], dtype=tl.float32)
    for w in tl.static_range(WIDTH):  # the old window first: its columns move left
        old = tl.where(column[:, None] == w,
                       tl.load(window + w * conv_stride_win, mask=ok, other=0.0).to(tl.float32)[None, :], old)
    for w in tl.static_range(WIDTH):
        position = pending - WIDTH + w
        from_ring = position >= 0
        ring_row = (start + tl.where(from_ring, position, 0)) % RING_ROWS
        value = tl.load(rows + ring_row * rows_stride_row, mask=tl.where(from_ring, ok, False),
                        other=0.0).to(tl.float32)
        shifted = tl.sum(tl.where(column[:, None] == WIDTH + position, old, 0.0), axis=0)
        value = tl.where(from_ring, value, shifted)
        tl.store(window + w * conv_stride_win, value.to(window.dtype.element_ty), mask=ok)


def window_call(conv, rows, cursor, ring_slots, state_slots, *, num_state_slots, layer, num_layers, num_nodes,
                max_pending, fold_above):
    """_ring_window_kernel's launch over rows x layers: the folded rows' conv windows (either mixer's)."""
    num_rows, dim, kernel_size = ring_slots.shape[0], rows.shape[3], conv.shape[3] + 1
    block = min(WINDOW_BLOCK, next_power_of_2(dim))
    return KernelCall(
        _ring_window_kernel, (cdiv(dim, block), num_rows, num_layers), (conv, rows, cursor, ring_slots, state_slots),
        (layer, num_state_slots, rows.shape[1], dim, *conv.stride(), *rows.stride(), *cursor.stride(),
         ring_slots.stride(0), state_slots.stride(0)),
        dict(NUM_NODES=num_nodes, RING_ROWS=rows.shape[2], MAX_PENDING=max_pending, FOLD_ABOVE=fold_above,
             WIDTH=kernel_size - 1, WINDOW=max(2, next_power_of_2(kernel_size - 1)), BLOCK=block),
    )


def flush_cursor_call(cursor, ring_slots, state_slots, *, num_state_slots, num_ring_slots, ring_rows, max_pending,
                      fold_above):
    """_flush_cursor_kernel's launch: the flushed rows' cursors (either mixer's)."""
    num_rows = ring_slots.shape[0]
    block = min(1024, next_power_of_2(num_rows))
    return KernelCall(_flush_cursor_kernel, (cdiv(num_rows, block),), (cursor, ring_slots, state_slots),
                      (num_rows, num_state_slots, num_ring_slots, *cursor.stride(), ring_slots.stride(0),
                       state_slots.stride(0)),
                      dict(RING_ROWS=ring_rows, MAX_PENDING=max_pending, FOLD_ABOVE=fold_above, BLOCK=block))


def flush_rule(ring_rows: int, num_draft: int | None, tree_depth: int | None = None) -> dict:
    """A flush's (max_pending, fold_above) for either mixer: every row with pending tokens (C - 1
    pending at most), or with num_draft only those the next verify of N = num_draft drafts would fold
    -- pending + T > capacity (verify_rule) -- under the verify's own bound on pending (the capacity)."""
    if num_draft is None:
        return dict(max_pending=ring_rows - 1, fold_above=0)
    rule = verify_rule(ring_rows, num_draft, tree_depth)
    return dict(rule, fold_above=rule["fold_above"] - num_draft)  # (a flush's kernels take no drafts: N = 0)


def _chunk_calls(out, q, k, v, g, beta, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots, parents,
                 *, layer, num_layers, num_nodes, heads, max_pending, fold_above, scale, use_qk_l2norm, block_v,
                 num_warps, precision, fold_precision, mma=False, maxnreg=None, small=True, fold_warps=None,
                 fold_block_v=None, fold_maxnreg=None, fused_window=None, merged=None, state_stages=None,
                 chunk_k=None, fold_tiles=1):
    """The chunk kernel's and the window kernel's KernelCalls over rows x layers layer ..
    layer + num_layers - 1 (weight [L, dim, K] / bias [L, dim]: every layer's, as a flush gives them
    even for L = 1; else one layer's). q, k, v, g, beta, out: the drafts' (None with no drafts: never
    read). With mma, gdn_ring_verify_mma's launches instead of the chunk kernel's (_mma_chunk_calls)."""
    num_k_heads, head_k_dim, num_v_heads, head_v_dim = heads
    num_rows = ring_slots.shape[0]
    ring_rows, kernel_size = rows.shape[2], conv.shape[3] + 1
    check_ring_grid(num_rows, num_layers)
    if block_v is None:
        block_v = max(MIN_DOT, min(RING_BLOCK_V, next_power_of_2(head_v_dim)))
    drafts = out is not None
    per_layer = (lambda t: t.stride()) if weight.dim() == 3 else (lambda t: (0, *t.stride()))  # [L, ...]: stacked
    no_strides = lambda n: (0,) * n  # noqa: E731 -- a tensor the kernel never reads
    bias_strides = (0, 0) if bias is None else per_layer(bias)
    index_strides = (ring_slots.stride(0), state_slots.stride(0), *((0, 0) if parents is None else parents.stride()))
    scalars = (layer, ssm.shape[1], rows.shape[1], float(scale),
               *(out.stride() if drafts else no_strides(4)), *(q.stride() if drafts else no_strides(4)),
               *(k.stride() if drafts else no_strides(4)), *(v.stride() if drafts else no_strides(4)),
               *(g.stride() if drafts else no_strides(3)), *(beta.stride() if drafts else no_strides(3)),
               *ssm.stride(), *conv.stride(), *rows.stride(), *gates.stride(), *cursor.stride(), *per_layer(weight),
               *bias_strides, *index_strides)
    constexprs = dict(
        NUM_NODES=num_nodes, RING_ROWS=ring_rows, MAX_PENDING=max_pending, FOLD_ABOVE=fold_above,
        NODES=max(MIN_DOT, next_power_of_2(ring_rows + num_nodes)), KERNEL_SIZE=kernel_size, NUM_K_HEADS=num_k_heads,
        NUM_V_HEADS=num_v_heads, HEAD_K_DIM=head_k_dim, HEAD_V_DIM=head_v_dim,
        BLOCK_K=max(MIN_DOT, next_power_of_2(head_k_dim)), BLOCK_V=block_v, TREE=parents is not None,
        L2NORM=bool(use_qk_l2norm), HAS_BIAS=bias is not None, PRECISION=precision or fold_precision_for(ssm),
        FOLD_PRECISION=fold_precision or precision or fold_precision_for(ssm), num_warps=num_warps,
    )
    placeholder = ssm  # where the drafts' tensors would be
    tensors = (out if drafts else placeholder, *((q, k, v, g, beta) if drafts else (placeholder,) * 5), ssm, conv, rows,
               gates, cursor, weight, weight if bias is None else bias, ring_slots, state_slots,
               state_slots if parents is None else parents)
    chunk = KernelCall(_gdn_ring_verify_kernel, (num_v_heads * cdiv(head_v_dim, block_v), num_rows, num_layers),
                       tensors, scalars, constexprs)
    # the windows in the mma verify launches (their programs cover q, k and v: the rows' whole width)
    fused = (RING_MMA_FUSED_WINDOW if fused_window is None else fused_window) and mma
    chunks = (_mma_chunk_calls(chunk, ssm, num_layers, maxnreg, small, fold_warps,
                               fold_block_v, fold_maxnreg, fused, RING_MMA_MERGED if merged is None else merged,
                               RING_MMA_STATE_STAGES if state_stages is None else state_stages,
                               chunk_k or RING_MMA_CHUNK_K, fold_tiles) if mma else (chunk,))
    if fused:
        return chunks
    window = window_call(conv, rows, cursor, ring_slots, state_slots, num_state_slots=ssm.shape[1], layer=layer,
                         num_layers=num_layers, num_nodes=num_nodes, max_pending=max_pending, fold_above=fold_above)
    return (*chunks, window)


def _mma_chunk_calls(chunk, ssm, num_layers, maxnreg, small, fold_warps=None, fold_block_v=None,
                     fold_maxnreg=None, fused_window=False, merged=False, state_stages=0, chunk_k=None,
                     fold_tiles=1):
    """``chunk`` (the Triton kernel's launch of a verify: one layer, drafts) on gdn_ring_verify_mma's
    kernel instead, same grid and arguments, one launch per kind of row: first those that fold,
    folding only -- a stack of the pending keys, no drafts (3xTF32 for a float32 checkpoint), on
    fold_warps warps over tiles of fold_block_v columns (None: the others'; a grid of its own),
    capped at fold_maxnreg registers (None: RING_MMA_FOLD_MAXNREG; 0: no cap), a program walking
    fold_tiles of its row's tiles (_mma_fold_call; 0, a row's: one short wave where none fold, after
    a due flush); then, their drafts verified from the folded checkpoint (with fused_window, their
    conv windows moved there too) with the others', with ``small`` (and N <= 8, more than 16 stack
    rows) the rows whose keys fit a stack of 16 rows (pending + N <= 16 - N), then the rest (tf32
    products); with ``merged`` those two in one launch (KIND 3, the others' cap); with state_stages
    the state chunks through shared memory, that many in flight (where a thread's copies are of 4
    bytes or more: gdn_verify.state_stages_for);
    chunk_k state rows a chunk; the non-folding rows' stack sized by their most keys
    (mma_verify_keys). maxnreg: the register cap of the launches that do not fold (0 or None: the
    compiler's choice), or a pair (the small rows' cap, the other non-folding rows')."""
    from . import gdn_ring_verify_mma

    block_v, num_warps = chunk.constexprs["BLOCK_V"], chunk.constexprs["num_warps"]
    fold_warps = fold_warps or num_warps
    fold_block_v = fold_block_v or block_v
    num_nodes, ring_rows = chunk.constexprs["NUM_NODES"], chunk.constexprs["RING_ROWS"]
    verify_keys = chunk.constexprs["FOLD_ABOVE"]  # (mma_verify_keys: a verify's rule)
    if num_layers != 1 or not num_nodes <= verify_keys < ring_rows or verify_keys + num_nodes > RING_MMA_NODES:
        raise ValueError(f"gdn_ring_verify_mma: one layer of a verify and a stack of {verify_keys} keys + N <= "
                         f"{RING_MMA_NODES} rows, got {num_layers} layers, {verify_keys} + {num_nodes}")
    chunk_k = min(chunk_k or RING_MMA_CHUNK_K, chunk.constexprs["BLOCK_K"])
    check_mma_tiles("gdn_ring_verify_mma", block_v, num_warps, chunk_k)
    small = small and 2 * num_nodes <= RING_MMA_SMALL_NODES < verify_keys + num_nodes
    constexprs = _mma_constexprs(chunk, ssm, chunk_k, fused_window, VERIFY_KEYS=verify_keys,
                                 SMALL_KEYS=RING_MMA_SMALL_NODES - num_nodes if small else 0)
    verify_nodes = max(RING_MMA_SMALL_NODES, next_power_of_2(verify_keys + num_nodes))
    small_cap, other_cap = (dict(maxnreg=n) if n else {} for n in (maxnreg if isinstance(maxnreg, tuple)
                                                                    else (maxnreg, maxnreg)))
    stages = state_stages_for(state_stages, block_v, num_warps, chunk_k, chunk.constexprs["BLOCK_K"], ssm)
    kinds = (*(((0, RING_MMA_SMALL_NODES, small_cap),) if small and not merged else ()),
             (3 if small and merged else 1, verify_nodes, other_cap))
    fold = _mma_fold_call(chunk, ssm, constexprs, fold_warps or num_warps, fold_block_v or block_v, fold_maxnreg,
                          state_stages, fold_tiles)
    return (fold, *(KernelCall(gdn_ring_verify_mma._gdn_ring_verify_mma_kernel, chunk.grid, chunk.tensors,
                               chunk.scalars, dict(constexprs, KIND=kind, NODES=nodes, STATE_STAGES=stages, **caps))
                    for kind, nodes, caps in kinds))


def _mma_constexprs(chunk, ssm, chunk_k, fused_window, **verify):
    """gdn_ring_verify_mma's constexprs common to its launches of ``chunk`` (the Triton kernel's:
    one layer's verify, or every layer's folds), with ``verify``'s (VERIFY_KEYS, SMALL_KEYS)."""
    constexprs = {name: value for name, value in chunk.constexprs.items()
                  if name not in ("PRECISION", "FOLD_PRECISION")}
    width = chunk.constexprs["KERNEL_SIZE"] - 1
    v = chunk.tensors[3]  # (the drafts' v; with none, a flush's, a placeholder)
    prefetch_v = bool(RING_MMA_PREFETCH_VALUES) and chunk.constexprs["NUM_NODES"] > 0 and v.stride(-1) == 1
    constexprs.update(FUSED_WINDOW=bool(fused_window), WIDTH=width, WINDOW=max(2, next_power_of_2(width)),
                      NODES=RING_MMA_NODES, SPLIT_FOLD=ssm.dtype == torch.float32, CHUNK_K=chunk_k,
                      WARPS=chunk.constexprs["num_warps"], SSM_STRIDE_K=ssm.stride(3), SSM_STRIDE_V=ssm.stride(4),
                      TILES_A_PROGRAM=1, STACK_PARTS=RING_MMA_STACK_PARTS, PREFETCH_V=prefetch_v, **verify)
    pdl = bool(RING_MMA_PDL) and pdl_device(ssm)
    constexprs.update(PDL=pdl, **({"launch_pdl": True} if pdl else {}))
    return constexprs


def _mma_fold_call(chunk, ssm, constexprs, fold_warps, fold_block_v, fold_maxnreg, state_stages,
                   tiles_a_program=1):
    """gdn_ring_verify_mma's launch of the rows that fold (KIND 2), folding only, over ``chunk``'s rows
    and layers: a stack of their pending keys (3xTF32 for a float32 checkpoint), fold_warps warps over
    tiles of fold_block_v columns, capped at fold_maxnreg registers (None: RING_MMA_FOLD_MAXNREG;
    0: no cap); a program folding tiles_a_program of its row's tiles one after another (0: all of
    them, one program a row and layer)."""
    from . import gdn_ring_verify_mma

    chunk_k = constexprs["CHUNK_K"]
    check_mma_tiles("gdn_ring_verify_mma (the folds)", fold_block_v, fold_warps, chunk_k)
    if constexprs["MAX_PENDING"] > RING_MMA_NODES:
        raise ValueError(f"gdn_ring_verify_mma: its folds take a stack of at most {RING_MMA_NODES} pending keys, got a "
                         f"ring holding {constexprs['MAX_PENDING']}")
    cap = RING_MMA_FOLD_MAXNREG if fold_maxnreg is None else fold_maxnreg
    tiles = constexprs["NUM_V_HEADS"] * cdiv(constexprs["HEAD_V_DIM"], fold_block_v)
    tiles_a_program, programs = programs_walking("gdn_ring_verify_mma", tiles, tiles_a_program)
    grid = (programs, *chunk.grid[1:])
    stages = state_stages_for(state_stages, fold_block_v, fold_warps, chunk_k, constexprs["BLOCK_K"], ssm)
    nodes = max(RING_MMA_SMALL_NODES, next_power_of_2(constexprs["MAX_PENDING"]))
    return KernelCall(gdn_ring_verify_mma._gdn_ring_verify_mma_kernel, grid, chunk.tensors, chunk.scalars,
                      dict(constexprs, KIND=2, NODES=nodes, WARPS=fold_warps, num_warps=fold_warps,
                           BLOCK_V=fold_block_v, STATE_STAGES=stages, TILES_A_PROGRAM=tiles_a_program,
                           **({"maxnreg": cap} if cap else {})))


def _mma_by_default(ring_rows: int, num_nodes: int, tree_depth: int | None, head_v_dim: int, ssm) -> bool:
    """Whether a verify of N = num_nodes drafts (and a due flush before it) takes the mma kernel when
    no tile or precision is asked for: its verify stack fits (mma_verify_keys), dv >= 8 x its warps,
    and the kernel runs on ssm's device."""
    return (mma_verify_keys(ring_rows, num_nodes, tree_depth) + num_nodes <= RING_MMA_NODES
            and head_v_dim >= 8 * RING_MMA_WARPS and _mma_kernel_runs_on(ssm))


def _mma_block_v(head_v_dim: int) -> int:
    """The mma launches' default columns a program (dv up to RING_MMA_BLOCK_V)."""
    return min(RING_MMA_BLOCK_V, max(MIN_DOT, next_power_of_2(head_v_dim)))


def _ring_calls(out, q, k, v, g, beta, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots, layer,
                parents, *, scale, use_qk_l2norm, tree_depth=None, block_v=None, num_warps=None, precision=None,
                fold_precision=None, mma=None, maxnreg=None, small=True, fold_warps=None,
                fold_block_v=None, fold_maxnreg=None, fused_window=None, merged=None, state_stages=None,
                chunk_k=None, fold_tiles=1):
    """gdn_ring_verify's launches (the verify -- with the mma kernel the folds' launch, then the
    other rows' in one launch or one per kind -- then the folded windows', unless the mma launches
    move them), or () with no rows. mma: gdn_ring_verify_mma's chunk kernel (None: where
    _mma_kernel_runs_on, its verify stack fits 32 rows -- C - T + N, mma_verify_keys --,
    dv >= 32 and no precision is asked for), with block_v, num_warps, maxnreg, small, fold_warps,
    fold_block_v, fold_maxnreg, fused_window, merged, state_stages and chunk_k its own (None: 128
    columns, fewer for small batches with RING_MMA_SPREAD; 4 warps, RING_MMA_MAXNREG (0: none),
    RING_MMA_FUSED_WINDOW, RING_MMA_MERGED, RING_MMA_STATE_STAGES, RING_MMA_CHUNK_K; the rest:
    _mma_chunk_calls) and fold_tiles (0 with the op's after_due_flush); else the Triton kernel at
    ``precision`` / ``fold_precision`` (tf32x3 for a float32 checkpoint). tree_depth: the fold
    rule's T (verify_rule)."""
    num_nodes = q.shape[1]
    if q.shape[0] == 0:
        return ()
    heads = (q.shape[2], q.shape[3], v.shape[2], v.shape[3])
    if mma is None:
        mma = (precision is None and fold_precision is None and block_v is None and num_warps is None
               and _mma_by_default(rows.shape[2], num_nodes, tree_depth, v.shape[3], ssm))
    num_warps = (RING_MMA_WARPS if mma else RING_WARPS) if num_warps is None else num_warps
    maxnreg = RING_MMA_MAXNREG if maxnreg is None else maxnreg
    if mma and block_v is None:  # (never under 8 columns a warp: check_mma_tiles)
        block_v = (spread_block(RING_MMA_BLOCK_V, q.shape[0], v.shape[2], v.shape[3], max(2 * MIN_DOT, 8 * num_warps))
                   if RING_MMA_SPREAD else _mma_block_v(v.shape[3]))
    return _chunk_calls(out, q, k, v, g, beta, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots,
                        parents, layer=layer, num_layers=1, num_nodes=num_nodes, heads=heads,
                        **verify_rule(rows.shape[2], num_nodes, tree_depth), scale=scale,
                        use_qk_l2norm=use_qk_l2norm, block_v=block_v, num_warps=num_warps, precision=precision,
                        fold_precision=fold_precision, mma=mma, maxnreg=maxnreg, small=small,
                        fold_warps=fold_warps, fold_block_v=fold_block_v, fold_maxnreg=fold_maxnreg,
                        fused_window=fused_window, merged=merged, state_stages=state_stages, chunk_k=chunk_k,
                        fold_tiles=fold_tiles)


def launch_gdn_ring_verify(out, q, k, v, g, beta, ssm, conv, rows, gates, cursor, weight, bias, ring_slots,
                           state_slots, layer, parents, *, scale, use_qk_l2norm, **tuning):
    """ops_ring.gdn_ring_verify's arguments as its prepare gives them (ssm [L, S, Hv, dk, dv], conv
    [L, S, dim, K-1], rows [L, M, C, dim], gates [L, M, C, 2, Hv], cursor [M, 2]; any strides).
    The verify's launches (the Triton kernel's one, or the mma kernel's by kind of row: _ring_calls),
    then the folded conv windows' (none where the mma launches move them: fused_window)."""
    for call in _ring_calls(out, q, k, v, g, beta, ssm, conv, rows, gates, cursor, weight, bias, ring_slots,
                            state_slots, layer, parents, scale=scale, use_qk_l2norm=use_qk_l2norm, **tuning):
        call.launch()


def planned_gdn_ring_verify(*args, **kwargs):
    """launch_gdn_ring_verify fixed for these shapes, strides, dtypes and arguments (_common.planned_calls)."""
    return planned_calls(_ring_calls, *args, **kwargs)


@triton.jit
def _flush_cursor_kernel(cursor_ptr, ring_slots_ptr, state_slots_ptr, num_rows, num_state_slots, num_ring_slots,
                         cursor_stride_slot, cursor_stride_field, ring_slots_stride, state_slots_stride,
                         RING_ROWS: tl.constexpr, MAX_PENDING: tl.constexpr, FOLD_ABOVE: tl.constexpr,
                         BLOCK: tl.constexpr):
    """A folded row's cursor (pending > FOLD_ABOVE): (start + pending, 0), after every layer's fold
    has read it."""
    row = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    ok = row < num_rows
    ring = tl.load(ring_slots_ptr + row * ring_slots_stride, mask=ok, other=-1).to(tl.int64)
    slot = tl.load(state_slots_ptr + row * state_slots_stride, mask=ok, other=-1).to(tl.int64)
    ring, start, pending, live = ring_row_state(cursor_ptr, ring, (slot >= 0) & (slot < num_state_slots),
                                                num_ring_slots, cursor_stride_slot, cursor_stride_field, RING_ROWS,
                                                MAX_PENDING)
    live = live & (pending > FOLD_ABOVE)
    field = cursor_ptr.dtype.element_ty
    tl.store(cursor_ptr + ring * cursor_stride_slot, ((start + pending) % RING_ROWS).to(field), mask=live)
    tl.store(cursor_ptr + ring * cursor_stride_slot + cursor_stride_field, (pending * 0).to(field), mask=live)


def _flush_calls(ssm, conv, cursor, rows, gates, weight, bias, ring_slots, state_slots, *, num_k_heads, head_k_dim,
                 num_v_heads, head_v_dim, use_qk_l2norm, num_draft=None, tree_depth=None, block_v=None,
                 num_warps=None, precision=None, fold_precision=None, mma=None, fold_warps=None, fold_maxnreg=None,
                 state_stages=None, chunk_k=None, fold_tiles=1):
    """gdn_ring_flush's three launches (every layer's fold, every layer's window, the cursors), or ():
    every row with pending tokens, or with num_draft (and tree_depth) those the next verify would fold
    (flush_rule). The folds by the Triton chunk kernel at ``precision`` / ``fold_precision`` (tf32x3
    for a float32 checkpoint; block_v and num_warps its tile), or with mma by gdn_ring_verify_mma's
    fold launch over every layer (None: with num_draft, where the verify's folds run on it and no tile
    or precision is asked for -- the same arithmetic, so the same checkpoints; fold_warps,
    fold_maxnreg, state_stages, chunk_k and fold_tiles as the verify's)."""
    num_rows = ring_slots.shape[0]
    if num_rows == 0:
        return ()
    ring_rows = rows.shape[2]
    rule = flush_rule(ring_rows, num_draft, tree_depth)
    heads = (num_k_heads, head_k_dim, num_v_heads, head_v_dim)
    window = window_call(conv, rows, cursor, ring_slots, state_slots, num_state_slots=ssm.shape[1], layer=0,
                         num_layers=ssm.shape[0], num_nodes=0, **rule)
    if mma is None:
        mma = (num_draft is not None and precision is None and fold_precision is None and block_v is None
               and num_warps is None and _mma_by_default(ring_rows, num_draft, tree_depth, head_v_dim, ssm))
    if mma:
        block_v = block_v or _mma_block_v(head_v_dim)
        num_warps = num_warps or RING_MMA_WARPS
    fold = fold_precision or precision or fold_precision_for(ssm)
    chunk, _ = _chunk_calls(
        None, None, None, None, None, None, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots,
        None, layer=0, num_layers=ssm.shape[0], num_nodes=0, heads=heads, **rule, scale=1.0,
        use_qk_l2norm=use_qk_l2norm, block_v=block_v, num_warps=num_warps or RING_WARPS, precision=fold,
        fold_precision=fold)
    if mma:
        chunk_k = min(chunk_k or RING_MMA_CHUNK_K, chunk.constexprs["BLOCK_K"])
        constexprs = _mma_constexprs(chunk, ssm, chunk_k, False, VERIFY_KEYS=0, SMALL_KEYS=0)
        chunk = _mma_fold_call(chunk, ssm, constexprs, fold_warps or num_warps, block_v, fold_maxnreg,
                               RING_MMA_STATE_STAGES if state_stages is None else state_stages, fold_tiles)
    cursors = flush_cursor_call(cursor, ring_slots, state_slots, num_state_slots=ssm.shape[1],
                                num_ring_slots=rows.shape[1], ring_rows=ring_rows, **rule)
    return chunk, window, cursors


def launch_gdn_ring_flush(ssm, conv, cursor, rows, gates, weight, bias, ring_slots, state_slots, **kwargs):
    """ops_ring.gdn_ring_flush's arguments as its prepare gives them (weight [L, dim, K], bias [L, dim]
    or None). Three launches: every layer's fold of the pending tokens, every layer's window, then
    the cursors."""
    for call in _flush_calls(ssm, conv, cursor, rows, gates, weight, bias, ring_slots, state_slots, **kwargs):
        call.launch()


def planned_gdn_ring_flush(*args, **kwargs):
    """launch_gdn_ring_flush fixed for these shapes, strides, dtypes and arguments (_common.planned_calls)."""
    return planned_calls(_flush_calls, *args, **kwargs)
