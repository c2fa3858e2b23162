"""What the replay commits share: the accepted path of a row, the causal conv of a path token,
the commit of the accepted conv window, and the per-token gates' capture.

Every replay kernel sees the conv-input buffer through two layout-free views
(sgl_convwin.layout.token_views): ``tokens [L, M, N, dim]`` (node n's conv input) and
``history [L, M, N, dim, K-2]`` (the K-2 newest committed inputs, oldest first, as the window of
node n holds them: token_major and channel_major buffers store them once, so their node stride is
0; a dense buffer's windows hold them per node). Indices are never trusted: a row whose step
(node), destination or source slot is out of range, or whose accepted path meets a parent link
outside [-1, n-1], is skipped whole.

A commit is two launches, in this order, because a path's first token needs all K-1 committed
inputs and only conv_state holds the oldest: the mixer's replay kernel reads conv_state and writes
the recurrent state, then ``_path_window_kernel`` overwrites conv_state from the buffer alone.
"""

from __future__ import annotations

import importlib

import torch
import triton
import triton.language as tl

from ._common import (MAX_GRID_Y, KernelCall, cdiv, next_power_of_2, nvidia_at_least, planned_launch,
                      row_indices, softplus)

try:  # host-side tensor descriptors (the replay kernels' state tile loads)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None

WINDOW_BLOCK = 1024  # channels per program of the window commit
WINDOW_WARPS = 2
# The shared-memory replay kernels (*_smem.py) are written in Gluon, whose API still moves between
# Triton releases: they run only on the versions their GPU tests passed on; others take the
# register kernels.
SMEM_TRITON_VERSIONS = ("3.6.",)


@triton.jit
def accepted_path(
    row, node, parents_ptr, parents_stride_row, parents_stride_node, num_nodes,
    NODES: tl.constexpr, TREE: tl.constexpr,
):
    """The accepted path of one row: (up [NODES], length, links_ok); path_node(up, length, j)
    is its j-th node, root first.

    Chain: nodes 0 .. node. Tree: up lists node, its parent, ... up to the node whose parent is
    -1; links_ok is False if a link on the way lies outside [-1, n-1]. The walk loads one link
    at a time from the row (one cached line): no cross-thread reduction per link."""
    index = tl.arange(0, NODES)
    if TREE:
        links = parents_ptr + row.to(tl.int64) * parents_stride_row
        up = tl.zeros([NODES], dtype=tl.int64)
        current = node
        length = node * 0
        links_ok = node >= 0
        for i in tl.static_range(NODES):
            live = current >= 0
            up = tl.where((index == i) & live, current, up)
            parent = tl.load(links + current * parents_stride_node, mask=live & (current < num_nodes),
                             other=-1).to(tl.int64)
            bad = live & ((parent < -1) | (parent >= current))
            links_ok &= ~bad
            length += live.to(tl.int64)
            current = tl.where(live & ~bad, parent, -1)
        return up, length, links_ok
    else:
        return index.to(tl.int64), node + 1, node >= 0


@triton.jit
def path_node(up, length, j, NODES: tl.constexpr, TREE: tl.constexpr):
    """The j-th node of an accepted path, root first, as a scalar (a chain's path is 0 ..)."""
    if TREE:
        return tl.sum(tl.where(tl.arange(0, NODES) == length - 1 - j, up, 0))
    else:
        return j


@triton.jit
def committed_input(conv_base, chan, cmask, conv_stride_dim, conv_stride_win, back: tl.constexpr,
               WIDTH: tl.constexpr):
    """The committed input ``back`` steps before the first path token (1 = the newest), float32;
    zeros past the K-1 that conv_state holds (those taps do not exist)."""
    if back <= WIDTH:
        return tl.load(conv_base + chan * conv_stride_dim + (WIDTH - back) * conv_stride_win,
                       mask=cmask, other=0.0).to(tl.float32)
    else:
        return tl.zeros(chan.shape, dtype=tl.float32)


@triton.jit
def committed_inputs(conv_base, chan, cmask, conv_stride_dim, conv_stride_win, WIDTH: tl.constexpr):
    """The four committed inputs before the first path token, newest first: what conv_silu takes
    as back1..back4 for the first token (zeros past the K-1 that exist)."""
    return (committed_input(conv_base, chan, cmask, conv_stride_dim, conv_stride_win, 1, WIDTH),
            committed_input(conv_base, chan, cmask, conv_stride_dim, conv_stride_win, 2, WIDTH),
            committed_input(conv_base, chan, cmask, conv_stride_dim, conv_stride_win, 3, WIDTH),
            committed_input(conv_base, chan, cmask, conv_stride_dim, conv_stride_win, 4, WIDTH))


@triton.jit
def conv_taps(weight_base, chan, cmask, weight_stride_dim, weight_stride_tap, bias_base, bias_stride,
              KERNEL_SIZE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """A program's conv weights and bias in float32, loaded once before its path: (bias, w_x, w_1,
    w_2, w_3, w_4), w_x multiplying the token's own input and w_i the one i steps back (zeros where
    no such tap or no bias exists)."""
    WIDTH: tl.constexpr = KERNEL_SIZE - 1
    taps = weight_base + chan * weight_stride_dim
    bias = tl.zeros(chan.shape, dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_base + chan * bias_stride, mask=cmask).to(tl.float32)
    w_x = tl.load(taps + WIDTH * weight_stride_tap, mask=cmask).to(tl.float32)
    w_1 = tl.load(taps + (WIDTH - 1) * weight_stride_tap, mask=cmask).to(tl.float32)
    w_2 = tl.zeros(chan.shape, dtype=tl.float32)
    w_3 = tl.zeros(chan.shape, dtype=tl.float32)
    w_4 = tl.zeros(chan.shape, dtype=tl.float32)
    if KERNEL_SIZE > 2:
        w_2 = tl.load(taps + (WIDTH - 2) * weight_stride_tap, mask=cmask).to(tl.float32)
    if KERNEL_SIZE > 3:
        w_3 = tl.load(taps + (WIDTH - 3) * weight_stride_tap, mask=cmask).to(tl.float32)
    if KERNEL_SIZE > 4:
        w_4 = tl.load(taps + (WIDTH - 4) * weight_stride_tap, mask=cmask).to(tl.float32)
    return bias, w_x, w_1, w_2, w_3, w_4


@triton.jit
def conv_silu(x, back1, back2, back3, back4, bias, w_x, w_1, w_2, w_3, w_4, KERNEL_SIZE: tl.constexpr):
    """silu(bias + sum_k w[:, k] * input k) in float32 for input x and the K-1 before it (back1 the
    newest), with conv_taps' weights. The fma order (bias, then the taps from the newest input up)
    is the verify kernel's; its SiLU is not (verify._silu's exp2 and fast divide), so the two differ
    in the last bits."""
    tl.static_assert(KERNEL_SIZE <= 5, "the replay conv keeps at most 4 previous inputs")
    acc = tl.fma(w_x, x, bias)
    acc = tl.fma(w_1, back1, acc)
    if KERNEL_SIZE > 2:
        acc = tl.fma(w_2, back2, acc)
    if KERNEL_SIZE > 3:
        acc = tl.fma(w_3, back3, acc)
    if KERNEL_SIZE > 4:
        acc = tl.fma(w_4, back4, acc)
    return acc * tl.sigmoid(acc)


@triton.jit
def _path_window_kernel(
    conv_ptr, tokens_ptr, history_ptr, dst_slots_ptr, src_slots_ptr, steps_ptr, parents_ptr,
    num_state_slots, num_src_slots, num_nodes, dim,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    tokens_stride_layer, tokens_stride_slot, tokens_stride_node, tokens_stride_dim,
    history_stride_layer, history_stride_slot, history_stride_node, history_stride_dim, history_stride_col,
    dst_slots_stride, src_slots_stride, steps_stride, parents_stride_row, parents_stride_node,
    KERNEL_SIZE: tl.constexpr, NODES: tl.constexpr, BLOCK: tl.constexpr, TREE: tl.constexpr,
    WIDTH_P2: tl.constexpr,
):
    """conv_state[l, dst] = the last K-1 inputs of the accepted path (history above the root).
    Copies only, so the window is what scatter / scatter_tree write for the same buffer."""
    WIDTH: tl.constexpr = KERNEL_SIZE - 1
    block = tl.program_id(0)
    row = tl.program_id(1)
    layer = tl.program_id(2).to(tl.int64)
    node, dst, src, active = row_indices(
        row, steps_ptr, steps_stride, num_nodes, dst_slots_ptr, dst_slots_stride, num_state_slots,
        src_slots_ptr, src_slots_stride, num_src_slots,
    )
    path, length, links_ok = accepted_path(row, node, parents_ptr, parents_stride_row, parents_stride_node,
                                           num_nodes, NODES, TREE)
    if active & links_ok:
        chan = block * BLOCK + tl.arange(0, BLOCK)
        cmask = chan < dim
        root = path_node(path, length, 0, NODES, TREE)
        tokens_base = tokens_ptr + layer * tokens_stride_layer + src * tokens_stride_slot
        history_base = (history_ptr + layer * history_stride_layer + src * history_stride_slot
                        + root * history_stride_node)
        conv_base = conv_ptr + layer * conv_stride_layer + dst * conv_stride_slot
        cols = tl.arange(0, WIDTH_P2)
        window = tl.zeros([BLOCK, WIDTH_P2], dtype=conv_ptr.dtype.element_ty)
        for column in tl.static_range(WIDTH):
            position = length - WIDTH + column  # on the path; < 0: history column WIDTH-1+position
            is_token = (chan * 0 + position) >= 0
            node_here = path_node(path, length, tl.maximum(position, 0), NODES, TREE)
            from_token = tl.load(tokens_base + node_here * tokens_stride_node + chan * tokens_stride_dim,
                                 mask=cmask & is_token)
            history_column = tl.maximum(WIDTH - 1 + position, 0)
            from_history = tl.load(history_base + chan * history_stride_dim + history_column * history_stride_col,
                                   mask=cmask & ~is_token)
            value = tl.where(is_token, from_token, from_history).to(conv_ptr.dtype.element_ty)
            window = tl.where(cols[None, :] == column, value[:, None], window)
        # one [channels, K-1] store: lanes then write whole windows, not one column K-1 elements apart
        tl.store(conv_base + chan[:, None] * conv_stride_dim + cols[None, :] * conv_stride_win, window,
                 mask=cmask[:, None] & (cols < WIDTH)[None, :])


def index_strides(dst_slots, src_slots, steps, parents):
    parents_strides = (0, 0) if parents is None else parents.stride()
    return (dst_slots.stride(0), src_slots.stride(0), steps.stride(0), *parents_strides)


def check_grid(op: str, num_rows: int, num_layers: int) -> None:
    if num_layers > MAX_GRID_Y:
        raise ValueError(f"{op} supports at most {MAX_GRID_Y} layers, got {num_layers}")
    if num_rows > MAX_GRID_Y:
        raise ValueError(f"{op} commits at most {MAX_GRID_Y} rows per call, got {num_rows}; split the batch")


def tma_signature_ok(ssm: torch.Tensor, box: list[int]) -> bool:
    """Whether ssm's state tiles (one ``box`` each) can come in through a tensor descriptor, as far
    as its signature says (a CUDA sm_90+ device, the last axis contiguous, every other stride on
    16 bytes, sizes a tensor map takes, at most 256 per box axis); the base's alignment is the
    call's."""
    if TensorDescriptor is None or not ssm.is_cuda or max(box) > 256:
        return False
    strides, size = ssm.stride(), ssm.element_size()
    if strides[-1] != 1 or any(stride * size % 16 or stride >= 2**40 for stride in strides[:-1]):
        return False
    if any(not 0 < n < 2**31 for n in ssm.shape):
        return False
    return nvidia_at_least(ssm.device, (9, 0))  # (the copy engine's tensor maps)


def _descriptor_signature(ssm: torch.Tensor, box: list[int], tree: bool) -> bool:
    """Whether a launch of this signature loads its state tiles through a descriptor (given a
    16-byte aligned base): chains whose state allows it (tma_signature_ok); trees load by pointers
    (the descriptor load measured slower there on the H200, docs/benchmarks.md)."""
    return not tree and tma_signature_ok(ssm, box)


def descriptor_load(ssm: torch.Tensor, box: list[int], *, tree: bool) -> bool:
    """The launchers' choice of state-tile load for this call: _descriptor_signature, and ssm's
    base on 16 bytes."""
    return _descriptor_signature(ssm, box, tree) and not ssm.data_ptr() & 15


def state_descriptor(ssm: torch.Tensor, box: list[int]):
    """A tensor descriptor over the state ``ssm`` whose box is one program's state tile."""
    return TensorDescriptor(ssm, list(ssm.shape), list(ssm.stride()), box)


def state_tile_box(ssm: torch.Tensor, rows: int, columns: int) -> list[int]:
    """The descriptor box of a [rows, columns] tile of a state [L, N, heads, ., .]."""
    return [1] * (ssm.dim() - 2) + [rows, columns]


def planned_state_replay(by_pointers: KernelCall | None, ssm: torch.Tensor, box: list[int]):
    """A replay kernel's launch fixed for its signature (``by_pointers``: its KernelCall with
    TMA_LOAD off and ssm as the descriptor's placeholder): a function of (ssm, the kernel's tensors
    after its descriptor argument). Where _descriptor_signature allows the descriptor load, it
    takes it on every call whose ssm is 16-byte aligned (a descriptor per call: it holds ssm), else
    the pointer load."""
    replay = planned_launch(by_pointers)
    if by_pointers is None or not _descriptor_signature(ssm, box, by_pointers.constexprs["TREE"]):
        return replay
    by_descriptor = planned_launch(by_pointers._replace(constexprs=dict(by_pointers.constexprs, TMA_LOAD=True)),
                                   num_descriptors=1)
    shape, strides = list(ssm.shape), list(ssm.stride())  # the signature's

    def run(ssm, *tensors):
        if ssm.data_ptr() & 15:
            replay(ssm, *tensors)
            return
        # TensorDescriptor's own checks are this signature's (made above) and the alignment:
        # skipping them saves most of a descriptor's host time
        desc = object.__new__(TensorDescriptor)
        desc.base, desc.shape, desc.strides, desc.block_shape = ssm, shape, strides, box
        by_descriptor(desc, *tensors)

    return run


def smem_module(name: str):
    """csrc_triton.<name>, a shared-memory replay kernel's module, imported only where a commit can
    use it (it imports Gluon); None on a Triton outside SMEM_TRITON_VERSIONS."""
    if not triton.__version__.startswith(SMEM_TRITON_VERSIONS):
        return None
    return importlib.import_module(f"{__package__}.{name}")


def planned_smem_replay(by_pointers: KernelCall, kernel, constexprs: dict, descriptor, misaligned):
    """A shared-memory replay kernel fixed for by_pointers' signature (the register kernel's call:
    both take the same arguments): a function of (ssm, the kernel's tensors after its descriptor)
    that launches ``kernel`` with ``constexprs`` through ``descriptor(ssm)`` (replay_smem.descriptor_maker
    for this signature), or runs ``misaligned`` for an ssm whose base is not on 16 bytes."""
    launch = planned_launch(by_pointers._replace(kernel=kernel, constexprs=constexprs), num_descriptors=1)

    def run(ssm, *tensors):
        if ssm.data_ptr() & 15:
            misaligned(ssm, *tensors)
            return
        launch(descriptor(ssm), *tensors)

    return run


def _path_window_tensors(conv, tokens, history, dst_slots, src_slots, steps, parents):
    """The window kernel's tensor arguments (a chain passes steps for parents: never read)."""
    return conv, tokens, history, dst_slots, src_slots, steps, steps if parents is None else parents


def _path_window_call(conv, tokens, history, dst_slots, src_slots, steps, parents, *, block=WINDOW_BLOCK,
                      num_warps=WINDOW_WARPS):
    """The window kernel's launch for launch_path_window and planned_path_window, or None if there
    is nothing to do."""
    num_layers, num_state_slots, dim, width = conv.shape
    num_rows = steps.shape[0]
    if num_rows == 0 or num_layers == 0 or dim == 0:
        return None
    check_grid("convwin window commit", num_rows, num_layers)
    block = min(block, next_power_of_2(dim))
    history_strides = history.stride() if history.shape[-1] > 0 else (0,) * 5
    grid = (cdiv(dim, block), num_rows, num_layers)
    scalars = (
        num_state_slots, tokens.shape[1], tokens.shape[2], dim,
        *conv.stride(), *tokens.stride(), *history_strides,
        *index_strides(dst_slots, src_slots, steps, parents),
    )
    constexprs = dict(KERNEL_SIZE=width + 1, NODES=next_power_of_2(tokens.shape[2]), BLOCK=block,
                      TREE=parents is not None, WIDTH_P2=next_power_of_2(width), num_warps=num_warps)
    tensors = _path_window_tensors(conv, tokens, history, dst_slots, src_slots, steps, parents)
    return KernelCall(_path_window_kernel, grid, tensors, scalars, constexprs)


def launch_path_window(conv, tokens, history, dst_slots, src_slots, steps, parents, *, block=WINDOW_BLOCK,
                       num_warps=WINDOW_WARPS):
    """conv [L, N_state, dim, K-1], tokens [L, M, N, dim], history [L, M, N, dim, K-2]; any strides.
    block, num_warps: channels and warps per program (tuning only)."""
    call = _path_window_call(conv, tokens, history, dst_slots, src_slots, steps, parents, block=block,
                             num_warps=num_warps)
    if call is not None:
        call.launch()


def planned_path_window(conv, tokens, history, dst_slots, src_slots, steps, parents):
    """launch_path_window with its plan fixed for THESE shapes, strides, dtypes and device: a
    function of the same seven arguments (_common.planned_launch)."""
    launch = planned_launch(_path_window_call(conv, tokens, history, dst_slots, src_slots, steps, parents))

    def run(conv, tokens, history, dst_slots, src_slots, steps, parents):
        launch(*_path_window_tensors(conv, tokens, history, dst_slots, src_slots, steps, parents))

    return run


@triton.jit
def _capture_gates_kernel(
    gates_ptr, g_ptr, beta_ptr, slots_ptr, a_log_ptr, dt_bias_ptr, gates_layer_offset, num_slots, num_nodes,
    num_heads, gates_stride_slot, gates_stride_node, gates_stride_gate, gates_stride_head,
    g_stride_row, g_stride_node, g_stride_head,
    beta_stride_row, beta_stride_node, beta_stride_head, slots_stride, a_log_stride, dt_bias_stride,
    HAS_BETA: tl.constexpr, RAW: tl.constexpr, BLOCK: tl.constexpr,
):
    """gates[layer, slots[row], n] = (g[row, n], beta[row, n]) for every node n: grid (B,). RAW:
    g, beta hold the raw a, b; g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), in float32."""
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row * slots_stride).to(tl.int64)
    if (slot >= 0) & (slot < num_slots):
        for start in range(0, num_nodes * num_heads, BLOCK):
            flat = start + tl.arange(0, BLOCK)
            mask = flat < num_nodes * num_heads
            n = flat // num_heads
            h = flat - n * num_heads
            dest = (gates_ptr + gates_layer_offset + slot * gates_stride_slot
                    + n * gates_stride_node + h * gates_stride_head)
            g = tl.load(g_ptr + row * g_stride_row + n * g_stride_node + h * g_stride_head, mask=mask)
            if RAW:
                x = g.to(tl.float32) + tl.load(dt_bias_ptr + h * dt_bias_stride, mask=mask).to(tl.float32)
                g = -tl.exp(tl.load(a_log_ptr + h * a_log_stride, mask=mask).to(tl.float32)) * softplus(x)
            tl.store(dest, g.to(gates_ptr.dtype.element_ty), mask=mask)
            if HAS_BETA:
                beta = tl.load(beta_ptr + row * beta_stride_row + n * beta_stride_node + h * beta_stride_head,
                               mask=mask)
                if RAW:
                    beta = 1.0 / (1.0 + tl.exp(-beta.to(tl.float32)))
                tl.store(dest + gates_stride_gate, beta.to(gates_ptr.dtype.element_ty), mask=mask)


def _capture_gates_tensors(gates, g, beta, slots, layer, A_log=None, dt_bias=None):
    """The gates kernel's tensor arguments (a single-gate buffer passes g for beta, and without raw
    gates slots for A_log and dt_bias: never read)."""
    return gates, g, g if beta is None else beta, slots, slots if A_log is None else A_log, \
        slots if dt_bias is None else dt_bias


def _capture_gates_call(gates, g, beta, slots, layer, A_log=None, dt_bias=None, *, block=1024):
    """The gates kernel's launch for launch_capture_gates and planned_capture_gates, or None if
    there is nothing to do."""
    num_rows, num_nodes, num_heads = g.shape
    if num_rows == 0 or num_nodes == 0 or num_heads == 0:
        return None
    block = min(block, next_power_of_2(num_nodes * num_heads))
    beta_strides = (0, 0, 0) if beta is None else beta.stride()
    raw = A_log is not None
    raw_strides = (A_log.stride(0), dt_bias.stride(0)) if raw else (0, 0)
    scalars = (layer * gates.stride(0), gates.shape[1], num_nodes, num_heads,
               *gates.stride()[1:], *g.stride(), *beta_strides, slots.stride(0), *raw_strides)
    constexprs = dict(HAS_BETA=beta is not None, RAW=raw, BLOCK=block, num_warps=4)
    return KernelCall(_capture_gates_kernel, (num_rows,),
                      _capture_gates_tensors(gates, g, beta, slots, layer, A_log, dt_bias), scalars, constexprs)


def launch_capture_gates(gates, g, beta, slots, layer, A_log=None, dt_bias=None, *, block=1024):
    """gates [L, M, D, G, H]; g, beta [B, N, H] (beta None: a single-gate buffer); any strides.
    With A_log, dt_bias [H]: g, beta are the raw a, b (see _capture_gates_kernel)."""
    call = _capture_gates_call(gates, g, beta, slots, layer, A_log, dt_bias, block=block)
    if call is not None:
        call.launch()


def planned_capture_gates(gates, g, beta, slots, layer, A_log=None, dt_bias=None):
    """launch_capture_gates with its plan fixed for THESE shapes, strides, dtypes, device and
    layer: a function of the same arguments (_common.planned_launch)."""
    launch = planned_launch(_capture_gates_call(gates, g, beta, slots, layer, A_log, dt_bias))

    def run(gates, g, beta, slots, layer, A_log=None, dt_bias=None):
        launch(*_capture_gates_tensors(gates, g, beta, slots, layer, A_log, dt_bias))

    return run
