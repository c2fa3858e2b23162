"""Block/warps sweep of the gdn_commit replay kernel at a real model shape, against a copy ceiling
measured in the same run; one table per batch size. Where the replay launcher's default (64 value
columns over 2 warps, csrc_triton/gdn_commit.py) comes from.

    python benchmarks/explore/replay_sweep.py [--batches 1 8 64 256] [--draft 4] [--tree]
"""

from __future__ import annotations

import argparse

import torch
import triton.testing

import sgl_convwin
from sgl_convwin._kernels import triton_kernels

L, HK, DK, HV, DV, K = 36, 16, 128, 32, 128, 4
DIM = 2 * HK * DK + HV * DV


def copy_ceiling_gbps() -> float:
    src = torch.empty(2**30 // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300)
    return 2 * src.numel() * 4 / ms / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--draft", type=int, default=4)
    parser.add_argument("--tree", action="store_true", help="a topk-3 tree of 8 nodes instead of a chain")
    parser.add_argument("--blocks", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s; L={L} Hk={HK} Hv={HV} dk={DK} dv={DV} dim={DIM} K={K}", flush=True)
    launch = triton_kernels().launch_gdn_commit
    nodes = 8 if args.tree else args.draft
    parents_row = [-1, 0, 0, 0, 1, 1, 2, 3][:nodes] if args.tree else None
    for batch in args.batches:
        gen = torch.Generator(device="cuda").manual_seed(batch)
        ssm = torch.randn(L, batch, HV, DK, DV, device="cuda", generator=gen)
        conv = torch.randn(L, batch, DIM, K - 1, device="cuda", dtype=torch.bfloat16, generator=gen)
        buffer = torch.randn(L, batch, nodes + K - 2, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        gates = torch.rand(L, batch, nodes, 2, HV, device="cuda", generator=gen)
        gates[:, :, :, 0] *= -1
        weight = torch.randn(L, DIM, K, device="cuda", dtype=torch.bfloat16, generator=gen)
        slots = torch.arange(batch, device="cuda")
        if args.tree:
            steps = torch.randint(0, nodes, (batch,), device="cuda", generator=gen)
            parents = torch.tensor([parents_row] * batch, device="cuda")
            depth = [1, 2, 2, 2, 3, 3, 3, 3]
            accepted = sum(depth[s] for s in steps.tolist())
        else:
            steps = torch.randint(0, nodes, (batch,), device="cuda", generator=gen)
            parents = None
            accepted = int(steps.sum()) + batch
        kwargs = dict(layout="token_major", num_k_heads=HK, head_k_dim=DK, num_v_heads=HV, head_v_dim=DV)
        a, kw = sgl_convwin.gdn_commit.kernel_arguments(ssm, conv, buffer, gates, weight, slots, slots, steps,
                                                        parents, **kwargs)
        state_bytes = 2 * L * batch * HV * DK * DV * 4
        input_bytes = L * accepted * (DIM * 2 + 2 * HV * 4) + L * batch * DIM * (K - 1) * 2 * 2
        nbytes = state_bytes + input_bytes
        print(f"\nB={batch} ({'tree' if args.tree else 'chain'}, {accepted} accepted tokens): "
              f"{nbytes / 1e6:.1f} MB to move = {nbytes / ceiling / 1e3:.1f} us at the ceiling", flush=True)
        print(f"{'block_v':>8} {'warps':>6} {'us':>9} {'% ceiling':>10}")
        for block_v in args.blocks:
            for warps in args.warps:
                run = lambda: launch(*a, **kw, block_v=block_v, num_warps=warps)  # noqa: E731
                try:
                    ms = triton.testing.do_bench(run, warmup=25, rep=150)
                except Exception as error:  # e.g. out of registers / shared memory
                    print(f"{block_v:>8} {warps:>6}  failed: {type(error).__name__}: {str(error)[:80]}")
                    continue
                print(f"{block_v:>8} {warps:>6} {ms * 1e3:>9.1f} {100 * nbytes / (ms * 1e-3) / 1e9 / ceiling:>9.0f}%",
                      flush=True)
        del ssm, conv, buffer, gates
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
