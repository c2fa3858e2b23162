"""The GDN ring's fold by replay: a folding row's pending tokens decoded one at a time onto its
checkpoint in float32, as gdn_commit replays an accepted path (csrc_triton/gdn_commit.py), the path
being the ring rows start, start + 1, ... (mod C) and the conv history before the first the
checkpoint's window.

The chunked fold (gdn_ring_verify_mma's KIND 2: the pending tokens as one chunk, 3xTF32 products)
holds a whole [dk, dv] tile and a stack of node matrices in one program; this one keeps a narrow
[dk, BLOCK_V] tile in registers and nothing else, so a fold is many short programs: what a step's
few folding rows need, and the float32 recurrence of the eager commit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import KernelCall, cdiv, next_power_of_2
from .gdn_commit import _smem as _smem_module
from .gdn_commit import _smem_signature, delta_rule_step, gdn_token_inputs
from .gdn_ring_verify import _ring_row
from .replay import committed_inputs, conv_silu, conv_taps, smem_module, state_tile_box
from .ring_conv import check_ring_grid

# value columns and warps of a fold program: a [dk, 32] fp32 tile over 2 warps (no spills at
# dk = 128 with the inputs loaded two tokens ahead)
RING_FOLD_BLOCK_V = 32
RING_FOLD_WARPS = 2
# the shared-memory kernel's (gdn_ring_fold_smem: a float32 checkpoint on sm_90+): gdn_commit's
# [dk, 64] tile over 2 warps
RING_FOLD_SMEM_BLOCK_V = 64


@triton.jit
def _gdn_ring_replay_kernel(
    ssm_ptr, conv_ptr, rows_ptr, gates_ptr, cursor_ptr, weight_ptr, bias_ptr, ring_slots_ptr, state_slots_ptr,
    layer, num_state_slots, num_ring_slots,
    ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_k, ssm_stride_v,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    rows_stride_layer, rows_stride_slot, rows_stride_row, rows_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_row, gates_stride_gate, gates_stride_head,
    cursor_stride_slot, cursor_stride_field, weight_stride_layer, weight_stride_dim, weight_stride_tap,
    bias_stride_layer, bias_stride, ring_slots_stride, state_slots_stride,
    NUM_NODES: tl.constexpr, RING_ROWS: tl.constexpr, MAX_PENDING: tl.constexpr, FOLD_ABOVE: tl.constexpr,
    KERNEL_SIZE: tl.constexpr, NUM_K_HEADS: tl.constexpr, NUM_V_HEADS: tl.constexpr, HEAD_K_DIM: tl.constexpr,
    HEAD_V_DIM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, HAS_BIAS: tl.constexpr,
    L2NORM: tl.constexpr,
):
    """One program: the [dk, BLOCK_V] checkpoint tile of one value head of one row, of layer
    ``layer`` + program_id(2), folded past the row's pending tokens -- where the row is live (the
    slots and cursor of gdn_ring_verify._gdn_ring_verify_kernel) and folds (pending > 0 and
    pending + NUM_NODES > FOLD_ABOVE: a verify's rule; a flush has FOLD_ABOVE = NUM_NODES = 0).
    Nothing else is read or written."""
    V_BLOCKS: tl.constexpr = (HEAD_V_DIM + BLOCK_V - 1) // BLOCK_V
    head = tl.program_id(0) // V_BLOCKS
    v_block = tl.program_id(0) % V_BLOCKS
    row = tl.program_id(1).to(tl.int64)
    layer = (layer + tl.program_id(2)).to(tl.int64)  # layer * a pool's layer stride passes 2**31
    ring, slot, start, pending, live = _ring_row(row, ring_slots_ptr, state_slots_ptr, cursor_ptr, num_state_slots,
                                                 num_ring_slots, ring_slots_stride, state_slots_stride,
                                                 cursor_stride_slot, cursor_stride_field, RING_ROWS, MAX_PENDING)
    if live & (pending > 0) & (pending + NUM_NODES > FOLD_ABOVE):
        k_head = head // (NUM_V_HEADS // NUM_K_HEADS)
        kk = tl.arange(0, BLOCK_K)
        vv = v_block * BLOCK_V + tl.arange(0, BLOCK_V)
        k_mask = kk < HEAD_K_DIM
        v_mask = vv < HEAD_V_DIM
        k_chan = NUM_K_HEADS * HEAD_K_DIM + k_head * HEAD_K_DIM + kk  # q, then k, then v
        v_chan = 2 * NUM_K_HEADS * HEAD_K_DIM + head * HEAD_V_DIM + vv
        tile_mask = k_mask[:, None] & v_mask[None, :]
        tile = (ssm_ptr + layer * ssm_stride_layer + slot * ssm_stride_slot + head * ssm_stride_head
                + (kk * ssm_stride_k)[:, None] + (vv * ssm_stride_v)[None, :])
        state = tl.load(tile, mask=tile_mask, other=0.0).to(tl.float32)

        window = conv_ptr + layer * conv_stride_layer + slot * conv_stride_slot
        rows_base = rows_ptr + layer * rows_stride_layer + ring * rows_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + ring * gates_stride_slot + head * gates_stride_head
        weight_base = weight_ptr + layer * weight_stride_layer
        bias_base = bias_ptr + layer * bias_stride_layer
        # (gdn_commit's replay: the K-1 inputs before a token slide along in registers, each token's
        # own input loaded two tokens ahead of its use)
        k1, k2, k3, k4 = committed_inputs(window, k_chan, k_mask, conv_stride_dim, conv_stride_win, KERNEL_SIZE - 1)
        v1, v2, v3, v4 = committed_inputs(window, v_chan, v_mask, conv_stride_dim, conv_stride_win, KERNEL_SIZE - 1)
        k_bias, k_wx, k_w1, k_w2, k_w3, k_w4 = conv_taps(weight_base, k_chan, k_mask, weight_stride_dim,
                                                         weight_stride_tap, bias_base, bias_stride, KERNEL_SIZE,
                                                         HAS_BIAS)
        v_bias, v_wx, v_w1, v_w2, v_w3, v_w4 = conv_taps(weight_base, v_chan, v_mask, weight_stride_dim,
                                                         weight_stride_tap, bias_base, bias_stride, KERNEL_SIZE,
                                                         HAS_BIAS)
        xk, xv, g, beta = gdn_token_inputs(rows_base, gates_base, start, pending > 0, k_chan, k_mask, v_chan, v_mask,
                                           rows_stride_row, rows_stride_dim, gates_stride_row, gates_stride_gate)
        xk_next, xv_next, g_next, beta_next = gdn_token_inputs(
            rows_base, gates_base, (start + 1) % RING_ROWS, pending > 1, k_chan, k_mask, v_chan, v_mask,
            rows_stride_row, rows_stride_dim, gates_stride_row, gates_stride_gate)
        for j in range(0, pending):
            xk_after, xv_after, g_after, beta_after = gdn_token_inputs(
                rows_base, gates_base, (start + j + 2) % RING_ROWS, j + 2 < pending, k_chan, k_mask, v_chan, v_mask,
                rows_stride_row, rows_stride_dim, gates_stride_row, gates_stride_gate)
            k = conv_silu(xk, k1, k2, k3, k4, k_bias, k_wx, k_w1, k_w2, k_w3, k_w4, KERNEL_SIZE)
            v = conv_silu(xv, v1, v2, v3, v4, v_bias, v_wx, v_w1, v_w2, v_w3, v_w4, KERNEL_SIZE)
            k4, k3, k2, k1 = k3, k2, k1, xk
            v4, v3, v2, v1 = v3, v2, v1, xv
            state = delta_rule_step(state, k, v, g, beta, k_mask, L2NORM)
            xk, xv, g, beta = xk_next, xv_next, g_next, beta_next
            xk_next, xv_next, g_next, beta_next = xk_after, xv_after, g_after, beta_after
        tl.store(tile, state.to(ssm_ptr.dtype.element_ty), mask=tile_mask)


def replay_fold_call(ssm, conv, rows, gates, cursor, weight, bias, ring_slots, state_slots, *, layer, num_layers,
                     num_nodes, heads, max_pending, fold_above, use_qk_l2norm, block_v=None, num_warps=None,
                     maxnreg=None, smem=None):
    """The replay fold's launch over rows x layers layer .. layer + num_layers - 1 (ssm
    [L, S, Hv, dk, dv], conv [L, S, dim, K-1], rows [L, M, C, dim], gates [L, M, C, 2, Hv], cursor
    [M, 2]; weight [L, dim, K] / bias [L, dim] every layer's, or [dim, K] / [dim] one layer's):
    gdn_ring_fold_smem's kernel where ``smem`` (None: where gdn_commit's shared-memory kernel would
    take the checkpoint, a 16-byte aligned float32 one on sm_90+), else _gdn_ring_replay_kernel.
    block_v, num_warps (None: RING_FOLD_SMEM_BLOCK_V or RING_FOLD_BLOCK_V, RING_FOLD_WARPS);
    maxnreg (None or 0: no cap)."""
    num_k_heads, head_k_dim, num_v_heads, head_v_dim = heads
    num_rows = ring_slots.shape[0]
    check_ring_grid(num_rows, num_layers)
    num_warps = num_warps or RING_FOLD_WARPS
    smem_block_v = block_v or min(RING_FOLD_SMEM_BLOCK_V, next_power_of_2(head_v_dim))
    box = state_tile_box(ssm, next_power_of_2(head_k_dim), smem_block_v)
    if smem is None:
        smem = not ssm.data_ptr() & 15 and _smem_signature(ssm, box, head_k_dim, head_v_dim, smem_block_v, num_warps)
    block_v = smem_block_v if smem else block_v or min(RING_FOLD_BLOCK_V, next_power_of_2(head_v_dim))
    per_layer = (lambda t: t.stride()) if weight.dim() == 3 else (lambda t: (0, *t.stride()))
    scalars = (layer, ssm.shape[1], rows.shape[1], *ssm.stride(), *conv.stride(), *rows.stride(), *gates.stride(),
               *cursor.stride(), *per_layer(weight), *((0, 0) if bias is None else per_layer(bias)),
               ring_slots.stride(0), state_slots.stride(0))
    constexprs = dict(NUM_NODES=num_nodes, RING_ROWS=rows.shape[2], MAX_PENDING=max_pending, FOLD_ABOVE=fold_above,
                      KERNEL_SIZE=conv.shape[3] + 1, NUM_K_HEADS=num_k_heads, NUM_V_HEADS=num_v_heads,
                      HEAD_K_DIM=head_k_dim, HEAD_V_DIM=head_v_dim, BLOCK_V=block_v, HAS_BIAS=bias is not None,
                      L2NORM=bool(use_qk_l2norm), num_warps=num_warps, **({"maxnreg": maxnreg} if maxnreg else {}))
    grid = (num_v_heads * cdiv(head_v_dim, block_v), num_rows, num_layers)
    tensors = (ssm, conv, rows, gates, cursor, weight, weight if bias is None else bias, ring_slots, state_slots)
    if smem:
        module = _smem_module()
        layout = module and module.tile_layout(head_k_dim, block_v, num_warps, module.SMEM_CHUNK)
        if not layout or head_v_dim % block_v or head_k_dim & (head_k_dim - 1) or ssm.dtype != torch.float32:
            raise ValueError(f"gdn_ring_fold: no shared-memory fold of a {ssm.dtype} checkpoint, dk {head_k_dim}, "
                             f"dv {head_v_dim} on {block_v} columns and {num_warps} warps (Triton "
                             f"{triton.__version__})")
        lanes_k, lanes_v, chunk = layout
        return KernelCall(smem_module("gdn_ring_fold_smem")._gdn_ring_replay_smem_kernel, grid,
                          (smem_module("replay_smem").state_descriptor(ssm, box), *tensors), scalars,
                          dict(constexprs, CHUNK=chunk, TPW_K=lanes_k, TPW_V=lanes_v, WARPS=num_warps))
    return KernelCall(_gdn_ring_replay_kernel, grid, tensors, scalars,
                      dict(constexprs, BLOCK_K=next_power_of_2(head_k_dim)))
