"""gdn_ring_fold's replay with the checkpoint tile in shared memory (Gluon, sm_90+): gdn_commit_smem's
token loop -- the tile in by TMA, walked a chunk of rows at a time per token, back by TMA -- over a
folding row's pending tokens, the ring rows start, start + 1, ... (mod C), the conv history before
the first the checkpoint's window. The grid, arguments, skip and fold rules of
gdn_ring_fold._gdn_ring_replay_kernel; the tile moves by ssm_desc alone.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .gdn_commit_smem import _token, delta_rule_step
from .replay_smem import conv_operands, conv_silu, ring_row, tile_load, tile_store


@gluon.jit
def _gdn_ring_replay_smem_kernel(
    ssm_desc, ssm_ptr, conv_ptr, rows_ptr, gates_ptr, cursor_ptr, weight_ptr, bias_ptr, ring_slots_ptr,
    state_slots_ptr,
    layer, num_state_slots, num_ring_slots,
    ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_k, ssm_stride_v,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    rows_stride_layer, rows_stride_slot, rows_stride_row, rows_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_row, gates_stride_gate, gates_stride_head,
    cursor_stride_slot, cursor_stride_field, weight_stride_layer, weight_stride_dim, weight_stride_tap,
    bias_stride_layer, bias_stride, ring_slots_stride, state_slots_stride,
    NUM_NODES: gl.constexpr, RING_ROWS: gl.constexpr, MAX_PENDING: gl.constexpr, FOLD_ABOVE: gl.constexpr,
    KERNEL_SIZE: gl.constexpr, NUM_K_HEADS: gl.constexpr, NUM_V_HEADS: gl.constexpr, HEAD_K_DIM: gl.constexpr,
    HEAD_V_DIM: gl.constexpr, BLOCK_V: gl.constexpr, HAS_BIAS: gl.constexpr, L2NORM: gl.constexpr,
    CHUNK: gl.constexpr, TPW_K: gl.constexpr, TPW_V: gl.constexpr, WARPS: gl.constexpr,
):
    """One program: the [dk, BLOCK_V] checkpoint tile of one value head of one row, of layer
    ``layer`` + program_id(2), folded past the row's pending tokens where the row is live and
    folds; nothing else is read or written."""
    V_BLOCKS: gl.constexpr = HEAD_V_DIM // BLOCK_V
    WIDTH: gl.constexpr = KERNEL_SIZE - 1
    STATE_L: gl.constexpr = gl.BlockedLayout([1, 4], [TPW_K, TPW_V], [1, WARPS], [1, 0])
    V_L: gl.constexpr = gl.SliceLayout(0, STATE_L)
    KC_L: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])  # the k conv: channels over all threads
    head = gl.program_id(0) // V_BLOCKS
    v_block = gl.program_id(0) % V_BLOCKS
    row = gl.program_id(1).to(gl.int64)
    layer32 = layer + gl.program_id(2)  # (a descriptor's coordinates are int32)
    layer = layer32.to(gl.int64)

    tile = gl.allocate_shared_memory(ssm_desc.dtype, ssm_desc.block_type.shape, ssm_desc.layout)
    k_rows = gl.allocate_shared_memory(gl.float32, [2, HEAD_K_DIM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)

    ring, slot, start, pending, live = ring_row(row, ring_slots_ptr, state_slots_ptr, cursor_ptr, num_state_slots,
                                                num_ring_slots, ring_slots_stride, state_slots_stride,
                                                cursor_stride_slot, cursor_stride_field, RING_ROWS, MAX_PENDING)
    fold = live & (pending > 0) & (pending + NUM_NODES > FOLD_ABOVE)
    coords = [layer32, slot.to(gl.int32), head, 0, v_block * BLOCK_V]
    tile_load(ssm_desc, coords, bar, tile, fold)
    if fold:
        k_head = head // (NUM_V_HEADS // NUM_K_HEADS)
        k_chan = NUM_K_HEADS * HEAD_K_DIM + k_head * HEAD_K_DIM + gl.arange(0, HEAD_K_DIM, layout=KC_L)
        v_chan = 2 * NUM_K_HEADS * HEAD_K_DIM + head * HEAD_V_DIM + v_block * BLOCK_V + gl.arange(
            0, BLOCK_V, layout=V_L)
        window = conv_ptr + layer * conv_stride_layer + slot * conv_stride_slot
        rows_base = rows_ptr + layer * rows_stride_layer + ring * rows_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + ring * gates_stride_slot + head * gates_stride_head
        weight_base = weight_ptr + layer * weight_stride_layer
        bias_base = bias_ptr + layer * bias_stride_layer
        k1, k2, k3, k4, k_bias, k_wx, k_w1, k_w2, k_w3, k_w4 = conv_operands(
            window, weight_base, bias_base, k_chan, conv_stride_dim, conv_stride_win, weight_stride_dim,
            weight_stride_tap, bias_stride, HAS_BIAS, WIDTH)
        v1, v2, v3, v4, v_bias, v_wx, v_w1, v_w2, v_w3, v_w4 = conv_operands(
            window, weight_base, bias_base, v_chan, conv_stride_dim, conv_stride_win, weight_stride_dim,
            weight_stride_tap, bias_stride, HAS_BIAS, WIDTH)
        # each pending token's inputs load two tokens ahead of their use, as in gdn_commit's kernels
        xk, xv, g, beta = _token(rows_base, gates_base, start, pending > 0, k_chan, v_chan, rows_stride_row,
                                 rows_stride_dim, gates_stride_row, gates_stride_gate)
        xk_next, xv_next, g_next, beta_next = _token(rows_base, gates_base, (start + 1) % RING_ROWS, pending > 1,
                                                     k_chan, v_chan, rows_stride_row, rows_stride_dim,
                                                     gates_stride_row, gates_stride_gate)
        state = tile.reshape([HEAD_K_DIM, BLOCK_V])
        mbarrier.wait(bar, 0)
        for j in range(0, pending):
            xk_after, xv_after, g_after, beta_after = _token(
                rows_base, gates_base, (start + j + 2) % RING_ROWS, j + 2 < pending, k_chan, v_chan,
                rows_stride_row, rows_stride_dim, gates_stride_row, gates_stride_gate)
            k = conv_silu(xk, k1, k2, k3, k4, k_bias, k_wx, k_w1, k_w2, k_w3, k_w4, KERNEL_SIZE)
            v = conv_silu(xv, v1, v2, v3, v4, v_bias, v_wx, v_w1, v_w2, v_w3, v_w4, KERNEL_SIZE)
            k4, k3, k2, k1 = k3, k2, k1, xk
            v4, v3, v2, v1 = v3, v2, v1, xv
            delta_rule_step(state, k_rows, j, k, v, g, beta, BLOCK_V, CHUNK, L2NORM, STATE_L)
            xk, xv, g, beta = xk_next, xv_next, g_next, beta_next
            xk_next, xv_next, g_next, beta_next = xk_after, xv_after, g_after, beta_after
        tile_store(ssm_desc, coords, tile)
