"""Where gdn_commit's replay kernel loses to an in-place state copy: the production kernel against
a copy of it with parts switched off (the l2 norm; the conv; the token inputs), each timed alone
(no window launch) on the same tensors, with its registers and spills.

    python benchmarks/explore/replay_ablate.py [--batches 64 256] [--accepted N] [--tma on off]

Shapes as replay_sweep.py (Qwen3-Next TP1, fp32 state, bf16 conv inputs).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl
import triton.testing

from sgl_convwin._kernels import triton_kernels

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from replay_sweep import copy_ceiling_gbps, problem  # noqa: E402

kernels = triton_kernels()
replay = kernels.replay
gdn = kernels.gdn_commit
row_indices = kernels._common.row_indices
accepted_path, path_node, committed_inputs = replay.accepted_path, replay.path_node, replay.committed_inputs
conv_taps, conv_silu, gdn_token_inputs = replay.conv_taps, replay.conv_silu, gdn.gdn_token_inputs


@triton.jit
def _gdn_replay_ablated_kernel(
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
    CONV: tl.constexpr, INPUTS: tl.constexpr, UNROLL: tl.constexpr, RECOMPUTE: tl.constexpr,
):
    """The production kernel (chains) with parts switched off: CONV=False takes each token's input
    as its k, v (no committed inputs, weights or SiLU); INPUTS=False also loads no token input
    (k, v are constants: what is left is the state tile, the gates and the delta rule). UNROLL
    walks the path in a static loop of NODES tokens, each behind a branch on the path's length."""
    V_BLOCKS: tl.constexpr = (HEAD_V_DIM + BLOCK_V - 1) // BLOCK_V
    head = tl.program_id(0) // V_BLOCKS
    v_block = tl.program_id(0) % V_BLOCKS
    row = tl.program_id(1)
    layer32 = tl.program_id(2)
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
        k_chan = NUM_K_HEADS * HEAD_K_DIM + k_head * HEAD_K_DIM + kk
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
        if CONV:
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
        if not INPUTS:
            xk = tl.where(k_mask, 0.088, 0.0)
            xv = tl.where(v_mask, 0.5, 0.0)
        if TMA_LOAD:
            state = ssm_desc.load([layer32, dst.to(tl.int32), head, 0, v_block * BLOCK_V])
            state = state.reshape(BLOCK_K, BLOCK_V).to(tl.float32)
        if UNROLL:
            # the path unrolled: each token's prefetched inputs are values of their own, no
            # loop-carried registers to move (a move waits for its load)
            for p in tl.static_range(NODES):
                xk_after, xv_after, g_after, beta_after = gdn_token_inputs(
                    tokens_base, gates_base, path_node(path, length, p + 2, NODES, TREE), p + 2 < length, k_chan,
                    k_mask, v_chan, v_mask, tokens_stride_node, tokens_stride_dim, gates_stride_node,
                    gates_stride_gate)
                if p < length:
                    if CONV:
                        k = conv_silu(xk, k1, k2, k3, k4, k_bias, k_wx, k_w1, k_w2, k_w3, k_w4, KERNEL_SIZE)
                        v = conv_silu(xv, v1, v2, v3, v4, v_bias, v_wx, v_w1, v_w2, v_w3, v_w4, KERNEL_SIZE)
                        k4, k3, k2, k1 = k3, k2, k1, xk
                        v4, v3, v2, v1 = v3, v2, v1, xv
                    else:
                        k = xk
                        v = xv
                    k = tl.where(k_mask, k, 0.0)
                    if L2NORM:
                        k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
                    state = state * tl.exp(g)
                    u = beta * (v - tl.sum(state * k[:, None], axis=0))
                    state = state + k[:, None] * u[None, :]
                xk, xv, g, beta = xk_next, xv_next, g_next, beta_next
                xk_next, xv_next, g_next, beta_next = xk_after, xv_after, g_after, beta_after
        else:
            for j in range(0, length):
                xk_after, xv_after, g_after, beta_after = gdn_token_inputs(
                    tokens_base, gates_base, path_node(path, length, j + 2, NODES, TREE), j + 2 < length, k_chan,
                    k_mask, v_chan, v_mask, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)
                if CONV:
                    k = conv_silu(xk, k1, k2, k3, k4, k_bias, k_wx, k_w1, k_w2, k_w3, k_w4, KERNEL_SIZE)
                    v = conv_silu(xv, v1, v2, v3, v4, v_bias, v_wx, v_w1, v_w2, v_w3, v_w4, KERNEL_SIZE)
                    k4, k3, k2, k1 = k3, k2, k1, xk
                    v4, v3, v2, v1 = v3, v2, v1, xv
                else:
                    k = xk
                    v = xv
                k = tl.where(k_mask, k, 0.0)
                if L2NORM:
                    k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
                state = state * tl.exp(g)
                u = beta * (v - tl.sum(state * k[:, None], axis=0))
                state = state + k[:, None] * u[None, :]
                if INPUTS:
                    xk, xv = xk_next, xv_next
                    xk_next, xv_next = xk_after, xv_after
                g, beta = g_next, beta_next
                g_next, beta_next = g_after, beta_after
        if TMA_LOAD or RECOMPUTE:
            if RECOMPUTE:  # (volatile: not merged with the first load, so no address lives over the path)
                dst = tl.load(dst_slots_ptr + row * dst_slots_stride, volatile=True).to(tl.int64)
            ssm = (ssm_ptr + layer * ssm_stride_layer + dst * ssm_stride_slot + head * ssm_stride_head
                   + (kk * ssm_stride_k)[:, None] + (vv * ssm_stride_v)[None, :])
        tl.store(ssm, state.to(ssm_ptr.dtype.element_ty), mask=tile_mask)


VARIANTS = {  # name: (the ablated kernel's switches, or None for the production kernel)
    "production": None,
    "copy of it": dict(CONV=True, INPUTS=True, UNROLL=False),
    "no l2 norm": dict(CONV=True, INPUTS=True, L2NORM=False, UNROLL=False),
    "no conv": dict(CONV=False, INPUTS=True, UNROLL=False),
    "no conv, no inputs": dict(CONV=False, INPUTS=False, UNROLL=False),
    "unrolled": dict(CONV=True, INPUTS=True, UNROLL=True),
    "unrolled, no l2 norm": dict(CONV=True, INPUTS=True, L2NORM=False, UNROLL=True),
}


def replay_call(a, kw, tma, switches):
    ssm, conv, tokens, history, gates, weight, bias, dst_slots, src_slots, steps, parents = a
    call = gdn._gdn_replay_call(ssm, conv, tokens, gates, weight, bias, dst_slots, src_slots, steps, parents,
                                **kw, tma=tma)
    if switches is not None:
        call = call._replace(kernel=_gdn_replay_ablated_kernel, constexprs=dict(call.constexprs, **switches))
    return call


def run(call):
    return call.kernel[call.grid](*call.tensors, *call.scalars, **call.constexprs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--draft", type=int, default=4)
    parser.add_argument("--accepted", type=int, default=None)
    parser.add_argument("--tma", nargs="+", choices=["on", "off"], default=["on", "off"])
    args = parser.parse_args()
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s; the replay kernel alone (no window launch), chain", flush=True)
    for batch in args.batches:
        gen = torch.Generator(device="cuda").manual_seed(batch)
        op, launch, tensors, kwargs, layers, dim, state_numel, heads, _ = problem("gdn", batch, args.draft, gen)
        slots = torch.arange(batch, device="cuda")
        steps = torch.randint(0, args.draft, (batch,), device="cuda", generator=gen)
        if args.accepted is not None:
            steps.fill_(args.accepted - 1)
        a, kw = op.kernel_arguments(*tensors, slots, slots, steps, None, layout="token_major", **kwargs)
        nbytes = 2 * layers * batch * state_numel * 4
        print(f"\nB={batch}: state bytes {nbytes / 1e6:.0f} MB = {nbytes / ceiling / 1e3:.0f} us at the ceiling",
              flush=True)
        ms = triton.testing.do_bench(lambda: a[0].mul_(1.0), warmup=25, rep=150)
        print(f"{'ssm.mul_(1)':>28} {'':>11} {ms * 1e3:9.1f} us {100 * nbytes / (ms * 1e-3) / 1e9 / ceiling:4.0f}%")
        window = lambda: replay.launch_path_window(a[1], a[2], a[3], *a[7:])  # noqa: E731
        ms = triton.testing.do_bench(window, warmup=25, rep=150)
        print(f"{'window launch alone':>28} {'':>11} {ms * 1e3:9.1f} us")
        for tma in args.tma:
            for name, switches in VARIANTS.items():
                call = replay_call(a, kw, tma == "on", switches)
                compiled = run(call)
                ms = triton.testing.do_bench(lambda: run(call), warmup=25, rep=150)
                label = f"{name} tma={tma}"
                print(f"{label:>28} {compiled.n_regs:>4} regs {compiled.n_spills:>3} spills {ms * 1e3:9.1f} us "
                      f"{100 * nbytes / (ms * 1e-3) / 1e9 / ceiling:4.0f}%", flush=True)
        del tensors, a, kw
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
