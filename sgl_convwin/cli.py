"""Command line: python -m sgl_convwin demo | plan | selfcheck.

demo: speculative decoding of a tiny hybrid model through the ops, every layout, chain and tree,
checked token for token against plain greedy decoding (sgl_convwin/demo.py).
plan: the speculative state per request slot and rank for a real model, four designs side by side
(snapshots, dedup conv + snapshots, input replay, this package) (sgl_convwin/plan.py).
selfcheck: allocates every layout, commits a partially accepted batch with
torch.ops.convwin.scatter, checks it against the loop oracle bit for bit, prints the memory saved.
"""

from __future__ import annotations

import argparse
import sys

import torch

from . import demo as demo_module
from . import plan as plan_module
from . import reference
from .layout import LAYOUTS, dedup_ratio, physical_nbytes, window_view
from .ops import alloc_windows, scatter

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3f} GiB"


def selfcheck(device: str, num_draft: int, kernel_size: int, seed: int) -> bool:
    generator = torch.Generator().manual_seed(seed)
    layers, slots, state_slots, dim = 3, 4, 6, 64
    width = kernel_size - 1
    sequences = torch.randn(layers, slots, num_draft + kernel_size - 2, dim, generator=generator)
    sequences = sequences.to(torch.bfloat16)
    # a padded batch: three accepted rows at different steps, one skipped row
    dst = torch.tensor([4, 0, -1, 2], device=device)
    src = torch.tensor([1, 3, 0, 0], device=device)
    steps = torch.tensor([num_draft - 1, 0, 1, num_draft // 2], device=device)
    print(f"selfcheck on {device}: L={layers} slots={slots} dim={dim} D={num_draft} K={kernel_size} bf16")
    print(f"{'layout':<15}{'buffer shape':<22}{'bytes':>8}  commit == oracle")
    all_ok = True
    for layout in LAYOUTS:
        buffer = alloc_windows(layers, slots, dim, num_draft, kernel_size, layout=layout, device=device)
        buffer.copy_(reference.pack_sequences(sequences, layout, num_draft, kernel_size))
        windows = window_view(buffer, layout, num_draft, kernel_size)
        conv_state = torch.randn(layers, state_slots, dim, width, generator=generator).to(device, torch.bfloat16)
        expected = reference.scatter_reference(conv_state, windows, dst, src, steps)
        scatter(conv_state, windows, dst, src, steps)
        ok = torch.equal(conv_state.cpu(), expected)
        all_ok &= ok
        nbytes = buffer.numel() * buffer.element_size()
        print(f"{layout:<15}{str(tuple(buffer.shape)):<22}{nbytes:>8}  {'yes' if ok else 'NO'}")

    # What it saves at Qwen3-Next-80B's shape (36 GDN layers, conv_dim 8192, K=4) per 256 slots.
    print("\nconv-window cache, Qwen3-Next-80B TP1 shape (36 layers, dim 8192, K=4), 256 slots, bf16")
    print(f"{'D':>3}  {'dense':>12}  {'token_major':>12}  {'ratio':>6}")
    for d in (2, 4, 8):
        dense = physical_nbytes("dense", 36, 256, 8192, d, 4)
        dedup = physical_nbytes("token_major", 36, 256, 8192, d, 4)
        print(f"{d:>3}  {_gib(dense):>12}  {_gib(dedup):>12}  {float(dedup_ratio(d, 4)):>6.3f}")
    print("\nOK: every layout committed exactly what the oracle says" if all_ok else "\nFAILED")
    return all_ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sgl_convwin", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="speculative decoding of a tiny hybrid model, every layout, chain and tree")
    demo.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    demo.add_argument("--tokens", type=int, default=24, help="tokens to generate per request")
    demo.add_argument("--requests", type=int, default=4)
    demo.add_argument("--draft", type=int, default=4, help="chain: tokens per verify pass (pending + drafts)")
    demo.add_argument("--tree-nodes", type=int, default=8, help="tree: nodes per verify pass")
    demo.add_argument("--topk", type=int, default=3, help="tree: children per node")
    demo.add_argument("--layers", type=int, default=3)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--draft-noise", type=float, default=0.01, help="how far the drafter's weights are perturbed")
    demo.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    demo.add_argument("--no-progress", action="store_true")
    demo.add_argument("--mixer", default="gdn", choices=list(demo_module.MIXERS),
                      help="gdn (default) / mamba2: Gated DeltaNet / Mamba2 layers committed by replay; "
                           "linear: a linear recurrence with snapshotted states")
    plan = commands.add_parser(
        "plan", help="speculative-state memory per slot and rank for a real model, four designs side by side")
    plan_module.add_arguments(plan)
    check = commands.add_parser("selfcheck", help="allocate, commit and check every layout; print the memory saved")
    check.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    check.add_argument("--num-draft", type=int, default=4)
    check.add_argument("--kernel-size", type=int, default=4)
    check.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.topk < 2:
            parser.error("--topk must be >= 2 for the tree run (the chain run is topk 1)")
        ok = demo_module.run_demo(
            device=args.device, new_tokens=args.tokens, batch=args.requests, draft=args.draft,
            tree_nodes=args.tree_nodes, topk=args.topk, layers=args.layers, seed=args.seed,
            noise=args.draft_noise, layouts_to_run=args.layouts, mixer=args.mixer,
            show_progress=not args.no_progress and sys.stderr.isatty(),
        )
        return 0 if ok else 1
    if args.command == "plan":
        return plan_module.run_plan(args)
    if args.command == "selfcheck":
        if args.num_draft < 1 or args.kernel_size < 2:
            parser.error("selfcheck needs --num-draft >= 1 and --kernel-size >= 2 (a conv window holds K-1 >= 1 inputs)")
        ok = selfcheck(args.device, args.num_draft, args.kernel_size, args.seed)
        return 0 if ok else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
