"""Commit (scatter) benchmark: this package's op on every layout against today's baselines.

    python benchmarks/bench_scatter.py                 # H200 tables (needs CUDA)
    python benchmarks/bench_scatter.py --verify-only   # check every variant on tiny shapes (CPU too)

Variants: torch advanced indexing; two baseline Triton kernels that stand for what engines run
today (common.py: a flat copy out of a dense buffer, and a per-element strided gather out of the
channel-major view); and sgl_convwin.scatter on each layout. Per row: the median of
triton.testing.do_bench, the time per launch from CUDA-graph replays, the effective bandwidth on
the bytes the commit must move (read K-1 columns per window + write them), and that bandwidth as
a fraction of a device-to-device copy ceiling measured in the same run. --tree adds the tree
commit, --eager-only times the host path of one eager call of every op (public function and
registered op) against a raw Triton launch of its kernels.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys

import torch

import common  # before sgl_convwin: without CUDA it sets TRITON_INTERPRET=1
import sgl_convwin
from common import SHAPES, commit_problem, graph_time_us, markdown_header, markdown_row, tree_config
from sgl_convwin import reference

# (name, layout of the windows it reads, function)
VARIANTS = [
    ("torch indexing (dense)", "dense", common.torch_indexing),
    ("baseline dense flat copy", "dense", common.dense_flat_copy),
    ("baseline channel_major strided", "channel_major", common.channel_major_strided),
    ("convwin dense", "dense", sgl_convwin.scatter),
    ("convwin channel_major", "channel_major", sgl_convwin.scatter),
    ("convwin token_major", "token_major", sgl_convwin.scatter),
]


def verify(device: str) -> bool:
    ok = True
    for layers, slots, dim, D, K, B in [(2, 6, 40, 4, 4, 3), (3, 5, 24, 2, 3, 5), (1, 4, 16, 8, 5, 2)]:
        for name, layout, fn in VARIANTS:
            for dtype in (torch.float32, torch.bfloat16):
                conv_state, windows, dst, src, steps = commit_problem(layers, slots, dim, D, K, B, dtype, layout, device)
                expected = reference.scatter_reference(conv_state, windows, dst, src, steps)
                fn(conv_state, windows, dst, src, steps)
                good = torch.equal(conv_state.cpu(), expected)
                ok &= good
                if not good:
                    print(f"MISMATCH: {name} L={layers} dim={dim} D={D} K={K} B={B} {dtype}")
    print("verify:", "all variants match the oracle" if ok else "FAILED")
    return ok


def bench(shapes, batches, drafts, dtypes, out_json):
    ceiling = common.copy_ceiling_gbps()
    common.print_environment(ceiling)
    rows = []
    for shape_name in shapes:
        layers, dim = SHAPES[shape_name]
        for dtype_name in dtypes:
            dtype = common.DTYPES[dtype_name]
            for D in drafts:
                for B in batches:
                    slots = max(B, 8)
                    for name, layout, fn in VARIANTS:
                        problem = commit_problem(layers, slots, dim, D, common.KERNEL_SIZE, B, dtype, layout, "cuda")
                        expected = reference.scatter_reference(*problem) if B <= 8 else None
                        fn(*problem)
                        if expected is not None:
                            assert torch.equal(problem[0].cpu(), expected), name
                        us = common.do_bench_us(lambda: fn(*problem))
                        graph_us = graph_time_us(lambda: fn(*problem))
                        nbytes = common.commit_bytes(B, layers, dim, common.KERNEL_SIZE, problem[0].element_size())
                        gbps = nbytes / (us * 1e-6) / 1e9
                        row = dict(shape=shape_name, dtype=dtype_name, D=D, B=B, variant=name,
                                   us=us, graph_us=graph_us, gbps=gbps, frac=gbps / ceiling)
                        rows.append(row)
                        if out_json:  # after every row: a run cut short keeps what it measured
                            common.write_results(out_json, ceiling, rows)
                        print(common.format_commit_row(row), flush=True)
                        problem = None  # (not del: the lambdas above read it, which pyflakes takes for undefined)
    return rows, ceiling


GDN_TP1 = dict(layers=36, num_k_heads=16, head_k_dim=128, num_v_heads=32, head_v_dim=128)  # Qwen3-Next-80B
MAMBA2_TP1 = dict(layers=24, num_heads=128, head_dim=64, n_groups=8, d_state=128)  # Nemotron-H-8B


def eager_calls(device, conv_shape=SHAPES["qwen3next-tp1"], gdn=GDN_TP1, mamba2=MAMBA2_TP1, slots=8, num_draft=4):
    """One B = 1 call ``(args, kwargs)`` of every op that launches a kernel: bf16 caches, token_major
    buffers, chains (scatter_tree: num_draft roots), zeros. The replay commits' row is padding
    (dst_slots -1): the host path is the same, and the GPU work stays shorter than a launch, as a
    B = 1 commit of the conv windows is, so the host time bounds every row."""
    K, bf16 = common.KERNEL_SIZE, dict(dtype=torch.bfloat16, device=device)
    layers, dim = conv_shape
    layer = min(3, layers - 1)
    index = torch.zeros(1, dtype=torch.int64, device=device)
    padding = torch.full((1,), -1, dtype=torch.int64, device=device)
    buffer = sgl_convwin.alloc_windows(layers, slots, dim, num_draft, K, layout="token_major", device=device)
    conv_state = torch.zeros(layers, slots, dim, K - 1, **bf16)
    x = torch.zeros(1, num_draft, dim, **bf16)
    parents = torch.full((1, num_draft), -1, dtype=torch.int64, device=device)
    heads = gdn["num_v_heads"]
    gates = sgl_convwin.alloc_gates(layers, slots, num_draft, heads, device=device)
    g = torch.zeros(1, num_draft, heads, device=device)
    calls = {
        "scatter": ((conv_state, sgl_convwin.window_view(buffer, "token_major", num_draft, K), index, index, index),
                    {}),
        "scatter_tree": ((conv_state, buffer, index, index, index, parents), {}),
        "capture": ((buffer, conv_state, x, index, index, layer), {}),
        "causal_conv1d_verify": ((torch.zeros_like(x), buffer, conv_state, x, torch.zeros(dim, K, **bf16),
                                  torch.zeros(dim, **bf16), index, index, layer), dict(activation="silu")),
        "capture_gates": ((gates, g, g, index, layer), {}),
    }
    for name, sizes in (("gdn_commit", gdn), ("mamba2_commit", mamba2)):
        sizes = dict(sizes)
        layers = sizes.pop("layers")
        if name == "gdn_commit":
            dim = 2 * sizes["num_k_heads"] * sizes["head_k_dim"] + sizes["num_v_heads"] * sizes["head_v_dim"]
            state, gates = (sizes["num_v_heads"], sizes["head_k_dim"], sizes["head_v_dim"]), (sizes["num_v_heads"], 2)
        else:
            dim = sizes["num_heads"] * sizes["head_dim"] + 2 * sizes["n_groups"] * sizes["d_state"]
            state, gates = (sizes["num_heads"], sizes["head_dim"], sizes["d_state"]), (sizes["num_heads"], 1)
        tensors = [
            torch.zeros(layers, slots, *state, device=device),
            torch.zeros(layers, slots, dim, K - 1, **bf16),
            sgl_convwin.alloc_windows(layers, slots, dim, num_draft, K, layout="token_major", device=device),
            sgl_convwin.alloc_gates(layers, slots, num_draft, gates[0], num_gates=gates[1], device=device),
            torch.zeros(layers, dim, K, **bf16),
        ]
        if name == "mamba2_commit":
            tensors.append(torch.zeros(layers, sizes["num_heads"], device=device))  # A
            sizes["conv_bias"] = torch.zeros(layers, dim, **bf16)
        calls[name] = ((*tensors, padding, index, index), sizes)
    return calls


def raw_calls(name, args, kwargs):
    """The kernel launches (csrc_triton._common.KernelCall) that ``sgl_convwin.<name>(*args, **kwargs)``
    makes, computed once from its checked kernel arguments: what a raw Triton launch repeats."""
    from sgl_convwin._kernels import triton_kernels

    kernels = triton_kernels()
    kernel_call = kernels._common.KernelCall
    kernel_args, kernel_kwargs = getattr(sgl_convwin, name).kernel_arguments(*args, **kwargs)
    if name == "scatter":
        grid, launch_args, launch_kwargs = kernels.scatter.scatter_launch_args(*kernel_args)
        return [kernel_call(kernels.scatter._scatter_windows_kernel, grid, launch_args[:5], launch_args[5:],
                            launch_kwargs)]
    if name == "scatter_tree":
        state, rows, dst, src, nodes, parents = kernel_args
        index_strides = (dst.stride(0), src.stride(0), nodes.stride(0), parents.stride())
        grid, scalars, constexprs = kernels.scatter_tree._plan_scatter_tree(
            state, rows, nodes.shape[0], parents.shape[1], index_strides)
        return [kernel_call(kernels.scatter_tree._scatter_tree_kernel, grid, kernel_args, scalars, constexprs)]
    if name == "capture":
        dest, state, x, buffer_slots, state_slots, layer, parents = kernel_args
        return [kernels.verify._verify_call(None, dest, state, x, None, None, buffer_slots, state_slots, layer,
                                            parents, silu=False, **kernel_kwargs)]
    if name == "causal_conv1d_verify":
        return [kernels.verify._verify_call(*kernel_args, **kernel_kwargs)]
    if name == "capture_gates":
        return [kernels.replay._capture_gates_call(*kernel_args)]
    ssm, conv, tokens, history, gates, weight, bias, *rest = kernel_args  # rest: [A,] dst, src, steps, parents
    replay = kernels.gdn_commit._gdn_replay_call if name == "gdn_commit" else kernels.mamba2_commit._mamba2_replay_call
    window = kernels.replay._path_window_call(conv, tokens, history, *rest[-4:])
    return [replay(ssm, conv, tokens, gates, weight, bias, *rest, **kernel_kwargs), window]


def raw_launch(calls):
    """A function launching ``calls`` straight through Triton, every argument prepared."""
    launches = [(call.kernel, call.grid, call.tensors + call.scalars, call.constexprs) for call in calls]

    def launch():
        for kernel, grid, args, kwargs in launches:
            kernel[grid](*args, **kwargs)

    return launch


def call_of(fn, *args, **kwargs):
    return lambda: fn(*args, **kwargs)


def eager_overhead(calls=1000, rounds=15, device="cuda", **shapes):
    """Host time per call at B=1 (the GPU work is shorter than the launch, so the host bounds it)
    of every op that launches a kernel: a raw Triton launch of its kernel(s) with every argument
    prepared, the public function ``sgl_convwin.<op>`` and the registered ``torch.ops.convwin.<op>``
    (scatter also through its launcher), each against its raw launch, timed in interleaved rounds
    (common.interleaved_host_times); best and median round. ``shapes``: eager_calls's."""
    from sgl_convwin._kernels import triton_kernels

    candidates = []  # name, call, the raw launch it is compared with
    for name, (args, kwargs) in eager_calls(device, **shapes).items():
        public = getattr(sgl_convwin, name)
        bound = inspect.signature(public.cuda_impl).bind(*args, **kwargs)  # the op's own argument order
        raw_name = f"raw Triton launch of {name} (args prepared)"
        candidates.append((raw_name, raw_launch(raw_calls(name, args, kwargs)), raw_name))
        if name == "scatter":
            launcher_args = public.kernel_arguments(*args)[0]
            candidates.append(("csrc_triton launch_scatter", call_of(triton_kernels().launch_scatter, *launcher_args),
                               raw_name))
        candidates.append((f"sgl_convwin.{name} (public)", call_of(public, *args, **kwargs), raw_name))
        candidates.append((f"torch.ops.convwin.{name}", call_of(public.op, *bound.args, **bound.kwargs), raw_name))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = common.interleaved_host_times({name: fn for name, fn, _ in candidates}, calls=calls, rounds=rounds,
                                          sync=sync)
    print(f"\neager host time per call, B=1, Qwen3-Next TP1 shapes, mamba2_commit at Nemotron-H-8B's (the replay "
          f"commits' row is padding; {rounds} interleaved rounds x {calls} calls)")
    print(markdown_header("call", "best us per call", "median us per call", "vs its raw launch (best)",
                          "vs its raw launch (median)"))
    results = []
    for name, _, ref in candidates:
        (best, median), (ref_best, ref_median) = times[name], times[ref]
        print(markdown_row(name, f"{best:.2f}", f"{median:.2f}", f"{best / ref_best:.2f}x", f"{median / ref_median:.2f}x"))
        results.append((name, best))
    return results


def tree_config_name(config: dict) -> str:
    walk = {None: "", True: ", links preloaded", False: ", link by link"}[config.get("preload_parents")]
    walk += ", own vectors stored" if config.get("lane_rows") is False else ""
    return f"scatter_tree kernel, {config['channels']} channels / {config['num_warps']} warps{walk}"


def bench_tree(batches, shape="qwen3next-tp1", num_nodes=8, topk=3, configs=()):
    """Tree commit: scatter_tree on token_major rows (N+K-2 rows per slot) against the dense
    fallback engines use for trees today (one [dim, K-1] window per node); ``configs``: also the
    tree kernel with these launcher arguments (tree_config; exploration)."""
    from sgl_convwin._kernels import triton_kernels

    launch_tree = triton_kernels().launch_scatter_tree
    (layers, dim), K = SHAPES[shape], common.KERNEL_SIZE
    parents_list = common.tree_parents(num_nodes, topk)
    print(f"\ntree commit, N={num_nodes} nodes (topk {topk}: parents {parents_list}), {shape}, bf16")
    print(markdown_header("B", "variant", "graph replay (us/launch)", "GB/s", "cache bytes per slot"))
    for B in batches:
        slots = max(B, 8)
        conv_state, rows, dense, dst, src, nodes, parents = common.tree_commit_problem(layers, dim, B, parents_list, K)
        want = conv_state.clone()
        sgl_convwin.scatter(want, dense, dst, src, nodes)
        variants = [
            ("convwin scatter_tree (token_major rows)", lambda: sgl_convwin.scatter_tree(conv_state, rows, dst, src, nodes, parents), rows),
            ("convwin scatter (dense tree fallback)", lambda: sgl_convwin.scatter(conv_state, dense, dst, src, nodes), dense),
        ]
        for config in configs:
            variants.append((tree_config_name(config), functools.partial(
                launch_tree, conv_state, rows, dst, src, nodes, parents, **config), rows))
        for name, fn, cache in variants:
            conv_state.zero_()
            fn()
            assert torch.equal(conv_state, want), name
            us = graph_time_us(fn)
            nbytes = common.commit_bytes(B, layers, dim, K, 2)
            per_slot = cache.numel() * cache.element_size() // slots
            print(markdown_row(B, name, f"{us:.1f}", f"{nbytes / (us * 1e-6) / 1e9:.0f}", per_slot), flush=True)
        rows = dense = conv_state = want = None  # (not del: the lambdas above read them)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify-only", action="store_true")
    parser.add_argument("--shapes", nargs="+", default=["qwen3next-tp1"], choices=list(SHAPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64, 256, 512])
    parser.add_argument("--drafts", nargs="+", type=int, default=[4])
    parser.add_argument("--dtypes", nargs="+", default=["bf16"], choices=list(common.DTYPES))
    parser.add_argument("--json", default=None, help="write all rows here")
    parser.add_argument("--tree", action="store_true", help="also time the tree commit")
    parser.add_argument("--tree-only", action="store_true", help="time only the tree commit")
    parser.add_argument("--tree-configs", nargs="+", type=tree_config, default=[],
                        help="tree kernel launches to explore: CHANNELS/WARPS[/preload|/links][/columns] ...")
    parser.add_argument("--eager-only", action="store_true", help="time only the eager host overhead")
    args = parser.parse_args(argv)
    if not verify(common.DEVICE):
        return 1
    if args.verify_only:
        return 0
    if not common.needs_cuda():
        return 1
    if args.tree_only:
        for shape in args.shapes:
            bench_tree(args.batches, shape, configs=args.tree_configs)
        return 0
    eager_overhead()
    if args.eager_only:
        return 0
    if args.tree:
        bench_tree(args.batches)
    rows, ceiling = bench(args.shapes, args.batches, args.drafts, args.dtypes, args.json)
    print()
    print(markdown_header("shape", "dtype", "D", "B", "variant", "do_bench median (us)", "graph replay (us/launch)",
                          "GB/s", f"of copy ceiling ({ceiling:.0f} GB/s)"))
    for r in rows:
        print(markdown_row(r["shape"], r["dtype"], r["D"], r["B"], r["variant"], f"{r['us']:.1f}",
                           f"{r['graph_us']:.1f}", f"{r['gbps']:.0f}", f"{r['frac']:.1%}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
