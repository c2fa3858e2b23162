"""The commit kernel's launch choices, swept per layout against the baselines (CUDA-graph replay).

Per (D, B, layout): the op's default plan; the same kernel with int64 per-element offsets; flat
against strided stores at each BLOCK/WARPS of --configs; the baseline of the layout (dense flat
copy, channel_major strided gather); for token_major, walking the SOURCE window flat (contiguous
loads, stores scattered with stride K-1). Every variant is checked against the op's result.
Small batches (B = 1, 8) are latency, long drafts gather channel_major windows from rows of D+K-2
elements per channel: the two places where the launcher's rules were chosen.

    python benchmarks/explore/commit_sweep.py                                   (CUDA; B 1 8 64, D 4)
    python benchmarks/explore/commit_sweep.py --batches 1 8 --drafts 2 4 8 --configs 1024/4 4096/4
    python benchmarks/explore/commit_sweep.py --drafts 8 16 --batches 1 8 64 256 --layouts channel_major
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/common.py
import common  # noqa: E402  (before sgl_convwin: without CUDA it sets TRITON_INTERPRET=1)
import sgl_convwin  # noqa: E402
from common import SHAPES, channel_major_strided, commit_problem, dense_flat_copy, graph_time_us  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402


def op_variant(problem, block=None, warps=4, walk_source=False, **launch):
    """The package's kernel with its launch arguments changed: block, warps, walk order, and the
    launcher's own choices (wide_offsets, flat_stores)."""
    kernels = triton_kernels().scatter
    grid, args, kwargs = kernels.scatter_launch_args(*problem, block=block, num_warps=warps, **launch)
    kwargs = dict(kwargs)  # the launcher's cached plan: never mutate it
    if walk_source:  # walk [K-1, dim] (the token_major source's own order), scatter the stores
        kwargs.update(WINDOW_MAJOR_ORDER=True, DST_CONTIGUOUS=False, SRC_CONTIGUOUS=True)

    def run():
        kernels._scatter_windows_kernel[grid](*args, **kwargs)

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3next-tp1", choices=list(SHAPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    parser.add_argument("--drafts", nargs="+", type=int, default=[4])
    parser.add_argument("--layouts", nargs="+", default=list(sgl_convwin.LAYOUTS), choices=sgl_convwin.LAYOUTS)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--configs", nargs="+", default=[(1024, 4), (4096, 4), (4096, 8)],
                        type=lambda text: tuple(int(v) for v in text.split("/")), help="BLOCK/WARPS ...")
    args = parser.parse_args()
    if not common.needs_cuda("this sweep"):
        return 1
    common.print_environment()
    dtype = common.DTYPES[args.dtype]
    layers, dim = SHAPES[args.shape]
    print(f"commit, {args.shape} ({layers} layers, dim {dim}), K=4, {args.dtype}, graph replay us/launch")
    print("| D | B | windows | variant | us | equal to oracle |")
    print("|---|---|---|---|---|---|")
    cases = [(D, B, layout) for D in args.drafts for B in args.batches for layout in args.layouts]
    for D, B, layout in cases:
        problem = commit_problem(layers, max(B, 8), dim, D, 4, B, dtype, layout, "cuda")
        problem[0].zero_()  # every variant starts from a zero state
        want = problem[0].clone()
        sgl_convwin.scatter(want, *problem[1:])
        variants = [("op default", lambda: sgl_convwin.scatter(*problem)),
                    ("op default, int64 offsets", op_variant(problem, wide_offsets=True))]
        for block, warps in args.configs:
            for flat in (True, False):
                variants.append((f"{'flat' if flat else 'strided'} stores {block}/{warps}w",
                                 op_variant(problem, block, warps, flat_stores=flat)))
        if layout == "dense":
            variants.append(("baseline dense flat copy (1024)", lambda: dense_flat_copy(*problem)))
        if layout == "channel_major":
            variants.append(("baseline channel_major strided (1024)", lambda: channel_major_strided(*problem)))
        if layout == "token_major":
            variants.append(("source-flat 1024/4w", op_variant(problem, 1024, 4, walk_source=True)))
        for name, fn in variants:
            problem[0].zero_()
            fn()
            ok = torch.equal(problem[0], want)
            us = graph_time_us(fn)
            print(f"| {D} | {B} | {layout} | {name} | {us:.2f} | {'yes' if ok else 'NO'} |", flush=True)
        del problem, want
    return 0


if __name__ == "__main__":
    sys.exit(main())
