"""gdn_ring_verify's chunk kernel on the tensor cores' own layouts (Gluon, sm_80+): the chunk of
csrc_triton/gdn_ring_verify.py (its docstring derives it) with gdn_verify_mma's state loads.

One program per [dk, BLOCK_V] checkpoint tile of one value head of one row. The state chunks go
from global memory into mma.sync B fragments (gdn_verify_mma: the tile's columns relabelled so
that a thread's columns are adjacent), through shared memory by cp.async with STATE_STAGES; the
key and query stack -- the pending tokens' k from their conv over the ring's rows, the drafts' k,
the drafts' q -- is normalised in registers and staged once in shared memory: keys, then queries
from row VERIFY_KEYS = max(R, N), the most keys a row that does not fold holds (R + N <= 32, one
[32, 32] set of node matrices, four warps side by side over the columns: none repeats them); a
row with few pending tokens (pending + 2 N <= 16) on a stack of 16 rows, its queries from row
16 - N; a folding row's stack its pending keys alone.

Launches over the same grid, one per kind of row -- first the rows that fold, folding only (a
stack of their pending keys), then the rows on the small stack, then the others, the folded rows
among these two from their new checkpoint with nothing pending -- the other rows' programs
returning after reading the cursor, so each kind is its own compile with its own registers. A
verify writes outputs only and multiplies the state in tf32, its operands rounded to nearest
(gdn_verify's accuracy), (I + A)^-1 by gdn_verify's blocks. A fold
writes the checkpoint, which must keep float32's accuracy over many folds: it multiplies in 3xTF32
(each operand split into a tf32 head and a tf32 rest, three products).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .gdn_verify import rows_contiguous
from .gdn_verify_mma import (_floored_log_decay, _grid_dependency, _issue_first_chunks, _mma,
                             _parent_of, _parts, _prefetch_rows, _product, _rounded, _staged_chunk, _state_chunk,
                             _state_copy_layout, _state_ring_layout, _unit_lower_inverse)


@gluon.jit
def _pending_conv(rows_base, window_base, weight_ptr, bias_ptr, chan, chan_ok, start, pending,
                  rows_stride_row, rows_stride_dim, window_stride_dim, window_stride_win, weight_stride_dim,
                  weight_stride_tap, bias_stride, RING_ROWS: gl.constexpr, KERNEL_SIZE: gl.constexpr,
                  NODES: gl.constexpr, HAS_BIAS: gl.constexpr, L: gl.constexpr):
    """[NODES, CH] fp32 in layout L: silu(bias + sum_t w_t x_t) of pending tokens 0..pending-1 at
    channels ``chan``, zeros elsewhere. Input t of token j is history
    input j - (K-1) + t: a ring row (start + i) % C for i >= 0 -- read per tap, whole rows, the
    channels a thread holds adjacent -- else the checkpoint window's column K-1 + i, which only
    tokens j < K-1 read: those sums come from the window's columns once, as [CH] vectors."""
    # (gdn_ring_verify._pending_conv's arithmetic: a Gluon function cannot call a Triton one)
    token = gl.arange(0, NODES, layout=gl.SliceLayout(1, L))
    pending_row = token < pending
    acc = gl.zeros([NODES, chan.shape[0]], gl.float32, layout=L)
    if HAS_BIAS:
        acc += gl.load(bias_ptr + chan * bias_stride, mask=chan_ok, other=0.0).to(gl.float32)[None, :]
    for tap in gl.static_range(KERNEL_SIZE):
        weight = gl.load(weight_ptr + chan * weight_stride_dim + tap * weight_stride_tap, mask=chan_ok,
                         other=0.0).to(gl.float32)
        logical = token - (KERNEL_SIZE - 1) + tap
        ring_row = start + gl.maximum(logical, 0)
        ring_row = gl.where(ring_row >= RING_ROWS, ring_row - RING_ROWS, ring_row)  # a pending token's < 2 C
        x = gl.load(rows_base + (ring_row * rows_stride_row)[:, None] + (chan * rows_stride_dim)[None, :],
                    mask=(pending_row & (logical >= 0))[:, None] & chan_ok[None, :], other=0.0)
        acc += weight[None, :] * x.to(gl.float32)
    # token j < K-1: sum over window columns c = j .. K-2 of w_{c-j} x_c
    for j in gl.static_range(KERNEL_SIZE - 1):
        part = gl.zeros_like(chan).to(gl.float32)
        for c in gl.static_range(j, KERNEL_SIZE - 1):
            column = gl.load(window_base + chan * window_stride_dim + c * window_stride_win,
                             mask=chan_ok & (pending > j), other=0.0).to(gl.float32)
            part += gl.load(weight_ptr + chan * weight_stride_dim + (c - j) * weight_stride_tap, mask=chan_ok,
                            other=0.0).to(gl.float32) * column
        acc += gl.where((token == j)[:, None], part[None, :], 0.0)
    ok = pending_row[:, None] & chan_ok[None, :]
    # SiLU: one exp2 and the approximate divide (2 ulp; an IEEE one is a dozen instructions a value)
    return gl.where(ok, gl.fdiv(acc, 1.0 + gl.exp2(acc * -1.4426950408889634), ieee_rounding=False), 0.0)


@gluon.jit
def _window_after(window, rows, ok, start, pending, conv_stride_win, rows_stride_row, RING_ROWS: gl.constexpr,
                  WIDTH: gl.constexpr, WINDOW: gl.constexpr, L: gl.constexpr):
    """gdn_ring_verify.window_after's move of a conv window past ``pending`` tokens, for pointer
    vectors ``window`` / ``rows`` in layout SliceLayout(0, L) (a Gluon function cannot call a Triton one)."""
    column = gl.arange(0, WINDOW, layout=gl.SliceLayout(1, L))
    old = gl.zeros([WINDOW, window.shape[0]], gl.float32, layout=L)
    for w in gl.static_range(WIDTH):  # the old window first: its columns move left
        old = gl.where(column[:, None] == w,
                       gl.load(window + w * conv_stride_win, mask=ok, other=0.0).to(gl.float32)[None, :], old)
    for w in gl.static_range(WIDTH):
        position = pending - WIDTH + w
        from_ring = position >= 0
        ring_row = (start + gl.where(from_ring, position, 0)) % RING_ROWS
        value = gl.load(rows + ring_row * rows_stride_row, mask=ok & from_ring, other=0.0).to(gl.float32)
        shifted = gl.sum(gl.where(column[:, None] == WIDTH + position, old, 0.0), axis=0)
        gl.store(window + w * conv_stride_win, gl.where(from_ring, value, shifted).to(window.dtype.element_ty),
                 mask=ok)


@gluon.jit
def _stack_entries(live, pending, NUM_NODES: gl.constexpr, KEY_ROWS: gl.constexpr, NODES: gl.constexpr,
                   L: gl.constexpr):
    """The stack's entries n along one axis, in layout L: (n, a key row, a pending token's, its draft
    index, a draft's). Key rows n < KEY_ROWS: pending token n below ``pending``, then draft n - pending;
    query rows from KEY_ROWS: draft n - KEY_ROWS."""
    n = gl.arange(0, NODES, layout=L)
    key = n < KEY_ROWS
    draft = gl.where(key, n - pending, n - KEY_ROWS)
    return n, key, key & (n < pending), draft, live & (draft >= 0) & (draft < NUM_NODES)


@gluon.jit
def _stack_gates(live, start, pending, row, head, gates_base, g_ptr, beta_ptr, g_stride_row, g_stride_node,
                 g_stride_head, beta_stride_row, beta_stride_node, beta_stride_head, gates_stride_row,
                 gates_stride_gate, NUM_NODES: gl.constexpr, RING_ROWS: gl.constexpr, KEY_ROWS: gl.constexpr,
                 NODES: gl.constexpr, MMA: gl.constexpr):
    """(g by stack column in SliceLayout(0, MMA), beta by stack row in SliceLayout(1, MMA)), fp32: a
    pending token's from the ring's gates, a draft's as given, zeros elsewhere (queries, padding)."""
    c, c_key, c_pending, _, c_drafted = _stack_entries(live, pending, NUM_NODES, KEY_ROWS, NODES,
                                                       gl.SliceLayout(0, MMA))
    c_drafted = c_drafted & c_key  # (a key column: a pending token or a draft)
    c_draft = c - pending
    g = gl.where(c_pending, gl.load(gates_base + ((start + gl.where(c_pending, c, 0)) % RING_ROWS) * gates_stride_row,
                                    mask=c_pending, other=0.0),
                 gl.load(g_ptr + row * g_stride_row + gl.where(c_drafted, c_draft, 0) * g_stride_node
                         + head * g_stride_head, mask=c_drafted, other=0.0).to(gl.float32))
    r, r_key, r_pending, r_draft, r_drafted = _stack_entries(live, pending, NUM_NODES, KEY_ROWS, NODES,
                                                             gl.SliceLayout(1, MMA))
    beta = gl.where(r_pending, gl.load(gates_base + ((start + gl.where(r_pending, r, 0)) % RING_ROWS) * gates_stride_row
                                       + gates_stride_gate, mask=r_pending, other=0.0),
                    gl.load(beta_ptr + row * beta_stride_row + gl.where(r_drafted, r_draft, 0) * beta_stride_node
                            + head * beta_stride_head, mask=r_drafted & r_key, other=0.0).to(gl.float32))
    return g, beta


@gluon.constexpr_function
def _stack_part(pending_rows, nodes, most_parts):
    """The rows of each block the stack is staged in: the first holds every pending token, the only
    rows whose k and v take the conv, so the fewest rows that do, a power of two of at least 8 and
    nodes // most_parts; with none pending, half the stack."""
    if pending_rows == 0:
        return nodes // 2
    part = max(8, nodes // most_parts)
    while part < pending_rows:
        part *= 2
    return min(part, nodes)


@gluon.jit
def _relabelled(n, v0, WARPS: gl.constexpr, TILES: gl.constexpr):
    """The value column at position n of the relabelled tile (gdn_verify_mma's relabelling)."""
    return v0 + ((n // 8) % WARPS) * (8 * TILES) + (n % 8) * TILES + n // (8 * WARPS)


@gluon.jit
def _columns_relabelled(x, WARPS: gl.constexpr, TILES: gl.constexpr):
    """x [rows, BLOCK_V] in LOAD_L, its columns reordered so that column n holds _relabelled(n, 0)."""
    return x.reshape([x.shape[0], WARPS, 8, TILES]).permute((0, 3, 1, 2)).reshape([x.shape[0], x.shape[1]])


@gluon.jit
def _columns_natural(x, WARPS: gl.constexpr, TILES: gl.constexpr):
    """The inverse of _columns_relabelled: x's column n holds _relabelled(n, 0); the result's column m
    holds column m."""
    return x.reshape([x.shape[0], TILES, WARPS, 8]).permute((0, 2, 3, 1)).reshape([x.shape[0], x.shape[1]])


@gluon.jit
def _state_products(state_ring, state_base, live, v0, upcoming, kq_hi, kq_lo, NODES: gl.constexpr,
                    HEAD_K_DIM: gl.constexpr, HEAD_V_DIM: gl.constexpr, BLOCK_K: gl.constexpr, BLOCK_V: gl.constexpr,
                    CHUNK_K: gl.constexpr, SSM_STRIDE_K: gl.constexpr, SSM_STRIDE_V: gl.constexpr,
                    STATE_STAGES: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr, TILES: gl.constexpr,
                    SPLIT: gl.constexpr, MMA: gl.constexpr, A_L: gl.constexpr, B_L: gl.constexpr,
                    LOAD_L: gl.constexpr, COPY_L: gl.constexpr):
    """K S0 (key rows) / Q S0 (query rows) of the staged stack, [NODES, BLOCK_V] in MMA, the state a
    chunk at a time: from the shared-memory ring (STATE_STAGES), or through registers a chunk ahead
    (``upcoming``: the first)."""
    products = gl.zeros([NODES, BLOCK_V], gl.float32, layout=MMA)
    for c in gl.static_range(0, BLOCK_K, CHUNK_K):
        if STATE_STAGES > 0:
            state = _staged_chunk(state_ring, state_base, live, v0, c, STAGES, HEAD_K_DIM, HEAD_V_DIM, BLOCK_K,
                                  SSM_STRIDE_K, SSM_STRIDE_V, CHUNK_K, BLOCK_V, LOAD_L, COPY_L)
        else:
            state = upcoming
            if c + CHUNK_K < BLOCK_K:
                upcoming = _state_chunk(state_base, c + CHUNK_K, live, v0, HEAD_K_DIM, HEAD_V_DIM, SSM_STRIDE_K,
                                        SSM_STRIDE_V, CHUNK_K, BLOCK_V, LOAD_L)
        state = _columns_relabelled(state, WARPS, TILES)
        a_hi = kq_hi.slice(c, CHUNK_K, dim=1).load(A_L)
        if SPLIT:
            s_hi = _rounded(state, True)
            products = _mma(a_hi, kq_lo.slice(c, CHUNK_K, dim=1).load(A_L), gl.convert_layout(s_hi, B_L),
                            gl.convert_layout(_rounded(state - s_hi, True), B_L), products, True)
        else:  # the state truncated by the tensor cores, as gdn_verify_mma
            products = mma_v2(a_hi, gl.convert_layout(state, B_L), products, input_precision="tf32")
    return products


@gluon.jit
def _row_head(live, start, pending, row, head, k_head, v0, state_base, state_ring, rows_base,
              window_base, gates_base, weight_ptr, bias_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, parents_ptr,
              out_ptr, ssm_ptr, scale,
              q_stride_row, q_stride_node, q_stride_head, q_stride_k, k_stride_row, k_stride_node, k_stride_head,
              k_stride_k, v_stride_row, v_stride_node, v_stride_head, v_stride_v,
              g_stride_row, g_stride_node, g_stride_head, beta_stride_row, beta_stride_node, beta_stride_head,
              conv_stride_dim, conv_stride_win, rows_stride_row, rows_stride_dim,
              gates_stride_row, gates_stride_gate, parents_stride_row, parents_stride_node,
              out_stride_row, out_stride_node, out_stride_head, out_stride_v,
              weight_stride_dim, weight_stride_tap, bias_stride,
              NUM_NODES: gl.constexpr, RING_ROWS: gl.constexpr, KEY_ROWS: gl.constexpr, PENDING_ROWS: gl.constexpr,
              NODES: gl.constexpr,
              KERNEL_SIZE: gl.constexpr,
              NUM_K_HEADS: gl.constexpr, HEAD_K_DIM: gl.constexpr, HEAD_V_DIM: gl.constexpr, BLOCK_K: gl.constexpr,
              BLOCK_V: gl.constexpr, CHUNK_K: gl.constexpr,
              TREE: gl.constexpr, L2NORM: gl.constexpr, HAS_BIAS: gl.constexpr, WARPS: gl.constexpr,
              SSM_STRIDE_K: gl.constexpr, SSM_STRIDE_V: gl.constexpr, FOLD: gl.constexpr, SPLIT: gl.constexpr,
              STATE_STAGES: gl.constexpr, STACK_PARTS: gl.constexpr, PREFETCH_V: gl.constexpr):
    """One program's work: with drafts (NUM_NODES > 0) the row's outputs for its query rows, stored,
    and the drafts' gates beside their rows (v0 = 0); with FOLD the checkpoint tile after the pending
    tokens, stored in place (after the outputs, which the old tile gave). Products in 3xTF32 with
    SPLIT, else tf32. Stack rows: keys below KEY_ROWS, then queries; a row of this launch has at most
    PENDING_ROWS pending tokens. With STATE_STAGES the chunks come through shared memory state_ring
    (cp.async, that many in flight). The stack is staged in STACK_PARTS blocks of rows at most
    (_stack_part). PREFETCH_V: the drafts' v rows into L2 first (gdn_verify_mma._prefetch_rows)."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, WARPS], instr_shape=[16, 8])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=1)
    B_L: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=1)
    ROW_L: gl.constexpr = gl.SliceLayout(1, MMA)
    COL_L: gl.constexpr = gl.SliceLayout(0, MMA)
    TILES: gl.constexpr = BLOCK_V // (8 * WARPS)
    LOAD_L: gl.constexpr = gl.BlockedLayout([1, TILES], [4, 8], [1, WARPS], [0, 1])
    # the chunks' copies and the folds' stores: whole lines down the rows where they are contiguous
    COPY_L: gl.constexpr = _state_copy_layout(LOAD_L, rows_contiguous(SSM_STRIDE_K, SSM_STRIDE_V),
                                              ssm_ptr.dtype.element_ty.primitive_bitwidth, CHUNK_K, WARPS)
    # a warp over whole rows of the stack: each channel vector (weights, window columns) 4 a thread
    STACK_COLUMNS: gl.constexpr = min(32, BLOCK_K // 4)
    STACK_L: gl.constexpr = gl.BlockedLayout([1, 4], [32 // STACK_COLUMNS, STACK_COLUMNS], [WARPS, 1], [1, 0])
    # 16-byte rows of the stack's [8, 4] ldmatrix tiles on distinct banks
    KQ_SMEM: gl.constexpr = gl.SwizzledSharedLayout(4, 1, 8, [1, 0])

    CHUNKS: gl.constexpr = BLOCK_K // CHUNK_K
    STAGES: gl.constexpr = min(STATE_STAGES, CHUNKS)
    if STATE_STAGES > 0:  # the long read first, into shared memory: no register holds it meanwhile
        _issue_first_chunks(state_ring, state_base, live, v0, HEAD_K_DIM, HEAD_V_DIM, BLOCK_K, SSM_STRIDE_K,
                            SSM_STRIDE_V, CHUNK_K, BLOCK_V, COPY_L)
        upcoming = live  # unread
    else:
        upcoming = _state_chunk(state_base, 0, live, v0, HEAD_K_DIM, HEAD_V_DIM, SSM_STRIDE_K, SSM_STRIDE_V,
                                CHUNK_K, BLOCK_V, LOAD_L)  # the long read first
    if PREFETCH_V and NUM_NODES > 0:  # the drafts' v, read after the products, into L2 under the state's read
        V_BYTES: gl.constexpr = v_ptr.dtype.element_ty.primitive_bitwidth // 8
        _prefetch_rows(v_ptr + row * v_stride_row + head * v_stride_head + v0 * v_stride_v, v_stride_node, NUM_NODES,
                       gl.minimum(BLOCK_V, HEAD_V_DIM - v0) * V_BYTES, NODES, BLOCK_V * V_BYTES, WARPS)
    lane = gl.arange(0, NODES, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
    if TREE:  # the parent links now, their latency under the state's (node c's on lane c)
        links = gl.load(parents_ptr + row * parents_stride_row + lane * parents_stride_node, mask=lane < NUM_NODES,
                        other=-1)
    # the stack's gates: their latency under the state's too, at a few registers held through the products
    g_col, beta = _stack_gates(live, start, pending, row, head, gates_base, g_ptr, beta_ptr, g_stride_row,
                               g_stride_node, g_stride_head, beta_stride_row, beta_stride_node, beta_stride_head,
                               gates_stride_row, gates_stride_gate, NUM_NODES, RING_ROWS, KEY_ROWS, NODES, MMA)

    # the stack [NODES, dk]: pending tokens' k from their conv, the drafts' k, then their q; normalised,
    # scaled, staged in shared memory in PARTS blocks of rows: the pending tokens (at most PENDING_ROWS)
    # all in the first, which alone needs the conv
    PART: gl.constexpr = _stack_part(PENDING_ROWS, NODES, STACK_PARTS)
    PARTS: gl.constexpr = NODES // PART
    kq_hi = gl.allocate_shared_memory(gl.float32, [NODES, BLOCK_K], KQ_SMEM)
    if SPLIT:
        kq_lo = gl.allocate_shared_memory(gl.float32, [NODES, BLOCK_K], KQ_SMEM)
    else:
        kq_lo = kq_hi  # unread
    kk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, STACK_L))
    k_ok = kk < HEAD_K_DIM
    for part in gl.static_range(PARTS):
        s = part * PART + gl.arange(0, PART, layout=gl.SliceLayout(1, STACK_L))
        is_key = s < KEY_ROWS
        draft = gl.where(is_key, s - pending, s - KEY_ROWS)
        drafted = live & (draft >= 0) & (draft < NUM_NODES)
        d = gl.where(drafted, draft, 0).to(gl.int64)
        keys = k_ptr + row * k_stride_row + k_head * k_stride_head + (d * k_stride_node)[:, None] + \
            (kk * k_stride_k)[None, :]
        queries = q_ptr + row * q_stride_row + k_head * q_stride_head + (d * q_stride_node)[:, None] + \
            (kk * q_stride_k)[None, :]
        given_k = gl.load(keys, mask=(drafted & is_key)[:, None] & k_ok[None, :], other=0.0)
        given_q = gl.load(queries, mask=(drafted & ~is_key)[:, None] & k_ok[None, :], other=0.0)
        kq = gl.where(is_key[:, None], given_k.to(gl.float32), given_q.to(gl.float32))
        if part == 0 and PENDING_ROWS > 0:
            if pending > 0:  # (none in a row that just folded: its verify starts from the new checkpoint)
                k_chan = NUM_K_HEADS * HEAD_K_DIM + k_head * HEAD_K_DIM + kk
                conv_k = _pending_conv(rows_base, window_base, weight_ptr, bias_ptr, k_chan, k_ok, start, pending,
                                       rows_stride_row, rows_stride_dim, conv_stride_dim, conv_stride_win,
                                       weight_stride_dim, weight_stride_tap, bias_stride, RING_ROWS, KERNEL_SIZE,
                                       PART, HAS_BIAS, STACK_L)
                kq = gl.where((is_key & (s < pending))[:, None], conv_k, kq)
        if L2NORM:
            kq = kq * (1.0 / gl.sqrt(gl.sum(kq * kq, axis=1) + 1e-6))[:, None]  # (a divide a row, not a value)
        kq = kq * gl.where(is_key, 1.0, scale)[:, None]
        kq_head = _rounded(kq, True)
        kq_hi.slice(part * PART, PART, dim=0).store(kq_head)
        if SPLIT:
            kq_lo.slice(part * PART, PART, dim=0).store(_rounded(kq - kq_head, True))
    gl.thread_barrier()

    # the gram of the normalised stack, then K S0 (keys) / Q S0 (queries)
    gram = gl.zeros([NODES, NODES], gl.float32, layout=MMA)
    for c in gl.static_range(0, BLOCK_K, CHUNK_K):
        hi = kq_hi.slice(c, CHUNK_K, dim=1)
        lo = kq_lo.slice(c, CHUNK_K, dim=1)
        gram = _mma(hi.load(A_L), lo.load(A_L), hi.permute((1, 0)).load(B_L), lo.permute((1, 0)).load(B_L), gram,
                    SPLIT)
    products = _state_products(state_ring, state_base, live, v0, upcoming, kq_hi, kq_lo, NODES, HEAD_K_DIM,
                               HEAD_V_DIM, BLOCK_K, BLOCK_V, CHUNK_K, SSM_STRIDE_K, SSM_STRIDE_V, STATE_STAGES,
                               STAGES, WARPS, TILES, SPLIT, MMA, A_L, B_L, LOAD_L, COPY_L)

    # the node matrices: rows r and columns c of the stack (key token r < C, query C + d)
    r, r_key, r_pending, r_draft, r_drafted = _stack_entries(live, pending, NUM_NODES, KEY_ROWS, NODES, ROW_L)
    c, c_key, c_pending, _, c_drafted = _stack_entries(live, pending, NUM_NODES, KEY_ROWS, NODES, COL_L)
    c_drafted = c_drafted & c_key  # (columns: keys only)
    c_draft = c - pending
    if TREE:
        # each stack row's path as a bit mask of drafts, walked across the warp's lanes
        # (gdn_verify_mma._parent_of), then the [NODES, NODES] matrix from it
        links_ok = gl.sum(gl.where((lane < NUM_NODES) & ((links < -1) | (links >= lane)), 1, 0), axis=0) == 0
        lane_draft = gl.where(lane < KEY_ROWS, lane - pending, lane - KEY_ROWS)
        up = gl.where(live & (lane_draft >= 0) & (lane_draft < NUM_NODES), lane_draft, -1)
        bits = gl.zeros_like(lane)
        for _ in gl.static_range(NUM_NODES):
            bits |= gl.where(up >= 0, 1 << gl.minimum(gl.maximum(up, 0), 31).to(gl.int32), 0)
            up = gl.where((up >= 0) & links_ok, _parent_of(up, links), -1)
        shift = gl.minimum(gl.maximum(c_draft, 0), 31)
        on_path = (((gl.convert_layout(bits, ROW_L)[:, None] >> shift[None, :]) & 1) != 0) & c_drafted[None, :]
    else:
        links_ok = live
        on_path = (c_draft[None, :] <= r_draft[:, None]) & c_drafted[None, :]
    ancestry = ((c_pending[None, :] & (r_drafted[:, None] | (r_pending[:, None] & (c[None, :] <= r[:, None]))))
                | (r_drafted[:, None] & on_path))
    g_col = _floored_log_decay(g_col)
    cumulative = gl.sum(gl.where(ancestry, g_col[None, :], 0.0), axis=1)  # G of row r's token
    decay = gl.where(ancestry, gl.exp(gl.where(ancestry, cumulative[:, None]
                                               - gl.convert_layout(cumulative, COL_L)[None, :], 0.0)), 0.0)
    eye = r[:, None] == c[None, :]
    A = gl.where(r_key[:, None] & ~eye, beta[:, None] * decay * gram, 0.0)
    inverse = _unit_lower_inverse(A, gl.where(eye, 1.0, 0.0), KEY_ROWS, MMA, A_L, B_L, SPLIT)  # (I + A)^-1
    MIX_SPLIT: gl.constexpr = SPLIT or KEY_ROWS > 4  # (gdn_verify_mma: near-parallel keys sum up here)
    grown = gl.exp(cumulative)
    query_mix = gl.where(r_key[:, None], 0.0, decay * gram)

    # v of the key rows (pending: their conv; drafts: given), relabelled as the state's columns, staged
    # in shared memory by the stack's blocks of rows
    v_smem = gl.allocate_shared_memory(gl.float32, [NODES, BLOCK_V], KQ_SMEM)
    vl = v0 + gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, LOAD_L))
    for part in gl.static_range(PARTS):
        sl = part * PART + gl.arange(0, PART, layout=gl.SliceLayout(1, LOAD_L))
        sl_draft = sl - pending
        sl_drafted = live & (sl < KEY_ROWS) & (sl_draft >= 0) & (sl_draft < NUM_NODES)
        v_part = gl.load(v_ptr + row * v_stride_row + head * v_stride_head
                         + (gl.where(sl_drafted, sl_draft, 0).to(gl.int64) * v_stride_node)[:, None]
                         + (vl * v_stride_v)[None, :], mask=sl_drafted[:, None] & (vl < HEAD_V_DIM)[None, :],
                         other=0.0).to(gl.float32)
        if part == 0 and PENDING_ROWS > 0:
            if pending > 0:
                v_chan = 2 * NUM_K_HEADS * HEAD_K_DIM + head * HEAD_V_DIM + vl
                conv_v = _pending_conv(rows_base, window_base, weight_ptr, bias_ptr, v_chan, vl < HEAD_V_DIM, start,
                                       pending, rows_stride_row, rows_stride_dim, conv_stride_dim, conv_stride_win,
                                       weight_stride_dim, weight_stride_tap, bias_stride, RING_ROWS, KERNEL_SIZE,
                                       PART, HAS_BIAS, LOAD_L)
                v_part = gl.where((sl < pending)[:, None], conv_v, v_part)
        v_smem.slice(part * PART, PART, dim=0).store(_columns_relabelled(v_part, WARPS, TILES))
    gl.thread_barrier()
    v = v_smem.load(MMA)
    rhs = beta[:, None] * (v - grown[:, None] * products)  # zero on query rows
    if NUM_NODES > 0:
        o = gl.where(r_key, 0.0, grown)[:, None] * products + _product(
            _product(query_mix, inverse, MMA, A_L, B_L, MIX_SPLIT), rhs, MMA, A_L, B_L, SPLIT)

        n = gl.arange(0, BLOCK_V, layout=COL_L)
        vv = _relabelled(n, v0, WARPS, TILES)
        d = gl.where(r_drafted, r_draft, 0).to(gl.int64)
        dst = out_ptr + row * out_stride_row + head * out_stride_head + (d * out_stride_node)[:, None] + \
            (vv * out_stride_v)[None, :]
        gl.store(dst, o.to(out_ptr.dtype.element_ty),
                 mask=links_ok & (r_drafted & ~r_key)[:, None] & (vv < HEAD_V_DIM)[None, :])

        # the drafts' gates beside their rows, once per head (where a fold leaves them too: start + pending)
        node = gl.arange(0, NODES, layout=gl.SliceLayout(1, STACK_L))
        drafts = live & (node < NUM_NODES) & (v0 == 0)
        position = gates_base + ((start + pending + gl.where(drafts, node, 0)) % RING_ROWS) * gates_stride_row
        g_in = gl.load(g_ptr + row * g_stride_row + node * g_stride_node + head * g_stride_head, mask=drafts,
                       other=0.0)
        beta_in = gl.load(beta_ptr + row * beta_stride_row + node * beta_stride_node + head * beta_stride_head,
                          mask=drafts, other=0.0)
        gl.store(position, g_in.to(gl.float32), mask=drafts)
        gl.store(position + gates_stride_gate, beta_in.to(gl.float32), mask=drafts)
    if FOLD:
        updates = _product(inverse, rhs, MMA, A_L, B_L, SPLIT)  # U on key rows
        # S_P = exp(G_P) S0 + K^T diag(exp(G_P - G_j)) U over the pending rows j, a chunk of rows at a time
        total = gl.sum(gl.where(c_pending, g_col, 0.0), axis=0)
        weighted = updates * gl.where(r_pending, gl.exp(total - cumulative), 0.0)[:, None]
        w_hi, w_lo = _parts(weighted, B_L, SPLIT)
        vl = v0 + gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, COPY_L))
        for k0 in gl.static_range(0, BLOCK_K, CHUNK_K):
            keys_t = kq_hi.slice(k0, CHUNK_K, dim=1).permute((1, 0))
            rests_t = kq_lo.slice(k0, CHUNK_K, dim=1).permute((1, 0))
            acc = _mma(keys_t.load(A_L), rests_t.load(A_L), w_hi, w_lo,
                       gl.zeros([CHUNK_K, BLOCK_V], gl.float32, layout=MMA), SPLIT)
            # back to the tile's own column order: whole-line loads and stores, as the state's reads
            acc = gl.convert_layout(_columns_natural(acc, WARPS, TILES), COPY_L)
            kk = k0 + gl.arange(0, CHUNK_K, layout=gl.SliceLayout(1, COPY_L))
            tile = state_base + (kk * SSM_STRIDE_K)[:, None] + (vl * SSM_STRIDE_V)[None, :]
            mask = live & (kk < HEAD_K_DIM)[:, None] & (vl < HEAD_V_DIM)[None, :]
            if STAGES == CHUNKS and STATE_STAGES > 0:  # the whole tile still in shared memory, every copy landed
                before = state_ring.index(k0 // CHUNK_K).load(COPY_L).to(gl.float32)
            else:
                before = gl.load(tile, mask=mask, other=0.0).to(gl.float32)
            gl.store(tile, (gl.exp(total) * before + acc).to(ssm_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _gdn_ring_verify_mma_kernel(
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
    NUM_NODES: gl.constexpr, RING_ROWS: gl.constexpr, MAX_PENDING: gl.constexpr, FOLD_ABOVE: gl.constexpr,
    NODES: gl.constexpr, KERNEL_SIZE: gl.constexpr,
    NUM_K_HEADS: gl.constexpr, NUM_V_HEADS: gl.constexpr, HEAD_K_DIM: gl.constexpr, HEAD_V_DIM: gl.constexpr,
    BLOCK_K: gl.constexpr, BLOCK_V: gl.constexpr, TREE: gl.constexpr, L2NORM: gl.constexpr,
    HAS_BIAS: gl.constexpr, SPLIT_FOLD: gl.constexpr, CHUNK_K: gl.constexpr, WARPS: gl.constexpr,
    SSM_STRIDE_K: gl.constexpr, SSM_STRIDE_V: gl.constexpr, KIND: gl.constexpr, SMALL_KEYS: gl.constexpr,
    FUSED_WINDOW: gl.constexpr, WIDTH: gl.constexpr, WINDOW: gl.constexpr, STATE_STAGES: gl.constexpr,
    VERIFY_KEYS: gl.constexpr, TILES_A_PROGRAM: gl.constexpr, PDL: gl.constexpr, STACK_PARTS: gl.constexpr,
    PREFETCH_V: gl.constexpr,
):
    """One program: one [dk, BLOCK_V] checkpoint tile of one value head of one row, of layer
    ``layer`` + program_id(2); the arguments, skips and stores of gdn_ring_verify._gdn_ring_verify_kernel
    (the verify kinds: one layer, N >= 1, VERIFY_KEYS + N <= 32; the fold kind also a due flush's,
    every layer, N = 0). Only the rows of one KIND do any work, each kind its own compile with
    its own registers: 0, those that do not fold and whose pending + N keys fit SMALL_KEYS (a stack
    of NODES = 16 rows, queries from row SMALL_KEYS = 16 - N); 1, the others that do not fold (NODES
    rows, queries from row VERIFY_KEYS = max(FOLD_ABOVE, N): a row that does not fold has at most
    that many keys); 2, those that fold, launched before the others: the fold alone on a
    stack of NODES pending keys (3xTF32 with SPLIT_FOLD); 3, kinds 0 and 1 in one launch (each its
    own code, the registers of the larger) -- the launches of kinds 0 and 1 (or 3) then take a
    folding row as one with nothing pending from start + pending, verifying its drafts; with
    FUSED_WINDOW their programs of such a row then move its conv window past the folded tokens
    (nothing in these launches reads a folded row's window): each its v columns, a key head's first
    value head its q and k. With STATE_STAGES the state chunks come through shared memory (cp.async,
    that many in flight). With TILES_A_PROGRAM > 1 (KIND 2 only) a program of a row that folds folds
    that many of its tiles, program_id(0) * TILES_A_PROGRAM onwards, one after another: fewer
    programs where few rows fold (all of a row's, after a due flush: its launch is a wave). PDL:
    launched as a programmatic dependent (sm_90; gdn_verify_mma._grid_dependency), every read after
    the wait. STACK_PARTS: the most blocks of rows the stack is staged in (_stack_part). PREFETCH_V:
    the verifies' drafts' v rows into L2 at the start (_row_head)."""
    V_BLOCKS: gl.constexpr = (HEAD_V_DIM + BLOCK_V - 1) // BLOCK_V
    if PDL:
        _grid_dependency()
    row = gl.program_id(1).to(gl.int64)
    layer = (layer + gl.program_id(2)).to(gl.int64)  # (a scalar: an int argument of 1 is a constant)
    weight_ptr += layer * weight_stride_layer
    bias_ptr += layer * bias_stride_layer

    # the row's slots and cursor (ring_conv.ring_row_state): nothing is read past them unless live
    ring = gl.load(ring_slots_ptr + row * ring_slots_stride).to(gl.int64)
    slot = gl.load(state_slots_ptr + row * state_slots_stride).to(gl.int64)
    live = (slot >= 0) & (slot < num_state_slots) & (ring >= 0) & (ring < num_ring_slots)
    ring = gl.where(live, ring, 0)
    slot = gl.where(live, slot, 0)
    if STATE_STAGES > 0:  # 16-byte units XOR-swizzled by row: a warp's rows of a load on distinct banks
        state_ring = gl.allocate_shared_memory(
            ssm_ptr.dtype.element_ty, [STATE_STAGES, CHUNK_K, BLOCK_V],
            _state_ring_layout(gl.SwizzledSharedLayout(4, 1, 8, [1, 0]), rows_contiguous(SSM_STRIDE_K, SSM_STRIDE_V),
                               ssm_ptr.dtype.element_ty.primitive_bitwidth, CHUNK_K, BLOCK_V // (8 * WARPS)))
    else:
        state_ring = live  # unread
    start = gl.load(cursor_ptr + ring * cursor_stride_slot, mask=live, other=0).to(gl.int64)
    pending = gl.load(cursor_ptr + ring * cursor_stride_slot + cursor_stride_field, mask=live, other=0).to(gl.int64)
    live = live & (start >= 0) & (start < RING_ROWS) & (pending >= 0) & (pending <= MAX_PENDING)
    start = gl.where(live, start, 0).to(gl.int32)
    pending = gl.where(live, pending, 0).to(gl.int32)
    fold = live & (pending > 0) & (pending + NUM_NODES > FOLD_ABOVE)
    folded_start, folded, moved = start, pending, fold  # (the window's move, with FUSED_WINDOW)
    if KIND != 2:
        # the fold launch, before this one, brought the checkpoint past the pending tokens: the row
        # verifies its drafts from there, with nothing pending
        start = gl.where(fold, (start + pending) % RING_ROWS, start)
        pending = gl.where(fold, 0, pending)
        fold = pending < 0  # (none)
    kind = gl.where(fold, 2, gl.where(pending + NUM_NODES <= SMALL_KEYS, 0, 1))

    rows_base = rows_ptr + layer * rows_stride_layer + ring * rows_stride_slot
    window_base = conv_ptr + layer * conv_stride_layer + slot * conv_stride_slot
    if TILES_A_PROGRAM > 1:  # the program's tiles, if the row folds
        tiles = gl.where(kind == 2, TILES_A_PROGRAM, 0)
    else:
        tiles = 1
    for tile in range(tiles):
        if TILES_A_PROGRAM > 1:
            gl.thread_barrier()  # (the tile before's last reads of shared memory, before this one's copies)
        program = gl.program_id(0) * TILES_A_PROGRAM + tile
        head = program // V_BLOCKS
        v0 = (program % V_BLOCKS) * BLOCK_V
        k_head = head // (NUM_V_HEADS // NUM_K_HEADS)
        state_base = ssm_ptr + layer * ssm_stride_layer + slot * ssm_stride_slot + head * ssm_stride_head
        gates_base = gates_ptr + layer * gates_stride_layer + ring * gates_stride_slot + head * gates_stride_head
        # this launch's kind of row (KIND 3: the kinds 0 and 1, each its own code)
        for THIS in gl.static_range(0 if KIND == 3 else KIND, 2 if KIND == 3 else KIND + 1):
            if kind == THIS:
                _row_head(live, start, pending, row, head, k_head, v0, state_base, state_ring, rows_base, window_base,
                          gates_base, weight_ptr, bias_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, parents_ptr, out_ptr,
                          ssm_ptr, scale,
                          q_stride_row, q_stride_node, q_stride_head, q_stride_k, k_stride_row, k_stride_node,
                          k_stride_head, k_stride_k, v_stride_row, v_stride_node, v_stride_head, v_stride_v,
                          g_stride_row, g_stride_node, g_stride_head, beta_stride_row, beta_stride_node,
                          beta_stride_head, conv_stride_dim, conv_stride_win, rows_stride_row, rows_stride_dim,
                          gates_stride_row, gates_stride_gate, parents_stride_row, parents_stride_node,
                          out_stride_row, out_stride_node, out_stride_head, out_stride_v,
                          weight_stride_dim, weight_stride_tap, bias_stride,
                          0 if THIS == 2 else NUM_NODES, RING_ROWS,
                          SMALL_KEYS if THIS == 0 else (NODES if THIS == 2 else VERIFY_KEYS),
                          SMALL_KEYS - NUM_NODES if THIS == 0 else
                          (MAX_PENDING if THIS == 2 else VERIFY_KEYS - NUM_NODES),
                          SMALL_KEYS + NUM_NODES if THIS == 0 else NODES, KERNEL_SIZE, NUM_K_HEADS,
                          HEAD_K_DIM, HEAD_V_DIM, BLOCK_K, BLOCK_V, CHUNK_K, TREE and THIS != 2,
                          L2NORM, HAS_BIAS, WARPS, SSM_STRIDE_K, SSM_STRIDE_V, THIS == 2, THIS == 2 and SPLIT_FOLD,
                          STATE_STAGES, STACK_PARTS, PREFETCH_V)
                if FUSED_WINDOW and THIS != 2:
                    if moved:
                        WINDOW_L: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, WARPS], [1, 0])
                        vv = v0 + gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, WINDOW_L))
                        v_chan = 2 * NUM_K_HEADS * HEAD_K_DIM + head * HEAD_V_DIM + vv
                        _window_after(window_base + v_chan * conv_stride_dim, rows_base + v_chan * rows_stride_dim,
                                      vv < HEAD_V_DIM, folded_start, folded, conv_stride_win, rows_stride_row,
                                      RING_ROWS, WIDTH, WINDOW, WINDOW_L)
                        if (head % (NUM_V_HEADS // NUM_K_HEADS) == 0) & (v0 == 0):
                            kk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, WINDOW_L))
                            for part in gl.static_range(2):  # q, then k
                                qk_chan = (part * NUM_K_HEADS + k_head) * HEAD_K_DIM + kk
                                _window_after(window_base + qk_chan * conv_stride_dim,
                                              rows_base + qk_chan * rows_stride_dim, kk < HEAD_K_DIM, folded_start,
                                              folded, conv_stride_win, rows_stride_row, RING_ROWS, WIDTH, WINDOW,
                                              WINDOW_L)
