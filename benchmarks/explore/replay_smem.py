"""gdn_commit with its state tile in shared memory (csrc_triton/gdn_commit_smem.py, Gluon, sm_90+)
against the production replay kernel, same problems, one run: each variant checked against the
production commit first (state within 1e-5 relative, window bit-equal), then timed.

    python benchmarks/explore/replay_smem.py [--batches 8 64 256] [--tree] [--configs 64/2/32/1 ...]

A config is block_v/warps/chunk/tma_store[/fused] (tma_store 0: the tile goes back by pointer stores;
fused 0: two passes over the tile per token instead of one).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/common.py
from common import copy_ceiling_gbps  # noqa: E402
from replay_sweep import K, problem  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--tree", action="store_true")
    parser.add_argument("--configs", nargs="+", default=["64/2/32/1"])
    args = parser.parse_args()
    smem = __import__(triton_kernels().__name__ + ".gdn_commit_smem", fromlist=["x"])
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    nodes = 8 if args.tree else 4
    for batch in args.batches:
        gen = torch.Generator(device="cuda").manual_seed(batch)
        op, launch, tensors, kwargs, layers, dim, state_numel, heads, _ = problem("gdn", batch, nodes, gen)
        slots = torch.arange(batch, device="cuda")
        steps = torch.randint(0, nodes, (batch,), device="cuda", generator=gen)
        if args.tree:
            parents = torch.tensor([[-1, 0, 0, 0, 1, 1, 2, 3]] * batch, device="cuda")
            accepted = sum([1, 2, 2, 2, 3, 3, 3, 3][s] for s in steps.tolist())
        else:
            parents = None
            accepted = int(steps.sum()) + batch
        a, kw = op.kernel_arguments(*tensors, slots, slots, steps, parents, layout="token_major", **kwargs)
        nbytes = (2 * layers * batch * state_numel * 4 + layers * accepted * (dim * 2 + 2 * heads * 4)
                  + layers * batch * dim * (K - 1) * 2 * 2)
        print(f"\nB={batch} ({'tree' if args.tree else 'chain'}, {accepted} accepted): "
              f"{nbytes / 1e6:.1f} MB = {nbytes / ceiling / 1e3:.1f} us at the ceiling", flush=True)
        ssm0, conv0 = a[0].clone(), a[1].clone()
        launch(*a, **kw)
        want_ssm, want_conv = a[0].clone(), a[1].clone()

        def timed(name, run):
            a[0].copy_(ssm0)
            a[1].copy_(conv0)
            run()
            err = ((a[0] - want_ssm).abs().max() / want_ssm.abs().max()).item()
            same_conv = torch.equal(a[1], want_conv)
            ms = triton.testing.do_bench(run, warmup=25, rep=150)
            print(f"{name:>14} {ms * 1e3:>9.1f} us {100 * nbytes / (ms * 1e-3) / 1e9 / ceiling:>5.0f}%"
                  f"   state rel err {err:.1e}, window {'equal' if same_conv else 'DIFFERS'}", flush=True)

        timed("production", lambda: launch(*a, **kw))
        for config in args.configs:
            block, warps, chunk, store, *fused = (int(x) for x in config.split("/"))
            try:
                timed(config, lambda: smem.launch_gdn_commit_smem(*a, **kw, block_v=block, num_warps=warps,
                                                                  chunk=chunk, tma_store=bool(store),
                                                                  fused=bool(fused[0]) if fused else True))
            except Exception as error:
                print(f"{config:>14}  failed: {type(error).__name__}: {str(error)[:160]}", flush=True)
        del tensors, a, kw
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
