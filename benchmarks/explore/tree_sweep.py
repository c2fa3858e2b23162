"""The tree commit's launch choices at small batches, in interleaved rounds against the dense fallback.

Per (shape, B): the dense fallback (convwin.scatter of one [dim, K-1] window per node), the public
op, and the tree kernel at each --configs entry, each checked equal to the fallback's result, then
timed by CUDA-graph replay in --rounds rounds, every variant once a round (launches of ~2 us differ
by ~0.1 us between runs; interleaving keeps the comparison within one stretch of time), after a
round that is not counted (in the first case of a run, the variants timed first ran up to 0.2 us
faster in the first round than in any later one). --previous loads another version of
csrc_triton/scatter_tree.py (e.g. `git show REV:csrc_triton/scatter_tree.py > /tmp/previous.py`)
beside the package's kernels and times its default launch too.

    python benchmarks/explore/tree_sweep.py                                     (CUDA; B 1 8)
    python benchmarks/explore/tree_sweep.py --batches 1 2 4 8 16 --configs 256/1 512/1 512/2 1024/4
    python benchmarks/explore/tree_sweep.py --configs 512/1 512/1/columns 512/1/links --previous /tmp/previous.py

A --configs entry is common.tree_config's CHANNELS/WARPS[/preload|/links][/columns]: channels per
program, warps, and optionally the parent links loaded up front or walked link by link, and an
interleaved window stored as each thread's own K-1 vectors instead of lane rows.
"""

import argparse
import functools
import importlib.util
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/common.py
import common  # noqa: E402  (before sgl_convwin: without CUDA it sets TRITON_INTERPRET=1)
import sgl_convwin  # noqa: E402
from common import SHAPES, graph_time_us  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402


def previous_kernels(path: str):
    """Another scatter_tree.py, imported as a sibling of the package's kernels (its relative
    imports resolve to the package's _common)."""
    package = triton_kernels().__name__
    spec = importlib.util.spec_from_file_location(f"{package}._previous_scatter_tree", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sweep(shape, batch, configs, previous, rounds, num_nodes=8, topk=3):
    layers, dim = SHAPES[shape]
    state, rows, dense, dst, src, nodes, parents = common.tree_commit_problem(
        layers, dim, batch, common.tree_parents(num_nodes, topk), common.KERNEL_SIZE)
    tensors = (state, rows, dst, src, nodes, parents)
    variants = [("dense fallback", lambda: sgl_convwin.scatter(state, dense, dst, src, nodes)),
                ("public op", lambda: sgl_convwin.scatter_tree(*tensors))]
    if previous is not None:
        variants.append(("previous kernel", functools.partial(previous.launch_scatter_tree, *tensors)))
    launch = triton_kernels().scatter_tree.launch_scatter_tree
    variants += [(name, functools.partial(launch, *tensors, **kwargs)) for name, kwargs in configs]
    variants[0][1]()
    want = state.clone()
    for name, fn in variants:
        state.zero_()
        fn()
        assert torch.equal(state, want), name
    times = {name: [] for name, _ in variants}
    for counted in [False] + [True] * rounds:
        for name, fn in variants:
            us = graph_time_us(fn)
            if counted:
                times[name].append(us)
    fallback = min(times["dense fallback"])
    for name, _ in variants:
        best = min(times[name])
        rounds_text = " / ".join(f"{t:.2f}" for t in times[name])
        print(f"| {shape} | {batch} | {name} | {best:.2f} | {rounds_text} | {best - fallback:+.2f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["qwen3next-tp1", "qwen3next-tp4", "nemotronh-tp1"],
                        choices=list(SHAPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--configs", nargs="+", type=lambda text: (text, common.tree_config(text)), default=[],
                        help="CHANNELS/WARPS[/preload|/links][/columns] ...")
    parser.add_argument("--previous", default=None, help="another version of csrc_triton/scatter_tree.py")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if not common.needs_cuda("this sweep"):
        return 1
    common.print_environment()
    previous = previous_kernels(args.previous) if args.previous else None
    print(f"tree commit, N=8 topk 3, bf16, graph replay us/launch; best of {args.rounds} interleaved rounds "
          "after one not counted")
    print("| shape | B | variant | best | rounds | against the fallback's best |")
    print("|---|---|---|---|---|---|")
    for shape in args.shapes:
        for batch in args.batches:
            sweep(shape, batch, args.configs, previous, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
