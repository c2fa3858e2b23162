"""One kernel case, launched a few times, for a profiler to catch (Nsight Compute on the H200).

    ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:_verify_node_loop_kernel \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        python3 benchmarks/explore/profile_one.py verify-chain

`scripts/gpu_checklist.sh OUT profile` runs every case this way. Shapes: Qwen3-Next TP1 (dim 8192,
K = 4, bf16); the verify cases are one layer at B = 256, and so is stream-chain (bench_verify's
one-kernel stream of a chain layer's bytes, their floor); the commit cases 36 layers; the replay
cases are benchmarks/explore/replay_sweep.py's shapes.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/common.py
import common  # noqa: E402  (before sgl_convwin: without CUDA it sets TRITON_INTERPRET=1)
import sgl_convwin  # noqa: E402
from common import SHAPES, commit_problem, tree_parents, verify_layer_problem  # noqa: E402


def verify_case(num_nodes, topk, batch=256, layout="token_major"):
    """One verify layer at B = 256 (as many slots as requests)."""
    dim, kernel_size = SHAPES["qwen3next-tp1"][1], common.KERNEL_SIZE
    buffer, _, state, x, out, weight, bias, slots_b, slots_s, parents = verify_layer_problem(
        batch, num_nodes, tree_parents(num_nodes, topk) if topk else None, layout, dim, kernel_size)
    return lambda: sgl_convwin.causal_conv1d_verify(
        out, buffer, state, x, weight, bias, slots_b, slots_s, 0, parents, layout=layout, activation="silu")


def stream_case(num_nodes=4, batch=256, block=4096, warps=4):
    """bench_verify's one-kernel stream of a token_major verify layer's bytes, read and written in
    their proportion (B = 256): the floor the verify kernels are compared with."""
    import bench_verify

    dim, kernel_size = SHAPES["qwen3next-tp1"][1], common.KERNEL_SIZE
    nbytes = common.layer_bytes(dim, kernel_size, num_nodes, batch, "token_major")
    read = common.layer_bytes(dim, kernel_size, num_nodes, batch, "token_major", written=False)
    return bench_verify.mix_stream_launch(read, nbytes - read, block, warps, "cuda")


def commit_case(layout, num_draft, batch):
    layers, dim = SHAPES["qwen3next-tp1"]
    problem = commit_problem(layers, max(batch, 8), dim, num_draft, common.KERNEL_SIZE, batch, torch.bfloat16,
                             layout, "cuda")
    return lambda: sgl_convwin.scatter(*problem)


def replay_case(mixer, batch=64, nodes=4):
    """One replay commit of every layer (chain, D = 4, steps uniform) at B = 64; replay_sweep's shapes."""
    from replay_sweep import problem

    gen = torch.Generator(device="cuda").manual_seed(0)
    op, _, tensors, kwargs, *_ = problem(mixer, batch, nodes, gen)
    slots = torch.arange(batch, device="cuda")
    steps = torch.randint(0, nodes, (batch,), device="cuda", generator=gen)
    return lambda: op(*tensors, slots, slots, steps, **kwargs)


VERIFY_CASES = {  # name: (nodes, topk or None for a chain, layout, the kernel the launcher picks at B = 256)
    "verify-chain": (4, None, "token_major", "_verify_node_loop_kernel"),
    "verify-tree": (8, 3, "token_major", "_verify_small_tree_kernel"),
    "verify-channel-major-tree": (8, 3, "channel_major", "_verify_small_tree_kernel"),
    "verify-channel-major-chain": (4, None, "channel_major", "_verify_small_tree_kernel"),
    "verify-dense-chain": (4, None, "dense", "_verify_small_tree_kernel"),
}
CASES = {  # name: (what it runs, the kernel ncu should filter on)
    **{name: ((lambda nodes=nodes, topk=topk, layout=layout: verify_case(nodes, topk, layout=layout)), kernel)
       for name, (nodes, topk, layout, kernel) in VERIFY_CASES.items()},
    "stream-chain": (stream_case, "_mix_stream_kernel"),
    "commit-token-major-b8": (lambda: commit_case("token_major", 4, 8), "_scatter_windows_kernel"),
    "commit-dense-b8": (lambda: commit_case("dense", 4, 8), "_scatter_windows_kernel"),
    "commit-channel-major-d16": (lambda: commit_case("channel_major", 16, 256), "_scatter_windows_kernel"),
    "gdn-commit-b64": (lambda: replay_case("gdn"), "_gdn_replay_kernel"),
    "mamba2-commit-b64": (lambda: replay_case("mamba2"), "_mamba2_replay_kernel"),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=list(CASES))
    parser.add_argument("--print-kernel", action="store_true", help="print the kernel name to filter on")
    args = parser.parse_args()
    build, kernel = CASES[args.case]
    if args.print_kernel:
        print(kernel)
        return 0
    if not common.needs_cuda("profiling"):
        return 1
    run = build()
    for _ in range(4):
        run()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
