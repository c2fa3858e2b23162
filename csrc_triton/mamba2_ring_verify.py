"""mamba2_ring_verify's and mamba2_ring_flush's kernels: the ring's pending tokens replayed from the
checkpoint and this step's drafts decoded, in the chunked (SSD) form of csrc_triton/mamba2_verify.py,
from one read of the checkpoint tile.

Per row b and head h (group h // (H / G)), with (start, pending) = cursor[ring_slots[b]], P =
pending, the key tokens are the P pending tokens (ring rows (start + j) % C) then the N drafts: a
pending token's x and B are its conv over the ring's rows (the checkpoint's window before the
first; SiLU), its d the dt the ring keeps; a draft's are given (d = dt (+ dt_bias), softplus'd).
With L_t the cumulative d A along token t's ancestors (a pending token: the pending tokens up to
it; a draft: every pending token and its tree path),

    y_n  = exp(L_n) C_n S0^T + sum_{t in anc(n)} exp(L_n - L_t) d_t (C_n . B_t) x_t  (+ D x_n) (* silu z_n)
    S_P  = exp(L_P) S0 + sum_{j < P} exp(L_P - L_j) d_j x_j B_j^T                  (the fold)

One program holds one [Ns, BLOCK_P] tile of S0^T: C S0^T is one product with the drafts' C, the
intra-chunk term one [N, keys] x [keys, BLOCK_P] product, the fold one [Ns, keys] x [keys, BLOCK_P]
product written over the tile it read. Every product is in 3xTF32 by default for a float32
checkpoint (fold_precision_for): the fold must keep float32's accuracy, and tf32 outputs missed
mamba2_verify's tolerance (2e-3 x max |y|) over the 1,000-step test. The folded conv window is
gdn_ring_verify's second launch, mixer-free.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import MAX_GRID_Y, KernelCall, cdiv, next_power_of_2
from .gdn_ring_verify import _pending_conv, _ring_row, flush_cursor_call, fold_precision_for, window_call
from .gdn_verify import MIN_DOT, VERIFY_PROGRAMS, _dot, _operand, spread_block
from .mamba2_verify import _step_sizes

# Head-dim rows per tile (fewer for small batches: gdn_verify.spread_block) and warps: the offline
# sm_90 compile's only spill-free choice at Nemotron-H's heads; not yet timed on a GPU.
RING_BLOCK_P = 64
MAMBA2_RING_WARPS = 8
RING_STAGES = 1  # the loop over a program's heads not software-pipelined: the H200 sweep's fastest


def group_share(tiles_per_head: int, num_heads: int, num_groups: int) -> int:
    """Heads per program: the most of a group's heads (a divisor of H / G) that still leaves
    VERIFY_PROGRAMS programs, each head's ``tiles_per_head`` tiles (rows x layers x column blocks)."""
    per_group = num_heads // num_groups
    for share in range(per_group, 1, -1):
        if per_group % share == 0 and tiles_per_head * (num_heads // share) >= VERIFY_PROGRAMS:
            return share
    return 1


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
    a_stride_layer, a_stride, d_stride, dt_bias_stride,
    ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_p, ssm_stride_n,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    rows_stride_layer, rows_stride_slot, rows_stride_row, rows_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_row, gates_stride_gate, gates_stride_head,
    cursor_stride_slot, cursor_stride_field, weight_stride_layer, weight_stride_dim, weight_stride_tap,
    bias_stride_layer, bias_stride, ring_slots_stride, state_slots_stride, parents_stride_row, parents_stride_node,
    NUM_NODES: tl.constexpr, RING_ROWS: tl.constexpr, MAX_PENDING: tl.constexpr, FOLD_ABOVE: tl.constexpr,
    KEYS: tl.constexpr, QUERIES: tl.constexpr, KERNEL_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr,
    NUM_GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, D_STATE: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr, TREE: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, FOLD_PRECISION: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr, ROWS: tl.constexpr,
):
    """One program: one [Ns, BLOCK_P] tile of S0^T of each of HEADS_PER_PROGRAM heads of one group
    of one row, of layer ``layer`` + program_id(2); what the group's heads share (the key tokens' B,
    its conv, their ancestry, the drafts' C, C B^T) once, then head by head. A row is left alone
    unless both slots are in range and its cursor a ring position (pending <= MAX_PENDING); its
    outputs also need every parent link in [-1, n-1]. It folds when pending > 0 and pending + N >
    FOLD_ABOVE (the verify: the capacity; the flush, no drafts: 0). ROWS: 0 every row, 1 only the
    rows that do not fold (pending + N <= KEYS suffices), 2 only those that fold; the others return."""
    P_BLOCKS: tl.constexpr = (HEAD_DIM + BLOCK_P - 1) // BLOCK_P
    first_head = (tl.program_id(0) // P_BLOCKS) * HEADS_PER_PROGRAM
    p_block = tl.program_id(0) % P_BLOCKS
    pp = p_block * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = pp < HEAD_DIM
    row = tl.program_id(1).to(tl.int64)
    layer = (layer + tl.program_id(2)).to(tl.int64)
    group = first_head // (NUM_HEADS // NUM_GROUPS)
    weight_ptr += layer * weight_stride_layer
    bias_ptr += layer * bias_stride_layer

    ring, slot, start, pending, live = _ring_row(row, ring_slots_ptr, state_slots_ptr, cursor_ptr, num_state_slots,
                                                 num_ring_slots, ring_slots_stride, state_slots_stride,
                                                 cursor_stride_slot, cursor_stride_field, RING_ROWS, MAX_PENDING)
    start = start.to(tl.int32)
    pending = pending.to(tl.int32)
    fold = live & (pending > 0) & (pending + NUM_NODES > FOLD_ABOVE)
    if ROWS != 0:
        if fold == (ROWS == 1):
            return

    # what the group's heads share: the key tokens t (pending t < P, then draft t - P), their B [KEYS, Ns]
    # and ancestry, the drafts' C, and C B^T
    nn = tl.arange(0, BLOCK_N)
    n_ok = nn < D_STATE
    key = tl.arange(0, KEYS)
    key_pending = key < pending  # (pending is 0 for a row left alone)
    key_draft = key - pending
    key_drafted = tl.where(live, (key_draft >= 0) & (key_draft < NUM_NODES), False)
    kd = tl.where(key_drafted, key_draft, 0).to(tl.int64)
    rows_base = rows_ptr + layer * rows_stride_layer + ring * rows_stride_slot
    window_base = conv_ptr + layer * conv_stride_layer + slot * conv_stride_slot
    b_pending = _pending_conv(rows_base, window_base, weight_ptr, bias_ptr, key, key_pending, start, pending,
                              NUM_HEADS * HEAD_DIM + group * D_STATE + nn, n_ok, rows_stride_row, rows_stride_dim,
                              conv_stride_dim, conv_stride_win, weight_stride_dim, weight_stride_tap, bias_stride,
                              RING_ROWS, KERNEL_SIZE, HAS_BIAS)
    b_given = tl.load(b_ptr + row * b_stride_row + group * b_stride_group + (kd * b_stride_node)[:, None]
                      + (nn * b_stride_n)[None, :], mask=key_drafted[:, None] & n_ok[None, :], other=0.0)
    b_keys = tl.where(key_pending[:, None], b_pending, b_given.to(tl.float32))

    query = tl.arange(0, QUERIES)
    query_real = tl.where(live, query < NUM_NODES, False)
    if TREE:
        links = parents_ptr + row * parents_stride_row
        node = tl.arange(0, QUERIES)
        real_node = node < NUM_NODES
        all_up = tl.load(links + tl.where(real_node, node, 0) * parents_stride_node, mask=real_node, other=-1)
        links_ok = tl.sum(tl.where(real_node & ((all_up < -1) | (all_up >= node)), 1, 0)) == 0
        up_key = tl.where(key_drafted, key_draft, -1)
        up_query = tl.where(query_real, query, -1)
        key_path = (up_key[:, None] == key_draft[None, :]) & key_drafted[None, :]
        query_path = (up_query[:, None] == key_draft[None, :]) & key_drafted[None, :]
        for _ in tl.static_range(NUM_NODES - 1):  # the links looked up in registers (all_up: node n's at n)
            climbing = tl.where(links_ok, up_key >= 0, False)
            up_key = tl.where(climbing, tl.gather(all_up, tl.where(climbing, up_key, 0).to(tl.int32), 0), -1)
            key_path |= (up_key[:, None] == key_draft[None, :]) & (up_key >= 0)[:, None] & key_drafted[None, :]
            climbing = tl.where(links_ok, up_query >= 0, False)
            up_query = tl.where(climbing, tl.gather(all_up, tl.where(climbing, up_query, 0).to(tl.int32), 0), -1)
            query_path |= (up_query[:, None] == key_draft[None, :]) & (up_query >= 0)[:, None] & key_drafted[None, :]
    else:
        links_ok = live
        key_path = (key_draft[None, :] <= key_draft[:, None]) & key_drafted[None, :]
        query_path = (key_draft[None, :] <= query[:, None]) & key_drafted[None, :]
    before = key_pending[:, None] & (key[None, :] <= key[:, None])  # a pending token's: the pending ones up to it
    key_ancestry = key_pending[None, :] & (key_drafted[:, None] | before) | key_drafted[:, None] & key_path
    query_ancestry = query_real[:, None] & (key_pending[None, :] | query_path)

    c = tl.load(c_ptr + row * c_stride_row + group * c_stride_group + (query * c_stride_node)[:, None]
                + (nn * c_stride_n)[None, :], mask=query_real[:, None] & n_ok[None, :], other=0.0).to(tl.float32)
    c = _operand(c, PRECISION)
    scores = _dot(c, tl.trans(b_keys), PRECISION)  # C_n . B_t [QUERIES, KEYS]
    gates_row = gates_ptr + layer * gates_stride_layer + ring * gates_stride_slot
    ring_key = (start + tl.where(key_pending, key, 0)) % RING_ROWS

    for head in range(first_head, first_head + HEADS_PER_PROGRAM):
        rate = tl.load(a_ptr + layer * a_stride_layer + head * a_stride).to(tl.float32)
        tile = (ssm_ptr + layer * ssm_stride_layer + slot * ssm_stride_slot + head * ssm_stride_head
                + (nn * ssm_stride_n)[:, None] + (pp * ssm_stride_p)[None, :])
        tile_ok = tl.where(live, n_ok[:, None] & p_ok[None, :], False)
        state_t = tl.load(tile, mask=tile_ok, other=0.0).to(tl.float32)  # S0^T, the long read first

        # the head's key tokens: x [KEYS, BLOCK_P] (pending: their conv) and d [KEYS]
        x_pending = _pending_conv(rows_base, window_base, weight_ptr, bias_ptr, key, key_pending, start, pending,
                                  head * HEAD_DIM + pp, p_ok, rows_stride_row, rows_stride_dim, conv_stride_dim,
                                  conv_stride_win, weight_stride_dim, weight_stride_tap, bias_stride, RING_ROWS,
                                  KERNEL_SIZE, HAS_BIAS)
        x_given = tl.load(x_ptr + row * x_stride_row + head * x_stride_head + (kd * x_stride_node)[:, None]
                          + (pp * x_stride_p)[None, :], mask=key_drafted[:, None] & p_ok[None, :], other=0.0)
        x_keys = tl.where(key_pending[:, None], x_pending, x_given.to(tl.float32))
        gates_base = gates_row + head * gates_stride_head
        step_ring = tl.load(gates_base + ring_key * gates_stride_row, mask=key_pending, other=0.0).to(tl.float32)
        dt_base = dt_ptr + row * dt_stride_row + head * dt_stride_head
        step_given = _step_sizes(dt_base, kd, key_drafted, dt_stride_node, dt_bias_ptr + head * dt_bias_stride,
                                 HAS_DT_BIAS, DT_SOFTPLUS)
        step = tl.where(key_pending, step_ring, tl.where(key_drafted, step_given, 0.0))
        logs = step * rate
        key_cumulative = tl.sum(tl.where(key_ancestry, logs[None, :], 0.0), axis=1)  # L_t
        query_cumulative = tl.sum(tl.where(query_ancestry, logs[None, :], 0.0), axis=1)  # L_n

        # the drafts' outputs
        decay = tl.where(query_ancestry, tl.exp(tl.where(query_ancestry, query_cumulative[:, None]
                                                         - key_cumulative[None, :], 0.0)), 0.0)
        mix = decay * step[None, :] * scores  # M [QUERIES, KEYS]
        y = tl.exp(query_cumulative)[:, None] * tl.dot(c, state_t, input_precision=PRECISION) + _dot(mix, x_keys,
                                                                                                     PRECISION)
        x_query = tl.load(x_ptr + row * x_stride_row + head * x_stride_head + (query * x_stride_node)[:, None]
                          + (pp * x_stride_p)[None, :], mask=query_real[:, None] & p_ok[None, :], other=0.0)
        if HAS_D:
            y += tl.load(d_ptr + head * d_stride).to(tl.float32) * x_query.to(tl.float32)
        if HAS_Z:
            gate = tl.load(z_ptr + row * z_stride_row + head * z_stride_head + (query * z_stride_node)[:, None]
                           + (pp * z_stride_p)[None, :], mask=query_real[:, None] & p_ok[None, :], other=0.0)
            gate = gate.to(tl.float32)
            y *= gate / (1.0 + tl.exp(-gate))
        dst = (out_ptr + row * out_stride_row + head * out_stride_head + (query * out_stride_node)[:, None]
               + (pp * out_stride_p)[None, :])
        tl.store(dst, y.to(out_ptr.dtype.element_ty),
                 mask=tl.where(links_ok, query_real[:, None] & p_ok[None, :], False))

        if ROWS != 1:  # (a launch of the rows that do not fold has no fold to compile)
            if fold:
                total = tl.sum(tl.where(key_pending, logs, 0.0))  # L_P
                weights = tl.where(key_pending, tl.exp(total - key_cumulative) * step, 0.0)
                folded = tl.exp(total) * state_t + _dot(tl.trans(b_keys * weights[:, None]), x_keys, FOLD_PRECISION)
                tl.store(tile, folded.to(ssm_ptr.dtype.element_ty), mask=tile_ok)

        if p_block == 0:  # the drafts' d beside their rows, once per head
            draft_row = (start + pending + tl.where(query_real, query, 0)) % RING_ROWS
            step_query = _step_sizes(dt_base, query, query_real, dt_stride_node, dt_bias_ptr + head * dt_bias_stride,
                                     HAS_DT_BIAS, DT_SOFTPLUS)
            tl.store(gates_base + draft_row * gates_stride_row, step_query, mask=query_real)


def _chunk_calls(out, x, dt, A, B, C, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots, parents,
                 D, z, dt_bias, *, layer, num_layers, num_nodes, heads, max_pending, fold_above, dt_softplus, block_p,
                 num_warps, precision, fold_precision, heads_per_program, num_stages=RING_STAGES, split=None):
    """The chunk kernel's KernelCalls and the window kernel's over rows x layers layer .. layer +
    num_layers - 1 (weight [L, dim, K], bias [L, dim], A [L, H]: every layer's, as a flush gives them
    even for L = 1; else one layer's). out, x, dt, B, C, D, z, dt_bias: the drafts' (None with no
    drafts: never read). Two chunk launches where the rows that do not fold need fewer key rows (a
    verify at capacity 16: 16 keys, not 32), unless ``split`` is False; else one."""
    num_heads, head_dim, num_groups, d_state = heads
    num_rows = ring_slots.shape[0]
    ring_rows, kernel_size = rows.shape[2], conv.shape[3] + 1
    if num_rows > MAX_GRID_Y or num_layers > MAX_GRID_Y:
        raise ValueError(f"convwin ring kernels take at most {MAX_GRID_Y} rows and layers per call, got {num_rows} "
                         f"and {num_layers}; split the batch")
    if block_p is None:
        block_p = spread_block(RING_BLOCK_P, num_rows, num_heads, head_dim)
    if heads_per_program is None:
        heads_per_program = group_share(num_rows * num_layers * cdiv(head_dim, block_p), num_heads, num_groups)
    elif (num_heads // num_groups) % heads_per_program:
        raise ValueError(f"heads_per_program must divide the {num_heads // num_groups} heads of a group, "
                         f"got {heads_per_program}")
    per_layer = (lambda t: t.stride()) if weight.dim() == 3 else (lambda t: (0, *t.stride()))  # [L, ...]: stacked
    strides = lambda t, n: (0,) * n if t is None else t.stride()  # noqa: E731 -- absent: never read
    bias_strides = (0, 0) if bias is None else per_layer(bias)
    index_strides = (ring_slots.stride(0), state_slots.stride(0), *((0, 0) if parents is None else parents.stride()))
    scalars = (layer, ssm.shape[1], rows.shape[1], *strides(out, 4), *strides(x, 4), *strides(dt, 3),
               *strides(B, 4), *strides(C, 4), *strides(z, 4), *per_layer(A), 0 if D is None else D.stride(0),
               0 if dt_bias is None else dt_bias.stride(0), *ssm.stride(), *conv.stride(), *rows.stride(),
               *gates.stride(), *cursor.stride(), *per_layer(weight), *bias_strides, *index_strides)
    constexprs = dict(
        NUM_NODES=num_nodes, RING_ROWS=ring_rows, MAX_PENDING=max_pending, FOLD_ABOVE=fold_above,
        QUERIES=max(MIN_DOT, next_power_of_2(num_nodes)),
        KERNEL_SIZE=kernel_size, NUM_HEADS=num_heads, NUM_GROUPS=num_groups, HEAD_DIM=head_dim, D_STATE=d_state,
        BLOCK_P=block_p, BLOCK_N=max(MIN_DOT, next_power_of_2(d_state)), TREE=parents is not None,
        HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=bool(dt_softplus),
        HAS_BIAS=bias is not None, PRECISION=precision or fold_precision_for(ssm),
        FOLD_PRECISION=fold_precision or precision or fold_precision_for(ssm), HEADS_PER_PROGRAM=heads_per_program,
        num_warps=num_warps, num_stages=num_stages,
    )
    stand_in = ssm  # where an absent tensor would be
    tensors = tuple(stand_in if t is None else t for t in (
        out, x, dt, B, C, z, A, D, dt_bias, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots,
        parents))
    grid = (num_heads // heads_per_program * cdiv(head_dim, block_p), num_rows, num_layers)
    keys = max(MIN_DOT, next_power_of_2(ring_rows))
    unfolded_keys = max(MIN_DOT, next_power_of_2(fold_above))  # a row that does not fold: pending + N <= capacity
    if split is None:
        split = unfolded_keys < keys
    launches = ((1, unfolded_keys), (2, keys)) if split else ((0, keys),)
    chunks = tuple(KernelCall(_mamba2_ring_verify_kernel, grid, tensors, scalars, dict(constexprs, ROWS=rows_kind,
                                                                                       KEYS=launch_keys))
                   for rows_kind, launch_keys in launches)
    window = window_call(conv, rows, cursor, ring_slots, state_slots, num_state_slots=ssm.shape[1], layer=layer,
                         num_layers=num_layers, num_nodes=num_nodes, max_pending=max_pending, fold_above=fold_above)
    return chunks, window


def _ring_calls(out, x, dt, A, B, C, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots, layer,
                parents, D, z, dt_bias, *, dt_softplus, block_p=None, num_warps=MAMBA2_RING_WARPS, precision=None,
                fold_precision=None, heads_per_program=None, num_stages=RING_STAGES, split=None):
    """mamba2_ring_verify's launches (the verify's -- the rows that do not fold, then those that fold
    -- then the folded windows), or () with no rows."""
    num_rows, num_nodes, num_heads, head_dim = x.shape
    if num_rows == 0:
        return ()
    chunks, window = _chunk_calls(
        out, x, dt, A, B, C, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots, parents, D, z,
        dt_bias, layer=layer, num_layers=1, num_nodes=num_nodes, heads=(num_heads, head_dim, B.shape[2], B.shape[3]),
        max_pending=rows.shape[2] - num_nodes, fold_above=rows.shape[2] - num_nodes, dt_softplus=dt_softplus,
        block_p=block_p, num_warps=num_warps, precision=precision, fold_precision=fold_precision,
        heads_per_program=heads_per_program, num_stages=num_stages, split=split)
    return (*chunks, window)


def launch_mamba2_ring_verify(out, x, dt, A, B, C, ssm, conv, rows, gates, cursor, weight, bias, ring_slots,
                              state_slots, layer, parents, D, z, dt_bias, *, dt_softplus, **tuning):
    """ops_ring_mamba2.mamba2_ring_verify's arguments as its prepare gives them (ssm [L, S, H, P, Ns],
    conv [L, S, dim, K-1], rows [L, M, C, dim], gates [L, M, C, 1, H], cursor [M, 2]; any strides).
    The verify's launches (and the fold's state), then the folded conv windows."""
    for call in _ring_calls(out, x, dt, A, B, C, ssm, conv, rows, gates, cursor, weight, bias, ring_slots,
                            state_slots, layer, parents, D, z, dt_bias, dt_softplus=dt_softplus, **tuning):
        call.launch()


def _flush_calls(ssm, conv, cursor, rows, gates, weight, bias, A, ring_slots, state_slots, *, num_heads, head_dim,
                 n_groups, d_state, block_p=None, num_warps=MAMBA2_RING_WARPS, precision=None, fold_precision=None,
                 heads_per_program=None):
    """mamba2_ring_flush's three launches (every layer's fold, every layer's window, the cursors), or ()."""
    num_rows = ring_slots.shape[0]
    if num_rows == 0:
        return ()
    ring_rows = rows.shape[2]
    fold = fold_precision or precision or fold_precision_for(ssm)
    chunks, window = _chunk_calls(
        None, None, None, A, None, None, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots, None,
        None, None, None, layer=0, num_layers=ssm.shape[0], num_nodes=0, heads=(num_heads, head_dim, n_groups, d_state),
        max_pending=ring_rows - 1, fold_above=0, dt_softplus=False, block_p=block_p, num_warps=num_warps,
        precision=fold, fold_precision=fold, heads_per_program=heads_per_program, split=False)
    cursors = flush_cursor_call(cursor, ring_slots, state_slots, num_state_slots=ssm.shape[1],
                                num_ring_slots=rows.shape[1], ring_rows=ring_rows)
    return (*chunks, window, cursors)


def launch_mamba2_ring_flush(ssm, conv, cursor, rows, gates, weight, bias, A, ring_slots, state_slots, **kwargs):
    """ops_ring_mamba2.mamba2_ring_flush's arguments as its prepare gives them (weight [L, dim, K], bias
    [L, dim] or None, A [L, H]). Three launches: every layer's fold, every layer's window, the cursors."""
    for call in _flush_calls(ssm, conv, cursor, rows, gates, weight, bias, A, ring_slots, state_slots, **kwargs):
        call.launch()
