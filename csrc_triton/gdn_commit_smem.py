"""gdn_commit's replay with the state tile in shared memory instead of registers (Gluon, sm_90+).

A register-resident [dk, 64] fp32 tile takes 128 registers per thread, so an SM holds four replay
programs, and a path token's latency-bound k work (loads, conv, l2 norm) stalls a quarter of its
state streams. Here the tile lands in shared memory by TMA and goes back by TMA; each path token
walks it in chunks of rows ([CHUNK, BLOCK_V], one pass for S^T k, one for the update), so a
program's registers hold a chunk, not the tile: at Qwen3-Next's heads 6 programs share an SM (34 KB
of shared memory each). Warps split the value columns, so the dk reductions stay inside a warp.

The same grid, skip rules and arithmetic per token as gdn_commit._gdn_replay_kernel (the S^T k sum
is taken chunk by chunk, so its rounding differs from that kernel's by an order of summation).
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


@gluon.jit
def _token(tokens_base, gates_base, node, live, k_chan, v_chan, tokens_stride_node, tokens_stride_dim,
           gates_stride_node, gates_stride_gate):
    """A path token's conv inputs (k channels, v columns) and (g, beta), fp32; zeros unless live."""
    token = tokens_base + node * tokens_stride_node
    xk = gl.load(token + k_chan * tokens_stride_dim, mask=(k_chan >= 0) & live, other=0.0).to(gl.float32)
    xv = gl.load(token + v_chan * tokens_stride_dim, mask=(v_chan >= 0) & live, other=0.0).to(gl.float32)
    gate = gates_base + node * gates_stride_node
    g = gl.load(gate, mask=live, other=0.0).to(gl.float32)
    beta = gl.load(gate + gates_stride_gate, mask=live, other=0.0).to(gl.float32)
    return xk, xv, g, beta


@gluon.jit
def delta_rule_step(state, k_rows, j, k, v, g, beta, BLOCK_V: gl.constexpr, CHUNK: gl.constexpr,
                    L2NORM: gl.constexpr, STATE_L: gl.constexpr):
    """The [dk, BLOCK_V] tile ``state`` (shared memory) after path token j: k (its key head's, over
    every thread; l2-normalised here with L2NORM) staged in k_rows' buffer j % 2, then per chunk of
    CHUNK rows S = S exp(g); u = beta (v - S^T k) (v in STATE_L's column slice); S = S + k u^T."""
    K_L: gl.constexpr = gl.SliceLayout(1, STATE_L)
    V_L: gl.constexpr = gl.SliceLayout(0, STATE_L)
    CHUNKS: gl.constexpr = k_rows.shape[1] // CHUNK
    if L2NORM:
        k = k / gl.sqrt(gl.sum(k * k, axis=0) + 1e-6)
    # k rows alternate between two buffers: this token's store cannot overtake the reads
    # of two tokens back, which all threads finished before the last token's barrier
    k_row = k_rows.index((j % 2).to(gl.int32))
    k_row.store(k)
    gl.thread_barrier()
    decay = gl.exp(g)
    sk = gl.zeros([BLOCK_V], gl.float32, V_L)
    for c in gl.static_range(CHUNKS):
        part = state.slice(c * CHUNK, CHUNK).load(STATE_L).to(gl.float32) * decay
        k_part = k_row.slice(c * CHUNK, CHUNK).load(K_L)
        sk += gl.sum(part * gl.expand_dims(k_part, 1), axis=0)
    u = gl.expand_dims(beta * (v - sk), 0)
    for c in gl.static_range(CHUNKS):
        rows = state.slice(c * CHUNK, CHUNK)
        part = rows.load(STATE_L).to(gl.float32) * decay
        k_part = k_row.slice(c * CHUNK, CHUNK).load(K_L)
        rows.store((part + gl.expand_dims(k_part, 1) * u).to(state.dtype))


@gluon.jit
def _gdn_replay_smem_kernel(
    ssm_desc, ssm_ptr, conv_ptr, tokens_ptr, gates_ptr, weight_ptr, bias_ptr,
    dst_slots_ptr, src_slots_ptr, steps_ptr, parents_ptr,
    num_state_slots, num_src_slots, num_nodes,
    ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_k, ssm_stride_v,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    tokens_stride_layer, tokens_stride_slot, tokens_stride_node, tokens_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_node, gates_stride_gate, gates_stride_head,
    weight_stride_layer, weight_stride_dim, weight_stride_tap,
    bias_stride_layer, bias_stride_dim,
    dst_slots_stride, src_slots_stride, steps_stride, parents_stride_row, parents_stride_node,
    NUM_K_HEADS: gl.constexpr, HEAD_K_DIM: gl.constexpr, NUM_V_HEADS: gl.constexpr, HEAD_V_DIM: gl.constexpr,
    KERNEL_SIZE: gl.constexpr, NODES: gl.constexpr, BLOCK_V: gl.constexpr, CHUNK: gl.constexpr,
    TREE: gl.constexpr, HAS_BIAS: gl.constexpr, L2NORM: gl.constexpr,
    TPW_K: gl.constexpr, TPW_V: gl.constexpr, WARPS: gl.constexpr,
):
    """One program: one (value head, block of value columns) of one row and layer, as the
    register kernel; its tile [dk, BLOCK_V] lives in shared memory over the path. The arguments
    are the register kernel's (so both share one launch plan); the tile moves by ssm_desc alone,
    so ssm_ptr and its strides go unread."""
    V_BLOCKS: gl.constexpr = HEAD_V_DIM // BLOCK_V
    WIDTH: gl.constexpr = KERNEL_SIZE - 1
    STATE_L: gl.constexpr = gl.BlockedLayout([1, 4], [TPW_K, TPW_V], [1, WARPS], [1, 0])
    V_L: gl.constexpr = gl.SliceLayout(0, STATE_L)
    KC_L: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])  # the k conv: channels over all threads
    PATH_L: gl.constexpr = gl.BlockedLayout([NODES], [32], [WARPS], [0])
    head = gl.program_id(0) // V_BLOCKS
    v_block = gl.program_id(0) % V_BLOCKS
    row = gl.program_id(1).to(gl.int64)
    layer32 = gl.program_id(2)
    layer = layer32.to(gl.int64)

    tile = gl.allocate_shared_memory(ssm_desc.dtype, ssm_desc.block_type.shape, ssm_desc.layout)
    k_rows = gl.allocate_shared_memory(gl.float32, [2, HEAD_K_DIM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)

    node, dst, src, active = row_indices(
        row, steps_ptr, steps_stride, num_nodes, dst_slots_ptr, dst_slots_stride, num_state_slots,
        src_slots_ptr, src_slots_stride, num_src_slots)
    coords = [layer32, dst.to(gl.int32), head, 0, v_block * BLOCK_V]
    tile_load(ssm_desc, coords, bar, tile, active)
    path, length, links_ok = accepted_path(row, node, parents_ptr, parents_stride_row, parents_stride_node,
                                            num_nodes, NODES, TREE, PATH_L)
    if active & links_ok:
        k_head = head // (NUM_V_HEADS // NUM_K_HEADS)
        k_chan = NUM_K_HEADS * HEAD_K_DIM + k_head * HEAD_K_DIM + gl.arange(0, HEAD_K_DIM, layout=KC_L)
        v_chan = 2 * NUM_K_HEADS * HEAD_K_DIM + head * HEAD_V_DIM + v_block * BLOCK_V + gl.arange(
            0, BLOCK_V, layout=V_L)
        conv_base = conv_ptr + layer * conv_stride_layer + dst * conv_stride_slot
        tokens_base = tokens_ptr + layer * tokens_stride_layer + src * tokens_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + src * gates_stride_slot + head * gates_stride_head
        weight_base = weight_ptr + layer * weight_stride_layer
        bias_base = bias_ptr + layer * bias_stride_layer
        k1, k2, k3, k4, k_bias, k_wx, k_w1, k_w2, k_w3, k_w4 = conv_operands(
            conv_base, weight_base, bias_base, k_chan, conv_stride_dim, conv_stride_win, weight_stride_dim,
            weight_stride_tap, bias_stride_dim, HAS_BIAS, WIDTH)
        v1, v2, v3, v4, v_bias, v_wx, v_w1, v_w2, v_w3, v_w4 = conv_operands(
            conv_base, weight_base, bias_base, v_chan, conv_stride_dim, conv_stride_win, weight_stride_dim,
            weight_stride_tap, bias_stride_dim, HAS_BIAS, WIDTH)
        # each path token's inputs load two tokens ahead of their use, as in the register kernel
        xk, xv, g, beta = _token(
            tokens_base, gates_base, path_node(path, length, 0, NODES, TREE, PATH_L), length > 0, k_chan,
            v_chan, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)
        xk_next, xv_next, g_next, beta_next = _token(
            tokens_base, gates_base, path_node(path, length, 1, NODES, TREE, PATH_L), length > 1, k_chan,
            v_chan, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)

        state = tile.reshape([HEAD_K_DIM, BLOCK_V])
        mbarrier.wait(bar, 0)
        for j in range(0, length):
            xk_after, xv_after, g_after, beta_after = _token(
                tokens_base, gates_base, path_node(path, length, j + 2, NODES, TREE, PATH_L), j + 2 < length,
                k_chan, v_chan, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)
            k = conv_silu(xk, k1, k2, k3, k4, k_bias, k_wx, k_w1, k_w2, k_w3, k_w4, KERNEL_SIZE)
            v = conv_silu(xv, v1, v2, v3, v4, v_bias, v_wx, v_w1, v_w2, v_w3, v_w4, KERNEL_SIZE)
            k4, k3, k2, k1 = k3, k2, k1, xk
            v4, v3, v2, v1 = v3, v2, v1, xv
            delta_rule_step(state, k_rows, j, k, v, g, beta, BLOCK_V, CHUNK, L2NORM, STATE_L)
            xk, xv, g, beta = xk_next, xv_next, g_next, beta_next
            xk_next, xv_next, g_next, beta_next = xk_after, xv_after, g_after, beta_after
        tile_store(ssm_desc, coords, tile)
    elif active:  # a broken parent link: the tile arrives, unread, before the program may exit
        mbarrier.wait(bar, 0)


SMEM_CHUNK = 64  # state rows per pass: [64, 64] fp32 over 2 warps, 32 per thread


def tile_layout(head_k_dim: int, block_v: int, num_warps: int, chunk: int):
    """(lanes along dk, lanes along dv, rows per pass) of the kernel's tile layout -- each warp owns
    block_v / num_warps whole columns, 4 adjacent per lane -- or None where it does not fit."""
    columns, chunk = block_v // num_warps, min(chunk, head_k_dim)
    if block_v % num_warps or columns < 4 or columns > 128 or columns & (columns - 1):
        return None
    lanes_v = columns // 4
    lanes_k = 32 // lanes_v
    if chunk < lanes_k or head_k_dim % chunk:
        return None
    return lanes_k, lanes_v, chunk


def signature_ok(ssm: torch.Tensor, box: list[int], head_k_dim: int, head_v_dim: int, block_v: int,
                 num_warps: int, chunk: int) -> bool:
    """Whether a commit of this signature can replay through this kernel, given a 16-byte aligned
    ssm: a tile the copy engine can move (replay_smem.tile_signature_ok), head sizes that are
    powers of two with whole value blocks, a layout that fits."""
    return (power_of_2(head_k_dim) and power_of_2(block_v) and 16 <= head_k_dim <= 256
            and head_v_dim % block_v == 0 and tile_layout(head_k_dim, block_v, num_warps, chunk) is not None
            and tile_signature_ok(ssm, box))


def kernel_constexprs(constexprs: dict, chunk: int) -> dict:
    """The register kernel's constexprs (gdn_commit._gdn_replay_call) turned into this kernel's."""
    lanes_k, lanes_v, chunk = tile_layout(constexprs["HEAD_K_DIM"], constexprs["BLOCK_V"],
                                          constexprs["num_warps"], chunk)
    names = ("NUM_K_HEADS", "HEAD_K_DIM", "NUM_V_HEADS", "HEAD_V_DIM", "KERNEL_SIZE", "NODES", "BLOCK_V", "TREE",
             "HAS_BIAS", "L2NORM", "num_warps")
    return dict({name: constexprs[name] for name in names}, CHUNK=chunk, TPW_K=lanes_k,
                TPW_V=lanes_v, WARPS=constexprs["num_warps"])
