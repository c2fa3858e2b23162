"""Exploration (kept as a record): variants of the tree commit kernel, side by side with the
production one and the dense fallback. Prints a table; docs/benchmarks.md has the reading.

    python benchmarks/explore_tree_kernels.py      (CUDA)

Variants
- production: csrc_triton/scatter_tree.py as it is.
- flat int32: the same walk of the destination window, but per-element offsets in int32 (bases
  stay int64 scalars) and the where-chain picks among K-1 scalar row offsets.
- per column: one program = a block of channels; for each of the K-1 columns one scalar row
  position, a contiguous load of BLOCK channels and a store with the column's stride.
"""

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_scatter import copy_ceiling_gbps, graph_time_us  # noqa: E402
from sgl_convwin import reference  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402


@triton.jit
def _flat_i32_kernel(state_ptr, rows_ptr, dst_ptr, src_ptr, nodes_ptr, parents_ptr,
                     num_nodes, dim, num_blocks, ssl, sss, ssd, ssw, rsl, rss, rsp, rsd, psr,
                     WIDTH: tl.constexpr, BLOCK: tl.constexpr, WINDOW_MAJOR_ORDER: tl.constexpr,
                     DST_CONTIGUOUS: tl.constexpr):
    HISTORY: tl.constexpr = WIDTH - 1
    pid = tl.program_id(0)
    row = pid // num_blocks
    block = pid % num_blocks
    layer = tl.program_id(1).to(tl.int64)
    node = tl.load(nodes_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    src = tl.load(src_ptr + row).to(tl.int64)
    if (node >= 0) & (dst >= 0):
        flat = block * BLOCK + tl.arange(0, BLOCK)
        mask = flat < dim * WIDTH
        if WINDOW_MAJOR_ORDER:
            col = flat // dim
            chan = flat - col * dim
        else:
            chan = flat // WIDTH
            col = flat - chan * WIDTH
        pos = HISTORY + node
        row_offset = tl.zeros([BLOCK], dtype=tl.int32) + (pos * rsp).to(tl.int32)
        links_ok = node >= 0
        parents_row = parents_ptr + row.to(tl.int64) * psr
        for older in tl.static_range(1, WIDTH):
            is_node = pos >= HISTORY
            parent = tl.load(parents_row + (pos - HISTORY), mask=is_node, other=-1).to(tl.int64)
            parent_ok = (parent >= -1) & (parent < pos - HISTORY)
            links_ok &= parent_ok | (pos < HISTORY)
            pos = tl.where(is_node & parent_ok, HISTORY + parent, pos - 1)
            row_offset = tl.where(col == WIDTH - 1 - older, (pos * rsp).to(tl.int32), row_offset)
        if links_ok:
            src_offsets = row_offset + chan * rsd
            if DST_CONTIGUOUS:
                dst_offsets = flat
            else:
                dst_offsets = chan * ssd + col * ssw
            values = tl.load(rows_ptr + layer * rsl + src * rss + src_offsets, mask=mask)
            tl.store(state_ptr + layer * ssl + dst * sss + dst_offsets,
                     values.to(state_ptr.dtype.element_ty), mask=mask)


def launch_flat_i32(state, rows, dst, src, nodes, parents, block=4096, warps=4):
    L, _, dim, width = state.shape
    numel = dim * width
    block = min(block, triton.next_power_of_2(numel))
    nb = triton.cdiv(numel, block)
    window_major = state.stride(2) == 1
    _flat_i32_kernel[(nodes.shape[0] * nb, L)](
        state, rows, dst, src, nodes, parents, parents.shape[1], dim, nb,
        *state.stride(), *rows.stride(), parents.stride(0),
        WIDTH=width, BLOCK=block, WINDOW_MAJOR_ORDER=window_major, DST_CONTIGUOUS=True, num_warps=warps)


@triton.jit
def _per_column_kernel(state_ptr, rows_ptr, dst_ptr, src_ptr, nodes_ptr, parents_ptr,
                       num_nodes, dim, num_blocks, ssl, sss, ssd, ssw, rsl, rss, rsp, rsd, psr,
                       WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    HISTORY: tl.constexpr = WIDTH - 1
    pid = tl.program_id(0)
    row = pid // num_blocks
    block = pid % num_blocks
    layer = tl.program_id(1).to(tl.int64)
    node = tl.load(nodes_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    src = tl.load(src_ptr + row).to(tl.int64)
    if (node >= 0) & (dst >= 0):
        parents_row = parents_ptr + row.to(tl.int64) * psr
        links_ok = node >= 0
        pos = HISTORY + node
        for _ in tl.static_range(1, WIDTH):
            is_node = pos >= HISTORY
            parent = tl.load(parents_row + (pos - HISTORY), mask=is_node, other=-1).to(tl.int64)
            parent_ok = (parent >= -1) & (parent < pos - HISTORY)
            links_ok &= parent_ok | (pos < HISTORY)
            pos = tl.where(is_node & parent_ok, HISTORY + parent, pos - 1)
        if links_ok:
            chan = block * BLOCK + tl.arange(0, BLOCK)
            cmask = chan < dim
            source = rows_ptr + layer * rsl + src * rss + chan * rsd
            dest = state_ptr + layer * ssl + dst * sss + chan * ssd
            pos = HISTORY + node
            for older in tl.static_range(WIDTH):
                values = tl.load(source + pos * rsp, mask=cmask)
                tl.store(dest + (WIDTH - 1 - older) * ssw, values.to(state_ptr.dtype.element_ty), mask=cmask)
                if older < WIDTH - 1:
                    is_node = pos >= HISTORY
                    parent = tl.load(parents_row + (pos - HISTORY), mask=is_node, other=-1).to(tl.int64)
                    pos = tl.where(is_node, HISTORY + parent, pos - 1)


def launch_per_column(state, rows, dst, src, nodes, parents, block=1024, warps=4):
    L, _, dim, width = state.shape
    block = min(block, triton.next_power_of_2(dim))
    nb = triton.cdiv(dim, block)
    _per_column_kernel[(nodes.shape[0] * nb, L)](
        state, rows, dst, src, nodes, parents, parents.shape[1], dim, nb,
        *state.stride(), *rows.stride(), parents.stride(0),
        WIDTH=width, BLOCK=block, num_warps=warps)


def main():
    layers, dim, K, num_nodes, topk = 36, 8192, 4, 8, 3
    parents_list = [(n // topk) - 1 if n >= topk else -1 for n in range(num_nodes)]
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"triton {triton.__version__}")
    print(f"tree commit, Qwen3-Next TP1 (L={layers}, dim={dim}, K={K}), N={num_nodes} topk {topk}, bf16")
    print("| state layout | B | variant | graph replay (us/launch) | of copy ceiling |")
    print("|---|---|---|---|---|")
    production = triton_kernels().launch_scatter_tree
    variants = [("production", production)]
    for block, warps in ((4096, 4), (2048, 4), (4096, 8)):
        variants.append((f"flat int32 {block}/{warps}w",
                         lambda *a, b=block, w=warps: launch_flat_i32(*a, block=b, warps=w)))
    for block, warps in ((1024, 4), (2048, 8), (512, 2)):
        variants.append((f"per column {block}/{warps}w",
                         lambda *a, b=block, w=warps: launch_per_column(*a, block=b, warps=w)))
    for state_layout in ("dim_major", "window_major"):
        for B in (1, 8, 64, 256):
            slots = max(B, 8)
            generator = torch.Generator(device="cuda").manual_seed(0)
            dst = torch.randperm(slots, generator=generator, device="cuda")[:B]
            src = torch.randperm(slots, generator=generator, device="cuda")[:B]
            nodes = torch.randint(0, num_nodes, (B,), generator=generator, device="cuda")
            parents = torch.tensor([parents_list] * B, device="cuda")
            rows = torch.randn(layers, slots, num_nodes + K - 2, dim, generator=generator, device="cuda").to(torch.bfloat16)
            shape = (layers, slots, dim, K - 1) if state_layout == "dim_major" else (layers, slots, K - 1, dim)
            conv_state = torch.zeros(shape, device="cuda", dtype=torch.bfloat16)
            state = conv_state if state_layout == "dim_major" else conv_state.transpose(2, 3)
            want = reference.scatter_tree_reference(conv_state, rows, dst, src, nodes, parents, state_layout) if B <= 8 else None
            for name, launch in variants:
                conv_state.zero_()
                launch(state, rows, dst, src, nodes, parents)
                if want is not None:
                    assert torch.equal(conv_state.cpu(), want), name
                us = graph_time_us(lambda: launch(state, rows, dst, src, nodes, parents))
                gbps = 2 * B * layers * dim * (K - 1) * 2 / (us * 1e-6) / 1e9
                print(f"| {state_layout} | {B} | {name} | {us:.1f} | {gbps / ceiling:.1%} |", flush=True)
            del rows, conv_state
    return 0


if __name__ == "__main__":
    sys.exit(main())
