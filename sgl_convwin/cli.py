"""Command line: python -m sgl_convwin demo | plan | selfcheck.

demo: speculative decoding of a tiny hybrid model through the ops, every layout, chain and tree,
checked token for token against plain greedy decoding (sgl_convwin/demo.py); --ring: on the ring.
plan: the speculative state per request slot and rank for a real model, four designs side by side
(snapshots, dedup conv + snapshots, input replay, this package) (sgl_convwin/plan.py).
selfcheck: one verify step and its commit through every op (the replay commits included), every
layout, chain and tree, each checked against its oracle in sgl_convwin/reference.py
(sgl_convwin/selfcheck.py); prints the memory the dedup buffer saves.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from . import demo as demo_module
from . import plan as plan_module
from .layout import LAYOUTS
from .ops_ring import DEFAULT_CAPACITY
from .selfcheck import selfcheck
from .validation import VERIFY_MAX_NODES


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit status 2), not the whole usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help for usage)\n")


def _at_least(minimum: int, maximum: int | None = None, why: str = ""):
    """An argparse type: an int >= minimum (and <= maximum, for ``why``); argparse reports anything
    else as a usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum} ({why}), got {value}")
        return value

    return parse


_SEED = _at_least(0, 2**32 - 1, "a 32-bit seed")


def _device(text: str) -> str:
    """An argparse type: cpu, or a CUDA device this build of torch can see."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"not a device: {text!r} (cpu or cuda[:index])") from None
    if device.type == "cpu":
        return text
    if device.type != "cuda":
        raise argparse.ArgumentTypeError(f"{text!r}: the ops run on cpu or cuda[:index]")
    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: torch {torch.__version__} sees no CUDA device")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return text


def _check_ring_arguments(demo, args) -> None:
    """demo's options that contradict --ring (or need it): usage errors before anything runs."""
    if not args.ring:
        if args.capacity is not None:
            demo.error("--capacity needs --ring")
        return
    if args.mixer not in demo_module.RING_MIXERS:
        demo.error(f"--ring runs Gated DeltaNet or Mamba2 layers (--mixer gdn|mamba2), not --mixer {args.mixer}")
    if args.layouts is not None:
        demo.error("--layouts does not apply to --ring (the ring has one layout: token-major rows)")
    if max(args.draft, args.tree_nodes) > VERIFY_MAX_NODES:
        demo.error(f"--ring verifies at most {VERIFY_MAX_NODES} draft tokens a step, got --draft {args.draft} "
                   f"--tree-nodes {args.tree_nodes}")
    capacity = DEFAULT_CAPACITY if args.capacity is None else args.capacity
    if capacity < max(args.draft, args.tree_nodes):
        demo.error(f"--capacity {capacity} must be >= --draft and --tree-nodes ({max(args.draft, args.tree_nodes)}): "
                   "a ring slot holds its pending tokens and one step's drafts")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; ``parser.commands`` maps each command's name to its parser."""
    parser = _Parser(prog="python -m sgl_convwin", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="speculative decoding of a tiny hybrid model, every layout, chain and tree")
    demo.add_argument("--device", type=_device, default="cpu", help="cpu (default) or cuda[:index]")
    demo.add_argument("--tokens", type=_at_least(1), default=24, help="tokens to generate per request")
    demo.add_argument("--requests", type=_at_least(1), default=4)
    demo.add_argument("--draft", type=_at_least(1), default=4,
                      help="chain: tokens per verify pass (pending + drafts; 1: no drafts)")
    demo.add_argument("--tree-nodes", type=_at_least(1), default=8, help="tree: nodes per verify pass")
    vocab = demo_module.ModelConfig.vocab
    demo.add_argument("--topk", type=_at_least(2, vocab, "the tiny model's vocabulary"), default=3,
                      help=f"tree: children per node (2..{vocab})")
    demo.add_argument("--layers", type=_at_least(1), default=3)
    demo.add_argument("--seed", type=_SEED, default=0)
    demo.add_argument("--draft-noise", type=float, default=0.01, help="how far the drafter's weights are perturbed")
    demo.add_argument("--layouts", nargs="+", default=None, choices=list(LAYOUTS),
                      help="the buffer layouts to run (default: all; not with --ring)")
    demo.add_argument("--no-progress", action="store_true")
    demo.add_argument("--mixer", default="gdn", choices=list(demo_module.MIXERS),
                      help="gdn (default) / mamba2: Gated DeltaNet / Mamba2 layers committed by replay; "
                           "linear: a linear recurrence with snapshotted states")
    demo.add_argument("--ring", action="store_true",
                      help="gdn or mamba2 on the ring (no commit: ring_conv1d_verify, the mixer's ring verify, "
                           "ring_accept, flush)")
    demo.add_argument("--capacity", type=_at_least(1), default=None,
                      help=f"--ring: pending tokens a slot holds (default {DEFAULT_CAPACITY}; >= --draft and --tree-nodes)")
    plan = commands.add_parser(
        "plan", help="speculative-state memory per slot and rank for a real model, four designs side by side")
    plan_module.add_arguments(plan)
    check = commands.add_parser("selfcheck", help="every op, every layout, chain and tree, against its oracle")
    check.add_argument("--device", type=_device, default="cpu", help="cpu (default) or cuda[:index]")
    check.add_argument("--num-draft", type=_at_least(1, VERIFY_MAX_NODES, "the verify ops' most"), default=4,
                       help=f"draft tokens N (1..{VERIFY_MAX_NODES})")
    check.add_argument("--kernel-size", type=_at_least(2), default=4,
                       help="conv width K (a window holds K-1 >= 1 inputs; the replay commits take K <= 5)")
    check.add_argument("--seed", type=_SEED, default=0)
    parser.commands = {"demo": demo, "plan": plan, "selfcheck": check}
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        status = _run(argv)
        sys.stdout.flush()  # (here, not at exit: a reader that left is caught below)
        return status
    except BrokenPipeError:  # (`... | head`): the reader left; no traceback, and the flush at exit goes nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback; the shell's status for SIGINT
        print("sgl_convwin: interrupted", file=sys.stderr)
        return 130


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        _check_ring_arguments(parser.commands["demo"], args)
        ok = demo_module.run_demo(
            device=args.device, new_tokens=args.tokens, batch=args.requests, draft=args.draft,
            tree_nodes=args.tree_nodes, topk=args.topk, layers=args.layers, seed=args.seed,
            noise=args.draft_noise, layouts_to_run=list(LAYOUTS) if args.layouts is None else args.layouts,
            mixer=args.mixer, ring=args.ring, capacity=DEFAULT_CAPACITY if args.capacity is None else args.capacity,
            show_progress=not args.no_progress and sys.stderr.isatty(),
        )
        return 0 if ok else 1
    if args.command == "plan":
        try:
            return plan_module.run_plan(args)
        except plan_module.PlanError as error:
            parser.commands["plan"].error(str(error))
    if args.command == "selfcheck":
        ok = selfcheck(args.device, args.num_draft, args.kernel_size, args.seed)
        return 0 if ok else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
