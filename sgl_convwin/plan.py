"""``python -m sgl_convwin plan``: the speculative state a hybrid model keeps per request slot and rank.

During speculative decoding every Gated DeltaNet / Mamba2 layer keeps, per request slot and besides
its committed state (conv state ``[conv_dim, K-1]`` and recurrent state, which every design keeps
and which is therefore left out here), what the commit needs to reach the state after any accepted
draft token (or tree node). Four designs, side by side:

(a) snapshots: the dense conv windows (K-1 columns per draft token) and one fp32 recurrent-state
    snapshot per draft token -- what engines did first.
(b) dedup conv + snapshots: the conv windows deduplicated to one sequence of D+K-2 conv inputs
    (N+K-2 rows for a tree of N nodes), the state snapshots as in (a).
(c) input replay as engines do it (vLLM / SGLang / TensorRT-LLM "ReplaySSM"): the conv state
    widened to K-1+D columns (D columns beyond the committed state), and per draft token the
    cached post-conv recurrence inputs in the model dtype (GDN: k and v, Hk*dk + Hv*dv elements;
    Mamba2: x and B, H*P + G*Ns elements) plus fp32 gates (GDN: g and beta per value head; Mamba2:
    dt per head). No engine replays trees; for a tree this is sized with dense conv windows (what
    SGLang keeps for trees) plus the same per-node inputs and gates.
(d) this package: the deduplicated conv-input buffer (D+K-2 rows, N+K-2 for a tree) and the fp32
    gates per draft token; k and v (x and B) are recomputed from the buffer at commit.

(e) the ring (docs/design.md, "The ring"): per slot and layer C = R + N rows of conv inputs (R =
    ``--capacity`` pending tokens, N this step's drafts) and fp32 gates beside each row (GDN: g, beta
    per value head; Mamba2: dt per head), plus one (start, pending) int32 cursor per slot -- exactly
    what ``alloc_ring`` / ``alloc_mamba2_ring`` / ``RingCache`` allocate. It keeps more than (d) but
    moves less state: see ``ring_traffic``.

Shapes per tensor-parallel rank: everything mixer-wide (conv_dim, heads, groups, the state) is
divided by the TP degree; layers and K are not. Conv windows, conv inputs and cached k/v are in
``--dtype``; recurrent states and gates are fp32.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from typing import ClassVar, Optional, Union

import torch

from .layout import physical_nbytes
from .ops_ring import DEFAULT_CAPACITY
from .validation import REPLAY_MAX_KERNEL_SIZE, VERIFY_MAX_NODES

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class PlanError(ValueError):
    """Command-line values that cannot be planned; the CLI reports it as a usage error."""
_FP32 = 4  # bytes of a recurrent-state element and of a gate, in every design
_CURSOR = 2 * 4  # the ring's (start, pending) int32 pair per slot, shared by the layers
DEFAULT_ACCEPT_LENGTH = 2.5  # tokens a step accepts, the verified one counted (engines report 2-3 at N = 4)
EAGER_STATE_PASSES = 3  # design (d): gdn_verify reads each state, gdn_commit reads and writes it


def _split(name: str, what: str, value: int, tp: int) -> int:
    if value % tp:
        raise ValueError(f"{name}: {what} {value} is not divisible by tp={tp}")
    return value // tp


@dataclass(frozen=True)
class GatedDeltaNet:
    """A Gated DeltaNet layer's dims (Qwen3-Next / Qwen3.5 ``linear_*`` config keys)."""

    num_k_heads: int  # Hk
    head_k_dim: int  # dk
    num_v_heads: int  # Hv
    head_v_dim: int  # dv
    kind: ClassVar[str] = "gdn"
    title: ClassVar[str] = "Gated DeltaNet"

    @property
    def conv_dim(self) -> int:  # q, k, v
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    @property
    def state_elements(self) -> int:  # [Hv, dk, dv]
        return self.num_v_heads * self.head_k_dim * self.head_v_dim

    @property
    def gate_scalars(self) -> int:  # g and beta per value head, per token
        return 2 * self.num_v_heads

    @property
    def cached_inputs(self) -> int:  # post-conv k and v per token (input replay, design c)
        return self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    def per_rank(self, tp: int, name: str) -> "GatedDeltaNet":
        return replace(self, num_k_heads=_split(name, "num_k_heads", self.num_k_heads, tp),
                       num_v_heads=_split(name, "num_v_heads", self.num_v_heads, tp))

    def describe(self) -> str:
        return (f"conv_dim {self.conv_dim} = 2*{self.num_k_heads}*{self.head_k_dim} (q, k) + "
                f"{self.num_v_heads}*{self.head_v_dim} (v); state [{self.num_v_heads}, {self.head_k_dim}, "
                f"{self.head_v_dim}] fp32; gates g, beta per value head")

    def keeps_for_replay(self) -> str:
        return "post-conv k, v"

    def gate_names(self) -> str:
        return "g, beta"


@dataclass(frozen=True)
class Mamba2:
    """A Mamba2 layer's dims (Nemotron-H ``mamba_num_heads``, ``mamba_head_dim``, ``n_groups``,
    ``ssm_state_size``)."""

    num_heads: int  # H
    head_dim: int  # P
    n_groups: int  # G
    d_state: int  # Ns
    kind: ClassVar[str] = "mamba2"
    title: ClassVar[str] = "Mamba2"

    @property
    def conv_dim(self) -> int:  # x, B, C
        return self.num_heads * self.head_dim + 2 * self.n_groups * self.d_state

    @property
    def state_elements(self) -> int:  # [H, P, Ns]
        return self.num_heads * self.head_dim * self.d_state

    @property
    def gate_scalars(self) -> int:  # dt per head, per token
        return self.num_heads

    @property
    def cached_inputs(self) -> int:  # x and B per token (input replay, design c)
        return self.num_heads * self.head_dim + self.n_groups * self.d_state

    def per_rank(self, tp: int, name: str) -> "Mamba2":
        return replace(self, num_heads=_split(name, "num_heads", self.num_heads, tp),
                       n_groups=_split(name, "n_groups", self.n_groups, tp))

    def describe(self) -> str:
        return (f"conv_dim {self.conv_dim} = {self.num_heads}*{self.head_dim} (x) + 2*{self.n_groups}*"
                f"{self.d_state} (B, C); state [{self.num_heads}, {self.head_dim}, {self.d_state}] fp32; "
                f"gate dt per head")

    def keeps_for_replay(self) -> str:
        return "x, B"

    def gate_names(self) -> str:
        return "dt"


Mixer = Union[GatedDeltaNet, Mamba2]


@dataclass(frozen=True)
class ModelShape:
    name: str
    conv_layers: int  # mixer layers that carry a conv (GDN / Mamba2)
    conv_dim: int  # at TP1
    kernel_size: int
    ssm_state_elements: Optional[int]  # one layer's recurrent state per slot at TP1 (fp32); None: unknown
    draft_tokens: int  # the typical speculative setting (draft tokens, tree nodes if topk > 1)
    topk: int
    source: str  # where the dims come from; says which numbers are assumed
    mixer: Optional[Mixer] = None  # None: only conv_dim (and maybe the state size) is known
    draft_source: str = ""  # where the default draft setting comes from

    def __post_init__(self):
        if self.mixer is not None:
            for what, given, derived in (("conv_dim", self.conv_dim, self.mixer.conv_dim),
                                         ("SSM state", self.ssm_state_elements, self.mixer.state_elements)):
                if given != derived:
                    raise ValueError(f"{self.name}: {what} {given} does not match the mixer's dims ({derived})")


def _preset(name, layers, mixer, draft_tokens, topk, source, draft_source) -> ModelShape:
    return ModelShape(name, layers, mixer.conv_dim, 4, mixer.state_elements, draft_tokens, topk, source,
                      mixer, draft_source)


_QWEN_MTP = ("NEXTN/MTP chain: steps 3, topk 1, 4 draft tokens, as in the Qwen3-Next model card's SGLang "
             "launch; a typical setting, not a config value")
_QWEN35_MTP = "NEXTN/MTP chain: steps 3, topk 1, 4 draft tokens -- ASSUMED (Qwen3-Next's setting; not a config value)"
_EAGLE_TREE = "EAGLE tree of 8 nodes, topk 3 -- ASSUMED (a typical tree; Nemotron-H has no MTP layer)"

PRESETS = {
    shape.name: shape
    for shape in (
        _preset(
            "qwen3-next-80b-a3b", 36, GatedDeltaNet(16, 128, 32, 128), 4, 1,
            "public config.json: 48 layers, full_attention_interval 4 -> 36 Gated DeltaNet layers; "
            "linear_num_key_heads 16, linear_key_head_dim 128, linear_num_value_heads 32, "
            "linear_value_head_dim 128, linear_conv_kernel_dim 4; nothing assumed",
            _QWEN_MTP,
        ),
        _preset(
            "qwen3.5-35b-a3b", 30, GatedDeltaNet(16, 128, 32, 128), 4, 1,
            "public config: 40 layers, full_attention_interval 4 -> 30 Gated DeltaNet layers; "
            "linear heads 16 (k) / 32 (v) of 128, conv kernel 4; nothing assumed",
            _QWEN35_MTP,
        ),
        _preset(
            "qwen3.5-9b", 24, GatedDeltaNet(16, 128, 32, 128), 4, 1,
            "public config: 32 layers, full_attention_interval 4 -> 24 Gated DeltaNet layers; "
            "linear heads 16 (k) / 32 (v) of 128, conv kernel 4; nothing assumed",
            _QWEN35_MTP,
        ),
        _preset(
            "qwen3.5-0.8b", 18, GatedDeltaNet(16, 128, 16, 128), 4, 1,
            "public config: 24 layers, full_attention_interval 4 -> 18 Gated DeltaNet layers; "
            "linear heads 16 (k) / 16 (v) of 128, conv kernel 4; nothing assumed",
            _QWEN35_MTP,
        ),
        _preset(
            "nemotron-h-8b", 24, Mamba2(128, 64, 8, 128), 8, 3,
            "public config: 52 layers, hybrid_override_pattern has 24 Mamba2 ('M') layers; "
            "mamba_num_heads 128, mamba_head_dim 64, n_groups 8, ssm_state_size 128, conv_kernel 4; "
            "nothing assumed",
            _EAGLE_TREE,
        ),
        _preset(
            "nemotron-h-47b", 45, Mamba2(256, 64, 8, 256), 8, 3,
            "public config: 98 layers, hybrid_override_pattern has 45 Mamba2 ('M') layers; "
            "mamba_num_heads 256, mamba_head_dim 64, n_groups 8, ssm_state_size 256, conv_kernel 4; "
            "nothing assumed",
            _EAGLE_TREE,
        ),
        _preset(
            "nemotron-h-56b", 54, Mamba2(256, 64, 8, 256), 8, 3,
            "public config: 118 layers, hybrid_override_pattern has 54 Mamba2 ('M') layers; "
            "mamba_num_heads 256, mamba_head_dim 64, ssm_state_size 256, conv_kernel 4; n_groups 8 is "
            "ASSUMED from the family's other configs and Megatron-Bridge's Nemotron-H provider (this "
            "checkpoint's own config.json was not read)",
            _EAGLE_TREE,
        ),
        _preset(
            "nemotron-3-nano-30b-a3b", 23, Mamba2(64, 64, 8, 128), 5, 3,
            "public config: 52 layers, hybrid_override_pattern has 23 Mamba2 ('M') layers (23 MoE, "
            "6 attention); mamba_num_heads 64, mamba_head_dim 64, n_groups 8, ssm_state_size 128, "
            "conv_kernel 4; nothing assumed",
            "EAGLE tree of 5 draft tokens (steps 2, topk 3) -- ASSUMED (kept from the first planner)",
        ),
    )
}
# The first planner's name for the Nemotron-3-Nano-30B-A3B shape; it aliases nemotron-3-nano-30b-a3b
# (NOT Nemotron-H-8B), so that existing commands keep their numbers.
PRESETS["nemotron-h"] = PRESETS["nemotron-3-nano-30b-a3b"]

# The four designs, in the order they are printed. Each keeps, per slot and beyond the committed state:
DESIGNS = (
    ("snapshot", "(a) snapshots"),
    ("dedup_snapshot", "(b) dedup conv + snapshots"),
    ("input_replay", "(c) input replay (engines)"),
    ("replay", "(d) this package"),
)


@dataclass
class Design:
    key: str  # snapshot | dedup_snapshot | input_replay | replay
    label: str
    keeps: str  # what it keeps per slot, in words
    bytes_per_slot: Optional[int]  # None: the recurrent state (or, for c and d, the mixer's dims) unknown
    bytes_total: Optional[int]  # for max_running_requests slots
    parts: dict  # bytes per slot by part: conv, states, inputs, gates (None where unknown)


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
    ssm_snapshot_bytes_per_slot: Optional[int]  # fp32, one snapshot per draft token; None: state unknown
    saving_share_of_speculative_state: Optional[float]  # saving / (dense conv windows + SSM snapshots)
    # the whole speculative state (None where the mixer's dims are unknown)
    mixer: Optional[str] = None  # "gdn" | "mamba2" | None
    state_bytes_per_layer: Optional[int] = None  # one fp32 recurrent state per rank
    gate_scalars_per_token: Optional[int] = None  # per layer and rank (GDN 2*Hv, Mamba2 H)
    cached_inputs_per_token: Optional[int] = None  # elements per layer and rank that design (c) caches
    snapshot_bytes_per_slot: Optional[int] = None  # (a)
    dedup_snapshot_bytes_per_slot: Optional[int] = None  # (b)
    input_replay_bytes_per_slot: Optional[int] = None  # (c)
    replay_bytes_per_slot: Optional[int] = None  # (d)
    snapshot_bytes_total: Optional[int] = None
    dedup_snapshot_bytes_total: Optional[int] = None
    input_replay_bytes_total: Optional[int] = None
    replay_bytes_total: Optional[int] = None
    replay_ratio_to_snapshot: Optional[float] = None  # (d) / (a)
    designs: list = field(default_factory=list)  # the four Design records, in DESIGNS order
    # (e) the ring (None without the mixer's dims): alloc_ring's / alloc_mamba2_ring's bytes, checkpoint excluded
    ring_capacity: Optional[int] = None  # R
    ring_rows: Optional[int] = None  # C = R + N per slot and layer
    ring_bytes_per_slot: Optional[int] = None  # rows + gates + cursor
    ring_bytes_total: Optional[int] = None
    ring_parts: Optional[dict] = None  # rows, gates, cursor
    # state passes per step (ring_traffic): eager (d) 3, the ring 1 + 1/F at the least, 1 + 2/F as the
    # kernels run, at accept length a
    accept_length: Optional[float] = None
    ring_tree_depth: Optional[int] = None  # T: the most tokens a step accepts (trees: --tree-depth; else N)
    ring_fold_every_steps: Optional[int] = None  # F
    ring_state_passes_per_step: Optional[float] = None
    ring_state_passes_per_step_run: Optional[float] = None
    replay_state_passes_per_step: Optional[int] = None
    ring_mean_pending_tokens: Optional[float] = None  # replayed by each verify, a (F + 1) / 2 on average
    ring_pending_share_of_state_pass: Optional[float] = None  # their rows + gates against one pass over the states


@dataclass(frozen=True)
class RingTraffic:
    """The ring's state traffic per decode step, in passes over every state of the slot (one pass =
    each recurrent state read once, or written once), against the eager replay design (d)."""

    capacity: int  # R: pending tokens a slot holds
    num_draft: int  # N: tokens verified per step (tree nodes)
    accept_length: float  # a: tokens a step makes pending (the accepted path, the verified token counted)
    fold_every_steps: int  # F = floor((R - T) / a) + 1 (T: the tree depth, else N)
    state_passes_per_step: float  # 1 + 1/F
    eager_state_passes_per_step: int  # 3
    state_passes_per_step_run: float  # 1 + 2/F: a fold reads the state, the verify after it reads it again
    mean_pending_tokens: float  # a (F + 1) / 2: tokens each verify replays, on average


def ring_traffic(capacity: int, num_draft: int, accept_length: float, tree_depth: Optional[int] = None) -> RingTraffic:
    """The ring's state passes per step, modelled with every step accepting exactly ``accept_length``
    tokens (the path's length, the verified token counted: SGLang's accept length, 1 <= a <= N).

    Eager (d): the verify reads each state, the commit reads and writes it: 3 passes a step. Ring:
    the verify reads the checkpoint every step and writes it only when it folds, i.e. when pending +
    N > R. After a fold the step's accepted tokens are pending (a), then 2a, ...: the verify with
    pending = m a folds for the first m with m a > R - N, so a fold every F = floor((R - N) / a) + 1
    steps and 1 + 1/F passes a step at the least. The kernels fold in a launch of their own (the due
    flush, or the verify's first launch) and the verify then reads the folded state again: 1 + 2/F
    (one launch doing both measured slower: docs/benchmarks.md, "Rejected designs"). With random
    acceptance of mean a this is approximate (the pending count overshoots R - N by part of a step).
    Besides the states, each verify reads the pending tokens' rows and gates: a, 2a, ..., F a over a
    cycle, a (F + 1) / 2 on average.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or not isinstance(num_draft, int) or num_draft < 1:
        raise ValueError(f"capacity and num_draft must be ints, num_draft >= 1; got {capacity!r}, {num_draft!r}")
    if capacity < num_draft:
        raise ValueError(f"ring capacity {capacity} must be >= the draft tokens N = {num_draft} (a slot holds its "
                         f"pending tokens and one step's drafts)")
    most = num_draft if tree_depth is None else tree_depth
    if not 1 <= most <= num_draft:
        raise ValueError(f"tree depth {tree_depth} must lie in [1, N = {num_draft}] (the nodes on a tree's longest "
                         f"root path)")
    if not 1 <= accept_length <= most:
        bound = f"T = {tree_depth}" if tree_depth else f"N = {num_draft}"
        raise ValueError(f"accept length {accept_length} must lie in [1, {bound}] (tokens a step accepts, the verified "
                         f"one counted)")
    fold_every = math.floor((capacity - most) / accept_length) + 1
    return RingTraffic(capacity, num_draft, accept_length, fold_every, 1 + 1 / fold_every, EAGER_STATE_PASSES,
                       1 + 2 / fold_every, accept_length * (fold_every + 1) / 2)


def ring_nbytes(num_layers: int, dim: int, num_draft: int, gate_scalars: int, capacity: int, itemsize: int) -> dict:
    """Bytes of one ring slot by part (``alloc_ring``'s / ``alloc_mamba2_ring``'s buffers): rows
    [L, C, dim] in the model dtype, gates [L, C, gate_scalars] fp32 (the mixer's ``gate_scalars``:
    2 Hv for g, beta, H for dt), the cursor's two int32; C = capacity + N."""
    ring_rows = capacity + num_draft
    return {"rows": num_layers * ring_rows * dim * itemsize,
            "gates": num_layers * ring_rows * gate_scalars * _FP32, "cursor": _CURSOR}


def default_capacity(num_draft: int) -> int:
    """DEFAULT_CAPACITY, or N when the drafts alone exceed it (a ring holds at least one step's drafts)."""
    return max(DEFAULT_CAPACITY, num_draft)


def _mul(*factors) -> Optional[int]:
    product = 1
    for factor in factors:
        if factor is None:
            return None
        product *= factor
    return product


def _add(*terms) -> Optional[int]:
    return None if any(term is None for term in terms) else sum(terms)


def make_plan(shape: ModelShape, tp: int, draft_tokens: int, topk: int, requests: int, dtype: str,
              capacity: Optional[int] = None, accept_length: Optional[float] = None,
              tree_depth: Optional[int] = None) -> Plan:
    """capacity (the ring's R; default ``default_capacity(N)``), accept_length (a, default
    min(DEFAULT_ACCEPT_LENGTH, T)) and tree_depth (T, trees only: the ring's fold rule; default N)
    size the ring of a mixer with known dims; ValueError if they do not fit."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    for what, value, least in (("draft tokens", draft_tokens, 1), ("topk", topk, 1),
                               ("max running requests", requests, 0)):
        if value < least:
            raise ValueError(f"{what} must be >= {least}, got {value}")
    conv_dim = _split(shape.name, "conv_dim", shape.conv_dim, tp)
    state = None if shape.ssm_state_elements is None else _split(shape.name, "SSM state", shape.ssm_state_elements, tp)
    mixer = None if shape.mixer is None else shape.mixer.per_rank(tp, shape.name)
    torch_dtype = _DTYPES[dtype]
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    layers, n, k = shape.conv_layers, draft_tokens, shape.kernel_size
    dense = physical_nbytes("dense", layers, 1, conv_dim, n, k, torch_dtype)  # N*(K-1) columns
    dedup = physical_nbytes("token_major", layers, 1, conv_dim, n, k, torch_dtype)  # N+K-2 rows
    # (c): vLLM widens the conv state by D columns (chains only); trees keep dense windows (SGLang)
    widened = layers * n * conv_dim * itemsize if topk == 1 else dense
    states = _mul(layers, n, state, _FP32)
    inputs = gates = None
    if mixer is not None:
        inputs = layers * n * mixer.cached_inputs * itemsize
        gates = layers * n * mixer.gate_scalars * _FP32
    saving = dense - dedup
    tree = topk > 1
    snaps = f"{n} fp32 state snapshots" + (" (one per node)" if tree else "")
    dense_words = f"dense conv windows ({n} x {k - 1} columns)"
    dedup_words = f"deduplicated conv inputs ({n}+{k - 2} = {n + k - 2} rows)"
    replay_inputs = "k, v / x, B" if mixer is None else mixer.keeps_for_replay()
    gate_words = "gates" if mixer is None else mixer.gate_names()
    keeps = {
        "snapshot": f"{dense_words} + {snaps}",
        "dedup_snapshot": f"{dedup_words} + {snaps}",
        "input_replay": (f"dense conv windows ({n} x {k - 1} columns; no engine replays trees) + "
                         if tree else f"conv state widened to K-1+D (+{n} columns) + ")
        + f"{replay_inputs} ({dtype}) and fp32 {gate_words} per {'node' if tree else 'draft token'}",
        "replay": f"{dedup_words} + fp32 {gate_words} per {'node' if tree else 'draft token'}",
    }
    parts = {
        "snapshot": {"conv": dense, "states": states, "inputs": 0, "gates": 0},
        "dedup_snapshot": {"conv": dedup, "states": states, "inputs": 0, "gates": 0},
        "input_replay": {"conv": widened, "states": 0, "inputs": inputs, "gates": gates},
        "replay": {"conv": dedup, "states": 0, "inputs": 0, "gates": gates},
    }
    designs = []
    for key, label in DESIGNS:
        per_slot = _add(*parts[key].values())
        designs.append(Design(key, label, keeps[key], per_slot, _mul(per_slot, requests), parts[key]))
    totals = {design.key: design.bytes_per_slot for design in designs}
    capacity = default_capacity(n) if capacity is None else capacity
    if tree_depth is not None and topk == 1:
        raise ValueError("tree depth is a tree's (topk > 1): a chain of N accepts up to N tokens")
    accept_length = min(DEFAULT_ACCEPT_LENGTH, tree_depth or n) if accept_length is None else accept_length
    traffic = ring_traffic(capacity, n, accept_length, tree_depth)  # validates them, for every mixer
    ring = {}
    if mixer is not None:
        ring_parts = ring_nbytes(layers, conv_dim, n, mixer.gate_scalars, capacity, itemsize)
        ring_slot = sum(ring_parts.values())
        pending_token = (ring_parts["rows"] + ring_parts["gates"]) // (capacity + n)  # every layer's row + gates
        ring = dict(
            ring_capacity=capacity, ring_rows=capacity + n, ring_bytes_per_slot=ring_slot,
            ring_bytes_total=ring_slot * requests, ring_parts=ring_parts, accept_length=accept_length,
            ring_tree_depth=tree_depth or n,
            ring_fold_every_steps=traffic.fold_every_steps, ring_state_passes_per_step=traffic.state_passes_per_step,
            ring_state_passes_per_step_run=traffic.state_passes_per_step_run,
            replay_state_passes_per_step=traffic.eager_state_passes_per_step,
            ring_mean_pending_tokens=traffic.mean_pending_tokens,
            ring_pending_share_of_state_pass=traffic.mean_pending_tokens * pending_token / (layers * state * _FP32),
        )
    return Plan(
        model=shape.name, tp=tp, draft_tokens=n, topk=topk, max_running_requests=requests,
        dtype=dtype, conv_layers=layers, conv_dim_per_rank=conv_dim, kernel_size=k,
        dedup_layout="token_major / channel_major rows, one per node" if tree else "token_major / channel_major",
        dense_bytes_per_slot=dense, dedup_bytes_per_slot=dedup, saving_bytes_per_slot=saving,
        saving_bytes_total=saving * requests, dedup_ratio=dedup / dense, ssm_snapshot_bytes_per_slot=states,
        saving_share_of_speculative_state=None if states is None else saving / (dense + states),
        mixer=None if mixer is None else mixer.kind,
        state_bytes_per_layer=_mul(state, _FP32),
        gate_scalars_per_token=None if mixer is None else mixer.gate_scalars,
        cached_inputs_per_token=None if mixer is None else mixer.cached_inputs,
        snapshot_bytes_per_slot=totals["snapshot"],
        dedup_snapshot_bytes_per_slot=totals["dedup_snapshot"],
        input_replay_bytes_per_slot=totals["input_replay"],
        replay_bytes_per_slot=totals["replay"],
        snapshot_bytes_total=_mul(totals["snapshot"], requests),
        dedup_snapshot_bytes_total=_mul(totals["dedup_snapshot"], requests),
        input_replay_bytes_total=_mul(totals["input_replay"], requests),
        replay_bytes_total=_mul(totals["replay"], requests),
        replay_ratio_to_snapshot=(None if totals["replay"] is None or not totals["snapshot"]
                                  else totals["replay"] / totals["snapshot"]),
        designs=designs,
        **ring,
    )


def _size(nbytes: Optional[int]) -> str:
    if nbytes is None:
        return "unknown"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def _draft_words(draft_tokens: int, topk: int) -> str:
    if topk > 1:
        return f"tree of {draft_tokens} nodes (topk {topk})"
    return f"chain of {draft_tokens} draft token{'s' if draft_tokens != 1 else ''}"


def print_plan(plan: Plan, shape: ModelShape) -> None:
    requests = plan.max_running_requests
    print(f"{plan.model}, TP{plan.tp}, {_draft_words(plan.draft_tokens, plan.topk)}, "
          f"{requests} running requests, {plan.dtype}")
    if (plan.draft_tokens, plan.topk) == (shape.draft_tokens, shape.topk) and shape.draft_source:
        print(f"  draft: the preset's default ({shape.draft_source})")
    elif shape.draft_source:
        print(f"  draft: as given on the command line (--draft-tokens {plan.draft_tokens} --topk {plan.topk}), "
              f"not the preset's default")
    mixer = shape.mixer.per_rank(plan.tp, shape.name) if shape.mixer is not None else None
    kind = f"{mixer.title} " if mixer is not None else ""
    print(f"  shape per rank: {plan.conv_layers} {kind}conv layers, conv_dim {plan.conv_dim_per_rank}, "
          f"K={plan.kernel_size}")
    if mixer is not None:
        print(f"  mixer per rank: {mixer.describe()}")
    if plan.state_bytes_per_layer is None:
        print("  recurrent state: UNKNOWN (pass --mixer gdn|mamba2 with its dims, or --ssm-state): "
              "the state snapshots, the designs that need them and the saving's share are not computed")
    else:
        print(f"  recurrent state: {_size(plan.state_bytes_per_layer)} per layer (fp32)")
    print(f"  ({shape.source})")
    print()
    print("| conv windows, per rank | per slot | for all running requests |")
    print("|---|---|---|")
    print(f"| conv windows, dense | {_size(plan.dense_bytes_per_slot)} | {_size(plan.dense_bytes_per_slot * requests)} |")
    print(f"| conv windows, deduplicated ({plan.dedup_layout}) | {_size(plan.dedup_bytes_per_slot)} "
          f"({plan.dedup_ratio:.2f}x) | {_size(plan.dedup_bytes_per_slot * requests)} |")
    print(f"| saved | {_size(plan.saving_bytes_per_slot)} | {_size(plan.saving_bytes_total)} |")
    print(f"| SSM state snapshots of the same pass (fp32) | {_size(plan.ssm_snapshot_bytes_per_slot)} | "
          f"{_size(_mul(plan.ssm_snapshot_bytes_per_slot, requests))} |")
    if plan.saving_share_of_speculative_state is None:
        print("The conv saving's share of the speculative state is unknown: the recurrent state is unknown.")
    else:
        print(f"The conv saving is {plan.saving_share_of_speculative_state:.1%} of the speculative state "
              f"(dense conv windows + SSM snapshots).")
    print()
    if all(design.bytes_per_slot is None for design in plan.designs):
        print("The whole speculative state (four designs): unknown without the recurrent state's size "
              "(--ssm-state) and, for designs (c) and (d), the mixer's dims (--mixer gdn|mamba2 ...).")
        return
    print("The whole speculative state per slot and rank, four designs:")
    print(f"| design | keeps per slot | per slot | vs (a) | for {requests} requests |")
    print("|---|---|---|---|---|")
    first = plan.designs[0].bytes_per_slot
    for design in plan.designs:
        ratio = ("" if design.bytes_per_slot is None or not first else f"{design.bytes_per_slot / first:.3f}x")
        if design.bytes_per_slot is None:
            print(f"| {design.label} | {design.keeps} | unknown: needs --mixer and its dims | | |")
            continue
        print(f"| {design.label} | {design.keeps} | {_size(design.bytes_per_slot)} | {ratio} | "
              f"{_size(design.bytes_total)} |")
    print("Assumptions: per tensor-parallel rank; the committed conv state and recurrent state are NOT "
          "counted (every design keeps them);")
    print(f"conv windows, conv inputs and cached k/v (x/B) in {plan.dtype}; recurrent states and gates in "
          "fp32; activations and scratch of the verify pass not counted;")
    print("(c) is the engines' ReplaySSM (vLLM: conv state widened to K-1+D columns, post-conv inputs and "
          "gates cached per token);")
    print("(d) keeps only the conv inputs once (the dedup buffer) and the gates, recomputing k, v (x, B) "
          "from the buffer at commit; trees too.")
    if plan.replay_ratio_to_snapshot is not None:
        print(f"(d) keeps {plan.replay_ratio_to_snapshot:.2%} of (a): "
              f"{_size(plan.snapshot_bytes_per_slot - plan.replay_bytes_per_slot)} less per slot, "
              f"{_size(plan.snapshot_bytes_total - plan.replay_bytes_total)} for {requests} requests; "
              f"{plan.replay_bytes_per_slot / plan.input_replay_bytes_per_slot:.2f}x of (c).")
    if plan.kernel_size > REPLAY_MAX_KERNEL_SIZE or plan.draft_tokens > VERIFY_MAX_NODES:
        print(f"Sizes only: the package's commits, verifies and ring take K <= {REPLAY_MAX_KERNEL_SIZE} and "
              f"N <= {VERIFY_MAX_NODES} drafts (here K = {plan.kernel_size}, N = {plan.draft_tokens}); "
              f"(d) and the ring would refuse this model.")
    print()
    print_ring(plan)


_RING_GATES = {"gdn": "g, beta", "mamba2": "dt"}  # what the ring keeps beside each row


def print_ring(plan: Plan) -> None:
    """The ring's lines: its memory per slot and its state passes per step against (d)."""
    if plan.ring_bytes_per_slot is None:
        print("(e) the ring: unknown without the mixer's dims (--mixer gdn|mamba2 ...).")
        return
    parts = plan.ring_parts
    print(f"(e) the ring (docs/design.md, \"The ring\"): {plan.ring_rows} rows per slot and layer "
          f"(capacity R = {plan.ring_capacity} pending tokens + N = {plan.draft_tokens} drafts)")
    print(f"  memory: {_size(plan.ring_bytes_per_slot)} per slot = rows {_size(parts['rows'])} ({plan.dtype}) + "
          f"{_RING_GATES[plan.mixer]} {_size(parts['gates'])} (fp32) + cursor {parts['cursor']} B; "
          f"checkpoint excluded; "
          f"{_size(plan.ring_bytes_total)} for {plan.max_running_requests} requests; "
          f"{plan.ring_bytes_per_slot / plan.replay_bytes_per_slot:.2f}x of (d)")
    print(f"  state passes per step at accept length a = {plan.accept_length:g}: (d) "
          f"{plan.replay_state_passes_per_step} (verify reads, commit reads + writes); ring "
          f"1 + 1/F = {plan.ring_state_passes_per_step:.2f} at the least (verify reads every step, a fold writes "
          f"every F = floor((R - {'T' if plan.topk > 1 else 'N'})/a) + 1 = {plan.ring_fold_every_steps} steps"
          f"{f', T = {plan.ring_tree_depth}' if plan.topk > 1 else ''}); 1 + 2/F = "
          f"{plan.ring_state_passes_per_step_run:.2f} as the kernels run (a fold reads the state, then the verify)")
    print(f"  besides the states each verify replays a(F + 1)/2 = {plan.ring_mean_pending_tokens:g} pending tokens "
          f"on average: their rows and gates are {plan.ring_pending_share_of_state_pass:.1%} of one state pass")


def designs_figure(plan: Plan):
    """A matplotlib figure: one horizontal bar per design (bytes per slot, log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    known = [design for design in plan.designs if design.bytes_per_slot]
    if not known:
        raise ValueError("the recurrent state is unknown: pass --mixer gdn|mamba2 with its dims to plot the designs")
    fig, ax = plt.subplots(figsize=(8.4, 4.6), layout="constrained")
    colors = ("#b03a2e", "#c46a1b", "#3b6ea8", "#2e7d4f")
    rows = range(len(known))[::-1]  # (a) on top
    values = [design.bytes_per_slot / 2**20 for design in known]
    ax.barh(list(rows), values, color=[colors[[key for key, _ in DESIGNS].index(design.key)] for design in known],
            height=0.6)
    low = min(values) / 2  # the axis' left end
    first = plan.designs[0].bytes_per_slot
    names = {"conv": "conv", "states": "state snapshots", "inputs": "cached inputs", "gates": "gates"}
    for row, design, value in zip(rows, known, values):
        ratio = f"  ({design.bytes_per_slot / first:.3f}x of (a))" if first else ""
        parts = " + ".join(f"{names[part]} {_size(nbytes)}" for part, nbytes in design.parts.items() if nbytes)
        if design.key == "input_replay" and plan.topk > 1:
            parts += "\n(dense windows: no engine replays trees)"
        label = f"{_size(design.bytes_per_slot)}{ratio}\n{parts}"
        if value > 30 * low:  # a long bar: the label inside it
            ax.text(low * 1.15, row, label, va="center", fontsize=8.5, color="white")
        else:
            ax.text(value * 1.1, row, label, va="center", fontsize=8.5)
    ax.set_yticks(list(rows))
    ax.set_yticklabels([design.label for design in known])
    ax.set_xscale("log")
    ax.set_xlim(low, max(max(values) * 2, low * 300))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    ax.set_xlabel(f"speculative state per request slot and rank (MiB, log scale); {plan.dtype} conv, fp32 state")
    ax.set_title(f"{plan.model}, TP{plan.tp}, {_draft_words(plan.draft_tokens, plan.topk)}\n"
                 "speculative state per slot (the committed state, kept by all, excluded)", fontsize=11)
    ax.grid(axis="x", alpha=0.3, which="both")
    return fig


def plot_plan(plan: Plan, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # an optional dependency
        raise PlanError(f"--plot needs matplotlib ({error}); pip install matplotlib") from error

    try:
        fig = designs_figure(plan)
    except ValueError as error:
        raise PlanError(str(error)) from error
    try:
        fig.savefig(path, dpi=120, format="png")  # (exactly ``path``: no extension added or read)
    except OSError as error:
        raise PlanError(f"--plot {path}: {error.strerror or error}") from error
    finally:
        plt.close(fig)


_GDN_DIMS = ("num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim")
_MAMBA2_DIMS = ("num_heads", "head_dim", "n_groups", "d_state")
_CUSTOM_ONLY = ("conv_dim", "kernel_size", "ssm_state", "mixer", *_GDN_DIMS, *_MAMBA2_DIMS)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def custom_shape(args) -> ModelShape:
    """The shape of ``--model custom`` from the command line's dims (PlanError if they do not fit)."""
    gdn_given = [n for n in _GDN_DIMS if getattr(args, n) is not None]
    mamba_given = [n for n in _MAMBA2_DIMS if getattr(args, n) is not None]
    mixer = None
    if args.mixer is None and (gdn_given or mamba_given):
        raise PlanError(f"{_flag((gdn_given + mamba_given)[0])} needs --mixer gdn or --mixer mamba2")
    if args.mixer is not None:
        needed, other, cls = ((_GDN_DIMS, mamba_given, GatedDeltaNet) if args.mixer == "gdn"
                              else (_MAMBA2_DIMS, gdn_given, Mamba2))
        if other:
            raise PlanError(f"{_flag(other[0])} does not apply to --mixer {args.mixer}")
        missing = [_flag(n) for n in needed if getattr(args, n) is None]
        if missing:
            raise PlanError(f"--mixer {args.mixer} needs {', '.join(missing)}")
        if any(getattr(args, n) < 1 for n in needed):
            raise PlanError(f"--mixer {args.mixer}: every dim must be >= 1")
        mixer = cls(*(getattr(args, n) for n in needed))
    if args.layers is None:
        raise PlanError("--model custom needs --layers")
    conv_dim = args.conv_dim
    if conv_dim is None:
        if mixer is None:
            raise PlanError("--model custom needs --conv-dim (or --mixer gdn|mamba2 with its dims)")
        conv_dim = mixer.conv_dim
    state = args.ssm_state
    if mixer is not None and state is None:
        state = mixer.state_elements
    if args.layers < 1 or conv_dim < 1 or (state is not None and state < 1):
        raise PlanError("--layers, --conv-dim and --ssm-state must be >= 1")
    if args.kernel_size is not None and args.kernel_size < 2:
        raise PlanError(f"--kernel-size must be >= 2 (a conv window holds K-1 >= 1 inputs), got {args.kernel_size}")
    try:
        return ModelShape("custom", args.layers, conv_dim, 4 if args.kernel_size is None else args.kernel_size,
                          state, 4, 1, "custom shape from the command line", mixer)
    except ValueError as error:  # --conv-dim / --ssm-state contradict the mixer's dims
        raise PlanError(f"{error}: drop --conv-dim / --ssm-state or fix the dims") from error


def run_plan(args) -> int:
    if args.plot is not None:
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not args.plot or os.path.isdir(args.plot):
            raise PlanError(f"--plot {args.plot!r}: a file name is needed (the PNG to write)")
        if not os.path.isdir(folder):
            raise PlanError(f"--plot {args.plot}: the folder {folder} does not exist")
    if args.layers is not None and args.layers < 1:
        raise PlanError(f"--layers must be >= 1, got {args.layers}")
    if args.model == "custom":
        shape = custom_shape(args)
    else:
        stray = [_flag(n) for n in _CUSTOM_ONLY if getattr(args, n) is not None]
        if stray:
            verb = "applies" if len(stray) == 1 else "apply"
            raise PlanError(f"{', '.join(stray)} {verb} only to --model custom "
                            "(a preset's dims are fixed; --layers overrides its layer count)")
        shape = PRESETS[args.model]
        if args.layers is not None:
            shape = replace(shape, conv_layers=args.layers)
    draft_tokens = shape.draft_tokens if args.draft_tokens is None else args.draft_tokens
    topk = shape.topk if args.topk is None else args.topk
    try:
        plan = make_plan(shape, args.tp, draft_tokens, topk, args.max_running_requests, args.dtype,
                         capacity=args.capacity, accept_length=args.accept_length, tree_depth=args.tree_depth)
    except ValueError as error:
        raise PlanError(str(error)) from error
    if args.plot and all(design.bytes_per_slot is None for design in plan.designs):
        raise PlanError("--plot: the recurrent state is unknown: pass --mixer gdn|mamba2 with its dims "
                        "(or --ssm-state) to plot the designs")
    if args.plot:  # first: a file that cannot be written stops the command before it prints
        plot_plan(plan, args.plot)
    if args.json:
        print(json.dumps(asdict(plan)))
    else:
        print_plan(plan, shape)
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, choices=[*PRESETS, "custom"],
                        help="a preset (nemotron-h aliases nemotron-3-nano-30b-a3b) or custom")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (everything mixer-wide is split)")
    parser.add_argument("--draft-tokens", type=int, default=None, help="draft tokens (tree nodes if topk > 1)")
    parser.add_argument("--topk", type=int, default=None, help="1: a chain; > 1: a tree")
    parser.add_argument("--max-running-requests", type=int, default=256)
    parser.add_argument("--dtype", default="bf16", choices=list(_DTYPES),
                        help="conv windows / inputs and cached k, v (states and gates are fp32)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", default=None, metavar="FILE", help="PNG: the four designs' bytes per slot")
    parser.add_argument("--capacity", type=int, default=None,
                        help=f"the ring's R: pending tokens a slot holds (default {DEFAULT_CAPACITY}, or N if larger)")
    parser.add_argument("--accept-length", dest="accept_length", type=float, default=None,
                        help=f"the ring's traffic model: tokens accepted per step, the verified one counted "
                             f"(default {DEFAULT_ACCEPT_LENGTH:g}, at most N)")
    parser.add_argument("--tree-depth", dest="tree_depth", type=int, default=None,
                        help="trees: the nodes on their longest root path, the ring's fold rule (gdn_ring_verify's "
                             "tree_depth; default N)")
    parser.add_argument("--layers", type=int, default=None, help="custom: conv layers (or override a preset)")
    parser.add_argument("--conv-dim", dest="conv_dim", type=int, default=None,
                        help="custom: conv_dim at TP1 (derived from --mixer dims when omitted)")
    parser.add_argument("--kernel-size", type=int, default=None, help="custom: K (default 4)")
    parser.add_argument("--ssm-state", dest="ssm_state", type=int, default=None,
                        help="custom: elements of one layer's recurrent state per slot at TP1 (derived from "
                             "--mixer dims when omitted)")
    parser.add_argument("--mixer", default=None, choices=["gdn", "mamba2"],
                        help="custom: the recurrent mixer, with its dims below (needed for designs c and d)")
    for name, what in (("num_k_heads", "GDN key heads Hk"), ("head_k_dim", "GDN dk"),
                       ("num_v_heads", "GDN value heads Hv"), ("head_v_dim", "GDN dv"),
                       ("num_heads", "Mamba2 heads H"), ("head_dim", "Mamba2 head dim P"),
                       ("n_groups", "Mamba2 groups G"), ("d_state", "Mamba2 state size Ns")):
        parser.add_argument(_flag(name), dest=name, type=int, default=None, help=f"custom: {what} at TP1")
