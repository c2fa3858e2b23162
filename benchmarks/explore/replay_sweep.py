"""Block/warps sweep of a replay-commit kernel at a real model shape, against a copy ceiling
measured in the same run; one table per batch size. Where the launchers' defaults come from
(csrc_triton/gdn_commit.py REPLAY_BLOCK_V, csrc_triton/mamba2_commit.py REPLAY_BLOCK_P).

    python benchmarks/explore/replay_sweep.py [--mixer gdn|mamba2] [--batches 1 8 64 256] [--draft 4] [--tree]
        [--configs 64/2 ...] [--tma on off] [--accepted N] [--window 1024/4 ...]

--window 512/4 ... times the window commit alone instead (csrc_triton/replay.py WINDOW_BLOCK,
WINDOW_WARPS). --accepted N fixes every chain row's accepted length and times an in-place read +
write of the state tensor beside the kernels: how much of the gap to the ceiling the path costs.

Shapes: gdn, Qwen3-Next TP1 (36 layers, Hk 16, Hv 32, dk = dv = 128, K 4); mamba2, Nemotron-H-8B TP1
(24 layers, H 128, P 64, G 8, Ns 128, K 4, conv bias). fp32 state, bf16 conv inputs.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/common.py
from common import copy_ceiling_gbps  # noqa: E402  (before sgl_convwin: without CUDA it sets TRITON_INTERPRET=1)
import sgl_convwin  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402

K = 4
GDN = dict(layers=36, k_heads=16, head_k=128, v_heads=32, head_v=128)
MAMBA2 = dict(layers=24, heads=128, head_dim=64, groups=8, d_state=128)


def problem(mixer, batch, nodes, gen):
    """(launcher, its arguments, its keyword arguments, layers, dim, state floats per slot and layer,
    gate heads, gates per head, the tuning keyword)."""
    if mixer == "gdn":
        s = GDN
        dim = 2 * s["k_heads"] * s["head_k"] + s["v_heads"] * s["head_v"]
        state = (s["v_heads"], s["head_k"], s["head_v"])
        heads, num_gates = s["v_heads"], 2
    else:
        s = MAMBA2
        dim = s["heads"] * s["head_dim"] + 2 * s["groups"] * s["d_state"]
        state = (s["heads"], s["head_dim"], s["d_state"])
        heads, num_gates = s["heads"], 1
    layers = s["layers"]
    ssm = torch.randn(layers, batch, *state, device="cuda", generator=gen)
    conv = torch.randn(layers, batch, dim, K - 1, device="cuda", dtype=torch.bfloat16, generator=gen)
    buffer = torch.randn(layers, batch, nodes + K - 2, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    gates = torch.rand(layers, batch, nodes, num_gates, heads, device="cuda", generator=gen)
    weight = torch.randn(layers, dim, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    if mixer == "gdn":
        gates[:, :, :, 0] *= -1
        return (sgl_convwin.gdn_commit, triton_kernels().launch_gdn_commit, (ssm, conv, buffer, gates, weight),
                dict(num_k_heads=s["k_heads"], head_k_dim=s["head_k"], num_v_heads=s["v_heads"],
                     head_v_dim=s["head_v"]), layers, dim, ssm[0, 0].numel(), heads, "block_v")
    a = -torch.rand(layers, heads, device="cuda", generator=gen) * 8 - 1
    bias = torch.randn(layers, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    return (sgl_convwin.mamba2_commit, triton_kernels().launch_mamba2_commit, (ssm, conv, buffer, gates, weight, a),
            dict(num_heads=s["heads"], head_dim=s["head_dim"], n_groups=s["groups"], d_state=s["d_state"],
                 conv_bias=bias), layers, dim, ssm[0, 0].numel(), heads, "block_p")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixer", default="gdn", choices=["gdn", "mamba2"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--draft", type=int, default=4)
    parser.add_argument("--tree", action="store_true", help="a topk-3 tree of 8 nodes instead of a chain")
    parser.add_argument("--window", nargs="+", default=None, metavar="CHANNELS/WARPS",
                        help="instead of the replay kernel, time the window commit alone (the second launch of a "
                             "commit) at these channels / warps per program")
    parser.add_argument("--accepted", type=int, default=None,
                        help="every chain row accepts exactly this many tokens (1..draft), not 1..draft at random")
    parser.add_argument("--blocks", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--configs", nargs="+", default=None,
                        help="block/warps pairs instead of the product of --blocks and --warps")
    parser.add_argument("--tma", nargs="+", choices=["auto", "on", "off"], default=["auto"],
                        help="the state tiles' load -- the launcher's choice, a tensor descriptor, "
                             "pointers (each timed)")
    parser.add_argument("--smem", nargs="+", choices=["auto", "on", "off"], default=["auto"],
                        help="the state tile in shared memory (csrc_triton/*_commit_smem.py) -- the "
                             "launcher's choice, yes, no (each timed)")
    parser.add_argument("--chunk", type=int, nargs="+", default=[None],
                        help="with --smem on: state rows per pass over the shared-memory tile (each timed)")
    args = parser.parse_args()
    if args.accepted is not None and (args.tree or not 1 <= args.accepted <= args.draft):
        parser.error(f"--accepted takes chains only, 1..{args.draft} tokens")
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s; {args.mixer}: {GDN if args.mixer == 'gdn' else MAMBA2} K={K}", flush=True)
    nodes = 8 if args.tree else args.draft
    parents_row = [-1, 0, 0, 0, 1, 1, 2, 3][:nodes] if args.tree else None
    for batch in args.batches:
        gen = torch.Generator(device="cuda").manual_seed(batch)
        op, launch, tensors, kwargs, layers, dim, state_numel, heads, tuning = problem(args.mixer, batch, nodes, gen)
        slots = torch.arange(batch, device="cuda")
        steps = torch.randint(0, nodes, (batch,), device="cuda", generator=gen)
        if args.accepted is not None:
            steps.fill_(args.accepted - 1)
        if args.tree:
            parents = torch.tensor([parents_row] * batch, device="cuda")
            depth = [1, 2, 2, 2, 3, 3, 3, 3]
            accepted = sum(depth[s] for s in steps.tolist())
        else:
            parents = None
            accepted = int(steps.sum()) + batch
        a, kw = op.kernel_arguments(*tensors, slots, slots, steps, parents, layout="token_major", **kwargs)
        state_bytes = 2 * layers * batch * state_numel * 4
        input_bytes = layers * accepted * (dim * 2 + 2 * heads * 4) + layers * batch * dim * (K - 1) * 2 * 2
        nbytes = state_bytes + input_bytes
        print(f"\nB={batch} ({'tree' if args.tree else 'chain'}, {accepted} accepted tokens): "
              f"{nbytes / 1e6:.1f} MB to move = {nbytes / ceiling / 1e3:.1f} us at the ceiling", flush=True)
        if args.window:
            window_sweep(a, args.window, ceiling)
        else:
            replay_table(args, launch, a, kw, tuning, tensors[0], state_bytes, nbytes, ceiling)
        del tensors, a, kw
        torch.cuda.empty_cache()


def replay_table(args, launch, a, kw, tuning, ssm, state_bytes, nbytes, ceiling) -> None:
    """The replay kernel at each block / warps (and state-tile load) of args."""
    loads = {"auto": {}, "on": {"tma": True}, "off": {"tma": False}}
    if args.configs:
        configs = [tuple(int(x) for x in c.split("/")) for c in args.configs]
    else:
        configs = [(b, w) for b in args.blocks for w in args.warps]
    print(f"{tuning + '/warps':>16} {'us':>9} {'% ceiling':>10}")
    if args.accepted is not None:  # the state's own read + write in place, no path: what the state bytes cost alone
        ms = triton.testing.do_bench(lambda: ssm.mul_(1.0), warmup=25, rep=150)
        print(f"{'ssm.mul_(1)':>16} {ms * 1e3:>9.1f} {100 * state_bytes / (ms * 1e-3) / 1e9 / ceiling:>9.0f}%"
              "   (state bytes only)", flush=True)
    kernels = {"auto": {}, "on": {"smem": True}, "off": {"smem": False}}
    variants = [(config, load, smem, chunk) for config in configs for load in args.tma for smem in args.smem
                for chunk in (args.chunk if smem == "on" else [None])]
    for (block, warps), load, smem, chunk in variants:
        name = (f"{block}/{warps}" + ("" if load == "auto" else f" tma={load}")
                + ("" if smem == "auto" else f" smem={smem}") + ("" if chunk is None else f"/{chunk}"))
        extra = dict(loads[load], **kernels[smem], **({} if chunk is None else {"chunk": chunk}))
        run = lambda: launch(*a, **kw, **{tuning: block}, num_warps=warps, **extra)  # noqa: E731
        try:
            ms = triton.testing.do_bench(run, warmup=25, rep=150)
        except Exception as error:  # e.g. out of registers / shared memory
            print(f"{name:>16}  failed: {type(error).__name__}: {str(error)[:80]}")
            continue
        print(f"{name:>16} {ms * 1e3:>9.1f} {100 * nbytes / (ms * 1e-3) / 1e9 / ceiling:>9.0f}%", flush=True)


def window_sweep(a, configs, ceiling) -> None:
    """The window commit alone at each channels / warps, checked equal to the default's first."""
    window = triton_kernels().replay.launch_path_window
    conv, tokens, history, rest = a[1], a[2], a[3], a[-4:]  # rest: dst_slots, src_slots, steps, parents
    nbytes = 2 * conv.numel() * conv.element_size()  # its window written, as many bytes read
    before = conv.clone()
    window(conv, tokens, history, *rest)
    want = conv.clone()
    print(f"{'window ch/warps':>16} {'us':>9} {'% ceiling':>10}   ({nbytes / 1e6:.0f} MB)")
    for config in ["default"] + configs:
        tuning = {} if config == "default" else dict(zip(("block", "num_warps"), map(int, config.split("/"))))
        conv.copy_(before)
        window(conv, tokens, history, *rest, **tuning)
        if not torch.equal(conv, want):
            print(f"{config:>16}  WRONG: differs from the default's window")
            continue
        ms = triton.testing.do_bench(lambda: window(conv, tokens, history, *rest, **tuning), warmup=25, rep=150)
        print(f"{config:>16} {ms * 1e3:>9.1f} {100 * nbytes / (ms * 1e-3) / 1e9 / ceiling:>9.0f}%", flush=True)


if __name__ == "__main__":
    main()
