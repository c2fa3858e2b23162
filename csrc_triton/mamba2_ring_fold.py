"""The Mamba2 ring's fold by replay: a folding row's pending tokens decoded one at a time onto its
checkpoint in float32, as mamba2_commit replays an accepted path (csrc_triton/mamba2_commit.py), the
path being the ring rows start, start + 1, ... (mod C), the conv history before the first the
checkpoint's window, each token's d the dt the ring keeps.

The chunked fold (mamba2_ring_verify's _mamba2_ring_fold_kernel: one [Ns, P] x [P, BLOCK_P] product
in 3xTF32, a few heads a program) holds a tile, the pending tokens' x and B and their products in
one program; this one keeps a [BLOCK_P, Ns] tile in registers and updates it elementwise, so a fold
is many short programs, in the eager commit's float32 arithmetic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import KernelCall, cdiv, next_power_of_2
from .gdn_ring_verify import _ring_row
from .mamba2_commit import _smem as _smem_module
from .mamba2_commit import _smem_signature, mamba2_token_inputs
from .replay import committed_inputs, conv_silu, conv_taps, smem_module, state_tile_box
from .ring_conv import check_ring_grid

# head-dim rows and warps of a fold program: a [32, d_state] fp32 tile over 4 warps (no spills at
# d_state 128 with the inputs loaded two tokens ahead; on one warp, mamba2_commit's, it spills)
RING_FOLD_BLOCK_P = 32
RING_FOLD_WARPS = 4
# the shared-memory kernel's (mamba2_ring_fold_smem: a float32 checkpoint on sm_90+): mamba2_commit's
# [32, d_state] tile in one warp
RING_FOLD_SMEM_WARPS = 1


@triton.jit
def _mamba2_ring_replay_kernel(
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
    KERNEL_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_STATE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """One program: the [BLOCK_P, d_state] checkpoint tile of one head of one row, of layer ``layer``
    + program_id(2), folded past the row's pending tokens -- where the row is live and folds (the
    slots, cursor and fold rule of mamba2_ring_verify's fold kernel). Nothing else is read or written."""
    P_BLOCKS: tl.constexpr = (HEAD_DIM + BLOCK_P - 1) // BLOCK_P
    head = tl.program_id(0) // P_BLOCKS
    p_block = tl.program_id(0) % P_BLOCKS
    row = tl.program_id(1).to(tl.int64)
    layer = (layer + tl.program_id(2)).to(tl.int64)  # layer * a pool's layer stride passes 2**31
    ring, slot, start, pending, live = _ring_row(row, ring_slots_ptr, state_slots_ptr, cursor_ptr, num_state_slots,
                                                 num_ring_slots, ring_slots_stride, state_slots_stride,
                                                 cursor_stride_slot, cursor_stride_field, RING_ROWS, MAX_PENDING)
    if live & (pending > 0) & (pending + NUM_NODES > FOLD_ABOVE):
        group = head // (NUM_HEADS // NUM_GROUPS)
        pp = p_block * BLOCK_P + tl.arange(0, BLOCK_P)
        nn = tl.arange(0, BLOCK_N)
        p_mask = pp < HEAD_DIM
        n_mask = nn < D_STATE
        x_chan = head * HEAD_DIM + pp  # x, then B, then C
        b_chan = NUM_HEADS * HEAD_DIM + group * D_STATE + nn
        tile_mask = p_mask[:, None] & n_mask[None, :]
        tile = (ssm_ptr + layer * ssm_stride_layer + slot * ssm_stride_slot + head * ssm_stride_head
                + (pp * ssm_stride_p)[:, None] + (nn * ssm_stride_n)[None, :])
        state = tl.load(tile, mask=tile_mask, other=0.0).to(tl.float32)
        rate = tl.load(a_ptr + layer * a_stride_layer + head * a_stride).to(tl.float32)

        window = conv_ptr + layer * conv_stride_layer + slot * conv_stride_slot
        rows_base = rows_ptr + layer * rows_stride_layer + ring * rows_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + ring * gates_stride_slot + head * gates_stride_head
        weight_base = weight_ptr + layer * weight_stride_layer
        bias_base = bias_ptr + layer * bias_stride_layer
        # (mamba2_commit's replay: the K-1 inputs before a token slide along in registers, each
        # token's own inputs loaded two tokens ahead of their use)
        x1, x2, x3, x4 = committed_inputs(window, x_chan, p_mask, conv_stride_dim, conv_stride_win, KERNEL_SIZE - 1)
        b1, b2, b3, b4 = committed_inputs(window, b_chan, n_mask, conv_stride_dim, conv_stride_win, KERNEL_SIZE - 1)
        x_bias, x_wx, x_w1, x_w2, x_w3, x_w4 = conv_taps(weight_base, x_chan, p_mask, weight_stride_dim,
                                                         weight_stride_tap, bias_base, bias_stride, KERNEL_SIZE,
                                                         HAS_BIAS)
        b_bias, b_wx, b_w1, b_w2, b_w3, b_w4 = conv_taps(weight_base, b_chan, n_mask, weight_stride_dim,
                                                         weight_stride_tap, bias_base, bias_stride, KERNEL_SIZE,
                                                         HAS_BIAS)
        xx, xb, dt = mamba2_token_inputs(rows_base, gates_base, start, pending > 0, x_chan, p_mask, b_chan, n_mask,
                                         rows_stride_row, rows_stride_dim, gates_stride_row)
        xx_next, xb_next, dt_next = mamba2_token_inputs(rows_base, gates_base, (start + 1) % RING_ROWS, pending > 1,
                                                        x_chan, p_mask, b_chan, n_mask, rows_stride_row,
                                                        rows_stride_dim, gates_stride_row)
        for j in range(0, pending):
            xx_after, xb_after, dt_after = mamba2_token_inputs(
                rows_base, gates_base, (start + j + 2) % RING_ROWS, j + 2 < pending, x_chan, p_mask, b_chan, n_mask,
                rows_stride_row, rows_stride_dim, gates_stride_row)
            x = conv_silu(xx, x1, x2, x3, x4, x_bias, x_wx, x_w1, x_w2, x_w3, x_w4, KERNEL_SIZE)
            b = conv_silu(xb, b1, b2, b3, b4, b_bias, b_wx, b_w1, b_w2, b_w3, b_w4, KERNEL_SIZE)
            x4, x3, x2, x1 = x3, x2, x1, xx
            b4, b3, b2, b1 = b3, b2, b1, xb
            state = state * tl.exp(dt * rate) + (dt * x)[:, None] * b[None, :]
            xx, xb, dt = xx_next, xb_next, dt_next
            xx_next, xb_next, dt_next = xx_after, xb_after, dt_after
        tl.store(tile, state.to(ssm_ptr.dtype.element_ty), mask=tile_mask)


def replay_fold_call(ssm, conv, rows, gates, cursor, weight, bias, A, ring_slots, state_slots, *, layer, num_layers,
                     num_nodes, heads, max_pending, fold_above, block_p=None, num_warps=None, maxnreg=None,
                     smem=None):
    """The replay fold's launch over rows x layers layer .. layer + num_layers - 1 (ssm
    [L, S, H, P, Ns], conv [L, S, dim, K-1], rows [L, M, C, dim], gates [L, M, C, 1, H], cursor
    [M, 2]; weight [L, dim, K], bias [L, dim] and A [L, H] every layer's, or [dim, K], [dim], [H]
    one layer's): mamba2_ring_fold_smem's kernel where ``smem`` (None: where mamba2_commit's
    shared-memory kernel would take the checkpoint, a 16-byte aligned float32 one on sm_90+), else
    _mamba2_ring_replay_kernel. block_p (None: RING_FOLD_BLOCK_P), num_warps (None:
    RING_FOLD_SMEM_WARPS or RING_FOLD_WARPS), maxnreg (None or 0: no cap)."""
    num_heads, head_dim, num_groups, d_state = heads
    num_rows = ring_slots.shape[0]
    check_ring_grid(num_rows, num_layers)
    block_p = block_p or min(RING_FOLD_BLOCK_P, next_power_of_2(head_dim))
    box = state_tile_box(ssm, block_p, next_power_of_2(d_state))
    if smem is None:
        smem = not ssm.data_ptr() & 15 and _smem_signature(ssm, box, head_dim, d_state, block_p,
                                                           num_warps or RING_FOLD_SMEM_WARPS)
    num_warps = num_warps or (RING_FOLD_SMEM_WARPS if smem else RING_FOLD_WARPS)
    layered = (lambda t: t.stride()) if weight.dim() == 3 else (lambda t: (0, *t.stride()))
    scalars = (layer, ssm.shape[1], rows.shape[1], *layered(A), *ssm.stride(), *conv.stride(), *rows.stride(),
               *gates.stride()[:3], gates.stride(4), *cursor.stride(), *layered(weight),
               *((0, 0) if bias is None else layered(bias)), ring_slots.stride(0), state_slots.stride(0))
    constexprs = dict(NUM_NODES=num_nodes, RING_ROWS=rows.shape[2], MAX_PENDING=max_pending, FOLD_ABOVE=fold_above,
                      KERNEL_SIZE=conv.shape[3] + 1, NUM_HEADS=num_heads, NUM_GROUPS=num_groups, HEAD_DIM=head_dim,
                      D_STATE=d_state, BLOCK_P=block_p, HAS_BIAS=bias is not None, num_warps=num_warps,
                      **({"maxnreg": maxnreg} if maxnreg else {}))
    grid = (num_heads * cdiv(head_dim, block_p), num_rows, num_layers)
    tensors = (A, ssm, conv, rows, gates, cursor, weight, ssm if bias is None else bias, ring_slots, state_slots)
    if smem:
        module = _smem_module()
        layout = module and module.tile_layout(block_p, d_state, num_warps, module.SMEM_CHUNK)
        if not layout or head_dim % block_p or block_p & (block_p - 1) or ssm.dtype != torch.float32:
            raise ValueError(f"mamba2_ring_fold: no shared-memory fold of a {ssm.dtype} checkpoint, head_dim "
                             f"{head_dim}, d_state {d_state} on {block_p} rows and {num_warps} warps (Triton "
                             f"{triton.__version__})")
        lanes_p, lanes_n, chunk = layout
        return KernelCall(smem_module("mamba2_ring_fold_smem")._mamba2_ring_replay_smem_kernel, grid,
                          (smem_module("replay_smem").state_descriptor(ssm, box), *tensors), scalars,
                          dict(constexprs, CHUNK=chunk, TPW_P=lanes_p, TPW_N=lanes_n, WARPS=num_warps))
    return KernelCall(_mamba2_ring_replay_kernel, grid, tensors, scalars,
                      dict(constexprs, BLOCK_N=next_power_of_2(d_state)))
