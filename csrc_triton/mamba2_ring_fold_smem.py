"""mamba2_ring_fold's replay with the checkpoint tile in shared memory (Gluon, sm_90+):
mamba2_commit_smem's token loop -- the tile in by TMA, updated a chunk of rows at a time per token,
back by TMA -- over a folding row's pending tokens, the ring rows start, start + 1, ... (mod C), the
conv history before the first the checkpoint's window. The grid, arguments, skip and fold rules of
mamba2_ring_fold._mamba2_ring_replay_kernel; the tile moves by ssm_desc alone.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .mamba2_commit_smem import _token, ssd_step
from .replay_smem import conv_operands, conv_silu, ring_row, tile_load, tile_store


@gluon.jit
def _mamba2_ring_replay_smem_kernel(
    ssm_desc, a_ptr, ssm_ptr, conv_ptr, rows_ptr, gates_ptr, cursor_ptr, weight_ptr, bias_ptr, ring_slots_ptr,
    state_slots_ptr,
    layer, num_state_slots, num_ring_slots,
    a_stride_layer, a_stride,
    ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_p, ssm_stride_n,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    rows_stride_layer, rows_stride_slot, rows_stride_row, rows_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_row, gates_stride_head,
    cursor_stride_slot, cursor_stride_field, weight_stride_layer, weight_stride_dim, weight_stride_tap,
    bias_stride_layer, bias_stride, ring_slots_stride, state_slots_stride,
    NUM_NODES: gl.constexpr, RING_ROWS: gl.constexpr, MAX_PENDING: gl.constexpr, FOLD_ABOVE: gl.constexpr,
    KERNEL_SIZE: gl.constexpr, NUM_HEADS: gl.constexpr, NUM_GROUPS: gl.constexpr, HEAD_DIM: gl.constexpr,
    D_STATE: gl.constexpr, BLOCK_P: gl.constexpr, HAS_BIAS: gl.constexpr,
    CHUNK: gl.constexpr, TPW_P: gl.constexpr, TPW_N: gl.constexpr, WARPS: gl.constexpr,
):
    """One program: the [BLOCK_P, d_state] checkpoint tile of one head of one row, of layer
    ``layer`` + program_id(2), folded past the row's pending tokens where the row is live and
    folds; nothing else is read or written."""
    P_BLOCKS: gl.constexpr = HEAD_DIM // BLOCK_P
    WIDTH: gl.constexpr = KERNEL_SIZE - 1
    STATE_L: gl.constexpr = gl.BlockedLayout([1, 4], [TPW_P, TPW_N], [WARPS, 1], [1, 0])
    N_L: gl.constexpr = gl.SliceLayout(0, STATE_L)
    XC_L: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])  # the x conv: rows over all threads
    head = gl.program_id(0) // P_BLOCKS
    p_block = gl.program_id(0) % P_BLOCKS
    row = gl.program_id(1).to(gl.int64)
    layer32 = layer + gl.program_id(2)  # (a descriptor's coordinates are int32)
    layer = layer32.to(gl.int64)

    tile = gl.allocate_shared_memory(ssm_desc.dtype, ssm_desc.block_type.shape, ssm_desc.layout)
    x_rows = gl.allocate_shared_memory(gl.float32, [2, BLOCK_P], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)

    ring, slot, start, pending, live = ring_row(row, ring_slots_ptr, state_slots_ptr, cursor_ptr, num_state_slots,
                                                num_ring_slots, ring_slots_stride, state_slots_stride,
                                                cursor_stride_slot, cursor_stride_field, RING_ROWS, MAX_PENDING)
    fold = live & (pending > 0) & (pending + NUM_NODES > FOLD_ABOVE)
    coords = [layer32, slot.to(gl.int32), head, p_block * BLOCK_P, 0]
    tile_load(ssm_desc, coords, bar, tile, fold)
    if fold:
        group = head // (NUM_HEADS // NUM_GROUPS)
        x_chan = head * HEAD_DIM + p_block * BLOCK_P + gl.arange(0, BLOCK_P, layout=XC_L)  # x, then B, then C
        b_chan = NUM_HEADS * HEAD_DIM + group * D_STATE + gl.arange(0, D_STATE, layout=N_L)
        rate = gl.load(a_ptr + layer * a_stride_layer + head * a_stride).to(gl.float32)
        window = conv_ptr + layer * conv_stride_layer + slot * conv_stride_slot
        rows_base = rows_ptr + layer * rows_stride_layer + ring * rows_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + ring * gates_stride_slot + head * gates_stride_head
        weight_base = weight_ptr + layer * weight_stride_layer
        bias_base = bias_ptr + layer * bias_stride_layer
        x1, x2, x3, x4, x_bias, x_wx, x_w1, x_w2, x_w3, x_w4 = conv_operands(
            window, weight_base, bias_base, x_chan, conv_stride_dim, conv_stride_win, weight_stride_dim,
            weight_stride_tap, bias_stride, HAS_BIAS, WIDTH)
        b1, b2, b3, b4, b_bias, b_wx, b_w1, b_w2, b_w3, b_w4 = conv_operands(
            window, weight_base, bias_base, b_chan, conv_stride_dim, conv_stride_win, weight_stride_dim,
            weight_stride_tap, bias_stride, HAS_BIAS, WIDTH)
        # each pending token's inputs load two tokens ahead of their use, as in mamba2_commit's kernels
        xx, xb, dt = _token(rows_base, gates_base, start, pending > 0, x_chan, b_chan, rows_stride_row,
                            rows_stride_dim, gates_stride_row)
        xx_next, xb_next, dt_next = _token(rows_base, gates_base, (start + 1) % RING_ROWS, pending > 1, x_chan,
                                           b_chan, rows_stride_row, rows_stride_dim, gates_stride_row)
        state = tile.reshape([BLOCK_P, D_STATE])
        mbarrier.wait(bar, 0)
        for j in range(0, pending):
            xx_after, xb_after, dt_after = _token(rows_base, gates_base, (start + j + 2) % RING_ROWS, j + 2 < pending,
                                                  x_chan, b_chan, rows_stride_row, rows_stride_dim, gates_stride_row)
            x = conv_silu(xx, x1, x2, x3, x4, x_bias, x_wx, x_w1, x_w2, x_w3, x_w4, KERNEL_SIZE)
            b = gl.expand_dims(conv_silu(xb, b1, b2, b3, b4, b_bias, b_wx, b_w1, b_w2, b_w3, b_w4, KERNEL_SIZE), 0)
            x4, x3, x2, x1 = x3, x2, x1, xx
            b4, b3, b2, b1 = b3, b2, b1, xb
            ssd_step(state, x_rows, j, x, b, dt, rate, CHUNK, STATE_L)
            xx, xb, dt = xx_next, xb_next, dt_next
            xx_next, xb_next, dt_next = xx_after, xb_after, dt_after
        tile_store(ssm_desc, coords, tile)
