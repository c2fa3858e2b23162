"""What the shared-memory replay kernels (Gluon, sm_90+) share: a row's indices and accepted path,
the causal conv of a path token, the tile's descriptor, its TMA load and store, and the check of a
signature. The Gluon counterparts of csrc_triton/replay.py's helpers, with the same rules (indices
never trusted, a tree path walked link by link, the verify kernel's fma order).
"""

from __future__ import annotations

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from .replay import tma_signature_ok

# Triton 3.6 names the TMA copies async_copy_*; later versions renamed them async_load / async_store
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@gluon.jit
def row_indices(row, steps_ptr, steps_stride, num_nodes, dst_ptr, dst_stride, num_dst, src_ptr, src_stride,
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
def tile_load(ssm_desc, coords, bar, tile, active):
    """An active row's state tile into shared memory by TMA, arriving on ``bar``; issued before a
    tree's walk of its parent links, whose loads depend on each other."""
    if active:
        mbarrier.expect(bar, ssm_desc.block_type.nbytes)
        tma_load(ssm_desc, coords, bar, tile)


@gluon.jit
def tile_store(ssm_desc, coords, tile):
    """The updated tile back by TMA, once every thread's writes are visible to the copy engine."""
    fence_async_shared()
    gl.thread_barrier()
    tma_store(ssm_desc, coords, tile)
    tma.store_wait(0)


@gluon.jit
def accepted_path(row, node, parents_ptr, parents_stride_row, parents_stride_node, num_nodes,
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
def path_node(up, length, j, NODES: gl.constexpr, TREE: gl.constexpr, PATH_L: gl.constexpr):
    """The j-th node of the path, root first (a chain's is j)."""
    if TREE:
        index = gl.arange(0, NODES, layout=PATH_L)
        return gl.sum(gl.where(index.to(gl.int64) == length - 1 - j, up, 0), axis=0).to(gl.int64)
    else:
        return j


@gluon.jit
def committed_input(conv_base, chan, conv_stride_dim, conv_stride_win, back: gl.constexpr, WIDTH: gl.constexpr):
    """The committed input ``back`` steps before the path, fp32 (zeros past the K-1 that exist)."""
    if back <= WIDTH:
        return gl.load(conv_base + chan * conv_stride_dim + (WIDTH - back) * conv_stride_win).to(gl.float32)
    else:
        return gl.full(chan.shape, 0.0, gl.float32, layout=chan.type.layout)


@gluon.jit
def conv_tap(taps, chan, weight_stride_tap, back: gl.constexpr, WIDTH: gl.constexpr):
    """The conv weight multiplying the input ``back`` steps before the token (0: its own), fp32."""
    if back <= WIDTH:
        return gl.load(taps + (WIDTH - back) * weight_stride_tap).to(gl.float32)
    else:
        return gl.full(chan.shape, 0.0, gl.float32, layout=chan.type.layout)


@gluon.jit
def conv_operands(conv_base, weight_base, bias_base, chan, conv_stride_dim, conv_stride_win, weight_stride_dim,
                  weight_stride_tap, bias_stride_dim, HAS_BIAS: gl.constexpr, WIDTH: gl.constexpr):
    """What conv_silu needs for channels ``chan`` besides a token's own input, fp32: the committed
    inputs, newest first, the bias (zeros without one) and the weights, the token's own first:
    (b1, b2, b3, b4, bias, w_x, w_1, w_2, w_3, w_4)."""
    taps = weight_base + chan * weight_stride_dim
    if HAS_BIAS:
        bias = gl.load(bias_base + chan * bias_stride_dim).to(gl.float32)
    else:
        bias = gl.full(chan.shape, 0.0, gl.float32, layout=chan.type.layout)
    return (
        committed_input(conv_base, chan, conv_stride_dim, conv_stride_win, 1, WIDTH),
        committed_input(conv_base, chan, conv_stride_dim, conv_stride_win, 2, WIDTH),
        committed_input(conv_base, chan, conv_stride_dim, conv_stride_win, 3, WIDTH),
        committed_input(conv_base, chan, conv_stride_dim, conv_stride_win, 4, WIDTH),
        bias,
        conv_tap(taps, chan, weight_stride_tap, 0, WIDTH),
        conv_tap(taps, chan, weight_stride_tap, 1, WIDTH),
        conv_tap(taps, chan, weight_stride_tap, 2, WIDTH),
        conv_tap(taps, chan, weight_stride_tap, 3, WIDTH),
        conv_tap(taps, chan, weight_stride_tap, 4, WIDTH),
    )


@gluon.jit
def conv_silu(x, b1, b2, b3, b4, bias, w_x, w_1, w_2, w_3, w_4, KERNEL_SIZE: gl.constexpr):
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


def _tile_layout(rank: int):
    # no swizzle: the kernels' row-chunk loads are bank-conflict free on the plain layout
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


def power_of_2(n: int) -> bool:
    return n > 0 and not n & (n - 1)


def tile_signature_ok(ssm: torch.Tensor, box: list[int]) -> bool:
    """Whether ssm's tiles (one ``box`` each) can live in shared memory: a float32 state whose
    tiles the copy engine can move (replay.tma_signature_ok; the base's alignment is the call's)."""
    return ssm.dtype == torch.float32 and tma_signature_ok(ssm, box)
