"""mamba2_commit's replay with the state tile in shared memory instead of registers (Gluon, sm_90+).

As gdn_commit_smem.py does for Gated DeltaNet: a register-resident [32, d_state] fp32 tile takes
128 registers per thread, so an SM holds few replay programs to hide each path token's conv work.
Here the tile lands in shared memory by TMA (issued before a tree's link walk) and goes back by
TMA; each path token updates it in chunks of rows ([CHUNK, d_state], one pass: the update
``h = exp(dt A) h + (dt x) B^T`` is elementwise), so a program's registers hold a chunk and an SM
holds as many programs as its shared memory allows. A token's dt * x goes through a small row
buffer to the chunks' layout; B is computed in it directly.

The same grid, skip rules and arithmetic per token as mamba2_commit._mamba2_replay_kernel.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .replay_smem import (
    accepted_path, conv_operands, conv_silu, path_node, power_of_2, row_indices, tile_load, tile_signature_ok,
    tile_store,
)

SMEM_CHUNK = 16  # head_dim rows per pass: [16, 128] fp32 in one warp, 64 per thread


@gluon.jit
def _token(tokens_base, gates_base, node, live, x_chan, b_chan, tokens_stride_node, tokens_stride_dim,
           gates_stride_node):
    """A path token's conv inputs (x rows, its group's B) and its dt, fp32; zeros unless live."""
    token = tokens_base + node * tokens_stride_node
    xx = gl.load(token + x_chan * tokens_stride_dim, mask=(x_chan >= 0) & live, other=0.0).to(gl.float32)
    xb = gl.load(token + b_chan * tokens_stride_dim, mask=(b_chan >= 0) & live, other=0.0).to(gl.float32)
    dt = gl.load(gates_base + node * gates_stride_node, mask=live, other=0.0).to(gl.float32)
    return xx, xb, dt


@gluon.jit
def ssd_step(state, x_rows, j, x, b, dt, rate, CHUNK: gl.constexpr, STATE_L: gl.constexpr):
    """The [BLOCK_P, d_state] tile ``state`` (shared memory) after path token j: dt * x (x over every
    thread) staged in x_rows' buffer j % 2, then per chunk of CHUNK rows h = exp(dt A) h + (dt x) B^T
    (b [1, d_state] in STATE_L, rate = A)."""
    P_L: gl.constexpr = gl.SliceLayout(1, STATE_L)
    CHUNKS: gl.constexpr = x_rows.shape[1] // CHUNK
    # dt * x rows alternate between two buffers: this token's store cannot overtake the
    # reads of two tokens back, which all threads finished before the last token's barrier
    x_row = x_rows.index((j % 2).to(gl.int32))
    x_row.store(dt * x)
    gl.thread_barrier()
    decay = gl.exp(dt * rate)
    for c in gl.static_range(CHUNKS):
        rows = state.slice(c * CHUNK, CHUNK)
        x_part = gl.expand_dims(x_row.slice(c * CHUNK, CHUNK).load(P_L), 1)
        rows.store(rows.load(STATE_L) * decay + x_part * b)


@gluon.jit
def _mamba2_replay_smem_kernel(
    ssm_desc, ssm_ptr, conv_ptr, tokens_ptr, gates_ptr, weight_ptr, bias_ptr, a_ptr,
    dst_slots_ptr, src_slots_ptr, steps_ptr, parents_ptr,
    num_state_slots, num_src_slots, num_nodes,
    ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_p, ssm_stride_n,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    tokens_stride_layer, tokens_stride_slot, tokens_stride_node, tokens_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_node, gates_stride_gate, gates_stride_head,
    weight_stride_layer, weight_stride_dim, weight_stride_tap,
    bias_stride_layer, bias_stride_dim, a_stride_layer, a_stride_head,
    dst_slots_stride, src_slots_stride, steps_stride, parents_stride_row, parents_stride_node,
    NUM_HEADS: gl.constexpr, HEAD_DIM: gl.constexpr, N_GROUPS: gl.constexpr, D_STATE: gl.constexpr,
    KERNEL_SIZE: gl.constexpr, NODES: gl.constexpr, BLOCK_P: gl.constexpr, CHUNK: gl.constexpr,
    TREE: gl.constexpr, HAS_BIAS: gl.constexpr, TPW_P: gl.constexpr, TPW_N: gl.constexpr, WARPS: gl.constexpr,
):
    """One program: one (head, block of head_dim rows) of one row and layer, as the register
    kernel; its tile [BLOCK_P, d_state] lives in shared memory over the path. The arguments are the
    register kernel's (one launch plan for both); ssm_ptr and its strides go unread."""
    P_BLOCKS: gl.constexpr = HEAD_DIM // BLOCK_P
    WIDTH: gl.constexpr = KERNEL_SIZE - 1
    STATE_L: gl.constexpr = gl.BlockedLayout([1, 4], [TPW_P, TPW_N], [WARPS, 1], [1, 0])
    N_L: gl.constexpr = gl.SliceLayout(0, STATE_L)
    XC_L: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])  # the x conv: rows over all threads
    PATH_L: gl.constexpr = gl.BlockedLayout([NODES], [32], [WARPS], [0])
    head = gl.program_id(0) // P_BLOCKS
    p_block = gl.program_id(0) % P_BLOCKS
    row = gl.program_id(1).to(gl.int64)
    layer32 = gl.program_id(2)
    layer = layer32.to(gl.int64)

    tile = gl.allocate_shared_memory(ssm_desc.dtype, ssm_desc.block_type.shape, ssm_desc.layout)
    x_rows = gl.allocate_shared_memory(gl.float32, [2, BLOCK_P], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)

    node, dst, src, active = row_indices(
        row, steps_ptr, steps_stride, num_nodes, dst_slots_ptr, dst_slots_stride, num_state_slots,
        src_slots_ptr, src_slots_stride, num_src_slots)
    coords = [layer32, dst.to(gl.int32), head, p_block * BLOCK_P, 0]
    tile_load(ssm_desc, coords, bar, tile, active)
    path, length, links_ok = accepted_path(row, node, parents_ptr, parents_stride_row, parents_stride_node,
                                           num_nodes, NODES, TREE, PATH_L)
    if active & links_ok:
        group = head // (NUM_HEADS // N_GROUPS)
        x_chan = head * HEAD_DIM + p_block * BLOCK_P + gl.arange(0, BLOCK_P, layout=XC_L)  # x, then B, then C
        b_chan = NUM_HEADS * HEAD_DIM + group * D_STATE + gl.arange(0, D_STATE, layout=N_L)
        rate = gl.load(a_ptr + layer * a_stride_layer + head * a_stride_head).to(gl.float32)
        conv_base = conv_ptr + layer * conv_stride_layer + dst * conv_stride_slot
        tokens_base = tokens_ptr + layer * tokens_stride_layer + src * tokens_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + src * gates_stride_slot + head * gates_stride_head
        weight_base = weight_ptr + layer * weight_stride_layer
        bias_base = bias_ptr + layer * bias_stride_layer
        x1, x2, x3, x4, x_bias, x_wx, x_w1, x_w2, x_w3, x_w4 = conv_operands(
            conv_base, weight_base, bias_base, x_chan, conv_stride_dim, conv_stride_win, weight_stride_dim,
            weight_stride_tap, bias_stride_dim, HAS_BIAS, WIDTH)
        b1, b2, b3, b4, b_bias, b_wx, b_w1, b_w2, b_w3, b_w4 = conv_operands(
            conv_base, weight_base, bias_base, b_chan, conv_stride_dim, conv_stride_win, weight_stride_dim,
            weight_stride_tap, bias_stride_dim, HAS_BIAS, WIDTH)
        # each path token's inputs load two tokens ahead of their use, as in the register kernel
        xx, xb, dt = _token(tokens_base, gates_base, path_node(path, length, 0, NODES, TREE, PATH_L), length > 0,
                            x_chan, b_chan, tokens_stride_node, tokens_stride_dim, gates_stride_node)
        xx_next, xb_next, dt_next = _token(
            tokens_base, gates_base, path_node(path, length, 1, NODES, TREE, PATH_L), length > 1, x_chan, b_chan,
            tokens_stride_node, tokens_stride_dim, gates_stride_node)

        state = tile.reshape([BLOCK_P, D_STATE])
        mbarrier.wait(bar, 0)
        for j in range(0, length):
            xx_after, xb_after, dt_after = _token(
                tokens_base, gates_base, path_node(path, length, j + 2, NODES, TREE, PATH_L), j + 2 < length,
                x_chan, b_chan, tokens_stride_node, tokens_stride_dim, gates_stride_node)
            x = conv_silu(xx, x1, x2, x3, x4, x_bias, x_wx, x_w1, x_w2, x_w3, x_w4, KERNEL_SIZE)
            b = gl.expand_dims(conv_silu(xb, b1, b2, b3, b4, b_bias, b_wx, b_w1, b_w2, b_w3, b_w4, KERNEL_SIZE), 0)
            x4, x3, x2, x1 = x3, x2, x1, xx
            b4, b3, b2, b1 = b3, b2, b1, xb
            ssd_step(state, x_rows, j, x, b, dt, rate, CHUNK, STATE_L)
            xx, xb, dt = xx_next, xb_next, dt_next
            xx_next, xb_next, dt_next = xx_after, xb_after, dt_after
        tile_store(ssm_desc, coords, tile)
    elif active:  # a broken parent link: the tile arrives, unread, before the program may exit
        mbarrier.wait(bar, 0)


def tile_layout(block_p: int, d_state: int, num_warps: int, chunk: int):
    """(lanes along head_dim, lanes along d_state, rows per pass) of the kernel's tile layout --
    each lane owns 4 adjacent d_state columns, warps split the rows -- or None where it does not fit."""
    chunk = min(chunk, block_p)
    if not power_of_2(d_state) or d_state < 4 or d_state > 256:
        return None
    lanes_n = min(32, d_state // 4)
    lanes_p = 32 // lanes_n
    if chunk < lanes_p * num_warps or block_p % chunk:
        return None
    return lanes_p, lanes_n, chunk


def signature_ok(ssm: torch.Tensor, box: list[int], head_dim: int, d_state: int, block_p: int, num_warps: int,
                 chunk: int) -> bool:
    """Whether a commit of this signature can replay through this kernel, given a 16-byte aligned
    ssm: a tile the copy engine can move (replay_smem.tile_signature_ok), head sizes that are powers
    of two with whole row blocks, a layout that fits."""
    return (power_of_2(head_dim) and power_of_2(block_p) and head_dim % block_p == 0
            and tile_layout(block_p, d_state, num_warps, chunk) is not None and tile_signature_ok(ssm, box))


def kernel_constexprs(constexprs: dict, chunk: int) -> dict:
    """The register kernel's constexprs (mamba2_commit._mamba2_replay_call) turned into this kernel's."""
    lanes_p, lanes_n, chunk = tile_layout(constexprs["BLOCK_P"], constexprs["D_STATE"], constexprs["num_warps"],
                                          chunk)
    names = ("NUM_HEADS", "HEAD_DIM", "N_GROUPS", "D_STATE", "KERNEL_SIZE", "NODES", "BLOCK_P", "TREE", "HAS_BIAS",
             "num_warps")
    return dict({name: constexprs[name] for name in names}, CHUNK=chunk, TPW_P=lanes_p, TPW_N=lanes_n,
                WARPS=constexprs["num_warps"])
