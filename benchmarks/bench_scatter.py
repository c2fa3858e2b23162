"""Commit (scatter) benchmark: this package's op on every layout against today's baselines.

    python benchmarks/bench_scatter.py                 # H200 tables (needs CUDA)
    python benchmarks/bench_scatter.py --verify-only   # check every variant on tiny shapes (CPU too)

Variants: torch advanced indexing; a dense flat-copy Triton kernel and a channel-major per-element
strided Triton kernel, written here from the descriptions in shared/CONTEXT.md as stand-ins for
what engines run today; and torch.ops.convwin.scatter on each layout. Per row: the median of
triton.testing.do_bench, the time per launch from CUDA-graph replays, the effective bandwidth on
the bytes the commit must move (read K-1 columns per window + write them), and that bandwidth as
a fraction of a device-to-device copy ceiling measured in the same run.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import sgl_convwin  # noqa: E402
from sgl_convwin import reference  # noqa: E402

SHAPES = {  # name: (layers, dim) per rank; K=4
    "qwen3next-tp1": (36, 8192),
    "qwen3next-tp4": (36, 2048),
    "nemotronh-tp1": (23, 6144),
}

# ------------------------------------------------------------------------------------------------
# Baselines (stand-ins for what engines run today)
# ------------------------------------------------------------------------------------------------


@triton.jit
def _dense_flat_copy_kernel(
    state_ptr, windows_ptr, dst_ptr, src_ptr, steps_ptr,
    state_stride_layer, state_stride_slot,
    windows_stride_layer, windows_stride_slot, windows_stride_step,
    numel, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    block = tl.program_id(2)
    step = tl.load(steps_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    src = tl.load(src_ptr + row).to(tl.int64)
    if (step >= 0) & (dst >= 0):
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < numel
        base_in = windows_ptr + layer * windows_stride_layer + src * windows_stride_slot + step * windows_stride_step
        values = tl.load(base_in + offsets, mask=mask)
        base_out = state_ptr + layer * state_stride_layer + dst * state_stride_slot
        tl.store(base_out + offsets, values.to(state_ptr.dtype.element_ty), mask=mask)


def dense_flat_copy(conv_state, windows, dst, src, steps):
    """windows: a contiguous dense buffer [L, M, D, dim, K-1]; conv_state contiguous [L, N, dim, K-1]."""
    L, _, dim, width = conv_state.shape
    numel = dim * width
    grid = (steps.shape[0], L, triton.cdiv(numel, 1024))
    _dense_flat_copy_kernel[grid](
        conv_state, windows, dst, src, steps,
        conv_state.stride(0), conv_state.stride(1),
        windows.stride(0), windows.stride(1), windows.stride(2),
        numel, BLOCK=1024,
    )


@triton.jit
def _channel_major_strided_kernel(
    state_ptr, windows_ptr, dst_ptr, src_ptr, steps_ptr,
    state_stride_layer, state_stride_slot, state_stride_dim, state_stride_win,
    win_stride_layer, win_stride_slot, win_stride_step, win_stride_dim, win_stride_win,
    numel, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    block = tl.program_id(2)
    step = tl.load(steps_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    src = tl.load(src_ptr + row).to(tl.int64)
    if (step >= 0) & (dst >= 0):
        flat = block * BLOCK + tl.arange(0, BLOCK)
        mask = flat < numel
        chan = flat // WIDTH
        col = flat % WIDTH
        in_ptr = (windows_ptr + layer * win_stride_layer + src * win_stride_slot + step * win_stride_step
                  + chan * win_stride_dim + col * win_stride_win)
        out_ptr = (state_ptr + layer * state_stride_layer + dst * state_stride_slot
                   + chan * state_stride_dim + col * state_stride_win)
        tl.store(out_ptr, tl.load(in_ptr, mask=mask).to(state_ptr.dtype.element_ty), mask=mask)


def channel_major_strided(conv_state, windows, dst, src, steps):
    """windows: any [L, M, D, dim, K-1] view (here the channel-major one), element by element."""
    L, _, dim, width = conv_state.shape
    numel = dim * width
    grid = (steps.shape[0], L, triton.cdiv(numel, 1024))
    _channel_major_strided_kernel[grid](
        conv_state, windows, dst, src, steps, *conv_state.stride(), *windows.stride(),
        numel, WIDTH=width, BLOCK=1024,
    )


def torch_indexing(conv_state, windows, dst, src, steps):
    """What a plain-PyTorch engine writes (all rows valid here; it has no skip rows)."""
    conv_state[:, dst] = windows[:, src, steps].to(conv_state.dtype)


# (name, layout of the windows it reads, function)
VARIANTS = [
    ("torch indexing (dense)", "dense", torch_indexing),
    ("baseline dense flat copy", "dense", dense_flat_copy),
    ("baseline channel_major strided", "channel_major", channel_major_strided),
    ("convwin dense", "dense", sgl_convwin.scatter),
    ("convwin channel_major", "channel_major", sgl_convwin.scatter),
    ("convwin token_major", "token_major", sgl_convwin.scatter),
]

# ------------------------------------------------------------------------------------------------


def make_problem(layers, slots, dim, num_draft, kernel_size, batch, dtype, layout, device, seed=0):
    generator = torch.Generator(device=device).manual_seed(seed)
    buffer = sgl_convwin.alloc_windows(layers, slots, dim, num_draft, kernel_size, layout=layout, dtype=dtype, device=device)
    buffer.copy_(torch.randn(buffer.shape, generator=generator, device=device, dtype=torch.float32))
    windows = sgl_convwin.window_view(buffer, layout, num_draft, kernel_size)
    conv_state = torch.randn(layers, slots, dim, kernel_size - 1, generator=generator, device=device).to(dtype)
    dst = torch.randperm(slots, generator=generator, device=device)[:batch]
    src = torch.randperm(slots, generator=generator, device=device)[:batch]
    steps = torch.randint(0, num_draft, (batch,), generator=generator, device=device)
    return conv_state, windows, dst, src, steps


def verify(device: str) -> bool:
    ok = True
    for layers, slots, dim, D, K, B in [(2, 6, 40, 4, 4, 3), (3, 5, 24, 2, 3, 5), (1, 4, 16, 8, 5, 2)]:
        for name, layout, fn in VARIANTS:
            for dtype in (torch.float32, torch.bfloat16):
                conv_state, windows, dst, src, steps = make_problem(layers, slots, dim, D, K, B, dtype, layout, device)
                expected = reference.scatter_reference(conv_state, windows, dst, src, steps)
                fn(conv_state, windows, dst, src, steps)
                good = torch.equal(conv_state.cpu(), expected)
                ok &= good
                if not good:
                    print(f"MISMATCH: {name} L={layers} dim={dim} D={D} K={K} B={B} {dtype}")
    print("verify:", "all variants match the oracle" if ok else "FAILED")
    return ok


def copy_ceiling_gbps() -> float:
    numel = 1 << 29  # 1 GiB of bf16 each way
    src = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * numel * 2 / (ms * 1e-3) / 1e9


def graph_time_us(fn, launches=20, replays=50) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * launches))
    return sorted(times)[len(times) // 2]


def bench(shapes, batches, drafts, dtypes, out_json):
    ceiling = copy_ceiling_gbps()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"copy ceiling (device-to-device, read+write): {ceiling:.0f} GB/s")
    rows = []
    for shape_name in shapes:
        layers, dim = SHAPES[shape_name]
        for dtype_name in dtypes:
            dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
            for D in drafts:
                for B in batches:
                    slots = max(B, 8)
                    for name, layout, fn in VARIANTS:
                        problem = make_problem(layers, slots, dim, D, 4, B, dtype, layout, "cuda")
                        expected = reference.scatter_reference(*problem) if B <= 8 else None
                        fn(*problem)
                        if expected is not None:
                            assert torch.equal(problem[0].cpu(), expected), name
                        ms = triton.testing.do_bench(lambda: fn(*problem), warmup=25, rep=200, return_mode="median")
                        graph_us = graph_time_us(lambda: fn(*problem))
                        nbytes = 2 * B * layers * dim * 3 * problem[0].element_size()
                        gbps = nbytes / (ms * 1e-3) / 1e9
                        row = dict(shape=shape_name, dtype=dtype_name, D=D, B=B, variant=name,
                                   us=ms * 1e3, graph_us=graph_us, gbps=gbps, frac=gbps / ceiling)
                        rows.append(row)
                        if out_json:  # after every row: a run cut short keeps what it measured
                            write_json(out_json, ceiling, rows)
                        print(f"{shape_name:14} {dtype_name:5} D={D:<2} B={B:<4} {name:32} "
                              f"{ms * 1e3:9.1f} us  graph {graph_us:8.1f} us  {gbps:7.0f} GB/s  {gbps / ceiling:5.1%}",
                              flush=True)
                        del problem
    return rows, ceiling


def write_json(path, ceiling, rows):
    with open(path, "w") as f:
        json.dump(dict(ceiling_gbps=ceiling, device=torch.cuda.get_device_name(), torch=torch.__version__,
                       triton=triton.__version__, rows=rows), f, indent=1)


def eager_overhead(calls=1000, rounds=15):
    """Host time per call at B=1 (the GPU work is shorter than the launch, so the host bounds it),
    of the chain commit and the tree commit, each against a raw Triton launch of its own kernel.

    The candidates are timed in interleaved rounds (each round times every candidate, in an order
    rotated from round to round), so a slow spell of the host weighs on all of them alike; the
    table gives each one's best and median round."""
    import statistics
    import time

    from sgl_convwin._kernels import triton_kernels

    kernels = triton_kernels()
    problem = make_problem(36, 8, 8192, 4, 4, 1, torch.bfloat16, "token_major", "cuda")
    grid, args, kwargs = kernels.scatter.scatter_launch_args(*problem)
    state, _, dst, src, steps = problem
    rows = sgl_convwin.alloc_windows(36, 8, 8192, 4, 4, layout="token_major", device="cuda")  # N = 4 nodes
    tree = (state, rows, dst, src, steps, torch.full((1, 4), -1, device="cuda"))
    index_strides = (1, 1, 1, tree[5].stride())
    tree_grid, tree_scalars, tree_kwargs = kernels.scatter_tree._plan_scatter_tree(
        state, rows, 1, 4, index_strides, None, 4)

    def raw():
        kernels.scatter._scatter_windows_kernel[grid](*args, **kwargs)

    def raw_tree():
        kernels.scatter_tree._scatter_tree_kernel[tree_grid](*tree, *tree_scalars, **tree_kwargs)

    raw_name, raw_tree_name = "raw Triton launch (args prepared)", "raw Triton launch of the tree kernel"
    candidates = [  # name, call, the raw launch it is compared with
        (raw_name, raw, raw_name),
        ("csrc_triton launch_scatter", lambda: kernels.launch_scatter(*problem), raw_name),
        ("sgl_convwin.scatter (public)", lambda: sgl_convwin.scatter(*problem), raw_name),
        ("torch.ops.convwin.scatter", lambda: torch.ops.convwin.scatter(*problem), raw_name),
        (raw_tree_name, raw_tree, raw_tree_name),
        ("sgl_convwin.scatter_tree (public)", lambda: sgl_convwin.scatter_tree(*tree), raw_tree_name),
    ]
    times = {name: [] for name, _, _ in candidates}
    for _, fn, _ in candidates:
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    for round_ in range(rounds):
        shift = round_ % len(candidates)
        for name, fn, _ in candidates[shift:] + candidates[:shift]:
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
    print(f"\neager host time per call, B=1, Qwen3-Next TP1 shape ({rounds} interleaved rounds x {calls} calls)")
    print("| call | best us per call | median us per call | vs its raw launch (best) | vs its raw launch (median) |")
    print("|---|---|---|---|---|")
    results = []
    for name, _, ref in candidates:
        best, median = min(times[name]), statistics.median(times[name])
        ref_best, ref_median = min(times[ref]), statistics.median(times[ref])
        print(f"| {name} | {best:.2f} | {median:.2f} | {best / ref_best:.2f}x | {median / ref_median:.2f}x |")
        results.append((name, best))
    return results


def bench_tree(batches, shape="qwen3next-tp1", num_nodes=8, topk=3, blocks=()):
    """Tree commit: scatter_tree on token_major rows (N+K-2 rows per slot) against the dense
    fallback engines use for trees today (one [dim, K-1] window per node); ``blocks``: also the
    tree kernel with these elements per program (exploration)."""
    from sgl_convwin._kernels import triton_kernels

    launch_tree = triton_kernels().launch_scatter_tree
    (layers, dim), K = SHAPES[shape], 4
    parents_list = [(n // topk) - 1 if n >= topk else -1 for n in range(num_nodes)]
    print(f"\ntree commit, N={num_nodes} nodes (topk {topk}: parents {parents_list}), {shape}, bf16")
    print("| B | variant | graph replay (us/launch) | GB/s | cache bytes per slot |")
    print("|---|---|---|---|---|")
    for B in batches:
        slots = max(B, 8)
        generator = torch.Generator(device="cuda").manual_seed(0)
        dst = torch.randperm(slots, generator=generator, device="cuda")[:B]
        src = torch.randperm(slots, generator=generator, device="cuda")[:B]
        nodes = torch.randint(0, num_nodes, (B,), generator=generator, device="cuda")
        parents = torch.tensor([parents_list] * B, device="cuda")
        conv_state = torch.zeros(layers, slots, dim, K - 1, device="cuda", dtype=torch.bfloat16)
        rows = sgl_convwin.alloc_windows(layers, slots, dim, num_nodes, K, layout="token_major", device="cuda")
        rows.copy_(torch.randn(rows.shape, generator=generator, device="cuda"))
        dense = sgl_convwin.alloc_windows(layers, slots, dim, num_nodes, K, layout="dense", device="cuda")
        for node in range(num_nodes):  # the dense cache holds the windows the tree rows imply
            positions = reference.tree_window_positions(node, parents_list, K)
            dense[:, :, node] = rows[:, :, positions].transpose(-1, -2)
        want = conv_state.clone()
        sgl_convwin.scatter(want, dense, dst, src, nodes)
        variants = [
            ("convwin scatter_tree (token_major rows)", lambda: sgl_convwin.scatter_tree(conv_state, rows, dst, src, nodes, parents), rows),
            ("convwin scatter (dense tree fallback)", lambda: sgl_convwin.scatter(conv_state, dense, dst, src, nodes), dense),
        ]
        for block in blocks:
            variants.append((f"scatter_tree kernel, block {block}", functools.partial(
                launch_tree, conv_state, rows, dst, src, nodes, parents, block=block), rows))
        for name, fn, cache in variants:
            conv_state.zero_()
            fn()
            assert torch.equal(conv_state, want), name
            us = graph_time_us(fn)
            nbytes = 2 * B * layers * dim * (K - 1) * 2
            per_slot = cache.numel() * cache.element_size() // slots
            print(f"| {B} | {name} | {us:.1f} | {nbytes / (us * 1e-6) / 1e9:.0f} | {per_slot} |", flush=True)
        del rows, dense, conv_state, want


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify-only", action="store_true")
    parser.add_argument("--shapes", nargs="+", default=["qwen3next-tp1"], choices=list(SHAPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64, 256, 512])
    parser.add_argument("--drafts", nargs="+", type=int, default=[4])
    parser.add_argument("--dtypes", nargs="+", default=["bf16"], choices=["bf16", "fp32"])
    parser.add_argument("--json", default=None, help="write all rows here")
    parser.add_argument("--tree", action="store_true", help="also time the tree commit")
    parser.add_argument("--tree-only", action="store_true", help="time only the tree commit")
    parser.add_argument("--tree-blocks", nargs="+", type=int, default=[], help="tree kernel blocks to explore")
    parser.add_argument("--eager-only", action="store_true", help="time only the eager host overhead")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not verify(device):
        return 1
    if args.verify_only:
        return 0
    if device != "cuda":
        print("timing needs CUDA")
        return 1
    if args.tree_only:
        for shape in args.shapes:
            bench_tree(args.batches, shape, blocks=args.tree_blocks)
        return 0
    eager_overhead()
    if args.eager_only:
        return 0
    if args.tree:
        bench_tree(args.batches)
    rows, ceiling = bench(args.shapes, args.batches, args.drafts, args.dtypes, args.json)
    print(f"\n| shape | dtype | D | B | variant | do_bench median (us) | graph replay (us/launch) | GB/s | of copy ceiling ({ceiling:.0f} GB/s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['dtype']} | {r['D']} | {r['B']} | {r['variant']} | {r['us']:.1f} | "
              f"{r['graph_us']:.1f} | {r['gbps']:.0f} | {r['frac']:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
