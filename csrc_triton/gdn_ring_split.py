"""gdn_ring_verify in two launches (RING_SPLIT): the small arithmetic apart from the state's read.

The drafts' outputs are linear in the checkpoint S0. With the chunk of gdn_ring_verify.py's
docstring (key tokens: the P pending tokens, then the N drafts; G a token's decay summed over its
ancestors and itself, gamma = exp(G); A[r, c] = beta_r exp(G_r - G_c) k_r.k_c over r's strict
ancestors c; U = (I + A)^-1 diag(beta) (V - diag(gamma) K S0)) and query n's row
M[n, c] = exp(G_n - G_c) q_n.k_c over its ancestors and itself,

    O = diag(gamma_q) Q S0 + M U = Q_eff S0 + R,
    Q_eff = diag(gamma_q) Q - (M T) diag(beta gamma) K,   R = (M T) diag(beta) V,   T = (I + A)^-1.

The first launch (_ring_prep_kernel, a program a row and value head; no state read) computes Q_eff
[N, dk] and R [N, dv] in float32 -- the pending tokens' conv, the norms, the gram and T -- and
stores them in a workspace, with the drafts' gates beside their ring rows. The second
(_ring_product_kernel, a program a state tile) reads the checkpoint once and stores
out = Q_eff S0 + R: a product of N rows, its operands rounded to tf32. The rows that fold do so
first (the verify's fold launch; their drafts then have nothing pending), as in the mma path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import KernelCall, cdiv, floored_log_decay, next_power_of_2
from .gdn_verify import MIN_DOT, _dot, _l2_normalised, _unit_lower_inverse
from .gdn_ring_verify import _ring_row, pending_conv

# the product's tile: columns a program, state rows a chunk, warps, software-pipeline stages
SPLIT_BLOCK_V = 64
SPLIT_CHUNK_K = 32
SPLIT_WARPS = 4
SPLIT_STAGES = 3
PREP_WARPS = 4


@triton.jit
def _path_bits(node, row, parents_ptr, parents_stride_row, parents_stride_node, NUM_NODES: tl.constexpr,
               TREE: tl.constexpr):
    """(bit masks [len(node)]: bit j of node n's set where draft j is n or one of its ancestors;
    whether every link of the row lies in [-1, n-1]). A chain's node n has bits 0..n."""
    real = node < NUM_NODES
    if TREE:
        links = tl.load(parents_ptr + row * parents_stride_row + tl.where(real, node, 0) * parents_stride_node,
                        mask=real, other=-1)
        links_ok = tl.sum(tl.where(real & ((links < -1) | (links >= node)), 1, 0)) == 0
        bits = tl.where(real, 1 << node, 0)
        up = tl.where(real & links_ok, links, -1)
        for _ in tl.static_range(NUM_NODES - 1):
            bits |= tl.where(up >= 0, 1 << tl.maximum(up, 0), 0)
            up = tl.where(up >= 0, tl.gather(links, tl.maximum(up, 0).to(tl.int32), 0), -1)
    else:
        links_ok = True
        bits = tl.where(real, (2 << node) - 1, 0)
    return bits, links_ok


@triton.jit
def _ring_prep_kernel(
    qeff_ptr, rest_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, conv_ptr, rows_ptr, gates_ptr, cursor_ptr, weight_ptr,
    bias_ptr, ring_slots_ptr, state_slots_ptr, parents_ptr,
    layer, num_state_slots, num_ring_slots, scale,
    qeff_stride_row, qeff_stride_node, qeff_stride_head, qeff_stride_k,
    rest_stride_row, rest_stride_node, rest_stride_head, rest_stride_v,
    q_stride_row, q_stride_node, q_stride_head, q_stride_k,
    k_stride_row, k_stride_node, k_stride_head, k_stride_k,
    v_stride_row, v_stride_node, v_stride_head, v_stride_v,
    g_stride_row, g_stride_node, g_stride_head,
    beta_stride_row, beta_stride_node, beta_stride_head,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    rows_stride_layer, rows_stride_slot, rows_stride_row, rows_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_row, gates_stride_gate, gates_stride_head,
    cursor_stride_slot, cursor_stride_field, weight_stride_layer, weight_stride_dim, weight_stride_tap,
    bias_stride_layer, bias_stride, ring_slots_stride, state_slots_stride, parents_stride_row, parents_stride_node,
    NUM_NODES: tl.constexpr, RING_ROWS: tl.constexpr, MAX_PENDING: tl.constexpr, FOLD_ABOVE: tl.constexpr,
    KEYS: tl.constexpr, QUERIES: tl.constexpr, KERNEL_SIZE: tl.constexpr,
    NUM_K_HEADS: tl.constexpr, NUM_V_HEADS: tl.constexpr, HEAD_K_DIM: tl.constexpr, HEAD_V_DIM: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, TREE: tl.constexpr, L2NORM: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """One program: row program_id(1)'s Q_eff and R at value head program_id(0) (module docstring),
    float32 products; its drafts' gates into the ring. A row that folds (pending + N > FOLD_ABOVE)
    counts as one from start + pending with nothing pending: the fold launch ran first. Nothing is
    stored for a row left alone (gdn_ring_verify's rule) or, but the gates, with a bad link."""
    head = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    layer = (layer + tl.program_id(2)).to(tl.int64)  # (layer * a pool's layer stride passes 2**31)
    k_head = head // (NUM_V_HEADS // NUM_K_HEADS)
    weight_ptr += layer * weight_stride_layer
    bias_ptr += layer * bias_stride_layer
    ring, slot, start, pending, live = _ring_row(row, ring_slots_ptr, state_slots_ptr, cursor_ptr, num_state_slots,
                                                 num_ring_slots, ring_slots_stride, state_slots_stride,
                                                 cursor_stride_slot, cursor_stride_field, RING_ROWS, MAX_PENDING)
    fold = live & (pending > 0) & (pending + NUM_NODES > FOLD_ABOVE)
    start = tl.where(fold, (start + pending) % RING_ROWS, start).to(tl.int32)
    pending = tl.where(fold, 0, pending).to(tl.int32)

    key = tl.arange(0, KEYS)  # stack row r: pending token r, or draft r - pending
    key_pending = key < pending
    key_node = key - pending
    key_draft = tl.where(live, (key_node >= 0) & (key_node < NUM_NODES), False)
    key_real = key_pending | key_draft
    kd = tl.where(key_draft, key_node, 0).to(tl.int64)
    node = tl.arange(0, QUERIES)
    node_real = tl.where(live, node < NUM_NODES, False)
    nd = tl.where(node_real, node, 0).to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    k_ok = kk < HEAD_K_DIM
    vv = tl.arange(0, BLOCK_V)
    v_ok = vv < HEAD_V_DIM

    rows_base = rows_ptr + layer * rows_stride_layer + ring * rows_stride_slot
    window_base = conv_ptr + layer * conv_stride_layer + slot * conv_stride_slot
    gates_base = gates_ptr + layer * gates_stride_layer + ring * gates_stride_slot + head * gates_stride_head

    # the key stack (pending tokens' k from their conv, the drafts' given) and the queries, normalised
    k_chan = NUM_K_HEADS * HEAD_K_DIM + k_head * HEAD_K_DIM + kk
    conv_k = pending_conv(rows_base, window_base, weight_ptr, bias_ptr, key, key_pending, start, pending, k_chan, k_ok,
                          rows_stride_row, rows_stride_dim, conv_stride_dim, conv_stride_win, weight_stride_dim,
                          weight_stride_tap, bias_stride, RING_ROWS, KERNEL_SIZE, HAS_BIAS)
    given_k = tl.load(k_ptr + row * k_stride_row + k_head * k_stride_head + (kd * k_stride_node)[:, None]
                      + (kk * k_stride_k)[None, :], mask=key_draft[:, None] & k_ok[None, :], other=0.0)
    keys = _l2_normalised(tl.where(key_pending[:, None], conv_k, given_k.to(tl.float32)), L2NORM)
    queries = tl.load(q_ptr + row * q_stride_row + k_head * q_stride_head + (nd * q_stride_node)[:, None]
                      + (kk * q_stride_k)[None, :], mask=node_real[:, None] & k_ok[None, :], other=0.0)
    queries = _l2_normalised(queries.to(tl.float32), L2NORM) * scale
    v_chan = 2 * NUM_K_HEADS * HEAD_K_DIM + head * HEAD_V_DIM + vv
    conv_v = pending_conv(rows_base, window_base, weight_ptr, bias_ptr, key, key_pending, start, pending, v_chan, v_ok,
                          rows_stride_row, rows_stride_dim, conv_stride_dim, conv_stride_win, weight_stride_dim,
                          weight_stride_tap, bias_stride, RING_ROWS, KERNEL_SIZE, HAS_BIAS)
    given_v = tl.load(v_ptr + row * v_stride_row + head * v_stride_head + (kd * v_stride_node)[:, None]
                      + (vv * v_stride_v)[None, :], mask=key_draft[:, None] & v_ok[None, :], other=0.0)
    values = tl.where(key_pending[:, None], conv_v, given_v.to(tl.float32))

    # gates: the pending tokens' from the ring, the drafts' given
    ring_row = (start + tl.where(key_pending, key, 0)) % RING_ROWS
    g_given = tl.load(g_ptr + row * g_stride_row + kd * g_stride_node + head * g_stride_head, mask=key_draft,
                      other=0.0).to(tl.float32)
    g = floored_log_decay(tl.where(key_pending, tl.load(gates_base + ring_row * gates_stride_row, mask=key_pending,
                                                        other=0.0), g_given))
    beta_given = tl.load(beta_ptr + row * beta_stride_row + kd * beta_stride_node + head * beta_stride_head,
                         mask=key_draft, other=0.0).to(tl.float32)
    beta = tl.where(key_pending, tl.load(gates_base + ring_row * gates_stride_row + gates_stride_gate,
                                         mask=key_pending, other=0.0), beta_given)

    # ancestry: the pending tokens up to a token, then a draft's tree path (its own included)
    bits, links_ok = _path_bits(node, row, parents_ptr, parents_stride_row, parents_stride_node, NUM_NODES, TREE)
    key_bits = tl.gather(bits, kd.to(tl.int32), 0)
    on_path = ((key_bits[:, None] >> kd[None, :].to(tl.int32)) & 1) != 0
    key_anc = key_real[:, None] & key_real[None, :] & (
        (key_pending[None, :] & (key[None, :] <= key[:, None])) | (key_draft[:, None] & key_draft[None, :] & on_path))
    query_anc = node_real[:, None] & key_real[None, :] & (
        key_pending[None, :] | (key_draft[None, :] & (((bits[:, None] >> kd[None, :].to(tl.int32)) & 1) != 0)))
    key_G = tl.sum(tl.where(key_anc, g[None, :], 0.0), axis=1)
    query_G = tl.sum(tl.where(query_anc, g[None, :], 0.0), axis=1)

    eye = (key[:, None] == key[None, :]).to(tl.float32)
    gram = tl.dot(keys, tl.trans(keys), input_precision="ieee")
    A = tl.where(key_anc & (eye < 0.5),
                 beta[:, None] * tl.exp(tl.where(key_anc, key_G[:, None] - key_G[None, :], 0.0)) * gram, 0.0)
    inverse = _unit_lower_inverse(A, eye, KEYS, "ieee")  # (I + A)^-1
    mix = tl.where(query_anc, tl.exp(tl.where(query_anc, query_G[:, None] - key_G[None, :], 0.0)), 0.0) * \
        tl.dot(queries, tl.trans(keys), input_precision="ieee")
    mix = _dot(mix, inverse, "ieee")  # M T
    q_eff = tl.exp(query_G)[:, None] * queries - _dot(mix * (beta * tl.exp(key_G))[None, :], keys, "ieee")
    rest = _dot(mix * beta[None, :], values, "ieee")

    store = node_real & links_ok
    tl.store(qeff_ptr + row * qeff_stride_row + head * qeff_stride_head + (nd * qeff_stride_node)[:, None]
             + (kk * qeff_stride_k)[None, :], q_eff, mask=store[:, None] & k_ok[None, :])
    tl.store(rest_ptr + row * rest_stride_row + head * rest_stride_head + (nd * rest_stride_node)[:, None]
             + (vv * rest_stride_v)[None, :], rest, mask=store[:, None] & v_ok[None, :])
    # the drafts' gates beside their rows, as given (the floor is the sums' alone)
    gate = gates_base + ((start + pending + nd) % RING_ROWS) * gates_stride_row
    tl.store(gate, tl.load(g_ptr + row * g_stride_row + nd * g_stride_node + head * g_stride_head, mask=node_real,
                           other=0.0).to(tl.float32), mask=node_real)
    tl.store(gate + gates_stride_gate, tl.load(beta_ptr + row * beta_stride_row + nd * beta_stride_node
                                               + head * beta_stride_head, mask=node_real, other=0.0).to(tl.float32),
             mask=node_real)


@triton.jit
def _ring_product_kernel(
    out_ptr, qeff_ptr, rest_ptr, ssm_ptr, cursor_ptr, ring_slots_ptr, state_slots_ptr, parents_ptr,
    layer, num_state_slots, num_ring_slots,
    out_stride_row, out_stride_node, out_stride_head, out_stride_v,
    qeff_stride_row, qeff_stride_node, qeff_stride_head, qeff_stride_k,
    rest_stride_row, rest_stride_node, rest_stride_head, rest_stride_v,
    ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_k, ssm_stride_v,
    cursor_stride_slot, cursor_stride_field, ring_slots_stride, state_slots_stride,
    parents_stride_row, parents_stride_node,
    NUM_NODES: tl.constexpr, QUERIES: tl.constexpr, RING_ROWS: tl.constexpr, MAX_PENDING: tl.constexpr,
    NUM_V_HEADS: tl.constexpr, HEAD_K_DIM: tl.constexpr, HEAD_V_DIM: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr, CHUNK_K: tl.constexpr, TREE: tl.constexpr, STAGES: tl.constexpr,
):
    """One program: out = Q_eff S0 + R over one [dk, BLOCK_V] checkpoint tile of one value head of
    row program_id(1); the rows and links _ring_prep_kernel stored, nothing elsewhere."""
    V_BLOCKS: tl.constexpr = (HEAD_V_DIM + BLOCK_V - 1) // BLOCK_V
    head = tl.program_id(0) // V_BLOCKS
    vv = (tl.program_id(0) % V_BLOCKS) * BLOCK_V + tl.arange(0, BLOCK_V)
    row = tl.program_id(1).to(tl.int64)
    layer = (layer + tl.program_id(2)).to(tl.int64)
    ring, slot, start, pending, live = _ring_row(row, ring_slots_ptr, state_slots_ptr, cursor_ptr, num_state_slots,
                                                 num_ring_slots, ring_slots_stride, state_slots_stride,
                                                 cursor_stride_slot, cursor_stride_field, RING_ROWS, MAX_PENDING)
    node = tl.arange(0, QUERIES)
    _, links_ok = _path_bits(node, row, parents_ptr, parents_stride_row, parents_stride_node, NUM_NODES, TREE)
    node_ok = tl.where(live & links_ok, node < NUM_NODES, False)
    v_ok = vv < HEAD_V_DIM
    nd = tl.where(node_ok, node, 0).to(tl.int64)
    tile = ssm_ptr + layer * ssm_stride_layer + slot * ssm_stride_slot + head * ssm_stride_head
    q_rows = qeff_ptr + row * qeff_stride_row + head * qeff_stride_head + nd * qeff_stride_node
    acc = tl.zeros([QUERIES, BLOCK_V], dtype=tl.float32)
    for k0 in tl.range(0, BLOCK_K, CHUNK_K, num_stages=STAGES):
        kk = k0 + tl.arange(0, CHUNK_K)
        k_ok = kk < HEAD_K_DIM
        q_eff = tl.load(q_rows[:, None] + (kk * qeff_stride_k)[None, :], mask=node_ok[:, None] & k_ok[None, :],
                        other=0.0)
        state = tl.load(tile + (kk * ssm_stride_k)[:, None] + (vv * ssm_stride_v)[None, :],
                        mask=tl.where(live, k_ok[:, None] & v_ok[None, :], False), other=0.0).to(tl.float32)
        acc += _dot(q_eff, state, "tf32")
    rest = tl.load(rest_ptr + row * rest_stride_row + head * rest_stride_head + (nd * rest_stride_node)[:, None]
                   + (vv * rest_stride_v)[None, :], mask=node_ok[:, None] & v_ok[None, :], other=0.0)
    tl.store(out_ptr + row * out_stride_row + head * out_stride_head + (nd * out_stride_node)[:, None]
             + (vv * out_stride_v)[None, :], (acc + rest).to(out_ptr.dtype.element_ty),
             mask=node_ok[:, None] & v_ok[None, :])


def split_calls(out, q, k, v, g, beta, ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots, layer,
                parents, *, scale, use_qk_l2norm, workspace=None, block_v=None, chunk_k=None, num_warps=None,
                stages=None, prep_warps=None):
    """The two launches after the verify's folds (module docstring): ssm [L, S, Hv, dk, dv], one layer's
    weight [dim, K] / bias [dim]; workspace a float32 [B, N, Hv, dk + dv] (None: allocated here) --
    Q_eff in its first dk columns, R after."""
    num_rows, num_nodes, num_k_heads, head_k_dim = q.shape
    num_v_heads, head_v_dim = v.shape[2], v.shape[3]
    ring_rows, kernel_size = rows.shape[2], conv.shape[3] + 1
    if workspace is None:
        workspace = torch.empty((num_rows, num_nodes, num_v_heads, head_k_dim + head_v_dim), dtype=torch.float32,
                                device=ssm.device)
    q_eff, rest = workspace[..., :head_k_dim], workspace[..., head_k_dim:]
    parents_strides = (0, 0) if parents is None else parents.stride()
    per_layer = (lambda t: t.stride()) if weight.dim() == 3 else (lambda t: (0, *t.stride()))  # [L, ...]: stacked
    index = state_slots if parents is None else parents
    rule = dict(NUM_NODES=num_nodes, RING_ROWS=ring_rows, MAX_PENDING=ring_rows - num_nodes)
    queries = max(MIN_DOT, next_power_of_2(num_nodes))
    block_k = max(MIN_DOT, next_power_of_2(head_k_dim))
    prep = KernelCall(
        _ring_prep_kernel, (num_v_heads, num_rows, 1),
        (q_eff, rest, q, k, v, g, beta, conv, rows, gates, cursor, weight, weight if bias is None else bias,
         ring_slots, state_slots, index),
        (layer, ssm.shape[1], rows.shape[1], float(scale), *q_eff.stride(), *rest.stride(), *q.stride(),
         *k.stride(), *v.stride(), *g.stride(), *beta.stride(), *conv.stride(), *rows.stride(), *gates.stride(),
         *cursor.stride(), *per_layer(weight), *((0, 0) if bias is None else per_layer(bias)), ring_slots.stride(0),
         state_slots.stride(0), *parents_strides),
        dict(rule, FOLD_ABOVE=ring_rows - num_nodes,
             KEYS=max(MIN_DOT, next_power_of_2(max(ring_rows - num_nodes, num_nodes))),
             QUERIES=queries, KERNEL_SIZE=kernel_size, NUM_K_HEADS=num_k_heads, NUM_V_HEADS=num_v_heads,
             HEAD_K_DIM=head_k_dim, HEAD_V_DIM=head_v_dim, BLOCK_K=block_k,
             BLOCK_V=max(MIN_DOT, next_power_of_2(head_v_dim)), TREE=parents is not None,
             L2NORM=bool(use_qk_l2norm), HAS_BIAS=bias is not None, num_warps=prep_warps or PREP_WARPS))
    block_v = block_v or min(SPLIT_BLOCK_V, max(MIN_DOT, next_power_of_2(head_v_dim)))
    product = KernelCall(
        _ring_product_kernel, (num_v_heads * cdiv(head_v_dim, block_v), num_rows, 1),
        (out, q_eff, rest, ssm, cursor, ring_slots, state_slots, index),
        (layer, ssm.shape[1], rows.shape[1], *out.stride(), *q_eff.stride(), *rest.stride(), *ssm.stride(),
         *cursor.stride(), ring_slots.stride(0), state_slots.stride(0), *parents_strides),
        dict(rule, QUERIES=queries, NUM_V_HEADS=num_v_heads, HEAD_K_DIM=head_k_dim, HEAD_V_DIM=head_v_dim,
             BLOCK_K=block_k, BLOCK_V=block_v, CHUNK_K=min(chunk_k or SPLIT_CHUNK_K, block_k),
             TREE=parents is not None, STAGES=stages or SPLIT_STAGES, num_warps=num_warps or SPLIT_WARPS))
    return prep, product
