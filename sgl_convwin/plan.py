"""``python -m sgl_convwin plan``: what the conv-window cache costs per rank for a real model.

Shapes per tensor-parallel rank: conv_dim and the SSM state are sharded across ranks (heads and
channels are split), layers and K are not. Chains (topk 1) store D windows densely or D+K-2 inputs
deduplicated; trees (topk > 1) store one window per draft node densely, or K-2 history rows plus
one row per node. The SSM state snapshots of the same verify pass (fp32, one per draft token) are
printed too: the conv saving is a small share of the whole speculative state, and the planner says
how small.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

from .layout import LAYOUTS, physical_nbytes

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class ModelShape:
    name: str
    conv_layers: int  # mixer layers that carry a conv (GDN / Mamba2)
    conv_dim: int  # at TP1
    kernel_size: int
    ssm_state_elements: int  # one layer's recurrent state per slot at TP1 (stored fp32)
    draft_tokens: int  # the typical speculative setting (draft tokens, tree nodes if topk > 1)
    topk: int
    source: str


PRESETS = {
    shape.name: shape
    for shape in (
        ModelShape(
            "qwen3-next-80b-a3b", 36, 8192, 4, 32 * 128 * 128, 4, 1,
            "36 of 48 layers are Gated DeltaNet; conv_dim = 2*16*128 (q, k) + 32*128 (v); state "
            "[32 value heads, 128, 128]; NEXTN steps 3, topk 1, 4 draft tokens",
        ),
        ModelShape(
            "qwen3.5-35b-a3b", 30, 8192, 4, 32 * 128 * 128, 4, 1,
            "the Qwen3.5 MoE hidden-2048 class: Gated DeltaNet conv_dim 8192, K=4, one MTP layer; "
            "3 of every 4 layers are GDN -- 30 of 40 layers is ASSUMED here (not verified from "
            "the model's config): pass --layers to override",
        ),
        ModelShape(
            "nemotron-h", 23, 6144, 4, 64 * 64 * 128, 5, 3,
            "Nemotron-H / Nemotron-3-Nano-30B-A3B class: 23 of 52 layers are Mamba2; conv_dim = "
            "64*64 (x) + 2*8*128 (B, C); state [64 heads, 64, 128]; steps 2, topk 3, 5 draft tokens",
        ),
    )
}
PRESETS["nemotron-3-nano-30b-a3b"] = PRESETS["nemotron-h"]


@dataclass
class Plan:
    model: str
    tp: int
    draft_tokens: int
    topk: int
    max_running_requests: int
    dtype: str
    conv_layers: int
    conv_dim_per_rank: int
    kernel_size: int
    dedup_layout: str  # "token_major rows (tree)" or "token_major / channel_major (chain)"
    dense_bytes_per_slot: int
    dedup_bytes_per_slot: int
    saving_bytes_per_slot: int
    saving_bytes_total: int  # for max_running_requests slots
    dedup_ratio: float
    ssm_snapshot_bytes_per_slot: int  # fp32, one snapshot per draft token
    saving_share_of_speculative_state: float  # saving / (dense conv windows + SSM snapshots)


def make_plan(shape: ModelShape, tp: int, draft_tokens: int, topk: int, requests: int, dtype: str) -> Plan:
    for what, value in (("conv_dim", shape.conv_dim), ("SSM state", shape.ssm_state_elements)):
        if value % tp:
            raise ValueError(f"{shape.name}: {what} {value} is not divisible by tp={tp}")
    if draft_tokens < 1 or topk < 1 or requests < 0:
        raise ValueError("draft tokens and topk must be >= 1, max running requests >= 0")
    conv_dim = shape.conv_dim // tp
    torch_dtype = _DTYPES[dtype]
    dense = physical_nbytes("dense", shape.conv_layers, 1, conv_dim, draft_tokens, shape.kernel_size, torch_dtype)
    dedup = physical_nbytes("token_major", shape.conv_layers, 1, conv_dim, draft_tokens, shape.kernel_size, torch_dtype)
    ssm = shape.conv_layers * draft_tokens * (shape.ssm_state_elements // tp) * 4
    saving = dense - dedup
    return Plan(
        model=shape.name, tp=tp, draft_tokens=draft_tokens, topk=topk, max_running_requests=requests,
        dtype=dtype, conv_layers=shape.conv_layers, conv_dim_per_rank=conv_dim,
        kernel_size=shape.kernel_size,
        dedup_layout="token_major / channel_major rows, one per node" if topk > 1 else "token_major / channel_major",
        dense_bytes_per_slot=dense, dedup_bytes_per_slot=dedup, saving_bytes_per_slot=saving,
        saving_bytes_total=saving * requests, dedup_ratio=dedup / dense, ssm_snapshot_bytes_per_slot=ssm,
        saving_share_of_speculative_state=saving / (dense + ssm),
    )


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def print_plan(plan: Plan, shape: ModelShape) -> None:
    draft = f"tree of {plan.draft_tokens} nodes (topk {plan.topk})" if plan.topk > 1 else f"chain of {plan.draft_tokens}"
    print(f"{plan.model}, TP{plan.tp}, {draft}, {plan.max_running_requests} running requests, {plan.dtype}")
    print(f"  shape per rank: {plan.conv_layers} conv layers, conv_dim {plan.conv_dim_per_rank}, K={plan.kernel_size}")
    print(f"  ({shape.source})")
    print("| per rank | per slot | for all running requests |")
    print("|---|---|---|")
    requests = plan.max_running_requests
    print(f"| conv windows, dense | {_size(plan.dense_bytes_per_slot)} | {_size(plan.dense_bytes_per_slot * requests)} |")
    print(f"| conv windows, deduplicated ({plan.dedup_layout}) | {_size(plan.dedup_bytes_per_slot)} "
          f"({plan.dedup_ratio:.2f}x) | {_size(plan.dedup_bytes_per_slot * requests)} |")
    print(f"| saved | {_size(plan.saving_bytes_per_slot)} | {_size(plan.saving_bytes_total)} |")
    print(f"| SSM state snapshots of the same pass (fp32) | {_size(plan.ssm_snapshot_bytes_per_slot)} | "
          f"{_size(plan.ssm_snapshot_bytes_per_slot * requests)} |")
    print(f"The saving is {plan.saving_share_of_speculative_state:.1%} of the speculative state "
          f"(dense conv windows + SSM snapshots).")


def plot_plan(shape: ModelShape, tp: int, dtype: str, path: str, max_draft: int = 16) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # an optional dependency
        raise SystemExit(f"--plot needs matplotlib ({error}); pip install matplotlib") from error
    drafts = list(range(1, max_draft + 1))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for layout, style in zip(LAYOUTS, ("-o", "--s", ":^")):
        per_slot = [
            physical_nbytes(layout, shape.conv_layers, 1, shape.conv_dim // tp, d, shape.kernel_size, _DTYPES[dtype]) / 2**20
            for d in drafts
        ]
        ax.plot(drafts, per_slot, style, label=layout, markersize=4)
    ax.set_xlabel("draft tokens (tree nodes)")
    ax.set_ylabel("conv-window cache per slot (MiB)")
    ax.set_title(f"{shape.name}, TP{tp}, {dtype}: channel_major and token_major coincide")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_plan(args) -> int:
    if args.model == "custom":
        missing = [f"--{n.replace('_', '-')}" for n in ("layers", "conv_dim") if getattr(args, n) is None]
        if missing:
            raise SystemExit(f"--model custom needs {' and '.join(missing)}")
        shape = ModelShape("custom", args.layers, args.conv_dim, args.kernel_size or 4, args.ssm_state or 0,
                           4, 1, "custom shape from the command line")
    else:
        shape = PRESETS[args.model]
        if args.layers is not None:
            shape = ModelShape(**{**asdict(shape), "conv_layers": args.layers})
    draft_tokens = shape.draft_tokens if args.draft_tokens is None else args.draft_tokens
    topk = shape.topk if args.topk is None else args.topk
    try:
        plan = make_plan(shape, args.tp, draft_tokens, topk, args.max_running_requests, args.dtype)
    except ValueError as error:
        raise SystemExit(str(error)) from error
    if args.json:
        print(json.dumps(asdict(plan)))
    else:
        print_plan(plan, shape)
    if args.plot:
        plot_plan(shape, args.tp, args.dtype, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, choices=[*PRESETS, "custom"])
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (conv_dim is sharded)")
    parser.add_argument("--draft-tokens", type=int, default=None, help="draft tokens (tree nodes if topk > 1)")
    parser.add_argument("--topk", type=int, default=None, help="1: a chain; > 1: a tree")
    parser.add_argument("--max-running-requests", type=int, default=256)
    parser.add_argument("--dtype", default="bf16", choices=list(_DTYPES))
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", default=None, metavar="FILE", help="PNG of memory vs draft length per layout")
    parser.add_argument("--layers", type=int, default=None, help="custom: conv layers (or override a preset)")
    parser.add_argument("--conv-dim", dest="conv_dim", type=int, default=None, help="custom: conv_dim at TP1")
    parser.add_argument("--kernel-size", type=int, default=None, help="custom: K (default 4)")
    parser.add_argument("--ssm-state", dest="ssm_state", type=int, default=None,
                        help="custom: elements of one layer's SSM state per slot at TP1")
