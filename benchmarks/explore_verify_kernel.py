"""Exploration (kept as a record): channels per program and warps of the fused verify kernel
(csrc_triton/verify.py), one layer at the Qwen3-Next TP1 shape, against the copy ceiling.

    python benchmarks/explore_verify_kernel.py      (CUDA)
"""

import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sgl_convwin  # noqa: E402
from bench_scatter import copy_ceiling_gbps, graph_time_us  # noqa: E402
from bench_verify import tree_parents  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402


def layer_bytes(batch, num_nodes, dim, kernel_size, layout, element=2):
    width = kernel_size - 1
    written = batch * num_nodes * width * dim if layout == "dense" else batch * (num_nodes + width - 1) * dim
    return element * (2 * batch * num_nodes * dim + batch * width * dim + dim * (kernel_size + 1) + written)


def main():
    dim, K = 8192, 4
    kernels = triton_kernels()
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"triton {triton.__version__}")
    print("fused verify (conv + capture), one layer, dim 8192, K=4, bf16")
    print("| draft | layout | B | block/warps | graph replay (us/launch) | of copy ceiling |")
    print("|---|---|---|---|---|---|")
    configs = [None, (128, 1), (256, 1), (512, 2), (512, 4), (1024, 4)]
    for tree, num_nodes in ((False, 4), (True, 8)):
        parents_list = tree_parents(num_nodes, 3 if tree else None)
        for layout in ("token_major", "dense"):
            for B in (1, 8, 64, 256):
                slots = max(B, 8)
                generator = torch.Generator(device="cuda").manual_seed(0)
                buffer = sgl_convwin.alloc_windows(1, slots, dim, num_nodes, K, layout=layout, device="cuda")
                dest = buffer if layout != "channel_major" else buffer.transpose(-1, -2)
                state = torch.randn(1, slots, dim, K - 1, generator=generator, device="cuda").to(torch.bfloat16)
                x = torch.randn(B, num_nodes, dim, generator=generator, device="cuda").to(torch.bfloat16)
                out = torch.empty_like(x)
                weight = torch.randn(dim, K, generator=generator, device="cuda").to(torch.bfloat16)
                bias = torch.randn(dim, generator=generator, device="cuda").to(torch.bfloat16)
                slots_b = torch.randperm(slots, generator=generator, device="cuda")[:B]
                slots_s = torch.randperm(slots, generator=generator, device="cuda")[:B]
                parents = torch.tensor([parents_list] * B, device="cuda") if tree else None
                nbytes = layer_bytes(B, num_nodes, dim, K, layout)
                reference_out = None
                for config in configs:
                    block, warps = config if config is not None else (None, None)

                    def run():
                        kernels.launch_causal_conv1d_verify(
                            out, dest, state, x, weight, bias, slots_b, slots_s, 0, parents,
                            dense=layout == "dense", silu=True, block=block, num_warps=warps)

                    run()
                    if reference_out is None:
                        reference_out = out.clone()
                    assert torch.equal(out, reference_out), config
                    us = graph_time_us(run)
                    name = "default" if config is None else f"{block}/{warps}w"
                    if config is None:
                        name += f" ({kernels.verify.VERIFY_BLOCK}/{kernels.verify.VERIFY_WARPS}w)"
                    draft = f"tree N={num_nodes} topk 3" if tree else f"chain D={num_nodes}"
                    gbps = nbytes / (us * 1e-6) / 1e9
                    print(f"| {draft} | {layout} | {B} | {name} | {us:.1f} | {gbps / ceiling:.1%} |", flush=True)
                del buffer
    return 0


if __name__ == "__main__":
    sys.exit(main())
