"""Exploration: commit kernels that copy several LAYERS per program, as one [layers, elements] tile.

    python benchmarks/explore_layer_tiles.py            (CUDA: the timing table)
    python benchmarks/explore_layer_tiles.py --check    (CPU too: the candidates against the oracles)

The production commit kernels (csrc_triton/scatter.py, scatter_tree.py) give every (row, block,
layer) its own program, so each of the 36 layers' programs loads the row's indices again and, for
trees, walks the K-2 parent links again before any data moves: three dependent loads that the
tree commit pays per program (it is at ~79% of the copy ceiling where the chain commit is at 91%).
The candidates here load the indices and walk the links once per program and then move LAYERS
layers' blocks in one tile load + one tile store, so there are LAYERS times fewer programs, each
with LAYERS times the bytes in flight. LAYERS x BLOCK is kept at 4096 elements (the production
block), so registers per thread stay the same.
"""

import argparse
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sgl_convwin  # noqa: E402
from sgl_convwin import reference  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402

_common = triton_kernels()._common
row_indices = _common.row_indices  # the production kernels' own helpers
window_block = _common.window_block


@triton.jit
def _chain_layers_kernel(
    state_ptr, windows_ptr, dst_ptr, src_ptr, steps_ptr,
    num_layers, num_state_slots, num_src_slots, num_draft, dim, num_blocks,
    ssl, sss, ssd, ssw, wsl, wss, wst, wsd, wsw,
    WIDTH: tl.constexpr, BLOCK: tl.constexpr, LAYERS: tl.constexpr, WINDOW_MAJOR_ORDER: tl.constexpr,
    DST_CONTIGUOUS: tl.constexpr, SRC_CONTIGUOUS: tl.constexpr,
):
    pid = tl.program_id(0)
    row = pid // num_blocks
    block = pid % num_blocks
    layer = (tl.program_id(1) * LAYERS + tl.arange(0, LAYERS)).to(tl.int64)
    step, dst, src, active = row_indices(row, steps_ptr, 1, num_draft, dst_ptr, 1, num_state_slots,
                                         src_ptr, 1, num_src_slots)
    if active:
        flat, mask, chan, col = window_block(block, dim, WIDTH, BLOCK, WINDOW_MAJOR_ORDER)
        src_offsets = flat if SRC_CONTIGUOUS else chan * wsd + col * wsw
        dst_offsets = flat if DST_CONTIGUOUS else chan * ssd + col * ssw
        tile_mask = (layer < num_layers)[:, None] & mask[None, :]
        source = windows_ptr + src * wss + step * wst + (layer * wsl)[:, None]
        values = tl.load(source + src_offsets[None, :], mask=tile_mask)
        dest = state_ptr + dst * sss + (layer * ssl)[:, None]
        tl.store(dest + dst_offsets[None, :], values.to(state_ptr.dtype.element_ty), mask=tile_mask)


@triton.jit
def _tree_layers_kernel(
    state_ptr, rows_ptr, dst_ptr, src_ptr, nodes_ptr, parents_ptr,
    num_layers, num_state_slots, num_src_slots, num_nodes, dim, num_blocks,
    ssl, sss, ssd, ssw, rsl, rss, rsp, rsd, psr,
    WIDTH: tl.constexpr, BLOCK: tl.constexpr, LAYERS: tl.constexpr, WINDOW_MAJOR_ORDER: tl.constexpr,
    DST_CONTIGUOUS: tl.constexpr,
):
    HISTORY: tl.constexpr = WIDTH - 1
    pid = tl.program_id(0)
    row = pid // num_blocks
    block = pid % num_blocks
    layer = (tl.program_id(1) * LAYERS + tl.arange(0, LAYERS)).to(tl.int64)
    node, dst, src, active = row_indices(row, nodes_ptr, 1, num_nodes, dst_ptr, 1, num_state_slots,
                                         src_ptr, 1, num_src_slots)
    if active:
        flat, mask, chan, col = window_block(block, dim, WIDTH, BLOCK, WINDOW_MAJOR_ORDER)
        pos = HISTORY + node  # the production kernel's walk, once for all LAYERS layers
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
            dst_offsets = flat if DST_CONTIGUOUS else chan * ssd + col * ssw
            tile_mask = (layer < num_layers)[:, None] & mask[None, :]
            values = tl.load(rows_ptr + src * rss + (layer * rsl)[:, None] + src_offsets[None, :], mask=tile_mask)
            dest = state_ptr + dst * sss + (layer * ssl)[:, None]
            tl.store(dest + dst_offsets[None, :], values.to(state_ptr.dtype.element_ty), mask=tile_mask)


def _orders(state, source_dim_stride, source_win_stride, dim, width):
    contiguous_order = triton_kernels()._common.contiguous_order
    dst_order = contiguous_order(state.stride(2), state.stride(3), dim, width)
    src_order = contiguous_order(source_dim_stride, source_win_stride, dim, width)
    order = dst_order or src_order or "dim_major"
    return order, dst_order == order, src_order == order


def launch_chain_layers(state, windows, dst, src, steps, *, layers_per_program, num_warps=4):
    """Like csrc_triton.launch_scatter (contiguous int64 indices assumed: an exploration)."""
    num_layers, num_state_slots, dim, width = state.shape
    order, dst_contiguous, src_contiguous = _orders(state, windows.stride(3), windows.stride(4), dim, width)
    block = min(4096 // layers_per_program, triton.next_power_of_2(dim * width))
    num_blocks = triton.cdiv(dim * width, block)
    grid = (steps.shape[0] * num_blocks, triton.cdiv(num_layers, layers_per_program))
    _chain_layers_kernel[grid](
        state, windows, dst, src, steps, num_layers, num_state_slots, windows.shape[1], windows.shape[2], dim,
        num_blocks, *state.stride(), *windows.stride(),
        WIDTH=width, BLOCK=block, LAYERS=layers_per_program, WINDOW_MAJOR_ORDER=order == "window_major",
        DST_CONTIGUOUS=dst_contiguous, SRC_CONTIGUOUS=src_contiguous, num_warps=num_warps,
    )


def launch_tree_layers(state, rows, dst, src, nodes, parents, *, layers_per_program, num_warps=4):
    """Like csrc_triton.launch_scatter_tree (contiguous indices and parents rows assumed)."""
    num_layers, num_state_slots, dim, width = state.shape
    order, dst_contiguous, _ = _orders(state, 0, 0, dim, width)
    block = min(4096 // layers_per_program, triton.next_power_of_2(dim * width))
    num_blocks = triton.cdiv(dim * width, block)
    grid = (nodes.shape[0] * num_blocks, triton.cdiv(num_layers, layers_per_program))
    _tree_layers_kernel[grid](
        state, rows, dst, src, nodes, parents, num_layers, num_state_slots, rows.shape[1], parents.shape[1], dim,
        num_blocks, *state.stride(), *rows.stride(), parents.stride(0),
        WIDTH=width, BLOCK=block, LAYERS=layers_per_program, WINDOW_MAJOR_ORDER=order == "window_major",
        DST_CONTIGUOUS=dst_contiguous, num_warps=num_warps,
    )


def problem(layers, slots, dim, num_nodes, K, B, tree, device, seed=0):
    """A commit of B rows: token_major windows (chain) or rows + parents (tree), dim-major state;
    destinations distinct, one row padded (-1) and one out of range when B >= 4."""
    g = torch.Generator(device=device).manual_seed(seed)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shape = sgl_convwin.physical_shape("token_major", layers, slots, dim, num_nodes, K)
    buffer = torch.randn(shape, generator=g, device=device).to(dtype)
    state = torch.randn(layers, slots + 1, dim, K - 1, generator=g, device=device).to(dtype)
    dst = torch.randperm(slots + 1, generator=g, device=device)[:B]
    src = torch.randint(0, slots, (B,), generator=g, device=device)
    picks = torch.randint(0, num_nodes, (B,), generator=g, device=device)
    if B >= 4:
        picks[1], src[2] = -1, slots + 5
    if not tree:
        return state, sgl_convwin.window_view(buffer, "token_major", num_nodes, K), dst, src, picks
    topk = 3
    parents = torch.tensor([[-1 if n < topk else (n - topk) // topk for n in range(num_nodes)]] * B, device=device)
    return state, buffer, dst, src, picks, parents


def check() -> bool:
    ok = True
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for tree in (False, True):
        for layers_per_program in (1, 2, 4, 8):
            for L, dim, B in ((3, 700, 5), (9, 24, 4)):  # L not a multiple of LAYERS; several blocks
                args = problem(L, 6, dim, 8 if tree else 4, 4, B, tree, device)
                want = args[0].cpu().clone()
                if tree:
                    want = reference.scatter_tree_reference(want, *[a.cpu() for a in args[1:]])
                    launch_tree_layers(*args, layers_per_program=layers_per_program)
                else:
                    want = reference.scatter_reference(want, *[a.cpu() for a in args[1:]])
                    launch_chain_layers(*args, layers_per_program=layers_per_program)
                good = torch.equal(args[0].cpu(), want)
                ok &= good
                print(f"{'tree' if tree else 'chain'} LAYERS={layers_per_program} L={L} dim={dim} B={B}: "
                      f"{'ok' if good else 'MISMATCH'}")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the candidates (CPU too)")
    if parser.parse_args().check or not torch.cuda.is_available():
        return 0 if check() else 1
    if not check():
        return 1
    from bench_scatter import copy_ceiling_gbps, graph_time_us

    kernels = triton_kernels()
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"triton {triton.__version__}")
    print("commit, Qwen3-Next TP1 (36 layers, dim 8192, K=4), token_major, dim-major state, bf16")
    print("| draft | B | variant | graph replay (us/launch) | of copy ceiling |")
    print("|---|---|---|---|---|")
    for tree in (False, True):
        for B in (1, 8, 64, 256):
            args = problem(36, max(B, 8), 8192, 8 if tree else 4, 4, B, tree, "cuda")
            production = kernels.launch_scatter_tree if tree else kernels.launch_scatter
            candidate = launch_tree_layers if tree else launch_chain_layers
            state = args[0]
            start = state.clone()
            production(*args)
            want = state.clone()
            variants = [("production", lambda: production(*args))]
            for layers_per_program in (2, 4, 8):
                variants.append((f"{layers_per_program} layers x {4096 // layers_per_program}",
                                 lambda n=layers_per_program: candidate(*args, layers_per_program=n)))
            for name, run in variants:
                state.copy_(start)
                run()
                same = torch.equal(state, want)
                us = graph_time_us(run)
                nbytes = 2 * B * 36 * 8192 * 3 * 2
                print(f"| {'tree N=8 topk 3' if tree else 'chain D=4'} | {B} | {name}{'' if same else ' (WRONG)'} | "
                      f"{us:.1f} | {nbytes / (us * 1e-6) / 1e9 / ceiling:.1%} |", flush=True)
            del args, state, start, want
    return 0


if __name__ == "__main__":
    sys.exit(main())
