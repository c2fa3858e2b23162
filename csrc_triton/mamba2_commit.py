"""The replay commit of a Mamba2 layer: each row's accepted path, decoded token by token from its
conv inputs (conv + bias -> SiLU -> x, B; dt from the gates) onto the committed state
``h = exp(dt * A) * h + (dt * x) B^T``, then the accepted conv window (csrc_triton/replay.py says
what all replay commits share).
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

REPLAY_BLOCK_P = 32  # head_dim rows per replay program: a [32, d_state] fp32 tile in one warp
REPLAY_WARPS = 1


def _smem():
    """csrc_triton/mamba2_commit_smem.py, or None (replay.smem_module)."""
    return smem_module("mamba2_commit_smem")


def _smem_signature(ssm, box, head_dim, d_state, block_p, num_warps) -> bool:
    """Whether a commit of this signature replays with its tile in shared memory (given an aligned
    base): float32 states on sm_90+ whose tiles a tensor map can move (mamba2_commit_smem.signature_ok)."""
    module = _smem() if ssm.is_cuda and ssm.dtype == torch.float32 else None
    return module is not None and module.signature_ok(ssm, box, head_dim, d_state, block_p, num_warps,
                                                      module.SMEM_CHUNK)


@triton.jit
def mamba2_token_inputs(tokens_base, gates_base, node, live, x_chan, p_mask, b_chan, n_mask,
                        tokens_stride_node, tokens_stride_dim, gates_stride_node):
    """A path token's conv inputs (the program's x rows, its group's B) and its dt in float32;
    zeros where ``live`` is False (a token past the path's end)."""
    token = tokens_base + node * tokens_stride_node
    # tl.where, not ``mask & live``: Triton's interpreter refuses a vector & scalar mask
    xx = tl.load(token + x_chan * tokens_stride_dim, mask=tl.where(live, p_mask, False), other=0.0).to(tl.float32)
    xb = tl.load(token + b_chan * tokens_stride_dim, mask=tl.where(live, n_mask, False), other=0.0).to(tl.float32)
    dt = tl.load(gates_base + node * gates_stride_node, mask=live, other=0.0).to(tl.float32)
    return xx, xb, dt


@triton.jit
def _mamba2_replay_kernel(
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
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, N_GROUPS: tl.constexpr, D_STATE: tl.constexpr,
    KERNEL_SIZE: tl.constexpr, NODES: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    TREE: tl.constexpr, HAS_BIAS: tl.constexpr, TMA_LOAD: tl.constexpr,
):
    """One program: one (head, block of head_dim rows) of one row and layer. The update is
    elementwise in the state, so the [BLOCK_P, d_state] tile stays in registers over the path and
    blocks need nothing from each other; each program recomputes its group's B. With TMA_LOAD
    the tile comes in through ssm_desc, a tensor descriptor over ssm, as in gdn_commit's kernel
    (else ssm_desc is a placeholder)."""
    P_BLOCKS: tl.constexpr = (HEAD_DIM + BLOCK_P - 1) // BLOCK_P
    head = tl.program_id(0) // P_BLOCKS
    p_block = tl.program_id(0) % P_BLOCKS
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
        group = head // (NUM_HEADS // N_GROUPS)
        pp = p_block * BLOCK_P + tl.arange(0, BLOCK_P)
        nn = tl.arange(0, BLOCK_N)
        p_mask = pp < HEAD_DIM
        n_mask = nn < D_STATE
        x_chan = head * HEAD_DIM + pp  # x, then B, then C
        b_chan = NUM_HEADS * HEAD_DIM + group * D_STATE + nn

        tile_mask = p_mask[:, None] & n_mask[None, :]
        if not TMA_LOAD:
            ssm = (ssm_ptr + layer * ssm_stride_layer + dst * ssm_stride_slot + head * ssm_stride_head
                   + (pp * ssm_stride_p)[:, None] + (nn * ssm_stride_n)[None, :])
            state = tl.load(ssm, mask=tile_mask, other=0.0).to(tl.float32)
        rate = tl.load(a_ptr + layer * a_stride_layer + head * a_stride_head).to(tl.float32)

        conv_base = conv_ptr + layer * conv_stride_layer + dst * conv_stride_slot
        tokens_base = tokens_ptr + layer * tokens_stride_layer + src * tokens_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + src * gates_stride_slot + head * gates_stride_head
        weight_base = weight_ptr + layer * weight_stride_layer
        bias_base = bias_ptr + layer * bias_stride_layer
        # the conv's K-1 previous inputs slide along in registers (x1/b1 the newest); each path
        # token's own inputs are loaded two tokens ahead of their use
        x1, x2, x3, x4 = committed_inputs(conv_base, x_chan, p_mask, conv_stride_dim, conv_stride_win,
                                          KERNEL_SIZE - 1)
        b1, b2, b3, b4 = committed_inputs(conv_base, b_chan, n_mask, conv_stride_dim, conv_stride_win,
                                          KERNEL_SIZE - 1)
        x_bias, x_wx, x_w1, x_w2, x_w3, x_w4 = conv_taps(weight_base, x_chan, p_mask, weight_stride_dim,
                                                         weight_stride_tap, bias_base, bias_stride_dim,
                                                         KERNEL_SIZE, HAS_BIAS)
        b_bias, b_wx, b_w1, b_w2, b_w3, b_w4 = conv_taps(weight_base, b_chan, n_mask, weight_stride_dim,
                                                         weight_stride_tap, bias_base, bias_stride_dim,
                                                         KERNEL_SIZE, HAS_BIAS)
        xx, xb, dt = mamba2_token_inputs(tokens_base, gates_base, path_node(path, length, 0, NODES, TREE), length > 0,
                                         x_chan, p_mask, b_chan, n_mask, tokens_stride_node, tokens_stride_dim,
                                         gates_stride_node)
        xx_next, xb_next, dt_next = mamba2_token_inputs(
            tokens_base, gates_base, path_node(path, length, 1, NODES, TREE), length > 1, x_chan, p_mask, b_chan,
            n_mask, tokens_stride_node, tokens_stride_dim, gates_stride_node)
        if TMA_LOAD:  # the box's parts past head_dim / d_state read as zeros, as the masked load's do
            state = ssm_desc.load([layer32, dst.to(tl.int32), head, p_block * BLOCK_P, 0])
            state = state.reshape(BLOCK_P, BLOCK_N).to(tl.float32)
        for j in range(0, length):
            xx_after, xb_after, dt_after = mamba2_token_inputs(
                tokens_base, gates_base, path_node(path, length, j + 2, NODES, TREE), j + 2 < length, x_chan,
                p_mask, b_chan, n_mask, tokens_stride_node, tokens_stride_dim, gates_stride_node)
            x = conv_silu(xx, x1, x2, x3, x4, x_bias, x_wx, x_w1, x_w2, x_w3, x_w4, KERNEL_SIZE)
            b = conv_silu(xb, b1, b2, b3, b4, b_bias, b_wx, b_w1, b_w2, b_w3, b_w4, KERNEL_SIZE)
            x4, x3, x2, x1 = x3, x2, x1, xx
            b4, b3, b2, b1 = b3, b2, b1, xb
            state = state * tl.exp(dt * rate) + (dt * x)[:, None] * b[None, :]
            xx, xb, dt = xx_next, xb_next, dt_next
            xx_next, xb_next, dt_next = xx_after, xb_after, dt_after
        if TREE or TMA_LOAD:
            # A tree's walk leaves no registers for the tile's store addresses over the path (they
            # spill): reload the slot (volatile, so not merged with the first load) and recompute
            # them; a chain keeps them, or computes them now after a descriptor load.
            if TREE:
                dst = tl.load(dst_slots_ptr + row * dst_slots_stride, volatile=True).to(tl.int64)
            ssm = (ssm_ptr + layer * ssm_stride_layer + dst * ssm_stride_slot + head * ssm_stride_head
                   + (pp * ssm_stride_p)[:, None] + (nn * ssm_stride_n)[None, :])
        tl.store(ssm, state.to(ssm_ptr.dtype.element_ty), mask=tile_mask)


def _mamba2_replay_tensors(ssm, conv, tokens, gates, weight, bias, a, dst_slots, src_slots, steps, parents):
    """The replay kernel's tensor arguments after ssm_desc (placeholders, never read, for no bias
    or a chain)."""
    return (ssm, conv, tokens, gates, weight, weight if bias is None else bias, a,
            dst_slots, src_slots, steps, steps if parents is None else parents)


def _mamba2_replay_call(
    ssm, conv, tokens, gates, weight, bias, a, dst_slots, src_slots, steps, parents,
    *, num_heads, head_dim, n_groups, d_state, block_p=None, num_warps=REPLAY_WARPS, tma=None, smem=None,
    chunk=None,
):
    """The replay kernel's launch for launch_mamba2_commit and planned_mamba2_commit, or None if
    there is nothing to do. tma, smem, chunk: as gdn_commit's (the shared-memory kernel is
    mamba2_commit_smem.py)."""
    num_layers, num_state_slots = ssm.shape[0], ssm.shape[1]
    num_rows, num_nodes = steps.shape[0], tokens.shape[2]
    if num_rows == 0 or num_layers == 0:
        return None
    check_grid("convwin.mamba2_commit", num_rows, num_layers)
    if block_p is None:
        block_p = min(REPLAY_BLOCK_P, next_power_of_2(head_dim))
    block_n = next_power_of_2(d_state)
    box = state_tile_box(ssm, block_p, block_n)
    if smem is None:
        smem = tma is None and not ssm.data_ptr() & 15 and _smem_signature(ssm, box, head_dim, d_state, block_p,
                                                                            num_warps)
    if tma is None:
        tma = descriptor_load(ssm, box, tree=parents is not None) and not smem
    grid = (num_heads * cdiv(head_dim, block_p), num_rows, num_layers)
    scalars = (
        num_state_slots, tokens.shape[1], num_nodes,
        *ssm.stride(), *conv.stride(), *tokens.stride(), *gates.stride(), *weight.stride(),
        *((0, 0) if bias is None else bias.stride()), *a.stride(),
        *index_strides(dst_slots, src_slots, steps, parents),
    )
    constexprs = dict(
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, N_GROUPS=n_groups, D_STATE=d_state,
        KERNEL_SIZE=conv.shape[3] + 1, NODES=next_power_of_2(num_nodes), BLOCK_P=block_p,
        BLOCK_N=block_n, TREE=parents is not None, HAS_BIAS=bias is not None, TMA_LOAD=bool(tma),
        num_warps=num_warps,
    )
    tensors = _mamba2_replay_tensors(ssm, conv, tokens, gates, weight, bias, a, dst_slots, src_slots, steps, parents)
    if smem:
        module, descriptor = _smem(), smem_module("replay_smem").state_descriptor(ssm, box)
        return KernelCall(module._mamba2_replay_smem_kernel, grid, (descriptor, *tensors),
                          scalars, module.kernel_constexprs(constexprs, chunk or module.SMEM_CHUNK))
    return KernelCall(_mamba2_replay_kernel, grid, (state_descriptor(ssm, box) if tma else ssm, *tensors), scalars,
                      constexprs)


def launch_mamba2_commit(
    ssm, conv, tokens, history, gates, weight, bias, a, dst_slots, src_slots, steps, parents,
    *, num_heads, head_dim, n_groups, d_state, block_p=None, num_warps=REPLAY_WARPS, tma=None, smem=None,
    chunk=None,
):
    """Replay every accepted path onto ssm [L, N_state, H, P, Ns], then commit its conv window
    into conv [L, N_state, dim, K-1]. tokens, history: see csrc_triton/replay.py; gates
    [L, M, N, 1, H] (dt, final); weight [L, dim, K]; bias [L, dim] or None; a [L, H] (A = -exp(A_log));
    any strides everywhere. block_p, num_warps, tma, smem, chunk: head_dim rows and warps per
    program, and which kernel and tile load (tuning only; see launch_gdn_commit)."""
    call = _mamba2_replay_call(
        ssm, conv, tokens, gates, weight, bias, a, dst_slots, src_slots, steps, parents,
        num_heads=num_heads, head_dim=head_dim, n_groups=n_groups, d_state=d_state, block_p=block_p,
        num_warps=num_warps, tma=tma, smem=smem, chunk=chunk,
    )
    if call is None:
        return
    call.launch()
    launch_path_window(conv, tokens, history, dst_slots, src_slots, steps, parents)


def planned_mamba2_commit(ssm, conv, tokens, history, gates, weight, bias, a, dst_slots, src_slots, steps,
                          parents, **heads):
    """launch_mamba2_commit with its plan fixed for THESE shapes, strides, dtypes, device and head
    sizes (``heads``: its keyword arguments): a function of the same arguments that launches the
    replay kernel (the shared-memory one where _smem_signature allows it, else the register one with
    its state tiles through a descriptor where replay.planned_state_replay can), then the window
    commit (_common.planned_launch)."""
    call = _mamba2_replay_call(ssm, conv, tokens, gates, weight, bias, a, dst_slots, src_slots, steps, parents,
                               **heads, tma=False)
    box = state_tile_box(ssm, call.constexprs["BLOCK_P"], call.constexprs["BLOCK_N"]) if call else []
    replay = planned_state_replay(call, ssm, box)
    if call is not None and _smem_signature(ssm, box, heads["head_dim"], heads["d_state"], call.constexprs["BLOCK_P"],
                                            call.constexprs["num_warps"]):
        module = _smem()
        replay = planned_smem_replay(call, module._mamba2_replay_smem_kernel,
                                     module.kernel_constexprs(call.constexprs, module.SMEM_CHUNK),
                                     smem_module("replay_smem").descriptor_maker(ssm, box), replay)
    window = planned_path_window(conv, tokens, history, dst_slots, src_slots, steps, parents)

    def run(ssm, conv, tokens, history, gates, weight, bias, a, dst_slots, src_slots, steps, parents, **heads):
        replay(ssm, *_mamba2_replay_tensors(ssm, conv, tokens, gates, weight, bias, a, dst_slots, src_slots, steps,
                                            parents))
        window(conv, tokens, history, dst_slots, src_slots, steps, parents)

    return run
