"""The replay commit of a Gated DeltaNet layer: each row's accepted path, decoded token by token
from its conv inputs (conv -> SiLU -> q, k, v -> l2-normalised k -> gated delta rule) onto the
committed state, then the accepted conv window (csrc_triton/replay.py says what all replay
commits share).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import KernelCall, cdiv, next_power_of_2, row_indices
from .replay import (
    accepted_path, check_grid, committed_inputs, conv_silu, conv_taps, descriptor_load, index_strides,
    launch_path_window, path_node, planned_path_window, planned_smem_replay, planned_state_replay, smem_module,
    state_descriptor, state_tile_box,
)

REPLAY_BLOCK_V = 64  # value columns per replay program: a [dk, 64] fp32 tile over 2 warps
REPLAY_WARPS = 2


def _smem():
    """csrc_triton/gdn_commit_smem.py, or None (replay.smem_module)."""
    return smem_module("gdn_commit_smem")


def _smem_signature(ssm, box, head_k_dim, head_v_dim, block_v, num_warps) -> bool:
    """Whether a commit of this signature replays with its tile in shared memory (given an aligned
    base): float32 states on sm_90+ whose tiles a tensor map can move (gdn_commit_smem.signature_ok)."""
    module = _smem() if ssm.is_cuda and ssm.dtype == torch.float32 else None
    return module is not None and module.signature_ok(ssm, box, head_k_dim, head_v_dim, block_v, num_warps,
                                                      module.SMEM_CHUNK)


@triton.jit
def gdn_token_inputs(tokens_base, gates_base, node, live, k_chan, k_mask, v_chan, v_mask,
                     tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate):
    """A path token's conv inputs (its key head's channels, the program's value columns) and its
    gates (g, beta) in float32; zeros where ``live`` is False (a token past the path's end)."""
    token = tokens_base + node * tokens_stride_node
    # tl.where, not ``mask & live``: Triton's interpreter refuses a vector & scalar mask
    xk = tl.load(token + k_chan * tokens_stride_dim, mask=tl.where(live, k_mask, False), other=0.0).to(tl.float32)
    xv = tl.load(token + v_chan * tokens_stride_dim, mask=tl.where(live, v_mask, False), other=0.0).to(tl.float32)
    gate = gates_base + node * gates_stride_node
    g = tl.load(gate, mask=live, other=0.0).to(tl.float32)
    beta = tl.load(gate + gates_stride_gate, mask=live, other=0.0).to(tl.float32)
    return xk, xv, g, beta


@triton.jit
def delta_rule_step(state, k, v, g, beta, k_mask, L2NORM: tl.constexpr):
    """A [dk, BLOCK_V] float32 state tile after one token (k its key head's, l2-normalised here with
    L2NORM; v the tile's columns): S = S exp(g); u = beta (v - S^T k); S = S + k u^T."""
    k = tl.where(k_mask, k, 0.0)
    if L2NORM:
        k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
    state = state * tl.exp(g)
    u = beta * (v - tl.sum(state * k[:, None], axis=0))
    return state + k[:, None] * u[None, :]


@triton.jit
def _gdn_replay_kernel(
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
    NUM_K_HEADS: tl.constexpr, HEAD_K_DIM: tl.constexpr, NUM_V_HEADS: tl.constexpr, HEAD_V_DIM: tl.constexpr,
    KERNEL_SIZE: tl.constexpr, NODES: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    TREE: tl.constexpr, HAS_BIAS: tl.constexpr, L2NORM: tl.constexpr, TMA_LOAD: tl.constexpr,
):
    """One program: one (value head, block of value columns) of one row and layer. Its state tile
    [dk, BLOCK_V] stays in registers over the whole path: the delta rule updates value columns
    independently, so blocks of them need nothing from each other. With TMA_LOAD the tile comes
    in through ssm_desc (a tensor descriptor over ssm: the copy engine loads it while the path's
    first inputs load, and no per-element addresses live over the path), else through pointers
    (ssm_desc is then a placeholder)."""
    V_BLOCKS: tl.constexpr = (HEAD_V_DIM + BLOCK_V - 1) // BLOCK_V
    head = tl.program_id(0) // V_BLOCKS
    v_block = tl.program_id(0) % V_BLOCKS
    row = tl.program_id(1)
    layer32 = tl.program_id(2)  # (a descriptor's coordinates are int32)
    layer = layer32.to(tl.int64)
    node, dst, src, active = row_indices(
        row, steps_ptr, steps_stride, num_nodes, dst_slots_ptr, dst_slots_stride, num_state_slots,
        src_slots_ptr, src_slots_stride, num_src_slots,
    )
    path, length, links_ok = accepted_path(row, node, parents_ptr, parents_stride_row, parents_stride_node,
                                           num_nodes, NODES, TREE)
    if active & links_ok:
        k_head = head // (NUM_V_HEADS // NUM_K_HEADS)
        kk = tl.arange(0, BLOCK_K)
        vv = v_block * BLOCK_V + tl.arange(0, BLOCK_V)
        k_mask = kk < HEAD_K_DIM
        v_mask = vv < HEAD_V_DIM
        k_chan = NUM_K_HEADS * HEAD_K_DIM + k_head * HEAD_K_DIM + kk  # q, then k, then v
        v_chan = 2 * NUM_K_HEADS * HEAD_K_DIM + head * HEAD_V_DIM + vv

        tile_mask = k_mask[:, None] & v_mask[None, :]
        if not TMA_LOAD:
            ssm = (ssm_ptr + layer * ssm_stride_layer + dst * ssm_stride_slot + head * ssm_stride_head
                   + (kk * ssm_stride_k)[:, None] + (vv * ssm_stride_v)[None, :])
            state = tl.load(ssm, mask=tile_mask, other=0.0).to(tl.float32)

        conv_base = conv_ptr + layer * conv_stride_layer + dst * conv_stride_slot
        tokens_base = tokens_ptr + layer * tokens_stride_layer + src * tokens_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + src * gates_stride_slot + head * gates_stride_head
        weight_base = weight_ptr + layer * weight_stride_layer
        bias_base = bias_ptr + layer * bias_stride_layer
        # The conv's K-1 previous inputs slide along in registers (k1/v1 the newest), so each path
        # token loads only its own input, two tokens ahead of its use: no step of the path waits
        # on memory.
        k1, k2, k3, k4 = committed_inputs(conv_base, k_chan, k_mask, conv_stride_dim, conv_stride_win,
                                          KERNEL_SIZE - 1)
        v1, v2, v3, v4 = committed_inputs(conv_base, v_chan, v_mask, conv_stride_dim, conv_stride_win,
                                          KERNEL_SIZE - 1)
        k_bias, k_wx, k_w1, k_w2, k_w3, k_w4 = conv_taps(weight_base, k_chan, k_mask, weight_stride_dim,
                                                         weight_stride_tap, bias_base, bias_stride_dim,
                                                         KERNEL_SIZE, HAS_BIAS)
        v_bias, v_wx, v_w1, v_w2, v_w3, v_w4 = conv_taps(weight_base, v_chan, v_mask, weight_stride_dim,
                                                         weight_stride_tap, bias_base, bias_stride_dim,
                                                         KERNEL_SIZE, HAS_BIAS)
        xk, xv, g, beta = gdn_token_inputs(
            tokens_base, gates_base, path_node(path, length, 0, NODES, TREE), length > 0, k_chan, k_mask, v_chan,
            v_mask, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)
        xk_next, xv_next, g_next, beta_next = gdn_token_inputs(
            tokens_base, gates_base, path_node(path, length, 1, NODES, TREE), length > 1, k_chan, k_mask, v_chan,
            v_mask, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)
        if TMA_LOAD:  # the box's parts past dk / dv read as zeros, as the masked load's do
            state = ssm_desc.load([layer32, dst.to(tl.int32), head, 0, v_block * BLOCK_V])
            state = state.reshape(BLOCK_K, BLOCK_V).to(tl.float32)
        for j in range(0, length):
            xk_after, xv_after, g_after, beta_after = gdn_token_inputs(
                tokens_base, gates_base, path_node(path, length, j + 2, NODES, TREE), j + 2 < length, k_chan,
                k_mask, v_chan, v_mask, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)
            k = conv_silu(xk, k1, k2, k3, k4, k_bias, k_wx, k_w1, k_w2, k_w3, k_w4, KERNEL_SIZE)
            v = conv_silu(xv, v1, v2, v3, v4, v_bias, v_wx, v_w1, v_w2, v_w3, v_w4, KERNEL_SIZE)
            k4, k3, k2, k1 = k3, k2, k1, xk
            v4, v3, v2, v1 = v3, v2, v1, xv
            state = delta_rule_step(state, k, v, g, beta, k_mask, L2NORM)
            xk, xv, g, beta = xk_next, xv_next, g_next, beta_next
            xk_next, xv_next, g_next, beta_next = xk_after, xv_after, g_after, beta_after
        if TREE or TMA_LOAD:
            # A tree's walk leaves no registers for the tile's store addresses over the path (they
            # spill): reload the slot (volatile, so not merged with the first load) and recompute
            # them; a chain keeps them, or computes them now after a descriptor load.
            if TREE:
                dst = tl.load(dst_slots_ptr + row * dst_slots_stride, volatile=True).to(tl.int64)
            ssm = (ssm_ptr + layer * ssm_stride_layer + dst * ssm_stride_slot + head * ssm_stride_head
                   + (kk * ssm_stride_k)[:, None] + (vv * ssm_stride_v)[None, :])
        tl.store(ssm, state.to(ssm_ptr.dtype.element_ty), mask=tile_mask)


def _gdn_replay_tensors(ssm, conv, tokens, gates, weight, bias, dst_slots, src_slots, steps, parents):
    """The replay kernel's tensor arguments after ssm_desc (placeholders, never read, for no bias or
    a chain)."""
    return (ssm, conv, tokens, gates, weight, weight if bias is None else bias,
            dst_slots, src_slots, steps, steps if parents is None else parents)


def _gdn_replay_call(
    ssm, conv, tokens, gates, weight, bias, dst_slots, src_slots, steps, parents,
    *, num_k_heads, head_k_dim, num_v_heads, head_v_dim, use_qk_l2norm, block_v=None, num_warps=REPLAY_WARPS,
    tma=None, smem=None, chunk=None,
):
    """The replay kernel's launch for launch_gdn_commit and planned_gdn_commit, or None if there
    is nothing to do. smem: replay with the tile in shared memory (gdn_commit_smem.py; None: where
    _smem_signature allows it and ssm is 16-byte aligned, unless ``tma`` asks for the register
    kernel); tma: that kernel's state tiles through a tensor descriptor (None: replay.descriptor_load
    decides); chunk: the shared-memory kernel's rows per pass."""
    num_layers, num_state_slots = ssm.shape[0], ssm.shape[1]
    num_rows, num_nodes = steps.shape[0], tokens.shape[2]
    if num_rows == 0 or num_layers == 0:
        return None
    check_grid("convwin.gdn_commit", num_rows, num_layers)
    if block_v is None:
        block_v = min(REPLAY_BLOCK_V, next_power_of_2(head_v_dim))
    block_k = next_power_of_2(head_k_dim)
    box = state_tile_box(ssm, block_k, block_v)
    if smem is None:
        smem = tma is None and not ssm.data_ptr() & 15 and _smem_signature(ssm, box, head_k_dim, head_v_dim, block_v,
                                                                            num_warps)
    if tma is None:
        tma = descriptor_load(ssm, box, tree=parents is not None) and not smem
    grid = (num_v_heads * cdiv(head_v_dim, block_v), num_rows, num_layers)
    scalars = (
        num_state_slots, tokens.shape[1], num_nodes,
        *ssm.stride(), *conv.stride(), *tokens.stride(), *gates.stride(), *weight.stride(),
        *((0, 0) if bias is None else bias.stride()),
        *index_strides(dst_slots, src_slots, steps, parents),
    )
    constexprs = dict(
        NUM_K_HEADS=num_k_heads, HEAD_K_DIM=head_k_dim, NUM_V_HEADS=num_v_heads, HEAD_V_DIM=head_v_dim,
        KERNEL_SIZE=conv.shape[3] + 1, NODES=next_power_of_2(num_nodes), BLOCK_K=block_k,
        BLOCK_V=block_v, TREE=parents is not None, HAS_BIAS=bias is not None, L2NORM=use_qk_l2norm,
        TMA_LOAD=bool(tma), num_warps=num_warps,
    )
    tensors = _gdn_replay_tensors(ssm, conv, tokens, gates, weight, bias, dst_slots, src_slots, steps, parents)
    if smem:
        module, descriptor = _smem(), smem_module("replay_smem").state_descriptor(ssm, box)
        return KernelCall(module._gdn_replay_smem_kernel, grid, (descriptor, *tensors),
                          scalars, module.kernel_constexprs(constexprs, chunk or module.SMEM_CHUNK))
    return KernelCall(_gdn_replay_kernel, grid, (state_descriptor(ssm, box) if tma else ssm, *tensors), scalars,
                      constexprs)


def launch_gdn_commit(
    ssm, conv, tokens, history, gates, weight, bias, dst_slots, src_slots, steps, parents,
    *, num_k_heads, head_k_dim, num_v_heads, head_v_dim, use_qk_l2norm, block_v=None, num_warps=REPLAY_WARPS,
    tma=None, smem=None, chunk=None,
):
    """Replay every accepted path onto ssm [L, N_state, Hv, dk, dv], then commit its conv window
    into conv [L, N_state, dim, K-1]. tokens, history: see the module docstring; gates
    [L, M, N, 2, Hv]; weight [L, dim, K]; bias [L, dim] or None; any strides everywhere.
    block_v, num_warps, tma, smem, chunk: value columns and warps per replay program, and which
    kernel and tile load (_gdn_replay_call; tuning only: tma=True needs what
    replay.tma_signature_ok checks and a 16-byte aligned ssm, smem=True what _smem_signature checks
    too)."""
    call = _gdn_replay_call(
        ssm, conv, tokens, gates, weight, bias, dst_slots, src_slots, steps, parents,
        num_k_heads=num_k_heads, head_k_dim=head_k_dim, num_v_heads=num_v_heads, head_v_dim=head_v_dim,
        use_qk_l2norm=use_qk_l2norm, block_v=block_v, num_warps=num_warps, tma=tma, smem=smem, chunk=chunk,
    )
    if call is None:
        return
    call.launch()
    launch_path_window(conv, tokens, history, dst_slots, src_slots, steps, parents)


def planned_gdn_commit(ssm, conv, tokens, history, gates, weight, bias, dst_slots, src_slots, steps, parents,
                       **heads):
    """launch_gdn_commit with its plan fixed for THESE shapes, strides, dtypes, device and head
    sizes (``heads``: its keyword arguments): a function of the same arguments that launches the
    replay kernel (the shared-memory one where _smem_signature allows it, else the register one with
    its state tiles through a descriptor where replay.planned_state_replay can), then the window
    commit (_common.planned_launch)."""
    call = _gdn_replay_call(ssm, conv, tokens, gates, weight, bias, dst_slots, src_slots, steps, parents,
                            **heads, tma=False)
    box = state_tile_box(ssm, call.constexprs["BLOCK_K"], call.constexprs["BLOCK_V"]) if call else []
    replay = planned_state_replay(call, ssm, box)
    if call is not None and _smem_signature(ssm, box, heads["head_k_dim"], heads["head_v_dim"],
                                            call.constexprs["BLOCK_V"], call.constexprs["num_warps"]):
        module = _smem()
        replay = planned_smem_replay(call, module._gdn_replay_smem_kernel,
                                     module.kernel_constexprs(call.constexprs, module.SMEM_CHUNK),
                                     smem_module("replay_smem").descriptor_maker(ssm, box), replay)
    window = planned_path_window(conv, tokens, history, dst_slots, src_slots, steps, parents)

    def run(ssm, conv, tokens, history, gates, weight, bias, dst_slots, src_slots, steps, parents, **heads):
        replay(ssm, *_gdn_replay_tensors(ssm, conv, tokens, gates, weight, bias, dst_slots, src_slots, steps,
                                         parents))
        window(conv, tokens, history, dst_slots, src_slots, steps, parents)

    return run

