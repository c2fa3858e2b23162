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

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from .replay import tma_signature_ok

# Triton 3.6 names the TMA copies async_copy_*; later versions renamed them async_load / async_store
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@gluon.jit
def _row_indices(row, steps_ptr, steps_stride, num_nodes, dst_ptr, dst_stride, num_dst, src_ptr, src_stride,
                 num_src):
    """(node, dst, src, in range) of one row, int64; any index out of range skips the row."""
    node = gl.load(steps_ptr + row * steps_stride).to(gl.int64)
    dst = gl.load(dst_ptr + row * dst_stride).to(gl.int64)
    src = gl.load(src_ptr + row * src_stride).to(gl.int64)
    active = (node >= 0) & (node < num_nodes)
    active = active & (dst >= 0) & (dst < num_dst)
    active = active & (src >= 0) & (src < num_src)
    return node, dst, src, active


@gluon.jit
def _accepted_path(row, node, parents_ptr, parents_stride_row, parents_stride_node, num_nodes,
                   NODES: gl.constexpr, TREE: gl.constexpr, PATH_L: gl.constexpr):
    """replay.accepted_path: (up [NODES], length, links_ok); every thread holds the whole path."""
    if TREE:
        index = gl.arange(0, NODES, layout=PATH_L)
        links = parents_ptr + row * parents_stride_row
        up = gl.zeros([NODES], gl.int32, PATH_L)
        current = node
        length = node * 0
        links_ok = node >= 0
        for i in gl.static_range(NODES):
            live = current >= 0
            up = gl.where((index == i) & live, current.to(gl.int32), up)
            parent = gl.load(links + current * parents_stride_node, mask=live & (current < num_nodes),
                             other=-1).to(gl.int64)
            bad = live & ((parent < -1) | (parent >= current))
            links_ok = links_ok & (bad == 0)
            length += live.to(gl.int64)
            current = gl.where(live & (bad == 0), parent, -1)
        return up, length, links_ok
    else:
        return node.to(gl.int32), node + 1, node >= 0


@gluon.jit
def _path_node(up, length, j, NODES: gl.constexpr, TREE: gl.constexpr, PATH_L: gl.constexpr):
    """The j-th node of the path, root first (a chain's is j)."""
    if TREE:
        index = gl.arange(0, NODES, layout=PATH_L)
        return gl.sum(gl.where(index.to(gl.int64) == length - 1 - j, up, 0), axis=0).to(gl.int64)
    else:
        return j


@gluon.jit
def _committed(conv_base, chan, conv_stride_dim, conv_stride_win, back: gl.constexpr, WIDTH: gl.constexpr):
    """The committed input ``back`` steps before the path, fp32 (zeros past the K-1 that exist)."""
    if back <= WIDTH:
        return gl.load(conv_base + chan * conv_stride_dim + (WIDTH - back) * conv_stride_win).to(gl.float32)
    else:
        return gl.full(chan.shape, 0.0, gl.float32, layout=chan.type.layout)


@gluon.jit
def _tap(taps, chan, weight_stride_tap, back: gl.constexpr, WIDTH: gl.constexpr):
    """The conv weight multiplying the input ``back`` steps before the token (0: its own), fp32."""
    if back <= WIDTH:
        return gl.load(taps + (WIDTH - back) * weight_stride_tap).to(gl.float32)
    else:
        return gl.full(chan.shape, 0.0, gl.float32, layout=chan.type.layout)


@gluon.jit
def _conv_silu(x, b1, b2, b3, b4, bias, w_x, w_1, w_2, w_3, w_4, KERNEL_SIZE: gl.constexpr):
    """replay.conv_silu's fma order."""
    acc = gl.fma(w_x, x, bias)
    acc = gl.fma(w_1, b1, acc)
    if KERNEL_SIZE > 2:
        acc = gl.fma(w_2, b2, acc)
    if KERNEL_SIZE > 3:
        acc = gl.fma(w_3, b3, acc)
    if KERNEL_SIZE > 4:
        acc = gl.fma(w_4, b4, acc)
    return acc * (1 / (1 + gl.exp(-acc)))


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
    CHUNKS: gl.constexpr = HEAD_K_DIM // CHUNK
    WIDTH: gl.constexpr = KERNEL_SIZE - 1
    STATE_L: gl.constexpr = gl.BlockedLayout([1, 4], [TPW_K, TPW_V], [1, WARPS], [1, 0])
    K_L: gl.constexpr = gl.SliceLayout(1, STATE_L)
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

    node, dst, src, active = _row_indices(
        row, steps_ptr, steps_stride, num_nodes, dst_slots_ptr, dst_slots_stride, num_state_slots,
        src_slots_ptr, src_slots_stride, num_src_slots)
    coords = [layer32, dst.to(gl.int32), head, 0, v_block * BLOCK_V]
    if active:  # the tile's load goes out before a tree's walk of its parent links (dependent loads)
        mbarrier.expect(bar, ssm_desc.block_type.nbytes)
        _tma_load(ssm_desc, coords, bar, tile)
    path, length, links_ok = _accepted_path(row, node, parents_ptr, parents_stride_row, parents_stride_node,
                                            num_nodes, NODES, TREE, PATH_L)
    if active & links_ok:
        k_head = head // (NUM_V_HEADS // NUM_K_HEADS)
        k_chan = NUM_K_HEADS * HEAD_K_DIM + k_head * HEAD_K_DIM + gl.arange(0, HEAD_K_DIM, layout=KC_L)
        v_chan = 2 * NUM_K_HEADS * HEAD_K_DIM + head * HEAD_V_DIM + v_block * BLOCK_V + gl.arange(
            0, BLOCK_V, layout=V_L)
        conv_base = conv_ptr + layer * conv_stride_layer + dst * conv_stride_slot
        tokens_base = tokens_ptr + layer * tokens_stride_layer + src * tokens_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + src * gates_stride_slot + head * gates_stride_head
        k_taps = weight_ptr + layer * weight_stride_layer + k_chan * weight_stride_dim
        v_taps = weight_ptr + layer * weight_stride_layer + v_chan * weight_stride_dim
        k1 = _committed(conv_base, k_chan, conv_stride_dim, conv_stride_win, 1, WIDTH)
        k2 = _committed(conv_base, k_chan, conv_stride_dim, conv_stride_win, 2, WIDTH)
        k3 = _committed(conv_base, k_chan, conv_stride_dim, conv_stride_win, 3, WIDTH)
        k4 = _committed(conv_base, k_chan, conv_stride_dim, conv_stride_win, 4, WIDTH)
        v1 = _committed(conv_base, v_chan, conv_stride_dim, conv_stride_win, 1, WIDTH)
        v2 = _committed(conv_base, v_chan, conv_stride_dim, conv_stride_win, 2, WIDTH)
        v3 = _committed(conv_base, v_chan, conv_stride_dim, conv_stride_win, 3, WIDTH)
        v4 = _committed(conv_base, v_chan, conv_stride_dim, conv_stride_win, 4, WIDTH)
        k_wx = _tap(k_taps, k_chan, weight_stride_tap, 0, WIDTH)
        k_w1 = _tap(k_taps, k_chan, weight_stride_tap, 1, WIDTH)
        k_w2 = _tap(k_taps, k_chan, weight_stride_tap, 2, WIDTH)
        k_w3 = _tap(k_taps, k_chan, weight_stride_tap, 3, WIDTH)
        k_w4 = _tap(k_taps, k_chan, weight_stride_tap, 4, WIDTH)
        v_wx = _tap(v_taps, v_chan, weight_stride_tap, 0, WIDTH)
        v_w1 = _tap(v_taps, v_chan, weight_stride_tap, 1, WIDTH)
        v_w2 = _tap(v_taps, v_chan, weight_stride_tap, 2, WIDTH)
        v_w3 = _tap(v_taps, v_chan, weight_stride_tap, 3, WIDTH)
        v_w4 = _tap(v_taps, v_chan, weight_stride_tap, 4, WIDTH)
        if HAS_BIAS:
            bias_base = bias_ptr + layer * bias_stride_layer
            k_bias = gl.load(bias_base + k_chan * bias_stride_dim).to(gl.float32)
            v_bias = gl.load(bias_base + v_chan * bias_stride_dim).to(gl.float32)
        else:
            k_bias = gl.zeros([HEAD_K_DIM], gl.float32, KC_L)
            v_bias = gl.zeros([BLOCK_V], gl.float32, V_L)
        # each path token's inputs load two tokens ahead of their use, as in the register kernel
        xk, xv, g, beta = _token(
            tokens_base, gates_base, _path_node(path, length, 0, NODES, TREE, PATH_L), length > 0, k_chan,
            v_chan, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)
        xk_next, xv_next, g_next, beta_next = _token(
            tokens_base, gates_base, _path_node(path, length, 1, NODES, TREE, PATH_L), length > 1, k_chan,
            v_chan, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)

        state = tile.reshape([HEAD_K_DIM, BLOCK_V])
        mbarrier.wait(bar, 0)
        for j in range(0, length):
            xk_after, xv_after, g_after, beta_after = _token(
                tokens_base, gates_base, _path_node(path, length, j + 2, NODES, TREE, PATH_L), j + 2 < length,
                k_chan, v_chan, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)
            k = _conv_silu(xk, k1, k2, k3, k4, k_bias, k_wx, k_w1, k_w2, k_w3, k_w4, KERNEL_SIZE)
            v = _conv_silu(xv, v1, v2, v3, v4, v_bias, v_wx, v_w1, v_w2, v_w3, v_w4, KERNEL_SIZE)
            k4, k3, k2, k1 = k3, k2, k1, xk
            v4, v3, v2, v1 = v3, v2, v1, xv
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
                rows.store((part + gl.expand_dims(k_part, 1) * u).to(ssm_desc.dtype))
            xk, xv, g, beta = xk_next, xv_next, g_next, beta_next
            xk_next, xv_next, g_next, beta_next = xk_after, xv_after, g_after, beta_after
        fence_async_shared()  # every thread's tile writes, before the copy engine reads the tile
        gl.thread_barrier()
        _tma_store(ssm_desc, coords, tile)
        tma.store_wait(0)
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
    ssm (replay.tma_signature_ok: the tile comes in and goes back by TMA): a float32 state, head
    sizes that are powers of two with whole value blocks, a layout that fits."""
    def power_of_2(n):
        return n > 0 and not n & (n - 1)

    return (ssm.dtype == torch.float32 and power_of_2(head_k_dim) and power_of_2(block_v)
            and 16 <= head_k_dim <= 256 and head_v_dim % block_v == 0
            and tile_layout(head_k_dim, block_v, num_warps, chunk) is not None and tma_signature_ok(ssm, box))


def _tile_layout(rank: int):
    # no swizzle: the kernel's row-chunk loads are bank-conflict free on the plain layout
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=rank)


def state_descriptor(ssm: torch.Tensor, box: list[int]):
    """A Gluon tensor descriptor over ssm (16-byte aligned) whose box is one program's tile."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(ssm, list(ssm.shape), list(ssm.stride()), box, _tile_layout(len(box)))


def descriptor_maker(ssm: torch.Tensor, box: list[int]):
    """A function of a state of ssm's signature (its shape and strides) on a 16-byte aligned base
    that gives state_descriptor's descriptor over it without the constructor's checks: they hold
    for the signature, cost about 3 us a call, and the base check would refuse ssm itself if the
    plan is made on a misaligned state."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    fields = {f.name: f.default for f in dataclasses.fields(TensorDescriptor) if f.default is not dataclasses.MISSING}
    fields.update(shape=list(ssm.shape), strides=list(ssm.stride()), block_shape=box, layout=_tile_layout(len(box)))

    def make(base: torch.Tensor):
        desc = object.__new__(TensorDescriptor)
        desc.__dict__.update(fields)
        desc.base = base
        return desc

    return make


def kernel_constexprs(constexprs: dict, chunk: int) -> dict:
    """The register kernel's constexprs (gdn_commit._gdn_replay_call) turned into this kernel's."""
    lanes_k, lanes_v, chunk = tile_layout(constexprs["HEAD_K_DIM"], constexprs["BLOCK_V"],
                                          constexprs["num_warps"], chunk)
    names = ("NUM_K_HEADS", "HEAD_K_DIM", "NUM_V_HEADS", "HEAD_V_DIM", "KERNEL_SIZE", "NODES", "BLOCK_V", "TREE",
             "HAS_BIAS", "L2NORM", "num_warps")
    return dict({name: constexprs[name] for name in names}, CHUNK=chunk, TPW_K=lanes_k,
                TPW_V=lanes_v, WARPS=constexprs["num_warps"])
