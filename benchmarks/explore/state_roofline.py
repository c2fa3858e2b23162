"""What a replay program's shape costs before its conv: in-place read + write of a Gated DeltaNet
state [L, B, Hv, dk, dv] (Qwen3-Next TP1: 36 layers, 32 heads, 128 x 128, fp32) by one program per
(layer, row, head, block of value columns), as gdn_commit's grid does, against the same bytes
moved by ``ssm.mul_(1)`` and by a copy, in one run.

    python benchmarks/explore/state_roofline.py [--batches 64 256] [--rounds 0 1 2 4]
        [--configs 64/2 128/4 ...] [--indirect on off] [--tma on off]

--rounds R applies R tokens of the gated delta rule (decay, S^T k, rank-1 update; k, v and the
gates read from a small table, as if already convolved) to each tile in registers; --indirect
reads the tile's slot from an index tensor first (the dependent load every commit makes). Each
variant prints its registers and spills; their states are checked against float64 math on the
first row before timing.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/common.py
from common import copy_ceiling_gbps  # noqa: E402

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None

LAYERS, HEADS, DK, DV = 36, 32, 128, 128
TABLE = 4  # tokens in the k / v / gates table


@triton.jit
def _state_rmw_kernel(
    desc, ssm_ptr, slots_ptr, k_ptr, v_ptr, gates_ptr,
    stride_layer, stride_slot, stride_head,
    HEADS: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr,
    ROUNDS: tl.constexpr, INDIRECT: tl.constexpr, TMA: tl.constexpr,
):
    V_BLOCKS: tl.constexpr = DV // BLOCK_V
    head = tl.program_id(0) // V_BLOCKS
    v_block = tl.program_id(0) % V_BLOCKS
    row = tl.program_id(1)
    layer = tl.program_id(2)
    if INDIRECT:
        slot = tl.load(slots_ptr + row)
    else:
        slot = row
    kk = tl.arange(0, DK)
    vv = v_block * BLOCK_V + tl.arange(0, BLOCK_V)
    k0 = tl.load(k_ptr + head * DK + kk)
    v0 = tl.load(v_ptr + head * DV + vv)
    base = ssm_ptr + layer.to(tl.int64) * stride_layer + slot.to(tl.int64) * stride_slot + head * stride_head
    tile = base + kk[:, None] * DV + vv[None, :]
    if TMA:
        state = desc.load([layer, slot.to(tl.int32), head, 0, v_block * BLOCK_V]).reshape(DK, BLOCK_V)
    else:
        state = tl.load(tile)
    for r in tl.static_range(ROUNDS):  # token r reads row r % 4 of the tables (TABLE)
        k = tl.load(k_ptr + ((r % 4) * HEADS + head) * DK + kk) if r > 0 else k0
        v = tl.load(v_ptr + ((r % 4) * HEADS + head) * DV + vv) if r > 0 else v0
        g = tl.load(gates_ptr + ((r % 4) * HEADS + head) * 2)
        beta = tl.load(gates_ptr + ((r % 4) * HEADS + head) * 2 + 1)
        state = state * tl.exp(g)
        u = beta * (v - tl.sum(state * k[:, None], axis=0))
        state = state + k[:, None] * u[None, :]
    tl.store(tile, state)


def reference(state, k, v, gates, head, rounds):
    """float64 gated delta rule on one head's [dk, dv] state."""
    s = state.double()
    for r in range(rounds):
        kr, vr = k[r % TABLE, head].double(), v[r % TABLE, head].double()
        g, beta = gates[r % TABLE, head].double()
        s = s * torch.exp(g)
        s = s + kr[:, None] * (beta * (vr - s.T @ kr))[None, :]
    return s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--configs", nargs="+", default=["64/2", "128/4", "32/1", "64/4", "128/8"])
    parser.add_argument("--indirect", nargs="+", choices=["on", "off"], default=["on"])
    parser.add_argument("--tma", nargs="+", choices=["on", "off"], default=["on", "off"])
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = torch.nn.functional.normalize(torch.randn(TABLE, HEADS, DK, device="cuda", generator=gen), dim=-1)
    v = torch.randn(TABLE, HEADS, DV, device="cuda", generator=gen)
    gates = torch.rand(TABLE, HEADS, 2, device="cuda", generator=gen)
    gates[..., 0] *= -0.5
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s; state [{LAYERS}, B, {HEADS}, {DK}, {DV}] fp32", flush=True)
    for batch in args.batches:
        ssm = torch.randn(LAYERS, batch, HEADS, DK, DV, device="cuda", generator=gen)
        slots = torch.randperm(batch, device="cuda", generator=gen).to(torch.int32)
        nbytes = 2 * ssm.numel() * 4
        print(f"\nB={batch}: {nbytes / 1e9:.1f} GB = {nbytes / ceiling / 1e3:.0f} us at the ceiling", flush=True)
        print(f"{'variant':>34} {'regs':>5} {'spills':>6} {'us':>9} {'% ceiling':>10}")
        ms = triton.testing.do_bench(lambda: ssm.mul_(1.0), warmup=25, rep=150)
        share = 100 * nbytes / (ms * 1e-3) / 1e9 / ceiling
        print(f"{'ssm.mul_(1)':>34} {'':>5} {'':>6} {ms * 1e3:>9.1f} {share:>9.0f}%", flush=True)
        for rounds in args.rounds:
            for config in args.configs:
                block_v, warps = (int(x) for x in config.split("/"))
                for indirect in args.indirect:
                    for tma in args.tma:
                        name = f"R={rounds} {config} indirect={indirect} tma={tma}"
                        desc = TensorDescriptor(ssm, list(ssm.shape), list(ssm.stride()), [1, 1, 1, DK, block_v]) \
                            if tma == "on" else ssm
                        grid = (HEADS * (DV // block_v), batch, LAYERS)

                        def launch():
                            return _state_rmw_kernel[grid](
                                desc, ssm, slots, k, v, gates, *ssm.stride()[:3],
                                HEADS=HEADS, DK=DK, DV=DV, BLOCK_V=block_v, ROUNDS=rounds,
                                INDIRECT=indirect == "on", TMA=tma == "on", num_warps=warps)

                        head0 = ssm[0, slots[0] if indirect == "on" else 0].clone()
                        try:
                            compiled = launch()
                        except Exception as error:  # e.g. out of resources
                            print(f"{name:>34}  failed: {type(error).__name__}: {str(error)[:60]}")
                            continue
                        after = ssm[0, slots[0] if indirect == "on" else 0]
                        err = max((after[h].double() - reference(head0[h], k, v, gates, h, rounds)).abs().max().item()
                                  for h in range(HEADS))
                        if err > 1e-3:
                            print(f"{name:>34}  WRONG: max error {err:.2e}")
                            continue
                        ms = triton.testing.do_bench(launch, warmup=10, rep=100)
                        # (each launch decays the state further: values shrink, the bytes do not)
                        print(f"{name:>34} {compiled.n_regs:>5} {compiled.n_spills:>6} {ms * 1e3:>9.1f} "
                              f"{100 * nbytes / (ms * 1e-3) / 1e9 / ceiling:>9.0f}%", flush=True)
        del ssm
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
