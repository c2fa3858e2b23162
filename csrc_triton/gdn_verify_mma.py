"""gdn_verify's kernel with the tensor-core operands loaded straight from global memory (Gluon,
sm_80+): the same chunked (UT) form and arithmetic as csrc_triton/gdn_verify.py, whose docstring
derives it.

Triton's kernel loads the state tile in a coalesced register layout and converts it to the layout
of a tensor-core operand through shared memory; those conversions, not the state's bytes, bound
it. Here every thread loads exactly the state elements its mma.m16n8k8 B fragments hold: the
fragments' columns are relabelled (a permutation of the value columns, undone where v is read and
out written) so that a thread's columns come in runs of 16 bytes and the 8 lanes of a row read
adjacent runs: every load instruction reads whole 128-byte lines. The [dk, BLOCK_V] tile thus goes
from global memory into the tensor cores with no shared memory and no layout conversion, a chunk of
rows at a time, the next chunk's loads in flight while one multiplies. v and out, small beside it,
go the other way (_key_values, _store_queries): in 16-byte runs a thread, through shared memory,
since from the accumulator's layout each access would be of one element over up to 32 sectors.
k and q are loaded raw
(bf16 and fp16 are exact in tf32) and the l2 norm and the scale are applied to the products' rows,
both being linear: K S0 / |k| = (K / |k|) S0; the norms are the diagonal of the raw gram matrix,
which the node matrices need anyway. A persistent launch (a tuning: gdn_verify's ``persistent``)
runs the same tile on a grid of a few programs an SM, each taking tiles until none is left, so
that a batch's tiles fill whole waves of them.

With Q_EFF (gdn_verify's ``q_eff``) the outputs come from the effective queries instead:
o = e^G Q S0 + M diag(beta) (V - diag(e^G) K S0) = Q_eff S0 + M diag(beta) V with
Q_eff = diag(e^G) Q - M diag(beta e^G) K (M the mix matrix). The two terms that cancel where a
query retrieves a key its own path wrote (beta near 1) cancel in float32 (W = [diag(e^G); -M diag(beta
e^G)] in 3xTF32 against the tf32-exact stack) before ONE tf32 product with the state: the error
is relative to |Q_eff S0| instead of |Q S0|. The node matrices then come before the state products.
"""

from __future__ import annotations

import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from ._common import LOG_DECAY_FLOOR, prefetch_lines
from .gdn_verify import column_copy_lanes, rows_contiguous


@gluon.jit
def _grid_dependency():
    """Programmatic dependent launch (sm_90): wait for the kernel before this one to finish and its
    writes to be visible (griddepcontrol.wait), then let the next kernel's programs start
    (griddepcontrol.launch_dependents). Only after the wait: so when a kernel starts, every one
    before the kernel just before it has finished."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _prefetch_tile(slot_at, num_state_slots, head_base, ssm_stride_slot, v0, HEAD_K_DIM: gl.constexpr,
                   HEAD_V_DIM: gl.constexpr, BLOCK_V: gl.constexpr, SSM_STRIDE_K: gl.constexpr,
                   SSM_STRIDE_V: gl.constexpr, ROWS: gl.constexpr, WARPS: gl.constexpr):
    """The first ROWS state rows of the tile at column v0 of the slot read at ``slot_at`` (its head's
    state at head_base + slot x ssm_stride_slot) into L2 (cp.async.bulk.prefetch, sm_90: one range
    where they are contiguous, else a run a row or a column a lane, at most 32 x WARPS runs;
    16-byte aligned, lengths rounded down to 16 bytes). A hint that reads nothing into the program:
    L2 is where every write lands, so it is safe before the kernel launched before this one has
    finished, whatever that kernel writes (the slot then may be stale: it only aims the hint; the
    caller reads it again after the wait)."""
    slot = gl.load(slot_at, volatile=True).to(gl.int64)  # (volatile: not merged with the read after the wait)
    ok = (slot >= 0) & (slot < num_state_slots)
    state_base = head_base + gl.where(ok, slot, 0) * ssm_stride_slot
    BYTES: gl.constexpr = state_base.dtype.element_ty.primitive_bitwidth // 8
    LANES: gl.constexpr = 32 * WARPS
    lane = gl.arange(0, LANES, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
    if rows_contiguous(SSM_STRIDE_K, SSM_STRIDE_V):  # the columns' first rows
        if ROWS >= HEAD_K_DIM and SSM_STRIDE_V == HEAD_K_DIM:  # whole columns, adjacent: one range
            starts = state_base + v0 * SSM_STRIDE_V + lane * 0
            live = ok & (lane == 0)
            sizes = gl.minimum(BLOCK_V, HEAD_V_DIM - v0) * HEAD_K_DIM * BYTES + lane * 0
        else:  # a column a lane
            starts = state_base + (v0 + lane) * SSM_STRIDE_V
            live = ok & (lane < BLOCK_V) & (v0 + lane < HEAD_V_DIM)
            sizes = gl.full([LANES], min(ROWS, HEAD_K_DIM) * BYTES, gl.int32, layout=lane.type.layout)
    else:  # the first rows' columns
        if SSM_STRIDE_V == 1 and SSM_STRIDE_K == BLOCK_V and BLOCK_V == HEAD_V_DIM:  # whole rows, adjacent: one range
            starts = state_base + lane * 0
            live = ok & (lane == 0)
            sizes = gl.full([LANES], min(ROWS, HEAD_K_DIM) * HEAD_V_DIM * BYTES, gl.int32, layout=lane.type.layout)
        else:  # a row a lane
            starts = state_base + lane * SSM_STRIDE_K + v0 * SSM_STRIDE_V
            live = ok & (lane < min(ROWS, HEAD_K_DIM)) & (SSM_STRIDE_V == 1)
            sizes = gl.minimum(BLOCK_V, HEAD_V_DIM - v0) * BYTES + lane * 0
    addresses = starts.to(gl.int64, bitcast=True)
    sizes = sizes // 16 * 16
    live = live & ((addresses & 15) == 0) & (sizes > 0)
    gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $3; mov.u32 $0, 0; }",
        "=r,l,r,r", [addresses, live.to(gl.int32), sizes], dtype=gl.int32, is_pure=False, pack=1)


_lines = gluon.constexpr_function(prefetch_lines)  # (_common's, at compile time)


@gluon.jit
def _prefetch_rows(base, stride_row, num_rows, row_bytes, ROWS: gl.constexpr, MOST_BYTES: gl.constexpr,
                   WARPS: gl.constexpr):
    """A hint: rows r < num_rows (of ROWS, a power of two) of ``row_bytes`` (at most MOST_BYTES)
    contiguous bytes each, at base + r x stride_row elements, into L2, kept there before the lines
    streamed through after them (prefetch.global.L2::evict_last, a prefetch a 128-byte line). It
    reads nothing into the program: safe whatever writes those bytes. (_common.prefetch_rows_l2's
    hint: a Gluon function cannot call a Triton one.)"""
    LINES: gl.constexpr = _lines(MOST_BYTES)
    i = gl.arange(0, ROWS * LINES, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
    row = i // LINES
    first = (base + row * stride_row).to(gl.int64, bitcast=True)
    line = (first // 128 + i % LINES) * 128
    live = (row < num_rows) & (line < first + row_bytes)
    gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [line, live.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _floored_log_decay(x):
    """_common.floored_log_decay for Gluon kernels."""
    return gl.maximum(x, LOG_DECAY_FLOOR, propagate_nan=tl.PropagateNan.ALL)


@gluon.jit
def _rounded(x, ROUND: gl.constexpr):
    """x rounded to tf32 to nearest (gdn_verify._operand), if ROUND."""
    if ROUND:
        bits = x.to(gl.int32, bitcast=True)
        x = ((bits + 0x1000) & -8192).to(gl.float32, bitcast=True)
    return x


@gluon.jit
def _mma(a_hi, a_lo, b_hi, b_lo, acc, SPLIT: gl.constexpr):
    """acc + a @ b from operands already in their dot layouts: hi hi, plus with SPLIT the rests'
    products first (3xTF32)."""
    if SPLIT:
        acc = mma_v2(a_lo, b_hi, acc, input_precision="tf32")
        acc = mma_v2(a_hi, b_lo, acc, input_precision="tf32")
    return mma_v2(a_hi, b_hi, acc, input_precision="tf32")


@gluon.jit
def _parts(x, LAYOUT: gl.constexpr, SPLIT: gl.constexpr):
    """(head, rest) of x as tf32 operands in LAYOUT, each rounded to nearest; the rest only with SPLIT."""
    head = _rounded(x, True)
    hi = gl.convert_layout(head, LAYOUT)
    if SPLIT:
        lo = gl.convert_layout(_rounded(x - head, True), LAYOUT)
    else:
        lo = hi  # unread
    return hi, lo


@gluon.jit
def _product(a, b, MMA: gl.constexpr, A_L: gl.constexpr, B_L: gl.constexpr, SPLIT: gl.constexpr):
    """a @ b of two tensors in the accumulator's layout."""
    a_hi, a_lo = _parts(a, A_L, SPLIT)
    b_hi, b_lo = _parts(b, B_L, SPLIT)
    return _mma(a_hi, a_lo, b_hi, b_lo, gl.zeros([a.shape[0], b.shape[1]], gl.float32, layout=MMA), SPLIT)


@gluon.jit
def _state_chunk(state_base, first, slot_ok, v0, HEAD_K_DIM: gl.constexpr, HEAD_V_DIM: gl.constexpr,
                 SSM_STRIDE_K: gl.constexpr, SSM_STRIDE_V: gl.constexpr, CHUNK_K: gl.constexpr,
                 BLOCK_V: gl.constexpr, LOAD_L: gl.constexpr, NATIVE: gl.constexpr = False):
    """State rows first .. first + CHUNK_K - 1 of the tile, fp32 (NATIVE: the pool's type), zeros
    outside it or for a bad slot."""
    kk = first + gl.arange(0, CHUNK_K, layout=gl.SliceLayout(1, LOAD_L))
    vv = v0 + gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, LOAD_L))
    tile = state_base + (kk * SSM_STRIDE_K)[:, None] + (vv * SSM_STRIDE_V)[None, :]
    mask = slot_ok & (kk < HEAD_K_DIM)[:, None] & (vv < HEAD_V_DIM)[None, :]
    chunk = gl.load(tile, mask=mask, other=0.0)
    if not NATIVE:
        chunk = chunk.to(gl.float32)
    return chunk


@gluon.constexpr_function
def _state_copy_layout(load_layout, k_contiguous, element_bits, chunk_k, warps):
    """The layout of a state chunk's cp.async: load_layout (a thread's run of value columns) where
    the columns are contiguous; where the rows are, 16-byte runs down a column, a warp's lanes over
    whole 128-byte column segments (state_stages_for checks that it fits the chunk)."""
    if not k_contiguous:
        return load_layout
    vec = 128 // element_bits
    lanes_k = max(1, column_copy_lanes(chunk_k, element_bits // 8))
    return gl.BlockedLayout([vec, 1], [lanes_k, 32 // lanes_k], [1, warps], [0, 1])


@gluon.constexpr_function
def _state_ring_layout(row_layout, k_contiguous, element_bits, chunk_k, run):
    """The shared layout of the chunks' ring: row_layout where the value columns are contiguous;
    where the rows are, column-major with its 16-byte units XOR-swizzled by column run (``run``:
    the columns a thread reads in a row), so that the lanes' reads of one row hit distinct banks."""
    if not k_contiguous:
        return row_layout
    return gl.SwizzledSharedLayout(128 // element_bits, run, max(1, min(8, chunk_k * element_bits // 128)), [0, 1])


@gluon.jit
def _issue_state_chunk(slot, state_base, first, live, v0, HEAD_K_DIM: gl.constexpr, HEAD_V_DIM: gl.constexpr,
                       SSM_STRIDE_K: gl.constexpr, SSM_STRIDE_V: gl.constexpr, CHUNK_K: gl.constexpr,
                       BLOCK_V: gl.constexpr, COPY_L: gl.constexpr):
    """State rows first .. first + CHUNK_K - 1 of the tile copied into shared memory ``slot`` by
    cp.async in COPY_L (_state_copy_layout), one commit group (zeros outside the tile or for a row
    not live)."""
    kk = first + gl.arange(0, CHUNK_K, layout=gl.SliceLayout(1, COPY_L))
    vv = v0 + gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, COPY_L))
    async_copy.async_copy_global_to_shared(
        slot, state_base + (kk * SSM_STRIDE_K)[:, None] + (vv * SSM_STRIDE_V)[None, :],
        mask=live & (kk < HEAD_K_DIM)[:, None] & (vv < HEAD_V_DIM)[None, :])
    async_copy.commit_group()


@gluon.jit
def _issue_first_chunks(state_ring, state_base, live, v0, HEAD_K_DIM: gl.constexpr, HEAD_V_DIM: gl.constexpr,
                        BLOCK_K: gl.constexpr, SSM_STRIDE_K: gl.constexpr, SSM_STRIDE_V: gl.constexpr,
                        CHUNK_K: gl.constexpr, BLOCK_V: gl.constexpr, COPY_L: gl.constexpr):
    """The tile's first chunks of rows issued into the ring's slots (_staged_chunk's ring), one each."""
    for i in gl.static_range(min(state_ring.shape[0], BLOCK_K // CHUNK_K)):
        _issue_state_chunk(state_ring.index(i), state_base, i * CHUNK_K, live, v0, HEAD_K_DIM, HEAD_V_DIM,
                           SSM_STRIDE_K, SSM_STRIDE_V, CHUNK_K, BLOCK_V, COPY_L)


@gluon.jit
def _staged_chunk(state_ring, state_base, live, v0, FIRST: gl.constexpr, STAGES: gl.constexpr,
                  HEAD_K_DIM: gl.constexpr, HEAD_V_DIM: gl.constexpr, BLOCK_K: gl.constexpr,
                  SSM_STRIDE_K: gl.constexpr, SSM_STRIDE_V: gl.constexpr, CHUNK_K: gl.constexpr,
                  BLOCK_V: gl.constexpr, LOAD_L: gl.constexpr, COPY_L: gl.constexpr,
                  NATIVE: gl.constexpr = False):
    """State rows FIRST .. FIRST + CHUNK_K - 1 of the tile in LOAD_L, fp32 (NATIVE: the pool's type),
    from their slot of the STAGES-slot ring in shared memory (chunk i in slot i % STAGES, chunks 0 ..
    STAGES-1 issued first); the slot then refilled with the chunk STAGES later (copied in COPY_L)."""
    CHUNKS: gl.constexpr = BLOCK_K // CHUNK_K
    I: gl.constexpr = FIRST // CHUNK_K
    async_copy.wait_group(min(CHUNKS, STAGES + I) - (I + 1))  # this thread's copies of chunk I landed
    gl.thread_barrier()  # and every other thread's
    state = state_ring.index(I % STAGES).load(LOAD_L)
    if not NATIVE:
        state = state.to(gl.float32)
    if I + STAGES < CHUNKS:  # the slot refilled once every thread has read it
        gl.thread_barrier()
        _issue_state_chunk(state_ring.index(I % STAGES), state_base, (I + STAGES) * CHUNK_K, live, v0, HEAD_K_DIM,
                           HEAD_V_DIM, SSM_STRIDE_K, SSM_STRIDE_V, CHUNK_K, BLOCK_V, COPY_L)
    return state


@gluon.jit
def _unit_lower_inverse(A, identity, PATH: gl.constexpr, MMA: gl.constexpr, A_L: gl.constexpr,
                        B_L: gl.constexpr, SPLIT: gl.constexpr, SHALLOW: gl.constexpr = False, depth=0):
    """(I + A)^-1 for A strictly lower triangular (zero past PATH nodes), in tf32 (3xTF32 with
    SPLIT): gdn_verify._unit_lower_inverse's blocks of 4 joined into 8, 16, ... (every intermediate
    the size of an inverse); with SHALLOW one block where no root path is over 4 nodes (``depth``)."""
    r = gl.arange(0, A.shape[0], layout=gl.SliceLayout(1, MMA))
    c = gl.arange(0, A.shape[1], layout=gl.SliceLayout(0, MMA))
    if PATH <= 2:
        inverse = identity - A
    else:
        within = A  # up to 4 nodes one block
        if PATH > 4:
            one_block = (r[:, None] // 4) == (c[None, :] // 4)
            if SHALLOW:
                one_block = one_block | (depth <= 4)
            within = gl.where(one_block, A, 0.0)
        inverse = identity - within  # exact: only the correction below carries the products' rounding
        inverse += _product(inverse, _product(within, within, MMA, A_L, B_L, SPLIT), MMA, A_L, B_L, SPLIT)
    if PATH > 4:
        if SHALLOW:
            if depth > 4:
                inverse = _joined_blocks(inverse, A, r, c, PATH, MMA, A_L, B_L, SPLIT)
        else:
            inverse = _joined_blocks(inverse, A, r, c, PATH, MMA, A_L, B_L, SPLIT)
    return inverse


@gluon.jit
def _joined_blocks(inverse, A, r, c, PATH: gl.constexpr, MMA: gl.constexpr, A_L: gl.constexpr, B_L: gl.constexpr,
                   SPLIT: gl.constexpr):
    """_unit_lower_inverse's blocks of 4 joined into 8, 16, ...: each pair of halves as T - T A' T."""
    for level in gl.static_range(0, max(0, (PATH - 1).bit_length() - 2)):
        half = 4 << level
        coupling = gl.where(((r[:, None] // (2 * half)) == (c[None, :] // (2 * half)))
                            & ((r[:, None] // half) != (c[None, :] // half)), A, 0.0)
        inverse = inverse - _product(_product(inverse, coupling, MMA, A_L, B_L, SPLIT), inverse, MMA, A_L, B_L,
                                     SPLIT)
    return inverse


@gluon.jit
def _parent_of(x, links):
    """links[x] per entry of x, -1 where x < 0 (links: -1 past the real nodes, in x's layout; x
    past them only in a row whose links are broken, whose walk is not used): a lookup across the
    warp's lanes, no load."""
    inside = (x >= 0) & (x < links.shape[0])
    return gl.where(x >= 0, gl.gather(links, gl.where(inside, x, 0).to(gl.int32), 0), -1)


@gluon.jit
def _path_masks(masks, walker, NUM_NODES: gl.constexpr):
    """(bits, masks_ok): entry c of ``masks`` node c's path mask (bit j set where node j is c or one of
    its ancestors), the mask of node ``walker`` per entry (its own bit past the real nodes), and
    whether they are a forest's: node n's has bit n and none above, and without bit n it is its
    parent's (the highest node left in it) or empty."""
    mine = gl.gather(masks, walker.to(gl.int32), 0)
    ok = (mine >> walker) == 1  # (in the masks' own width: no bit above n survives a narrowing)
    rest = (mine ^ (1 << walker)).to(gl.int32)  # (below 2^15 where ok: at most 16 nodes)
    up = gl.zeros_like(rest)  # the highest bit of rest: the parent
    x = rest
    for i in gl.static_range(4):
        shifted = x >> (8 >> i)
        up = gl.where(shifted != 0, up + (8 >> i), up)
        x = gl.where(shifted != 0, shifted, x)
    parents = gl.gather(masks, gl.where((rest > 0) & (up < NUM_NODES), up, 0), 0).to(gl.int32)
    ok &= (rest == 0) | (parents == rest)
    masks_ok = gl.sum(gl.where((walker < NUM_NODES) & ~ok, 1, 0), axis=0) == 0
    return gl.where(walker < NUM_NODES, mine.to(gl.int32), 1 << walker), masks_ok


@gluon.jit
def _gates(row, head, g_ptr, beta_ptr, g_stride_row, g_stride_node, g_stride_head, beta_stride_row,
           beta_stride_node, beta_stride_head, NUM_NODES: gl.constexpr, NODES: gl.constexpr, MMA: gl.constexpr):
    """(g_col, beta): the stack columns' floored log decays (node c's on both sides' columns) and the
    stack rows' betas (zero on query rows: no update there), fp32, in _node_matrices' layouts."""
    HALF: gl.constexpr = NODES // 2
    col_node = gl.arange(0, NODES, layout=gl.SliceLayout(0, MMA)) % HALF
    stack = gl.arange(0, NODES, layout=gl.SliceLayout(1, MMA))
    node = stack % HALF
    g_col = gl.load(g_ptr + row * g_stride_row + head * g_stride_head + col_node * g_stride_node,
                    mask=col_node < NUM_NODES, other=0.0)
    beta = gl.load(beta_ptr + row * beta_stride_row + node * beta_stride_node + head * beta_stride_head,
                   mask=(node < NUM_NODES) & (stack < HALF), other=0.0)
    return _floored_log_decay(g_col.to(gl.float32)), beta.to(gl.float32)


@gluon.jit
def _node_matrices(gram, row, scale, g_col, beta, links,
                   NUM_NODES: gl.constexpr, NODES: gl.constexpr, TREE: gl.constexpr, L2NORM: gl.constexpr,
                   MMA: gl.constexpr, A_L: gl.constexpr, B_L: gl.constexpr, SPLIT: gl.constexpr,
                   TREE_MASKS: gl.constexpr, SHALLOW: gl.constexpr):
    """From the raw gram [k; q][k; q]^T: (mix, row_c, grown, kept, beta, links_ok), the
    [NODES, NODES] matrix and the per-row factors of gdn_verify's docstring, in the accumulator's
    layout (row_c: the l2 norm's and the scale's factor of each stack row). g_col, beta: _gates'
    (beta returned as given). links: a tree's parent links [NODES], entry c node c's (-1 past the
    real nodes), one a lane, loaded with the first state chunk; the walk up the tree looks them up
    across lanes. With TREE_MASKS the entries
    are each node's path mask instead (_path_masks): checked, not walked. SPLIT: the inverse and the
    mix in 3xTF32 (else the mix past 4 nodes only). SHALLOW: a tree's inverse as one block where its
    paths allow (_unit_lower_inverse)."""
    ROW_L: gl.constexpr = gl.SliceLayout(1, MMA)
    COL_L: gl.constexpr = gl.SliceLayout(0, MMA)
    HALF: gl.constexpr = NODES // 2
    stack = gl.arange(0, NODES, layout=ROW_L)
    key_side = stack < HALF
    node = stack % HALF
    col_stack = gl.arange(0, NODES, layout=COL_L)
    col_key = col_stack < HALF
    col_node = col_stack % HALF
    col_real = col_node < NUM_NODES
    eye = stack[:, None] == col_stack[None, :]
    # rows of the normalised, scaled stack: c_r [k; q]_r; the raw norms are the gram's diagonal
    row_sq = gl.sum(gl.where(eye, gram, 0.0), axis=1)
    col_sq = gl.sum(gl.where(eye, gram, 0.0), axis=0)
    if L2NORM:
        row_c = 1.0 / gl.sqrt(row_sq + 1e-6)
        col_c = 1.0 / gl.sqrt(col_sq + 1e-6)
    else:
        row_c = gl.full([NODES], 1.0, gl.float32, layout=ROW_L)
        col_c = gl.full([NODES], 1.0, gl.float32, layout=COL_L)
    row_c = row_c * gl.where(key_side, 1.0, scale)
    col_c = col_c * gl.where(col_key, 1.0, scale)
    gram = gram * row_c[:, None] * col_c[None, :]

    # ancestry[r, c]: node(c) is node(r) or one of its ancestors (both sides of the stack)
    if TREE:
        # each stack row's ancestors as a bit mask, then the [NODES, NODES] matrix from it
        walker = gl.arange(0, NODES, layout=links.type.layout) % HALF
        if TREE_MASKS:
            bits, links_ok = _path_masks(links, walker, NUM_NODES)
        else:
            up = _parent_of(walker, links)
            links_ok = gl.sum(gl.where((walker < NUM_NODES) & ((up < -1) | (up >= walker)), 1, 0), axis=0) == 0
            bits = gl.full([NODES], 1, gl.int32, layout=links.type.layout) << walker
            for _ in gl.static_range(NUM_NODES - 1):
                bits |= gl.where(up >= 0, 1 << gl.minimum(gl.maximum(up, 0), 31).to(gl.int32), 0)
                up = gl.where((up >= 0) & links_ok, _parent_of(up, links), -1)
        ancestry = ((gl.convert_layout(bits, ROW_L)[:, None] >> col_node[None, :]) & 1) != 0
    else:
        ancestry = col_node[None, :] <= node[:, None]
        links_ok = row >= 0
    ancestry &= (col_key & col_real)[None, :]
    depth = gl.max(gl.sum(ancestry.to(gl.int32), axis=1), axis=0)  # the longest root path's nodes
    cumulative = gl.sum(gl.where(ancestry, g_col[None, :], 0.0), axis=1)  # G of node(r)
    decay = gl.exp(gl.where(ancestry, cumulative[:, None] - gl.convert_layout(cumulative, COL_L)[None, :], 0.0))
    decay = gl.where(ancestry, decay, 0.0)  # D, on both sides' rows
    A = gl.where(key_side[:, None] & ~eye, beta[:, None] * decay * gram, 0.0)
    identity = gl.where(eye, 1.0, 0.0)
    queries = gl.where(key_side[:, None], 0.0, decay * gram)
    inverse = _unit_lower_inverse(A, identity, NUM_NODES, MMA, A_L, B_L, SPLIT, SHALLOW, depth)
    # past 4 nodes in 3xTF32: near-parallel keys sum up to N terms here (as gdn_verify's kernel)
    mix = _product(queries, inverse, MMA, A_L, B_L, SPLIT or NUM_NODES > 4)
    grown = gl.exp(cumulative)
    kept = gl.where(key_side, 0.0, grown)  # diag(exp G) Q S0 on query rows

    return mix, row_c, grown, kept, beta, links_ok


@gluon.jit
def _value_rows(ptr, row, head, v0, stride_row, stride_node, stride_head, stride_v, NUM_NODES: gl.constexpr,
                NODES: gl.constexpr, HEAD_V_DIM: gl.constexpr, BLOCK_V: gl.constexpr, WARPS: gl.constexpr,
                VEC: gl.constexpr, MMA: gl.constexpr, KEYS: gl.constexpr = True):
    """(pointers, mask) of a [NODES, BLOCK_V] tile of v's or out's rows in the accumulator's layout
    and the state's column relabelling (mma column n is the state's column vv): the stack's key rows
    (KEYS) or its query rows, node by node."""
    HALF: gl.constexpr = NODES // 2
    stack = gl.arange(0, NODES, layout=gl.SliceLayout(1, MMA))
    node = stack % HALF
    n = gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, MMA))
    tile = n // (8 * WARPS)
    vv = v0 + (tile // VEC) * (8 * VEC * WARPS) + ((n // 8) % WARPS) * (8 * VEC) + (n % 8) * VEC + tile % VEC
    side = (stack < HALF) == KEYS
    mask = ((node < NUM_NODES) & side)[:, None] & (vv < HEAD_V_DIM)[None, :]
    return ptr + row * stride_row + head * stride_head + (node * stride_node)[:, None] + (vv * stride_v)[None, :], mask


@gluon.constexpr_function
def _runs_layout(element_bits, block_v, warps):
    """A [rows, block_v] tile's layout of 16-byte runs a thread along its rows (the lanes of a warp
    across them first)."""
    run = min(block_v, 128 // element_bits)
    lanes = min(32, block_v // run)
    return gl.BlockedLayout([1, run], [32 // lanes, lanes], [warps, 1], [1, 0])


@gluon.jit
def _value_runs(ptr, row, head, v0, stride_row, stride_node, stride_head, stride_v, NUM_NODES: gl.constexpr,
                NODES: gl.constexpr, HEAD_V_DIM: gl.constexpr, BLOCK_V: gl.constexpr, WARPS: gl.constexpr,
                KEYS: gl.constexpr):
    """_value_rows' (pointers, mask) in 16-byte runs a thread (_runs_layout) and the value columns
    in order, not relabelled."""
    RUNS_L: gl.constexpr = _runs_layout(ptr.dtype.element_ty.primitive_bitwidth, BLOCK_V, WARPS)
    HALF: gl.constexpr = NODES // 2
    stack = gl.arange(0, NODES, layout=gl.SliceLayout(1, RUNS_L))
    node = stack % HALF
    vv = v0 + gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, RUNS_L))
    mask = (((stack < HALF) == KEYS) & (node < NUM_NODES))[:, None] & (vv < HEAD_V_DIM)[None, :]
    return ptr + row * stride_row + head * stride_head + (node * stride_node)[:, None] + (vv * stride_v)[None, :], mask


@gluon.jit
def _key_values(v_ptr, row, head, v0, stride_row, stride_node, stride_head, stride_v, NUM_NODES: gl.constexpr,
                NODES: gl.constexpr, HEAD_V_DIM: gl.constexpr, BLOCK_V: gl.constexpr, WARPS: gl.constexpr,
                VEC: gl.constexpr, MMA: gl.constexpr, RUNS: gl.constexpr):
    """v's rows on the stack's key rows of a [NODES, BLOCK_V] tile in the accumulator's layout and
    the state's column relabelling (_value_rows), zeros on its query rows, in v's type. RUNS: loaded
    in 16-byte runs, then relabelled and moved into the accumulator's layout through shared memory
    (an element a load otherwise: each touching up to 32 sectors for 64 bytes)."""
    if RUNS:
        TILES: gl.constexpr = BLOCK_V // (8 * WARPS)
        rows, key_rows = _value_runs(v_ptr, row, head, v0, stride_row, stride_node, stride_head, stride_v, NUM_NODES,
                                     NODES, HEAD_V_DIM, BLOCK_V, WARPS, True)
        v = gl.load(rows, mask=key_rows, other=0.0)
        v = v.reshape([NODES, TILES // VEC, WARPS, 8, VEC]).permute((0, 1, 4, 2, 3)).reshape([NODES, BLOCK_V])
        return gl.convert_layout(v, MMA)
    rows, key_rows = _value_rows(v_ptr, row, head, v0, stride_row, stride_node, stride_head, stride_v, NUM_NODES,
                                 NODES, HEAD_V_DIM, BLOCK_V, WARPS, VEC, MMA)
    return gl.load(rows, mask=key_rows, other=0.0)


@gluon.jit
def _store_queries(out_ptr, o, ok, row, head, v0, stride_row, stride_node, stride_head, stride_v,
                   NUM_NODES: gl.constexpr, NODES: gl.constexpr, HEAD_V_DIM: gl.constexpr, BLOCK_V: gl.constexpr,
                   WARPS: gl.constexpr, VEC: gl.constexpr, MMA: gl.constexpr, RUNS: gl.constexpr):
    """o's query rows ([NODES, BLOCK_V], the accumulator's layout and the state's column
    relabelling) stored into out's node rows where ``ok``; RUNS: its columns put back in order and
    moved through shared memory into 16-byte runs a thread (as _key_values loads)."""
    o = o.to(out_ptr.dtype.element_ty)
    if RUNS:
        TILES: gl.constexpr = BLOCK_V // (8 * WARPS)
        o = gl.convert_layout(
            o.reshape([NODES, TILES // VEC, VEC, WARPS, 8]).permute((0, 1, 3, 4, 2)).reshape([NODES, BLOCK_V]),
            _runs_layout(out_ptr.dtype.element_ty.primitive_bitwidth, BLOCK_V, WARPS))
        dst, query_rows = _value_runs(out_ptr, row, head, v0, stride_row, stride_node, stride_head, stride_v,
                                      NUM_NODES, NODES, HEAD_V_DIM, BLOCK_V, WARPS, False)
        gl.store(dst, o, mask=ok & query_rows)
    else:
        dst, query_rows = _value_rows(out_ptr, row, head, v0, stride_row, stride_node, stride_head, stride_v,
                                      NUM_NODES, NODES, HEAD_V_DIM, BLOCK_V, WARPS, VEC, MMA, False)
        gl.store(dst, o, mask=ok & query_rows)


@gluon.jit
def _verify_tile(
    tile, out_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, ssm_ptr, slots_ptr, parents_ptr,
    num_state_slots, scale,
    out_stride_row, out_stride_node, out_stride_head, out_stride_v,
    q_stride_row, q_stride_node, q_stride_head, q_stride_k,
    k_stride_row, k_stride_node, k_stride_head, k_stride_k,
    v_stride_row, v_stride_node, v_stride_head, v_stride_v,
    g_stride_row, g_stride_node, g_stride_head,
    beta_stride_row, beta_stride_node, beta_stride_head,
    ssm_stride_slot, ssm_stride_head, slots_stride, parents_stride_row, parents_stride_node,
    NUM_NODES: gl.constexpr, NODES: gl.constexpr, NUM_K_HEADS: gl.constexpr, NUM_V_HEADS: gl.constexpr,
    HEAD_K_DIM: gl.constexpr, HEAD_V_DIM: gl.constexpr, BLOCK_K: gl.constexpr, BLOCK_V: gl.constexpr,
    TREE: gl.constexpr, L2NORM: gl.constexpr, CHUNK_K: gl.constexpr, ROUND_KQ: gl.constexpr, WARPS: gl.constexpr,
    SSM_STRIDE_K: gl.constexpr, SSM_STRIDE_V: gl.constexpr, STATE_STAGES: gl.constexpr, FROM_PROGRAM: gl.constexpr,
    PDL: gl.constexpr, Q_EFF: gl.constexpr, TREE_MASKS: gl.constexpr, SHALLOW: gl.constexpr,
    EARLY: gl.constexpr, NATIVE: gl.constexpr, PREFETCH: gl.constexpr, RUNS: gl.constexpr, PREFETCH_V: gl.constexpr,
):
    """One [dk, BLOCK_V] state tile's outputs, from one read of it: the tile of _gdn_verify_mma_kernel's
    program (FROM_PROGRAM), else tile ``tile`` of the batch, row-major (a row's value heads and
    their column blocks, then the next row's). PDL 1: everything read once the kernel launched
    before this one has finished; 2: the slot and the state's first chunks before that (that
    kernel must write neither; only the slot with Q_EFF in registers), the rest after. Q_EFF: the
    node matrices first, then one product of the state with the effective queries (module
    docstring). EARLY 1: g and beta loaded with the parent links, not when the node matrices need
    them; 2, with Q_EFF: also v, its term M diag(beta) V then the products' first addend (its latency
    and product not after the state's). TREE_MASKS: parents_ptr holds each node's path mask
    (_path_masks) instead of its link. NATIVE (stacked products; the pool, q and k of one 16-bit
    type): the gram and the state's products as 16-bit mma.m16n8k16 of the raw stack, exact like
    tf32's of those values, with half the mma instructions and the state never widened. PREFETCH_V:
    v's rows, which the products' end reads, prefetched into L2 at the start (_prefetch_rows)."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, WARPS], instr_shape=[16, 8])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=1)
    B_L: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=1)
    ROW_L: gl.constexpr = gl.SliceLayout(1, MMA)
    COL_L: gl.constexpr = gl.SliceLayout(0, MMA)
    TILES: gl.constexpr = BLOCK_V // (8 * WARPS)  # mma tiles of 8 columns per warp
    VEC: gl.constexpr = min(TILES, 128 // ssm_ptr.dtype.element_ty.primitive_bitwidth)  # 16-byte loads
    # NATIVE's 16-bit operands (mma.m16n8k16: a register holds two elements adjacent along k)
    A16_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B16_L: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    # B's fragments (rows tig and tig + 4 of each k step): a thread's columns in runs of VEC, the
    # 8 runs of a warp's lanes adjacent, so that every load instruction reads whole 128-byte lines
    LOAD_L: gl.constexpr = gl.BlockedLayout([1, VEC], [4, 8], [1, WARPS], [0, 1])
    STACK_L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    # 16-byte units XOR-swizzled by row: the mma operands' 8 rows x 4 columns hit 32 banks
    KQ_SMEM: gl.constexpr = gl.SwizzledSharedLayout(8 if NATIVE else 4, 1, 8, [1, 0])
    BITS: gl.constexpr = ssm_ptr.dtype.element_ty.primitive_bitwidth
    K_CONTIGUOUS: gl.constexpr = rows_contiguous(SSM_STRIDE_K, SSM_STRIDE_V)
    COPY_L: gl.constexpr = _state_copy_layout(LOAD_L, K_CONTIGUOUS, BITS, CHUNK_K, WARPS)
    HALF: gl.constexpr = NODES // 2
    V_BLOCKS: gl.constexpr = (HEAD_V_DIM + BLOCK_V - 1) // BLOCK_V
    GATES_FIRST: gl.constexpr = Q_EFF and EARLY > 0  # (the stacked products' node matrices come last)
    V_FIRST: gl.constexpr = Q_EFF and EARLY == 2
    if FROM_PROGRAM:
        head = gl.program_id(0) // V_BLOCKS
        v0 = (gl.program_id(0) % V_BLOCKS) * BLOCK_V
        row = gl.program_id(1).to(gl.int64)
    else:
        head = (tile % (NUM_V_HEADS * V_BLOCKS)) // V_BLOCKS
        v0 = (tile % V_BLOCKS) * BLOCK_V
        row = (tile // (NUM_V_HEADS * V_BLOCKS)).to(gl.int64)
    k_head = head // (NUM_V_HEADS // NUM_K_HEADS)

    if PDL == 1 and PREFETCH > 0:
        _prefetch_tile(slots_ptr + row * slots_stride, num_state_slots, ssm_ptr + head * ssm_stride_head,
                       ssm_stride_slot, v0, HEAD_K_DIM, HEAD_V_DIM, BLOCK_V, SSM_STRIDE_K, SSM_STRIDE_V, PREFETCH,
                       WARPS)
    if PDL == 1:
        _grid_dependency()
    slot = gl.load(slots_ptr + row * slots_stride).to(gl.int64)
    slot_ok = (slot >= 0) & (slot < num_state_slots)
    slot = gl.where(slot_ok, slot, 0)
    state_base = ssm_ptr + slot * ssm_stride_slot + head * ssm_stride_head
    k_base = k_ptr + row * k_stride_row + k_head * k_stride_head
    q_base = q_ptr + row * q_stride_row + k_head * q_stride_head

    if STATE_STAGES > 0:  # 16-byte units XOR-swizzled by row: a warp's rows of a load on distinct banks
        state_ring = gl.allocate_shared_memory(
            ssm_ptr.dtype.element_ty, [STATE_STAGES, CHUNK_K, BLOCK_V],
            _state_ring_layout(gl.SwizzledSharedLayout(VEC, 1, 8, [1, 0]), K_CONTIGUOUS, BITS, CHUNK_K, VEC))
        _issue_first_chunks(state_ring, state_base, slot_ok, v0, HEAD_K_DIM, HEAD_V_DIM, BLOCK_K, SSM_STRIDE_K,
                            SSM_STRIDE_V, CHUNK_K, BLOCK_V, COPY_L)  # the long read first: nothing before it waits
        upcoming = slot_ok  # unread
    elif Q_EFF:  # the first chunk after the effective queries: held across them, it costs registers
        state_ring = slot_ok  # unread
        upcoming = slot_ok
    else:
        state_ring = slot_ok  # unread
        upcoming = _state_chunk(state_base, 0, slot_ok, v0, HEAD_K_DIM, HEAD_V_DIM, SSM_STRIDE_K, SSM_STRIDE_V,
                                CHUNK_K, BLOCK_V, LOAD_L, NATIVE)  # the long read first: nothing before it waits
    if PDL == 2:  # what the kernel before wrote (q, k, v, g, beta, parents) only from here on
        _grid_dependency()
    if PREFETCH_V:  # v's rows into L2 under the state's read: its load after the products finds them there
        _prefetch_rows(v_ptr + row * v_stride_row + head * v_stride_head + v0 * v_stride_v, v_stride_node, NUM_NODES,
                       gl.minimum(BLOCK_V, HEAD_V_DIM - v0) * (v_ptr.dtype.element_ty.primitive_bitwidth // 8), HALF,
                       BLOCK_V * (v_ptr.dtype.element_ty.primitive_bitwidth // 8), WARPS)
    # the tree walk's layout: node c's parent link on lane c
    index = gl.arange(0, NODES, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
    if TREE:  # the parent links now, their latency under the state's: the walk runs on registers
        links = gl.load(parents_ptr + row * parents_stride_row + index * parents_stride_node,
                        mask=index < NUM_NODES, other=-1)
    else:
        links = index  # unread
    if GATES_FIRST:  # their latency under the stack's and the state's: the node matrices wait on them
        g_col, beta = _gates(row, head, g_ptr, beta_ptr, g_stride_row, g_stride_node, g_stride_head, beta_stride_row,
                             beta_stride_node, beta_stride_head, NUM_NODES, NODES, MMA)
    if V_FIRST:
        v = _key_values(v_ptr, row, head, v0, v_stride_row, v_stride_node, v_stride_head, v_stride_v, NUM_NODES,
                        NODES, HEAD_V_DIM, BLOCK_V, WARPS, VEC, MMA, RUNS)
    # The [k; q] stack, fp32, into shared memory once: each chunk's A operand and the gram's B
    # operand (its transpose) are read from there.
    stack_b = gl.arange(0, NODES, layout=gl.SliceLayout(1, STACK_L))
    node_b = stack_b % HALF
    kk_b = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, STACK_L))
    stack_ok = (node_b < NUM_NODES)[:, None] & (kk_b < HEAD_K_DIM)[None, :]
    if k_ptr.dtype == q_ptr.dtype:  # one load through the rows' pointers
        rows_b = gl.where(stack_b < HALF, k_base + node_b * k_stride_node, q_base + node_b * q_stride_node)
        strides_b = gl.where(stack_b < HALF, k_stride_k, q_stride_k)
        kq_all = gl.load(rows_b[:, None] + kk_b[None, :] * strides_b[:, None], mask=stack_ok, other=0.0)
        if not NATIVE:  # (NATIVE: raw, in their own type, the products' A operand)
            kq_all = kq_all.to(gl.float32)
    else:  # (pointers of two types do not mix: one load each)
        key_b = (stack_b < HALF)[:, None]
        kq_all = gl.where(key_b, gl.load((k_base + node_b * k_stride_node)[:, None] + (kk_b * k_stride_k)[None, :],
                                         mask=stack_ok & key_b, other=0.0).to(gl.float32),
                          gl.load((q_base + node_b * q_stride_node)[:, None] + (kk_b * q_stride_k)[None, :],
                                  mask=stack_ok & ~key_b, other=0.0).to(gl.float32))
    if NATIVE:  # k relabelled as the state's rows are below (a product over k is the same in any order)
        kq_smem = gl.allocate_shared_memory(kq_all.dtype, [NODES, BLOCK_K], KQ_SMEM, kq_all.reshape(
            [NODES, BLOCK_K // 16, 2, 2, 4]).permute((0, 1, 2, 4, 3)).reshape([NODES, BLOCK_K]))
    else:
        kq_smem = gl.allocate_shared_memory(gl.float32, [NODES, BLOCK_K], KQ_SMEM, _rounded(kq_all, ROUND_KQ))

    gram = gl.zeros([NODES, NODES], gl.float32, layout=MMA)
    gl.thread_barrier()
    for c in gl.static_range(0, BLOCK_K, CHUNK_K):
        chunk = kq_smem.slice(c, CHUNK_K, dim=1)
        if NATIVE:
            gram = mma_v2(chunk.load(A16_L), chunk.permute((1, 0)).load(B16_L), gram)
        else:
            gram = mma_v2(chunk.load(A_L), chunk.permute((1, 0)).load(B_L), gram, input_precision="tf32")

    if Q_EFF:  # the stack's query rows become Q_eff = W [k; q], its key rows zero, before the products
        if not GATES_FIRST:
            g_col, beta = _gates(row, head, g_ptr, beta_ptr, g_stride_row, g_stride_node, g_stride_head,
                                 beta_stride_row, beta_stride_node, beta_stride_head, NUM_NODES, NODES, MMA)
        mix, row_c, grown, kept, beta, links_ok = _node_matrices(
            gram, row, scale, g_col, beta, links, NUM_NODES, NODES, TREE, L2NORM, MMA, A_L, B_L,
            True, TREE_MASKS, SHALLOW)
        eye = gl.arange(0, NODES, layout=ROW_L)[:, None] == gl.arange(0, NODES, layout=COL_L)[None, :]
        W = gl.where(eye, (kept * row_c)[:, None], 0.0) - mix * gl.convert_layout(beta * grown * row_c, COL_L)[None, :]
        w_hi, w_lo = _parts(W, A_L, True)
        stack_b = kq_smem.load(B_L)  # tf32 values already (ROUND_KQ): only W has a rest
        q_eff = mma_v2(w_lo, stack_b, gl.zeros([NODES, BLOCK_K], gl.float32, layout=MMA), input_precision="tf32")
        q_eff = mma_v2(w_hi, stack_b, q_eff, input_precision="tf32")
        gl.thread_barrier()  # every read of the raw stack done
        kq_smem.store(_rounded(q_eff, True))
        gl.thread_barrier()
        if STATE_STAGES == 0:
            upcoming = _state_chunk(state_base, 0, slot_ok, v0, HEAD_K_DIM, HEAD_V_DIM, SSM_STRIDE_K, SSM_STRIDE_V,
                                    CHUNK_K, BLOCK_V, LOAD_L)

    if V_FIRST:  # o = M diag(beta) V + Q_eff S0: the first term's product before the state's
        products = _product(mix, beta[:, None] * v.to(gl.float32), MMA, A_L, B_L, False)
    else:
        products = gl.zeros([NODES, BLOCK_V], gl.float32, layout=MMA)
    for c in gl.static_range(0, BLOCK_K, CHUNK_K):
        if STATE_STAGES > 0:
            state = _staged_chunk(state_ring, state_base, slot_ok, v0, c, min(STATE_STAGES, BLOCK_K // CHUNK_K),
                                  HEAD_K_DIM, HEAD_V_DIM, BLOCK_K, SSM_STRIDE_K, SSM_STRIDE_V, CHUNK_K, BLOCK_V, LOAD_L,
                                  COPY_L, NATIVE)
        else:
            state = upcoming
            if c + CHUNK_K < BLOCK_K:  # the next chunk's loads in flight while this one multiplies
                upcoming = _state_chunk(state_base, c + CHUNK_K, slot_ok, v0, HEAD_K_DIM, HEAD_V_DIM, SSM_STRIDE_K,
                                        SSM_STRIDE_V, CHUNK_K, BLOCK_V, LOAD_L, NATIVE)
        # relabel the columns (no data moves): a thread's TILES columns (runs of VEC) become its
        # columns of the warp's TILES mma tiles
        state = state.reshape([CHUNK_K, TILES // VEC, WARPS, 8, VEC]).permute((0, 1, 4, 2, 3)).reshape(
            [CHUNK_K, BLOCK_V])
        if NATIVE:  # and the rows: a thread's tig, tig + 4 (+ 8) of 16 become m16n8k16's 2 tig, 2 tig + 1 (+ 8)
            state = state.reshape([CHUNK_K // 16, 2, 2, 4, BLOCK_V]).permute((0, 1, 3, 2, 4)).reshape(
                [CHUNK_K, BLOCK_V])
            products = mma_v2(kq_smem.slice(c, CHUNK_K, dim=1).load(A16_L), gl.convert_layout(state, B16_L), products)
        else:
            products = mma_v2(kq_smem.slice(c, CHUNK_K, dim=1).load(A_L), gl.convert_layout(state, B_L), products,
                              input_precision="tf32")
    if not Q_EFF:  # after the products: before them, the chunks' loads wait in registers (docs/benchmarks.md)
        if not GATES_FIRST:
            g_col, beta = _gates(row, head, g_ptr, beta_ptr, g_stride_row, g_stride_node, g_stride_head,
                                 beta_stride_row, beta_stride_node, beta_stride_head, NUM_NODES, NODES, MMA)
        mix, row_c, grown, kept, beta, links_ok = _node_matrices(
            gram, row, scale, g_col, beta, links, NUM_NODES, NODES, TREE, L2NORM, MMA, A_L, B_L,
            False, TREE_MASKS, SHALLOW)
        products = products * row_c[:, None]  # K S0 on key rows, Q S0 (scaled) on query rows
    if not V_FIRST:
        v = _key_values(v_ptr, row, head, v0, v_stride_row, v_stride_node, v_stride_head, v_stride_v, NUM_NODES,
                        NODES, HEAD_V_DIM, BLOCK_V, WARPS, VEC, MMA, RUNS).to(gl.float32)
    if V_FIRST:
        o = products
    elif Q_EFF:
        o = products + _product(mix, beta[:, None] * v, MMA, A_L, B_L, False)
    else:
        rhs = beta[:, None] * (v - grown[:, None] * products)
        o = kept[:, None] * products + _product(mix, rhs, MMA, A_L, B_L, False)
    _store_queries(out_ptr, o, slot_ok & links_ok, row, head, v0, out_stride_row, out_stride_node, out_stride_head,
                   out_stride_v, NUM_NODES, NODES, HEAD_V_DIM, BLOCK_V, WARPS, VEC, MMA, RUNS)


@gluon.jit
def _gdn_verify_mma_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, ssm_ptr, slots_ptr, parents_ptr,
    num_state_slots, scale,
    out_stride_row, out_stride_node, out_stride_head, out_stride_v,
    q_stride_row, q_stride_node, q_stride_head, q_stride_k,
    k_stride_row, k_stride_node, k_stride_head, k_stride_k,
    v_stride_row, v_stride_node, v_stride_head, v_stride_v,
    g_stride_row, g_stride_node, g_stride_head,
    beta_stride_row, beta_stride_node, beta_stride_head,
    ssm_stride_slot, ssm_stride_head, ssm_stride_k, ssm_stride_v,
    slots_stride, parents_stride_row, parents_stride_node,
    NUM_NODES: gl.constexpr, NODES: gl.constexpr, NUM_K_HEADS: gl.constexpr, NUM_V_HEADS: gl.constexpr,
    HEAD_K_DIM: gl.constexpr, HEAD_V_DIM: gl.constexpr, BLOCK_K: gl.constexpr, BLOCK_V: gl.constexpr,
    TREE: gl.constexpr, L2NORM: gl.constexpr, PRECISION: gl.constexpr, CHUNK_K: gl.constexpr,
    ROUND_KQ: gl.constexpr, WARPS: gl.constexpr, SSM_STRIDE_K: gl.constexpr, SSM_STRIDE_V: gl.constexpr,
    STATE_STAGES: gl.constexpr, PDL: gl.constexpr, Q_EFF: gl.constexpr, TREE_MASKS: gl.constexpr,
    SHALLOW: gl.constexpr, EARLY: gl.constexpr, NATIVE: gl.constexpr, PREFETCH: gl.constexpr, RUNS: gl.constexpr,
    PREFETCH_V: gl.constexpr,
):
    """One program: one [dk, BLOCK_V] state tile of one value head of one row, as
    gdn_verify._gdn_verify_kernel (the same arguments, skips and stores; PRECISION unread: tf32,
    its operands rounded to nearest). The state's strides come as SSM_STRIDE_K / _V, constants, so
    that the chunk loads take immediate offsets. With STATE_STAGES the chunks go through shared
    memory (cp.async, that many in flight from the program's start) instead of registers. PDL 1 or
    2: launched as a programmatic dependent (sm_90; _verify_tile); PREFETCH (with PDL 1): the tile's
    first that many rows prefetched into L2 before the wait (_prefetch_tile). TREE_MASKS: parents
    holds each node's path mask (_verify_tile). RUNS: v and out in 16-byte runs (_key_values).
    PREFETCH_V: v's rows into L2 at the start (_verify_tile)."""
    _verify_tile(-1, out_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, ssm_ptr,
                 slots_ptr, parents_ptr, num_state_slots, scale,
                 out_stride_row, out_stride_node, out_stride_head, out_stride_v,
                 q_stride_row, q_stride_node, q_stride_head, q_stride_k,
                 k_stride_row, k_stride_node, k_stride_head, k_stride_k,
                 v_stride_row, v_stride_node, v_stride_head, v_stride_v,
                 g_stride_row, g_stride_node, g_stride_head,
                 beta_stride_row, beta_stride_node, beta_stride_head,
                 ssm_stride_slot, ssm_stride_head, slots_stride, parents_stride_row, parents_stride_node,
                 NUM_NODES, NODES, NUM_K_HEADS, NUM_V_HEADS, HEAD_K_DIM, HEAD_V_DIM, BLOCK_K, BLOCK_V,
                 TREE, L2NORM, CHUNK_K, ROUND_KQ, WARPS, SSM_STRIDE_K, SSM_STRIDE_V, STATE_STAGES, True, PDL,
                 Q_EFF, TREE_MASKS, SHALLOW, EARLY, NATIVE, PREFETCH, RUNS, PREFETCH_V)


@gluon.jit(do_not_specialize=["num_rows"])
def _gdn_verify_mma_persistent_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, ssm_ptr, slots_ptr, parents_ptr,
    num_state_slots, scale, num_rows,
    out_stride_row, out_stride_node, out_stride_head, out_stride_v,
    q_stride_row, q_stride_node, q_stride_head, q_stride_k,
    k_stride_row, k_stride_node, k_stride_head, k_stride_k,
    v_stride_row, v_stride_node, v_stride_head, v_stride_v,
    g_stride_row, g_stride_node, g_stride_head,
    beta_stride_row, beta_stride_node, beta_stride_head,
    ssm_stride_slot, ssm_stride_head, ssm_stride_k, ssm_stride_v,
    slots_stride, parents_stride_row, parents_stride_node,
    NUM_NODES: gl.constexpr, NODES: gl.constexpr, NUM_K_HEADS: gl.constexpr, NUM_V_HEADS: gl.constexpr,
    HEAD_K_DIM: gl.constexpr, HEAD_V_DIM: gl.constexpr, BLOCK_K: gl.constexpr, BLOCK_V: gl.constexpr,
    TREE: gl.constexpr, L2NORM: gl.constexpr, PRECISION: gl.constexpr, CHUNK_K: gl.constexpr,
    ROUND_KQ: gl.constexpr, WARPS: gl.constexpr, SSM_STRIDE_K: gl.constexpr, SSM_STRIDE_V: gl.constexpr,
    STATE_STAGES: gl.constexpr, PDL: gl.constexpr, Q_EFF: gl.constexpr, TREE_MASKS: gl.constexpr,
    SHALLOW: gl.constexpr, EARLY: gl.constexpr, NATIVE: gl.constexpr, RUNS: gl.constexpr,
):
    """_gdn_verify_mma_kernel's tiles of num_rows rows (row-major: a row's heads, then the next row's),
    program_id(0), + num_programs, ... a program, on a grid (programs, 1): a grid of a few programs
    an SM caps how many share one, so that the batch's tiles fill whole waves."""
    V_BLOCKS: gl.constexpr = (HEAD_V_DIM + BLOCK_V - 1) // BLOCK_V
    HEAD_TILES: gl.constexpr = NUM_V_HEADS * V_BLOCKS
    for tile in range(gl.program_id(0), num_rows * HEAD_TILES, gl.num_programs(0)):
        gl.thread_barrier()  # (the tile before's last reads of shared memory, before this one's stores)
        _verify_tile(tile, out_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, ssm_ptr,
                     slots_ptr, parents_ptr, num_state_slots, scale,
                     out_stride_row, out_stride_node, out_stride_head, out_stride_v,
                     q_stride_row, q_stride_node, q_stride_head, q_stride_k,
                     k_stride_row, k_stride_node, k_stride_head, k_stride_k,
                     v_stride_row, v_stride_node, v_stride_head, v_stride_v,
                     g_stride_row, g_stride_node, g_stride_head,
                     beta_stride_row, beta_stride_node, beta_stride_head,
                     ssm_stride_slot, ssm_stride_head, slots_stride, parents_stride_row, parents_stride_node,
                     NUM_NODES, NODES, NUM_K_HEADS, NUM_V_HEADS, HEAD_K_DIM, HEAD_V_DIM, BLOCK_K, BLOCK_V,
                     TREE, L2NORM, CHUNK_K, ROUND_KQ, WARPS, SSM_STRIDE_K, SSM_STRIDE_V, STATE_STAGES, False, PDL,
                     Q_EFF, TREE_MASKS, SHALLOW, EARLY, NATIVE, 0, RUNS, False)
