"""Streaming replay kernels, measured against the package's: one program per (row, layer, heads)
walks its heads' state in chunks through a software-pipelined loop (the next chunks' loads in
flight while this one replays), instead of one register-resident tile per program.

Both recurrences are independent per state column (GDN: per value column; Mamba2: per element),
so a chunk needs only the path's per-token vectors. The path is unrolled to NODES tokens so the
loop has no inner loop (Triton pipelines innermost loops only); a token past the path's end is an
exact no-op (decay exp(0) = 1, an update of -0.0).

    python benchmarks/explore/replay_stream.py [--mixer gdn|mamba2] [--tree] [--batches 8 64 256]
        [--configs BLOCK/WARPS/HEADS/STAGES ...]

Each variant's state is checked against the package kernel's (allclose) before it is timed.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
import triton.testing

from sgl_convwin._kernels import triton_kernels

triton_kernels()  # (registers sgl_convwin.csrc_triton, installed or in the checkout)
from sgl_convwin.csrc_triton._common import next_power_of_2, row_indices  # noqa: E402
from sgl_convwin.csrc_triton.replay import (  # noqa: E402
    accepted_path, committed_inputs, conv_silu, conv_taps, index_strides, launch_path_window, path_node,
    state_descriptor, state_tile_box,
)


@triton.jit
def _path_rows(tokens_base, chan, cmask, path, length, tokens_stride_node, tokens_stride_dim,
               NODES: tl.constexpr, TREE: tl.constexpr):
    """The raw conv inputs of every path token, [NODES, channels] float32, root first (zeros past
    the path)."""
    jj = tl.arange(0, NODES)
    if TREE:
        ii = tl.arange(0, NODES)
        order = tl.sum(tl.where(ii[None, :] == length - 1 - jj[:, None], path[None, :], 0), axis=1)
    else:
        order = jj.to(tl.int64)
    live = jj < length
    return tl.load(tokens_base + order[:, None] * tokens_stride_node + chan[None, :] * tokens_stride_dim,
                   mask=live[:, None] & cmask[None, :], other=0.0).to(tl.float32)


@triton.jit
def _row(tile, t: tl.constexpr, NODES: tl.constexpr):
    """Row t of a [NODES, C] tile (pure: hoisted out of the chunk loop)."""
    return tl.sum(tl.where((tl.arange(0, NODES) == t)[:, None], tile, 0.0), axis=0)


@triton.jit
def _mamba2_stream_kernel(
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
    TREE: tl.constexpr, HAS_BIAS: tl.constexpr, HEADS: tl.constexpr, STAGES: tl.constexpr,
    TMA_LOAD: tl.constexpr,
):
    P_BLOCKS: tl.constexpr = (HEAD_DIM + BLOCK_P - 1) // BLOCK_P
    head0 = tl.program_id(0) * HEADS
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
        group = head0 // (NUM_HEADS // N_GROUPS)
        nn = tl.arange(0, BLOCK_N)
        n_mask = nn < D_STATE
        b_chan = NUM_HEADS * HEAD_DIM + group * D_STATE + nn
        conv_base = conv_ptr + layer * conv_stride_layer + dst * conv_stride_slot
        tokens_base = tokens_ptr + layer * tokens_stride_layer + src * tokens_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + src * gates_stride_slot
        weight_base = weight_ptr + layer * weight_stride_layer
        bias_base = bias_ptr + layer * bias_stride_layer
        b_rows = _path_rows(tokens_base, b_chan, n_mask, path, length, tokens_stride_node, tokens_stride_dim,
                            NODES, TREE)
        b1, b2, b3, b4 = committed_inputs(conv_base, b_chan, n_mask, conv_stride_dim, conv_stride_win,
                                          KERNEL_SIZE - 1)
        b_bias, b_wx, b_w1, b_w2, b_w3, b_w4 = conv_taps(weight_base, b_chan, n_mask, weight_stride_dim,
                                                         weight_stride_tap, bias_base, bias_stride_dim,
                                                         KERNEL_SIZE, HAS_BIAS)
        for i in tl.range(0, HEADS * P_BLOCKS, num_stages=STAGES):
            head = head0 + i // P_BLOCKS
            pp = (i % P_BLOCKS) * BLOCK_P + tl.arange(0, BLOCK_P)
            p_mask = pp < HEAD_DIM
            x_chan = head * HEAD_DIM + pp
            tile_mask = p_mask[:, None] & n_mask[None, :]
            if TMA_LOAD:
                state = ssm_desc.load([layer32, dst.to(tl.int32), head, (i % P_BLOCKS) * BLOCK_P, 0])
                state = state.reshape(BLOCK_P, BLOCK_N).to(tl.float32)
            else:
                state = tl.load(ssm_ptr + layer * ssm_stride_layer + dst * ssm_stride_slot + head * ssm_stride_head
                                + (pp * ssm_stride_p)[:, None] + (nn * ssm_stride_n)[None, :],
                                mask=tile_mask, other=0.0).to(tl.float32)
            rate = tl.load(a_ptr + layer * a_stride_layer + head * a_stride_head).to(tl.float32)
            x1, x2, x3, x4 = committed_inputs(conv_base, x_chan, p_mask, conv_stride_dim, conv_stride_win,
                                              KERNEL_SIZE - 1)
            x_bias, x_wx, x_w1, x_w2, x_w3, x_w4 = conv_taps(weight_base, x_chan, p_mask, weight_stride_dim,
                                                             weight_stride_tap, bias_base, bias_stride_dim,
                                                             KERNEL_SIZE, HAS_BIAS)
            c1, c2, c3, c4 = b1, b2, b3, b4
            for t in tl.static_range(NODES):
                live = t < length
                here = path_node(path, length, t, NODES, TREE)
                xx = tl.load(tokens_base + here * tokens_stride_node + x_chan * tokens_stride_dim,
                             mask=tl.where(live, p_mask, False), other=0.0).to(tl.float32)
                dt = tl.load(gates_base + here * gates_stride_node + head * gates_stride_head, mask=live,
                             other=0.0).to(tl.float32)
                xb = _row(b_rows, t, NODES)
                x = conv_silu(xx, x1, x2, x3, x4, x_bias, x_wx, x_w1, x_w2, x_w3, x_w4, KERNEL_SIZE)
                b = conv_silu(xb, c1, c2, c3, c4, b_bias, b_wx, b_w1, b_w2, b_w3, b_w4, KERNEL_SIZE)
                x4, x3, x2, x1 = x3, x2, x1, xx
                c4, c3, c2, c1 = c3, c2, c1, xb
                dtx = tl.where(live, dt * x, -0.0)
                b = tl.where(live, b, 0.0)
                state = state * tl.exp(dt * rate) + dtx[:, None] * b[None, :]
            ssm = (ssm_ptr + layer * ssm_stride_layer + dst * ssm_stride_slot + head * ssm_stride_head
                   + (pp * ssm_stride_p)[:, None] + (nn * ssm_stride_n)[None, :])
            tl.store(ssm, state.to(ssm_ptr.dtype.element_ty), mask=tile_mask)


@triton.jit
def _gdn_stream_kernel(
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
    TREE: tl.constexpr, HAS_BIAS: tl.constexpr, L2NORM: tl.constexpr, HEADS: tl.constexpr,
    STAGES: tl.constexpr, TMA_LOAD: tl.constexpr,
):
    V_BLOCKS: tl.constexpr = (HEAD_V_DIM + BLOCK_V - 1) // BLOCK_V
    head0 = tl.program_id(0) * HEADS
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
        k_head = head0 // (NUM_V_HEADS // NUM_K_HEADS)
        kk = tl.arange(0, BLOCK_K)
        k_mask = kk < HEAD_K_DIM
        k_chan = NUM_K_HEADS * HEAD_K_DIM + k_head * HEAD_K_DIM + kk
        conv_base = conv_ptr + layer * conv_stride_layer + dst * conv_stride_slot
        tokens_base = tokens_ptr + layer * tokens_stride_layer + src * tokens_stride_slot
        gates_base = gates_ptr + layer * gates_stride_layer + src * gates_stride_slot
        weight_base = weight_ptr + layer * weight_stride_layer
        bias_base = bias_ptr + layer * bias_stride_layer
        k_rows = _path_rows(tokens_base, k_chan, k_mask, path, length, tokens_stride_node, tokens_stride_dim,
                            NODES, TREE)
        k1, k2, k3, k4 = committed_inputs(conv_base, k_chan, k_mask, conv_stride_dim, conv_stride_win,
                                          KERNEL_SIZE - 1)
        k_bias, k_wx, k_w1, k_w2, k_w3, k_w4 = conv_taps(weight_base, k_chan, k_mask, weight_stride_dim,
                                                         weight_stride_tap, bias_base, bias_stride_dim,
                                                         KERNEL_SIZE, HAS_BIAS)
        for i in tl.range(0, HEADS * V_BLOCKS, num_stages=STAGES):
            head = head0 + i // V_BLOCKS
            vv = (i % V_BLOCKS) * BLOCK_V + tl.arange(0, BLOCK_V)
            v_mask = vv < HEAD_V_DIM
            v_chan = 2 * NUM_K_HEADS * HEAD_K_DIM + head * HEAD_V_DIM + vv
            tile_mask = k_mask[:, None] & v_mask[None, :]
            if TMA_LOAD:
                state = ssm_desc.load([layer32, dst.to(tl.int32), head, 0, (i % V_BLOCKS) * BLOCK_V])
                state = state.reshape(BLOCK_K, BLOCK_V).to(tl.float32)
            else:
                state = tl.load(ssm_ptr + layer * ssm_stride_layer + dst * ssm_stride_slot + head * ssm_stride_head
                                + (kk * ssm_stride_k)[:, None] + (vv * ssm_stride_v)[None, :],
                                mask=tile_mask, other=0.0).to(tl.float32)
            v1, v2, v3, v4 = committed_inputs(conv_base, v_chan, v_mask, conv_stride_dim, conv_stride_win,
                                              KERNEL_SIZE - 1)
            v_bias, v_wx, v_w1, v_w2, v_w3, v_w4 = conv_taps(weight_base, v_chan, v_mask, weight_stride_dim,
                                                             weight_stride_tap, bias_base, bias_stride_dim,
                                                             KERNEL_SIZE, HAS_BIAS)
            c1, c2, c3, c4 = k1, k2, k3, k4
            for t in tl.static_range(NODES):
                live = t < length
                here = path_node(path, length, t, NODES, TREE)
                xv = tl.load(tokens_base + here * tokens_stride_node + v_chan * tokens_stride_dim,
                             mask=tl.where(live, v_mask, False), other=0.0).to(tl.float32)
                gate = gates_base + here * gates_stride_node + head * gates_stride_head
                g = tl.load(gate, mask=live, other=0.0).to(tl.float32)
                beta = tl.load(gate + gates_stride_gate, mask=live, other=0.0).to(tl.float32)
                xk = _row(k_rows, t, NODES)
                k = conv_silu(xk, c1, c2, c3, c4, k_bias, k_wx, k_w1, k_w2, k_w3, k_w4, KERNEL_SIZE)
                v = conv_silu(xv, v1, v2, v3, v4, v_bias, v_wx, v_w1, v_w2, v_w3, v_w4, KERNEL_SIZE)
                c4, c3, c2, c1 = c3, c2, c1, xk
                v4, v3, v2, v1 = v3, v2, v1, xv
                k = tl.where(k_mask, k, 0.0)
                if L2NORM:
                    k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
                k = tl.where(live, k, 0.0)
                state = state * tl.exp(g)
                u = tl.where(live, beta * (v - tl.sum(state * k[:, None], axis=0)), -0.0)
                state = state + k[:, None] * u[None, :]
            ssm = (ssm_ptr + layer * ssm_stride_layer + dst * ssm_stride_slot + head * ssm_stride_head
                   + (kk * ssm_stride_k)[:, None] + (vv * ssm_stride_v)[None, :])
            tl.store(ssm, state.to(ssm_ptr.dtype.element_ty), mask=tile_mask)


def _largest_divisor(n: int, cap: int) -> int:
    best = 1
    for d in range(1, cap + 1):
        if n % d == 0:
            best = d
    return best


def launch_stream(mixer, args, kw, *, block, warps, heads, stages, tma=False, window=True):
    """The streaming replay kernel for the launcher arguments ``args, kw`` (kernel_arguments'),
    then the package's window commit."""
    if mixer == "gdn":
        ssm, conv, tokens, history, gates, weight, bias, dst, src, steps, parents = args
        a = None
        group = kw["num_v_heads"] // kw["num_k_heads"]
        total_heads, head_dim, inner = kw["num_v_heads"], kw["head_v_dim"], kw["head_k_dim"]
    else:
        ssm, conv, tokens, history, gates, weight, bias, a, dst, src, steps, parents = args
        group = kw["num_heads"] // kw["n_groups"]
        total_heads, head_dim, inner = kw["num_heads"], kw["head_dim"], kw["d_state"]
    heads = _largest_divisor(group, heads)
    block = min(block, next_power_of_2(head_dim))
    grid = (total_heads // heads, steps.shape[0], ssm.shape[0])
    common = (
        dst, src, steps, steps if parents is None else parents,
        ssm.shape[1], tokens.shape[1], tokens.shape[2],
        *ssm.stride(), *conv.stride(), *tokens.stride(), *gates.stride(), *weight.stride(),
        *((0, 0) if bias is None else bias.stride()),
    )
    nodes = next_power_of_2(tokens.shape[2])
    flags = dict(KERNEL_SIZE=conv.shape[3] + 1, NODES=nodes, TREE=parents is not None, HAS_BIAS=bias is not None,
                 HEADS=heads, STAGES=stages, TMA_LOAD=tma, num_warps=warps)
    box = state_tile_box(ssm, next_power_of_2(inner), block) if mixer == "gdn" else state_tile_box(
        ssm, block, next_power_of_2(inner))
    desc = state_descriptor(ssm, box) if tma else ssm
    bias_arg = weight if bias is None else bias
    if mixer == "gdn":
        _gdn_stream_kernel[grid](
            desc, ssm, conv, tokens, gates, weight, bias_arg, *common, *index_strides(dst, src, steps, parents),
            NUM_K_HEADS=kw["num_k_heads"], HEAD_K_DIM=inner, NUM_V_HEADS=total_heads, HEAD_V_DIM=head_dim,
            BLOCK_K=next_power_of_2(inner), BLOCK_V=block, L2NORM=kw["use_qk_l2norm"], **flags)
    else:
        _mamba2_stream_kernel[grid](
            desc, ssm, conv, tokens, gates, weight, bias_arg, a, *common, *a.stride(),
            *index_strides(dst, src, steps, parents),
            NUM_HEADS=total_heads, HEAD_DIM=head_dim, N_GROUPS=kw["n_groups"], D_STATE=inner,
            BLOCK_P=block, BLOCK_N=next_power_of_2(inner), **flags)
    if window:
        launch_path_window(conv, tokens, history, dst, src, steps, parents)


def main() -> None:
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location("replay_sweep", pathlib.Path(__file__).with_name("replay_sweep.py"))
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)

    parser = argparse.ArgumentParser()
    parser.add_argument("--mixer", default="gdn", choices=["gdn", "mamba2"])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--draft", type=int, default=4)
    parser.add_argument("--tree", action="store_true")
    parser.add_argument("--configs", nargs="+", default=["32/4/2/3"], help="block/warps/heads/stages[/1: the state through a descriptor]")
    args = parser.parse_args()
    ceiling = sweep.copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s; {args.mixer} {'tree' if args.tree else 'chain'}", flush=True)
    nodes = 8 if args.tree else args.draft
    parents_row = [-1, 0, 0, 0, 1, 1, 1, 4][:nodes] if args.tree else None
    depth = [1, 2, 2, 2, 3, 3, 3, 4]
    for batch in args.batches:
        gen = torch.Generator(device="cuda").manual_seed(batch)
        op, launch, tensors, kwargs, layers, dim, state_numel, heads, _ = sweep.problem(args.mixer, batch, nodes, gen)
        slots = torch.arange(batch, device="cuda")
        steps = torch.randint(0, nodes if args.tree else args.draft, (batch,), device="cuda", generator=gen)
        parents = torch.tensor([parents_row] * batch, device="cuda") if args.tree else None
        accepted = sum(depth[s] for s in steps.tolist()) if args.tree else int(steps.sum()) + batch
        a, kw = op.kernel_arguments(*tensors, slots, slots, steps, parents, layout="token_major", **kwargs)
        nbytes = (2 * layers * batch * state_numel * 4 + layers * accepted * (dim * 2 + 2 * heads * 4)
                  + layers * batch * dim * (sweep.K - 1) * 2 * 2)
        ssm, conv = a[0], a[1]
        start, start_conv = ssm.clone(), conv.clone()
        launch(*a, **kw)
        expect = ssm.clone()
        print(f"\nB={batch}: {nbytes / 1e6:.1f} MB, {accepted} accepted tokens")
        ms = triton.testing.do_bench(lambda: launch(*a, **kw), warmup=25, rep=150)
        print(f"{'package':>14} {ms * 1e3:>9.1f} us {100 * nbytes / (ms * 1e-3) / 1e9 / ceiling:>5.0f}%", flush=True)
        for config in args.configs:
            block, warps, heads_pp, stages, *tma = (int(x) for x in config.split("/"))
            run = lambda: launch_stream(args.mixer, a, kw, block=block, warps=warps, heads=heads_pp,  # noqa: E731
                                        stages=stages, tma=bool(tma and tma[0]))
            try:
                ssm.copy_(start)
                conv.copy_(start_conv)  # (the replay reads the committed window the commit overwrites)
                run()
                error = (ssm - expect).abs().max().item()
                ok = torch.allclose(ssm, expect, rtol=1e-4, atol=1e-4)
                ms = triton.testing.do_bench(run, warmup=25, rep=150)
            except Exception as exc:  # out of resources
                print(f"{config:>14}  failed: {type(exc).__name__}: {str(exc)[:100]}", flush=True)
                continue
            print(f"{config:>14} {ms * 1e3:>9.1f} us {100 * nbytes / (ms * 1e-3) / 1e9 / ceiling:>5.0f}%"
                  f"  max|diff| {error:.2e} {'ok' if ok else 'MISMATCH'}", flush=True)
        del tensors, a, kw, start, start_conv, expect
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
