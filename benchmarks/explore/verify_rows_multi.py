"""A candidate for the fused verify rows kernel: one program takes ROWS requests of one channel block
(grid (cdiv(B, ROWS), cdiv(dim, BLOCK))), so its slot loads and then its data loads go out as one
round for all of them, instead of two dependent rounds per small single-request program. Compared
here with the production launch (csrc_triton/verify.py) for equal results and time, one layer at the
Qwen3-Next TP1 shape, token_major, chain D = 4 and a topk-3 tree of 8 nodes.

    python benchmarks/explore/verify_rows_multi.py [--configs ROWS/BLOCK/WARPS ...]   (CUDA; CPU: a check)
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/common.py
import common  # noqa: E402  (before triton: without CUDA it sets TRITON_INTERPRET=1)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from common import graph_time_us, tree_parents, verify_layer_problem  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402


@triton.jit
def _up_one(pos, parents_row, parents_stride_node, HAS_PARENTS: tl.constexpr):
    if HAS_PARENTS:
        is_node = pos >= 0
        parent = tl.load(parents_row + pos * parents_stride_node, mask=is_node, other=-1).to(pos.dtype)
        parent = tl.where((parent >= -1) & (parent < pos), parent, -1)
        return tl.where(is_node, parent, pos - 1)
    else:
        return pos - 1


@triton.jit
def _verify_rows_multi_kernel(
    rows_ptr, state_ptr, x_ptr, out_ptr, weight_ptr, bias_ptr, buffer_slots_ptr, state_slots_ptr, parents_ptr,
    rows_layer_offset, state_layer_offset, num_rows, num_buffer_slots, num_state_slots, num_nodes, dim,
    rows_stride_slot, rows_stride_pos, rows_stride_dim,
    state_stride_slot, state_stride_dim, state_stride_win,
    x_stride_row, x_stride_node, x_stride_dim,
    out_stride_row, out_stride_node, out_stride_dim,
    weight_stride_dim, weight_stride_tap, bias_stride, buffer_slots_stride, state_slots_stride,
    parents_stride_row, parents_stride_node,
    ROWS: tl.constexpr, NODES: tl.constexpr, KERNEL_SIZE: tl.constexpr, BLOCK: tl.constexpr,
    HAS_PARENTS: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    WIDTH: tl.constexpr = KERNEL_SIZE - 1
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = r < num_rows
    chan = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = chan < dim
    dst = tl.load(buffer_slots_ptr + r * buffer_slots_stride, mask=rmask, other=-1).to(tl.int64)
    src = tl.load(state_slots_ptr + r * state_slots_stride, mask=rmask, other=-1).to(tl.int64)
    active = rmask & (dst >= 0) & (dst < num_buffer_slots) & (src >= 0) & (src < num_state_slots)
    dst = tl.where(active, dst, 0)
    src = tl.where(active, src, 0)
    rows3 = (rows_ptr + rows_layer_offset + dst * rows_stride_slot)[:, None, None]
    state3 = (state_ptr + state_layer_offset + src * state_stride_slot)[:, None, None]
    xs3 = (x_ptr + r * x_stride_row)[:, None, None]
    chan3 = chan[None, None, :]
    row_ok = active[:, None, None] & cmask[None, None, :]
    one = tl.arange(0, 1)[None, :, None]
    for h in tl.static_range(WIDTH - 1):  # rows 0 .. K-3: the K-2 newest committed inputs
        committed = tl.load(state3 + (h + 1) * state_stride_win + one + chan3 * state_stride_dim, mask=row_ok)
        tl.store(rows3 + h * rows_stride_pos + one + chan3 * rows_stride_dim,
                 committed.to(rows_ptr.dtype.element_ty), mask=row_ok)
    node = tl.arange(0, NODES)
    nmask = node < num_nodes
    tile_mask = row_ok & nmask[None, :, None]
    node3 = node[None, :, None]
    tokens = tl.load(xs3 + node3 * x_stride_node + chan3 * x_stride_dim, mask=tile_mask)
    tl.store(rows3 + (WIDTH - 1 + node3) * rows_stride_pos + chan3 * rows_stride_dim,
             tokens.to(rows_ptr.dtype.element_ty), mask=tile_mask)
    parents2 = (parents_ptr + r * parents_stride_row)[:, None]
    pos = tl.where(active[:, None] & nmask[None, :], node[None, :], -1).to(tl.int64)  # [ROWS, NODES]
    write2 = pos >= 0
    if HAS_PARENTS:  # a bad link among the K-1 above a node skips its output
        probe = pos
        for _ in tl.static_range(WIDTH):
            is_node = probe >= 0
            parent = tl.load(parents2 + probe * parents_stride_node, mask=is_node, other=-1).to(tl.int64)
            parent_ok = (parent >= -1) & (parent < probe)
            write2 &= parent_ok | (probe < 0)
            probe = tl.where(is_node, tl.where(parent_ok, parent, -1), probe - 1)
    write = write2[:, :, None] & cmask[None, None, :]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + chan * bias_stride, mask=cmask).to(tl.float32)
        acc = tl.zeros([ROWS, NODES, BLOCK], dtype=tl.float32) + bias[None, None, :]
    else:
        acc = tl.zeros([ROWS, NODES, BLOCK], dtype=tl.float32)
    newest = tl.load(weight_ptr + chan * weight_stride_dim + WIDTH * weight_stride_tap, mask=cmask)
    acc = tl.fma(newest.to(tl.float32)[None, None, :], tokens.to(tl.float32), acc)
    for up in tl.static_range(1, KERNEL_SIZE):
        pos = _up_one(pos, parents2, parents_stride_node, HAS_PARENTS)
        is_token = (pos >= 0)[:, :, None]
        pos3 = pos[:, :, None]
        from_x = tl.load(xs3 + pos3 * x_stride_node + chan3 * x_stride_dim, mask=is_token & write)
        from_state = tl.load(state3 + (WIDTH + pos3) * state_stride_win + chan3 * state_stride_dim,
                             mask=(~is_token) & write)
        value = tl.where(is_token, from_x.to(tl.float32), from_state.to(tl.float32))
        tap = tl.load(weight_ptr + chan * weight_stride_dim + (WIDTH - up) * weight_stride_tap, mask=cmask)
        acc = tl.fma(tap.to(tl.float32)[None, None, :], value, acc)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    out = (out_ptr + r[:, None, None] * out_stride_row + node3 * out_stride_node + chan3 * out_stride_dim)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=write)


def launch_multi(out, dest, state, x, weight, bias, buffer_slots, state_slots, layer, parents, *, rows, block, warps):
    num_rows, num_nodes, dim = x.shape
    grid = (triton.cdiv(num_rows, rows), triton.cdiv(dim, block))
    _verify_rows_multi_kernel[grid](
        dest, state, x, out, weight, bias, buffer_slots, state_slots,
        parents if parents is not None else buffer_slots,
        layer * dest.stride(0), layer * state.stride(0), num_rows, dest.shape[1], state.shape[1], num_nodes, dim,
        *dest.stride()[1:], *state.stride()[1:], *x.stride(), *out.stride(), *weight.stride(), bias.stride(0),
        buffer_slots.stride(0), state_slots.stride(0), *(parents.stride() if parents is not None else (0, 0)),
        ROWS=rows, NODES=triton.next_power_of_2(num_nodes), KERNEL_SIZE=state.shape[3] + 1, BLOCK=block,
        HAS_PARENTS=parents is not None, HAS_BIAS=True, SILU=True, num_warps=warps,
    )


def layer_bytes(batch, num_nodes, dim, kernel_size, element=2):
    width = kernel_size - 1
    written = batch * (num_nodes + width - 1) * dim
    return element * (2 * batch * num_nodes * dim + batch * width * dim + dim * (kernel_size + 1) + written)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", nargs="+", default=["2/64/1", "4/64/2", "4/64/4", "8/64/4", "4/128/4", "2/128/2"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64, 256])
    args = parser.parse_args()
    cuda = common.DEVICE == "cuda"
    dim, K = (common.SHAPES["qwen3next-tp1"][1], common.KERNEL_SIZE) if cuda else (96, 4)
    batches = args.batches if cuda else [3]
    kernels = triton_kernels()
    ceiling = common.copy_ceiling_gbps() if cuda else None
    if cuda:
        common.print_environment(ceiling)
    print("| draft | B | kernel | graph replay (us/launch) | of copy ceiling | equal to production |")
    print("|---|---|---|---|---|---|")
    for tree, num_nodes in ((False, 4), (True, 8)):
        parents_list = tree_parents(num_nodes, 3 if tree else None)
        if not cuda and tree:
            parents_list[5] = 9  # a bad link: its node and those below it write no output
        for B in batches:
            buffer, dest, state, x, out, weight, bias, slots_b, slots_s, parents = verify_layer_problem(
                B, num_nodes, parents_list if tree else None, "token_major", dim, K, device=common.DEVICE)
            if not cuda:
                slots_b[1] = -1  # a padded request writes nothing
            nbytes = layer_bytes(B, num_nodes, dim, K)

            def production():
                kernels.launch_causal_conv1d_verify(out, dest, state, x, weight, bias, slots_b, slots_s, 0, parents,
                                                    dense=False, silu=True)

            out.zero_()
            buffer.zero_()
            production()
            want_out, want_buffer = out.clone(), buffer.clone()
            draft = f"tree N={num_nodes} topk 3" if tree else f"chain D={num_nodes}"
            candidates = [("production", production)]
            for config in args.configs:
                rows, block, warps = (int(v) for v in config.split("/"))
                candidates.append((f"{rows} rows/{block} ch/{warps}w", lambda r=rows, b=block, w=warps: launch_multi(
                    out, dest, state, x, weight, bias, slots_b, slots_s, 0, parents, rows=r, block=b, warps=w)))
            for name, run in candidates:
                out.zero_()
                buffer.zero_()
                run()
                same = torch.equal(out, want_out) and torch.equal(buffer, want_buffer)
                if cuda:
                    us = graph_time_us(run)
                    fraction = nbytes / (us * 1e-6) / 1e9 / ceiling
                    print(f"| {draft} | {B} | {name} | {us:.1f} | {fraction:.1%} | {'yes' if same else 'NO'} |", flush=True)
                else:
                    print(f"| {draft} | {B} | {name} | | | {'yes' if same else 'NO'} |", flush=True)
            del buffer
    return 0


if __name__ == "__main__":
    sys.exit(main())
