"""Exploration (kept as a record): does capping the registers of the fused verify rows kernel
raise its throughput? Nsight Compute (docs/benchmarks.md) found it at 80 registers per thread
(chain) and 37.5% theoretical occupancy, latency-bound. Triton's `maxnreg` launch option caps the
registers per thread (the compiler spills above it); this times the production plan with caps, and
with more warps per program, against the default, one layer at the Qwen3-Next TP1 shape.

    python benchmarks/explore_verify_registers.py      (CUDA)
"""

import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_scatter import copy_ceiling_gbps, graph_time_us  # noqa: E402
from bench_verify import tree_parents  # noqa: E402
from explore_verify_kernel import layer_bytes, layer_problem  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402

VARIANTS = [  # name: launch options changed from the production plan's
    ("default", {}),
    ("maxnreg 64", dict(maxnreg=64)),
    ("maxnreg 56", dict(maxnreg=56)),
    ("maxnreg 48", dict(maxnreg=48)),
    ("2 warps", dict(num_warps=2)),
    ("2 warps, maxnreg 64", dict(num_warps=2, maxnreg=64)),
]


def main():
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    verify = triton_kernels().verify
    dim, K = 8192, 4
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"triton {triton.__version__}")
    print("fused verify rows kernel (conv + capture), one layer, dim 8192, K=4, bf16, token_major")
    print("| draft | B | variant | registers | spills | graph replay (us/launch) | of copy ceiling | out and buffer equal to default |")
    print("|---|---|---|---|---|---|---|---|")
    for tree, num_nodes in ((False, 4), (True, 8)):
        parents_list = tree_parents(num_nodes, 3 if tree else None)
        for B in (8, 64, 256):
            buffer, _, state, x, out, weight, bias, slots_b, slots_s, parents = layer_problem(
                B, num_nodes, parents_list if tree else None, "token_major", dim, K)
            kernel, grid, scalars, flags = verify._plan(
                out, buffer, state, x, weight, bias, slots_b, slots_s, parents, False, True, None, None)
            tensors = (buffer, state, x, out, weight, bias, slots_b, slots_s,
                       parents if parents is not None else slots_b, 0, 0)
            nbytes = layer_bytes(B, num_nodes, dim, K, "token_major")
            reference = None
            for name, options in VARIANTS:
                launch_flags = {**flags, **options}
                out.zero_()
                buffer.zero_()
                compiled = kernel[grid](*tensors, *scalars, **launch_flags)
                if reference is None:
                    reference = (out.clone(), buffer.clone())
                same = "yes" if torch.equal(out, reference[0]) and torch.equal(buffer, reference[1]) else "NO"
                us = graph_time_us(lambda: kernel[grid](*tensors, *scalars, **launch_flags))
                draft = f"tree N={num_nodes} topk 3" if tree else f"chain D={num_nodes}"
                gbps = nbytes / (us * 1e-6) / 1e9
                print(f"| {draft} | {B} | {name} | {compiled.n_regs} | {compiled.n_spills} | {us:.1f} | "
                      f"{gbps / ceiling:.1%} | {same} |", flush=True)
            del buffer
    return 0


if __name__ == "__main__":
    sys.exit(main())
