"""Replay-commit kernels of a Gated DeltaNet layer: the accepted path's recurrence, replayed from
the conv-input buffer onto the committed state, and the accepted conv window.

Every kernel here sees the buffer through two layout-free views (sgl_convwin.ops_replay builds
them): ``tokens [L, M, N, dim]`` (node n's conv input) and ``history [L, M, N, dim, K-2]`` (the
K-2 newest committed inputs, oldest first, as the window of node n holds them: token_major and
channel_major buffers store them once, so their node stride is 0; a dense buffer's windows hold
them per node). Indices are never trusted: a row whose step (node), destination or source slot is
out of range, or whose accepted path meets a parent link outside [-1, n-1], is skipped whole.

Two launches, in this order, because token 0's conv needs all K-1 committed inputs and only
conv_state holds the oldest: ``_gdn_replay_kernel`` reads conv_state and writes ssm_state,
``_path_window_kernel`` then overwrites conv_state (from the buffer alone).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import MAX_GRID_Y, cdiv, next_power_of_2, row_indices

REPLAY_BLOCK_V = 64  # value columns per replay program: a [dk, 64] fp32 tile over 2 warps
REPLAY_WARPS = 2
WINDOW_BLOCK = 1024  # channels per program of the window commit


@triton.jit
def accepted_path(
    row, node, parents_ptr, parents_stride_row, parents_stride_node,
    NODES: tl.constexpr, TREE: tl.constexpr,
):
    """The accepted path of one row, root first: (path [NODES] node indices, length, links_ok).

    Chain: nodes 0 .. node. Tree: node, its parent, ... up to the node whose parent is -1,
    reversed; links_ok is False if a link on the way lies outside [-1, n-1]."""
    index = tl.arange(0, NODES)
    if TREE:
        parents_row = parents_ptr + row.to(tl.int64) * parents_stride_row
        up = tl.zeros([NODES], dtype=tl.int64)  # up[i]: the i-th node walking up from ``node``
        current = node
        length = node * 0
        links_ok = node >= 0
        for i in tl.static_range(NODES):
            live = current >= 0
            up = tl.where((index == i) & live, current, up)
            parent = tl.load(parents_row + current * parents_stride_node, mask=live, other=-1).to(tl.int64)
            bad = live & ((parent < -1) | (parent >= current))
            links_ok &= ~bad
            length += live.to(tl.int64)
            current = tl.where(live & ~bad, parent, -1)
        # reverse: path[j] = up[length - 1 - j]
        flipped = length - 1 - index
        path = tl.zeros([NODES], dtype=tl.int64)
        for i in tl.static_range(NODES):
            take = tl.sum(tl.where(index == i, up, 0))
            path = tl.where(flipped == i, take, path)
        return path, length, links_ok
    else:
        return index.to(tl.int64), node + 1, node >= 0


@triton.jit
def _nth(path, j, NODES: tl.constexpr, TREE: tl.constexpr):
    """path[j] as a scalar (a vector element cannot be indexed directly; a chain's path is 0..)."""
    if TREE:
        return tl.sum(tl.where(tl.arange(0, NODES) == j, path, 0))
    else:
        return j


@triton.jit
def _committed(conv_base, chan, cmask, conv_stride_dim, conv_stride_win, back: tl.constexpr,
               WIDTH: tl.constexpr):
    """The committed input ``back`` steps before the first path token (1 = the newest), float32;
    zeros past the K-1 that conv_state holds (those taps do not exist)."""
    if back <= WIDTH:
        return tl.load(conv_base + chan * conv_stride_dim + (WIDTH - back) * conv_stride_win,
                       mask=cmask, other=0.0).to(tl.float32)
    else:
        return tl.zeros(chan.shape, dtype=tl.float32)


@triton.jit
def _conv_silu(x, back1, back2, back3, back4, chan, cmask, weight_base, weight_stride_dim, weight_stride_tap,
               bias_base, bias_stride, KERNEL_SIZE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """silu(bias + sum_k w[:, k] * input k) in float32 for input x and the K-1 before it
    (back1 the newest). The fma order (bias, then the taps from the newest input up) is the verify
    kernel's, so both give the same bits for the same inputs."""
    WIDTH: tl.constexpr = KERNEL_SIZE - 1
    if HAS_BIAS:
        acc = tl.load(bias_base + chan * bias_stride, mask=cmask).to(tl.float32)
    else:
        acc = tl.zeros(chan.shape, dtype=tl.float32)
    taps = weight_base + chan * weight_stride_dim
    acc = tl.fma(tl.load(taps + WIDTH * weight_stride_tap, mask=cmask).to(tl.float32), x, acc)
    acc = tl.fma(tl.load(taps + (WIDTH - 1) * weight_stride_tap, mask=cmask).to(tl.float32), back1, acc)
    if KERNEL_SIZE > 2:
        acc = tl.fma(tl.load(taps + (WIDTH - 2) * weight_stride_tap, mask=cmask).to(tl.float32), back2, acc)
    if KERNEL_SIZE > 3:
        acc = tl.fma(tl.load(taps + (WIDTH - 3) * weight_stride_tap, mask=cmask).to(tl.float32), back3, acc)
    if KERNEL_SIZE > 4:
        acc = tl.fma(tl.load(taps + (WIDTH - 4) * weight_stride_tap, mask=cmask).to(tl.float32), back4, acc)
    return acc * tl.sigmoid(acc)


@triton.jit
def _gdn_replay_kernel(
    ssm_ptr, conv_ptr, tokens_ptr, gates_ptr, weight_ptr, bias_ptr,
    dst_slots_ptr, src_slots_ptr, steps_ptr, parents_ptr,
    num_state_slots, num_src_slots, num_nodes,
    ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_k, ssm_stride_v,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    tokens_stride_layer, tokens_stride_slot, tokens_stride_node, tokens_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_node, gates_stride_gate, gates_stride_head,
    weight_stride_layer, weight_stride_dim, weight_stride_tap,
    bias_stride_layer, bias_stride_dim,
    dst_slots_stride, src_slots_stride, steps_stride, parents_stride_row, parents_stride_node,
    NUM_K_HEADS: tl.constexpr, HEAD_K_DIM: tl.constexpr, NUM_V_HEADS: tl.constexpr, HEAD_V_DIM: tl.constexpr,
    KERNEL_SIZE: tl.constexpr, NODES: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    TREE: tl.constexpr, HAS_BIAS: tl.constexpr, L2NORM: tl.constexpr,
):
    """One program: one (value head, block of value columns) of one row and layer. Its state tile
    [dk, BLOCK_V] stays in registers over the whole path: the delta rule updates value columns
    independently, so blocks of them need nothing from each other."""
    V_BLOCKS: tl.constexpr = (HEAD_V_DIM + BLOCK_V - 1) // BLOCK_V
    head = tl.program_id(0) // V_BLOCKS
    v_block = tl.program_id(0) % V_BLOCKS
    row = tl.program_id(1)
    layer = tl.program_id(2).to(tl.int64)
    node, dst, src, active = row_indices(
        row, steps_ptr, steps_stride, num_nodes, dst_slots_ptr, dst_slots_stride, num_state_slots,
        src_slots_ptr, src_slots_stride, num_src_slots,
    )
    path, length, links_ok = accepted_path(row, node, parents_ptr, parents_stride_row, parents_stride_node,
                                           NODES, TREE)
    if active & links_ok:
        k_head = head // (NUM_V_HEADS // NUM_K_HEADS)
        kk = tl.arange(0, BLOCK_K)
        vv = v_block * BLOCK_V + tl.arange(0, BLOCK_V)
        k_mask = kk < HEAD_K_DIM
        v_mask = vv < HEAD_V_DIM
        k_chan = NUM_K_HEADS * HEAD_K_DIM + k_head * HEAD_K_DIM + kk  # q, then k, then v
        v_chan = 2 * NUM_K_HEADS * HEAD_K_DIM + head * HEAD_V_DIM + vv

        ssm = (ssm_ptr + layer * ssm_stride_layer + dst * ssm_stride_slot + head * ssm_stride_head
               + (kk * ssm_stride_k)[:, None] + (vv * ssm_stride_v)[None, :])
        tile_mask = k_mask[:, None] & v_mask[None, :]
        state = tl.load(ssm, mask=tile_mask, other=0.0).to(tl.float32)

        conv_base = conv_ptr + layer * conv_stride_layer + dst * conv_stride_slot
        tokens_base = tokens_ptr + layer * tokens_stride_layer + src * tokens_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + src * gates_stride_slot + head * gates_stride_head
        weight_base = weight_ptr + layer * weight_stride_layer
        bias_base = bias_ptr + layer * bias_stride_layer
        # The conv's K-1 previous inputs slide along in registers (k1/v1 the newest), so each path
        # token loads only its own input. (Loading the state before the path walk gained nothing.)
        k1 = _committed(conv_base, k_chan, k_mask, conv_stride_dim, conv_stride_win, 1, KERNEL_SIZE - 1)
        k2 = _committed(conv_base, k_chan, k_mask, conv_stride_dim, conv_stride_win, 2, KERNEL_SIZE - 1)
        k3 = _committed(conv_base, k_chan, k_mask, conv_stride_dim, conv_stride_win, 3, KERNEL_SIZE - 1)
        k4 = _committed(conv_base, k_chan, k_mask, conv_stride_dim, conv_stride_win, 4, KERNEL_SIZE - 1)
        v1 = _committed(conv_base, v_chan, v_mask, conv_stride_dim, conv_stride_win, 1, KERNEL_SIZE - 1)
        v2 = _committed(conv_base, v_chan, v_mask, conv_stride_dim, conv_stride_win, 2, KERNEL_SIZE - 1)
        v3 = _committed(conv_base, v_chan, v_mask, conv_stride_dim, conv_stride_win, 3, KERNEL_SIZE - 1)
        v4 = _committed(conv_base, v_chan, v_mask, conv_stride_dim, conv_stride_win, 4, KERNEL_SIZE - 1)
        for j in range(0, length):
            path_node = _nth(path, j, NODES, TREE)
            token = tokens_base + path_node * tokens_stride_node
            xk = tl.load(token + k_chan * tokens_stride_dim, mask=k_mask, other=0.0).to(tl.float32)
            xv = tl.load(token + v_chan * tokens_stride_dim, mask=v_mask, other=0.0).to(tl.float32)
            k = _conv_silu(xk, k1, k2, k3, k4, k_chan, k_mask, weight_base, weight_stride_dim, weight_stride_tap,
                           bias_base, bias_stride_dim, KERNEL_SIZE, HAS_BIAS)
            v = _conv_silu(xv, v1, v2, v3, v4, v_chan, v_mask, weight_base, weight_stride_dim, weight_stride_tap,
                           bias_base, bias_stride_dim, KERNEL_SIZE, HAS_BIAS)
            k4, k3, k2, k1 = k3, k2, k1, xk
            v4, v3, v2, v1 = v3, v2, v1, xv
            k = tl.where(k_mask, k, 0.0)
            if L2NORM:
                k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
            gate = gates_base + path_node * gates_stride_node
            g = tl.load(gate).to(tl.float32)
            beta = tl.load(gate + gates_stride_gate).to(tl.float32)
            state = state * tl.exp(g)
            u = beta * (v - tl.sum(state * k[:, None], axis=0))
            state = state + k[:, None] * u[None, :]
        tl.store(ssm, state.to(ssm_ptr.dtype.element_ty), mask=tile_mask)


@triton.jit
def _path_window_kernel(
    conv_ptr, tokens_ptr, history_ptr, dst_slots_ptr, src_slots_ptr, steps_ptr, parents_ptr,
    num_state_slots, num_src_slots, num_nodes, dim,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    tokens_stride_layer, tokens_stride_slot, tokens_stride_node, tokens_stride_dim,
    history_stride_layer, history_stride_slot, history_stride_node, history_stride_dim, history_stride_col,
    dst_slots_stride, src_slots_stride, steps_stride, parents_stride_row, parents_stride_node,
    KERNEL_SIZE: tl.constexpr, NODES: tl.constexpr, BLOCK: tl.constexpr, TREE: tl.constexpr,
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
                                           NODES, TREE)
    if active & links_ok:
        chan = block * BLOCK + tl.arange(0, BLOCK)
        cmask = chan < dim
        root = _nth(path, 0, NODES, TREE)
        tokens_base = tokens_ptr + layer * tokens_stride_layer + src * tokens_stride_slot
        history_base = (history_ptr + layer * history_stride_layer + src * history_stride_slot
                        + root * history_stride_node)
        conv_base = conv_ptr + layer * conv_stride_layer + dst * conv_stride_slot
        for column in tl.static_range(WIDTH):
            position = length - WIDTH + column  # on the path; < 0: history column WIDTH-1+position
            is_token = (chan * 0 + position) >= 0
            node_here = _nth(path, tl.maximum(position, 0), NODES, TREE)
            from_token = tl.load(tokens_base + node_here * tokens_stride_node + chan * tokens_stride_dim,
                                 mask=cmask & is_token)
            history_column = tl.maximum(WIDTH - 1 + position, 0)
            from_history = tl.load(history_base + chan * history_stride_dim + history_column * history_stride_col,
                                   mask=cmask & ~is_token)
            value = tl.where(is_token, from_token, from_history)
            tl.store(conv_base + chan * conv_stride_dim + column * conv_stride_win,
                     value.to(conv_ptr.dtype.element_ty), mask=cmask)


def _index_strides(dst_slots, src_slots, steps, parents):
    parents_strides = (0, 0) if parents is None else parents.stride()
    return (dst_slots.stride(0), src_slots.stride(0), steps.stride(0), *parents_strides)


def _check_grid(op: str, num_rows: int, num_layers: int) -> None:
    if num_layers > MAX_GRID_Y:
        raise ValueError(f"{op} supports at most {MAX_GRID_Y} layers, got {num_layers}")
    if num_rows > MAX_GRID_Y:
        raise ValueError(f"{op} commits at most {MAX_GRID_Y} rows per call, got {num_rows}; split the batch")


def launch_path_window(conv, tokens, history, dst_slots, src_slots, steps, parents, *, block=WINDOW_BLOCK):
    """conv [L, N_state, dim, K-1], tokens [L, M, N, dim], history [L, M, N, dim, K-2]; any strides."""
    num_layers, num_state_slots, dim, width = conv.shape
    num_rows = steps.shape[0]
    if num_rows == 0 or num_layers == 0 or dim == 0:
        return
    _check_grid("convwin window commit", num_rows, num_layers)
    block = min(block, next_power_of_2(dim))
    history_strides = history.stride() if history.shape[-1] > 0 else (0,) * 5
    grid = (cdiv(dim, block), num_rows, num_layers)
    _path_window_kernel[grid](
        conv, tokens, history, dst_slots, src_slots, steps, steps if parents is None else parents,
        num_state_slots, tokens.shape[1], tokens.shape[2], dim,
        *conv.stride(), *tokens.stride(), *history_strides,
        *_index_strides(dst_slots, src_slots, steps, parents),
        KERNEL_SIZE=width + 1, NODES=next_power_of_2(tokens.shape[2]), BLOCK=block, TREE=parents is not None,
        num_warps=4,
    )


def launch_gdn_commit(
    ssm, conv, tokens, history, gates, weight, bias, dst_slots, src_slots, steps, parents,
    *, num_k_heads, head_k_dim, num_v_heads, head_v_dim, use_qk_l2norm, block_v=None, num_warps=REPLAY_WARPS,
):
    """Replay every accepted path onto ssm [L, N_state, Hv, dk, dv], then commit its conv window
    into conv [L, N_state, dim, K-1]. tokens, history: see the module docstring; gates
    [L, M, N, 2, Hv]; weight [L, dim, K]; bias [L, dim] or None; any strides everywhere.
    block_v, num_warps: value columns and warps per replay program (tuning only)."""
    num_layers, num_state_slots = ssm.shape[0], ssm.shape[1]
    num_rows, num_nodes = steps.shape[0], tokens.shape[2]
    if num_rows == 0 or num_layers == 0:
        return
    _check_grid("convwin.gdn_commit", num_rows, num_layers)
    if block_v is None:
        block_v = min(REPLAY_BLOCK_V, next_power_of_2(head_v_dim))
    v_blocks = cdiv(head_v_dim, block_v)
    width = conv.shape[3]
    index_strides = _index_strides(dst_slots, src_slots, steps, parents)
    _gdn_replay_kernel[(num_v_heads * v_blocks, num_rows, num_layers)](
        ssm, conv, tokens, gates, weight, weight if bias is None else bias,
        dst_slots, src_slots, steps, steps if parents is None else parents,
        num_state_slots, tokens.shape[1], num_nodes,
        *ssm.stride(), *conv.stride(), *tokens.stride(), *gates.stride(), *weight.stride(),
        *((0, 0) if bias is None else bias.stride()),
        *index_strides,
        NUM_K_HEADS=num_k_heads, HEAD_K_DIM=head_k_dim, NUM_V_HEADS=num_v_heads, HEAD_V_DIM=head_v_dim,
        KERNEL_SIZE=width + 1, NODES=next_power_of_2(num_nodes), BLOCK_K=next_power_of_2(head_k_dim),
        BLOCK_V=block_v, TREE=parents is not None, HAS_BIAS=bias is not None, L2NORM=use_qk_l2norm,
        num_warps=num_warps,
    )
    launch_path_window(conv, tokens, history, dst_slots, src_slots, steps, parents)


@triton.jit
def _capture_gates_kernel(
    gates_ptr, g_ptr, beta_ptr, slots_ptr, gates_layer_offset, num_slots, num_nodes, num_heads,
    gates_stride_slot, gates_stride_node, gates_stride_gate, gates_stride_head,
    g_stride_row, g_stride_node, g_stride_head,
    beta_stride_row, beta_stride_node, beta_stride_head, slots_stride,
    HAS_BETA: tl.constexpr, BLOCK: tl.constexpr,
):
    """gates[layer, slots[row], n] = (g[row, n], beta[row, n]) for every node n: grid (B,)."""
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
            tl.store(dest, g.to(gates_ptr.dtype.element_ty), mask=mask)
            if HAS_BETA:
                beta = tl.load(beta_ptr + row * beta_stride_row + n * beta_stride_node + h * beta_stride_head,
                               mask=mask)
                tl.store(dest + gates_stride_gate, beta.to(gates_ptr.dtype.element_ty), mask=mask)


def launch_capture_gates(gates, g, beta, slots, layer, *, block=1024):
    """gates [L, M, D, G, H]; g, beta [B, N, H] (beta None: a single-gate buffer); any strides."""
    num_rows, num_nodes, num_heads = g.shape
    if num_rows == 0 or num_nodes == 0 or num_heads == 0:
        return
    block = min(block, next_power_of_2(num_nodes * num_heads))
    beta_strides = (0, 0, 0) if beta is None else beta.stride()
    _capture_gates_kernel[(num_rows,)](
        gates, g, g if beta is None else beta, slots, layer * gates.stride(0), gates.shape[1], num_nodes, num_heads,
        *gates.stride()[1:], *g.stride(), *beta_strides, slots.stride(0),
        HAS_BETA=beta is not None, BLOCK=block, num_warps=4,
    )
