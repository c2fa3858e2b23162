"""Channels per program and warps of the fused verify kernels (csrc_triton/verify.py), one layer
at the Qwen3-Next TP1 shape, against the copy ceiling: chain D = 4 and trees of 8 and 32 nodes,
every layout, B = 1 .. 256. The rows kernel's block rule (_rows_block) comes from this sweep.

    python benchmarks/explore/verify_sweep.py            (CUDA)
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/common.py
import common  # noqa: E402  (before sgl_convwin: without CUDA it sets TRITON_INTERPRET=1)
from common import graph_time_us, tree_parents, verify_layer_problem  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402


def layer_bytes(batch, num_nodes, dim, kernel_size, layout, element=2):
    width = kernel_size - 1
    written = batch * num_nodes * width * dim if layout == "dense" else batch * (num_nodes + width - 1) * dim
    return element * (2 * batch * num_nodes * dim + batch * width * dim + dim * (kernel_size + 1) + written)


def main():
    if not common.needs_cuda("this sweep"):
        return 1
    dim, K = common.SHAPES["qwen3next-tp1"][1], common.KERNEL_SIZE
    kernels = triton_kernels()
    ceiling = common.copy_ceiling_gbps()
    common.print_environment(ceiling)
    print("fused verify (conv + capture), one layer, dim 8192, K=4, bf16")
    print("| draft | layout | B | block/warps | graph replay (us/launch) | of copy ceiling | out equal to default |")
    print("|---|---|---|---|---|---|---|")
    configs = {  # None: the launcher's default
        "rows": [None, (16, 1), (32, 1), (64, 1), (128, 1), (64, 2)],
        "dense": [None, (128, 1), (512, 4)],
    }
    for tree, num_nodes in ((False, 4), (True, 8), (True, 32)):
        parents_list = tree_parents(num_nodes, 3 if tree else None)
        for layout in ("token_major", "channel_major", "dense"):
            for B in (1, 8, 64, 256):
                if num_nodes == 32 and B == 1:
                    continue
                buffer, dest, state, x, out, weight, bias, slots_b, slots_s, parents = verify_layer_problem(
                    B, num_nodes, parents_list if tree else None, layout, dim, K)
                nbytes = layer_bytes(B, num_nodes, dim, K, layout)
                reference_out = None
                for config in configs["dense" if layout == "dense" else "rows"]:
                    tuning = {} if config is None else dict(block=config[0], num_warps=config[1])

                    def run():
                        kernels.launch_causal_conv1d_verify(
                            out, dest, state, x, weight, bias, slots_b, slots_s, 0, parents,
                            dense=layout == "dense", silu=True, **tuning)

                    run()
                    if reference_out is None:
                        reference_out = out.clone()
                    same = "yes" if torch.equal(out, reference_out) else "NO"
                    us = graph_time_us(run)
                    name = "default" if config is None else f"{config[0]}/{config[1]}w"
                    draft = f"tree N={num_nodes} topk 3" if tree else f"chain D={num_nodes}"
                    gbps = nbytes / (us * 1e-6) / 1e9
                    print(f"| {draft} | {layout} | {B} | {name} | {us:.1f} | {gbps / ceiling:.1%} | {same} |", flush=True)
                del buffer
    return 0


if __name__ == "__main__":
    sys.exit(main())
