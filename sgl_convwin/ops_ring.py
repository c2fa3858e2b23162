"""The ring operators (Gated DeltaNet): no commit pass. Per request slot the engine's ``ssm_state``
and ``conv_state`` are a CHECKPOINT; a ring beside them holds the conv inputs and gates of the
tokens accepted since (pending) and of this step's drafts; the verify replays the pending tokens
from the checkpoint and folds them into it when the ring would overflow; acceptance moves a
cursor; ``gdn_ring_flush`` brings the checkpoint up to date on demand. See docs/design.md, "The ring".

On CUDA tensors each op is Triton launches (csrc_triton/ring_conv.py, gdn_ring_verify.py,
ring_accept.py): indices and cursors stay on the device, shapes are fixed, nothing is decided on
the host, so a whole step is capturable in a CUDA graph. On the CPU they run cpu_ring.py's
vectorised PyTorch code.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import cpu_ring
from .declare import declare_op
from .layout import CACHE_DTYPES, DIM_MAJOR, WINDOW_MAJOR
from .validation import (
    check_alloc_ring_args,
    check_flush_tree_depth,
    check_gdn_ring_flush_args,
    check_gdn_ring_verify_args,
    check_ring_accept_args,
    check_ring_conv1d_verify_args,
    check_ring_index_values,
    check_separate_storages,
    check_tree_depth,
    layer_output,
    should_check_index_values,
)

DEFAULT_CAPACITY = 16


class Ring(NamedTuple):
    """One ring (``alloc_ring``): C = capacity + N rows per slot."""

    rows: torch.Tensor  # [L, M, C, dim]: conv inputs, token-major
    gates: torch.Tensor  # [L, M, C, G, H] float32: g, beta per value head (G = 2), or Mamba2's dt per head (G = 1)
    cursor: torch.Tensor  # [M, 2] int32: (start, pending)


def alloc_ring(
    num_layers: int,
    num_slots: int,
    dim: int,
    num_draft: int,
    num_v_heads: int,
    *,
    capacity: int = DEFAULT_CAPACITY,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
) -> Ring:
    """Zeros: ``rows [L, M, capacity + N, dim]`` in ``dtype``, ``gates [L, M, capacity + N, 2, Hv]``
    float32, ``cursor [M, 2]`` int32 (every slot empty). ``capacity`` >= N: the most pending
    tokens a slot holds (its verify folds them when pending + N would exceed it)."""
    check_alloc_ring_args("alloc_ring", num_layers=num_layers, num_slots=num_slots, dim=dim, num_draft=num_draft,
                          num_v_heads=num_v_heads, capacity=capacity)
    if dtype not in CACHE_DTYPES:
        raise TypeError(f"alloc_ring: dtype must be float32, float16 or bfloat16, got {dtype}")
    ring_rows = capacity + num_draft
    return Ring(
        torch.zeros(num_layers, num_slots, ring_rows, dim, dtype=dtype, device=device),
        torch.zeros(num_layers, num_slots, ring_rows, 2, num_v_heads, dtype=torch.float32, device=device),
        torch.zeros(num_slots, 2, dtype=torch.int32, device=device),
    )


def _kernel_state(conv_state, state_layout):
    """conv_state as the kernels read it: [L, S, dim, K-1] (a view)."""
    return conv_state.transpose(2, 3) if state_layout == WINDOW_MAJOR else conv_state


# ---------------------------------------------------------------------------------------------
# ring_conv1d_verify: the verify conv, history from the checkpoint's window and the pending rows
# ---------------------------------------------------------------------------------------------

_RING_CONV = "convwin.ring_conv1d_verify"


def _prepare_ring_conv1d_verify(real, out, rows, conv_state, x, weight, bias, ring_slots, state_slots, cursor, layer,
                                parents, activation, state_layout, sizes=None):
    """As ops._prepare_verify (``sizes``: a call of this signature's, whose checks it skips)."""
    if sizes is None:
        sizes, layer_out = check_ring_conv1d_verify_args(out, rows, conv_state, x, weight, bias, ring_slots,
                                                         state_slots, cursor, layer, parents, activation, state_layout)
    else:
        layer_out = layer_output(sizes, out, layer)
    if real:
        check_separate_storages(_RING_CONV, {"out": layer_out, "rows": rows},
                                dict(conv_state=conv_state, x=x, weight=weight, bias=bias, cursor=cursor))
        if should_check_index_values(rows):
            check_ring_index_values(_RING_CONV, sizes, ring_slots, cursor, state_slots=state_slots, parents=parents)
    args = (layer_out, rows, _kernel_state(conv_state, state_layout), x, weight, bias, ring_slots, state_slots, cursor,
            layer, parents)
    return args, dict(silu=activation is not None), sizes


@declare_op(mutates=("out", "rows"), prepare=_prepare_ring_conv1d_verify, cpu=cpu_ring.ring_conv1d_verify_cpu,
            cuda="launch_ring_conv1d_verify", eager_plan="planned_ring_conv1d_verify")
def ring_conv1d_verify(
    out: torch.Tensor,
    rows: torch.Tensor,
    conv_state: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    ring_slots: torch.Tensor,
    state_slots: torch.Tensor,
    cursor: torch.Tensor,
    layer: int,
    parents: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    state_layout: str = DIM_MAJOR,
) -> None:
    """The verify pass's depthwise causal conv of layer ``layer`` in ring mode; stores the drafts'
    conv inputs in the ring.

    Row b's slot holds (start, pending) = cursor[ring_slots[b]]. Node n's K inputs are, oldest
    first, the last ones of: the checkpoint's window ``conv_state[layer, state_slots[b]]``, the
    pending tokens' rows ``rows[layer, ring_slots[b], (start + j) % C]`` for j < pending, and the
    path root -> n of ``x[b]`` (``parents`` None: a chain). ``out[b, n] = act(bias + sum_k
    weight[:, k] * input k)`` (causal_conv1d_verify's arithmetic); ``x[b, n]`` is stored at row
    (start + pending + n) % C, cast to the ring's dtype.

    out: [B, N, dim] or every layer's [L, B, N, dim]. rows: the ring's [L, M, C, dim], C =
    capacity + N. conv_state: [L, S, dim, K-1] (or window-major), read only. x: [B, N, dim].
    weight [dim, K], bias [dim] or None. ring_slots, state_slots: [B]; cursor: [M, 2]; parents:
    [B, N] or None; int32/int64. A row is skipped when a slot is negative or out of range or its
    cursor is not a ring position (0 <= start < C, 0 <= pending <= capacity); a node whose K-1
    parent links above it hold a bad one gets no output. One launch.
    Same as ``torch.ops.convwin.ring_conv1d_verify``.
    """


# ---------------------------------------------------------------------------------------------
# gdn_ring_verify: replay the pending tokens, fold them if the ring would overflow, the drafts' outputs
# ---------------------------------------------------------------------------------------------

_GDN_RING_VERIFY = "convwin.gdn_ring_verify"


def _prepare_gdn_ring_verify(real, out, q, k, v, g, beta, ssm_state, conv_state, rows, gates, cursor, conv_weight,
                             conv_bias, ring_slots, state_slots, layer, parents, scale, use_qk_l2norm, state_layout,
                             after_due_flush, tree_depth, sizes=None):
    """As _prepare_ring_conv1d_verify."""
    if sizes is None:
        sizes = check_gdn_ring_verify_args(out, q, k, v, g, beta, ssm_state, conv_state, rows, gates, cursor,
                                           conv_weight, conv_bias, ring_slots, state_slots, layer, parents, scale,
                                           state_layout)
        check_tree_depth(_GDN_RING_VERIFY, tree_depth, sizes.num_nodes, parents is not None)
    if real:
        written = {"out": out, "ssm_state": ssm_state, "conv_state": conv_state, "gates": gates}
        check_separate_storages(
            _GDN_RING_VERIFY, written,
            dict(q=q, k=k, v=v, g=g, beta=beta, rows=rows, cursor=cursor, conv_weight=conv_weight, conv_bias=conv_bias,
                 ring_slots=ring_slots, state_slots=state_slots, parents=parents),
        )
        if should_check_index_values(ssm_state):
            check_ring_index_values(_GDN_RING_VERIFY, sizes, ring_slots, cursor, state_slots=state_slots,
                                    parents=parents, tree_depth=tree_depth)
    scale = q.shape[3] ** -0.5 if scale is None else float(scale)
    args = (out, q, k, v, g, beta, ssm_state, _kernel_state(conv_state, state_layout), rows, gates, cursor,
            conv_weight, conv_bias, ring_slots, state_slots, layer, parents)
    return args, dict(scale=scale, use_qk_l2norm=bool(use_qk_l2norm), tree_depth=tree_depth,
                      fold_tiles=0 if after_due_flush else 1), sizes


@declare_op(mutates=("out", "ssm_state", "conv_state", "gates"), prepare=_prepare_gdn_ring_verify,
            cpu=cpu_ring.gdn_ring_verify_cpu, cuda="launch_gdn_ring_verify", eager_plan="planned_gdn_ring_verify")
def gdn_ring_verify(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    conv_state: torch.Tensor,
    rows: torch.Tensor,
    gates: torch.Tensor,
    cursor: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    ring_slots: torch.Tensor,
    state_slots: torch.Tensor,
    layer: int,
    parents: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    state_layout: str = DIM_MAJOR,
    after_due_flush: bool = False,
    tree_depth: int | None = None,
) -> None:
    """``gdn_verify`` in ring mode, layer ``layer``: the drafts' outputs from the checkpoint plus
    the pending tokens, the fold when the ring would overflow, the drafts' gates into the ring.

    For row b, with (start, pending) = cursor[ring_slots[b]], capacity = C - N and T =
    ``tree_depth`` (None: N):
    1. S = the checkpoint ``ssm_state[layer, state_slots[b]]`` (float32) after the pending tokens,
       replayed as ``gdn_commit`` replays a path: token j's conv input is ring row (start + j) % C,
       its conv reads the checkpoint's window ``conv_state[layer, state_slots[b]]`` before the
       first one, its g, beta are ``gates[layer, ring_slots[b], (start + j) % C]``.
    2. If pending > 0 and pending + T > capacity (fold): ``ssm_state[layer, state_slots[b]] = S``
       (cast) and ``conv_state[layer, state_slots[b]]`` = the last K-1 inputs (ring rows, else
       window columns). The cursor is not written: ``ring_accept`` applies the same rule.
    3. ``out[b, n]`` = gdn_verify's output of node n from S (q, k, v, g, beta [b, n] as given).
    4. ``gates[layer, ring_slots[b], (start + pending + n) % C] = (g[b, n], beta[b, n])``.

    out [B, N, Hv, dv]; q, k [B, N, Hk, dk]; v [B, N, Hv, dv]; g, beta [B, N, Hv] (as gdn_verify).
    ssm_state: every layer's pool [L, S, Hv, dk, dv], float32 or bfloat16; conv_state [L, S, dim,
    K-1] (or window-major), dim = 2*Hk*dk + Hv*dv, K <= 5. rows [L, M, C, dim] (read), gates
    [L, M, C, 2, Hv], cursor [M, 2] (read). conv_weight [dim, K], conv_bias [dim] or None: the
    layer's. Rows are skipped as in ``ring_conv1d_verify``; a bad parent link leaves the row's
    ``out`` untouched but still folds and stores the gates (the fold does not depend on the tree).
    ``after_due_flush``: a hint that this step began with a due flush of these rows
    (``gdn_ring_flush(..., num_draft=N)``), so that no row folds here; the fold launch then takes a
    program a row instead of a tile, one short wave. The results never depend on it: a row that does
    fold is folded the same, only slower. ``tree_depth``: for trees, the most nodes on a root path
    (the most tokens a step accepts, <= N): the ring then folds only when the accepted path could
    overflow it, not the whole tree (TREE_PARENTS-like trees of 8 nodes, depth 4, fold as seldom as
    chains of 4). Every op of the step takes the same value (``ring_accept``, the due flush); no
    tree may be deeper (the checked mode names one). None (or N) for chains.
    Same as ``torch.ops.convwin.gdn_ring_verify``.
    """


# ---------------------------------------------------------------------------------------------
# ring_accept: acceptance moves the cursor (a tree's accepted path is made contiguous)
# ---------------------------------------------------------------------------------------------

_RING_ACCEPT = "convwin.ring_accept"


def _prepare_ring_accept(real, cursor, rows, gates, ring_slots, steps, parents, num_draft, tree_depth, sizes=None):
    """As _prepare_ring_conv1d_verify."""
    if sizes is None:
        sizes = check_ring_accept_args(cursor, rows, gates, ring_slots, steps, parents, num_draft)
        check_tree_depth(_RING_ACCEPT, tree_depth, num_draft, parents is not None)
    if real:
        check_separate_storages(_RING_ACCEPT, {"cursor": cursor, "rows": rows, "gates": gates},
                                dict(ring_slots=ring_slots, steps=steps, parents=parents))
        if should_check_index_values(cursor):
            check_ring_index_values(_RING_ACCEPT, sizes, ring_slots, cursor, parents=parents, steps=steps,
                                    tree_depth=tree_depth)
    return (cursor, rows, gates, ring_slots, steps, parents), dict(num_draft=int(num_draft),
                                                                   tree_depth=tree_depth), sizes


@declare_op(mutates=("cursor", "rows", "gates"), prepare=_prepare_ring_accept, cpu=cpu_ring.ring_accept_cpu,
            cuda="launch_ring_accept", eager_plan="planned_ring_accept")
def ring_accept(
    cursor: torch.Tensor,
    rows: torch.Tensor,
    gates: torch.Tensor,
    ring_slots: torch.Tensor,
    steps: torch.Tensor,
    parents: torch.Tensor | None = None,
    *,
    num_draft: int,
    tree_depth: int | None = None,
) -> None:
    """After every layer's verify: advance each row's cursor, all layers at once.

    For row b with (start, pending) = cursor[ring_slots[b]], capacity = C - num_draft and T =
    ``tree_depth`` (None: num_draft): if pending + T > capacity (the verify folded),
    start = (start + pending) % C and
    pending = 0. Then, if steps[b] (the last accepted draft token, or the accepted node:
    ``gdn_commit``'s steps) lies in [0, N) and its path's links are good, the path root ->
    steps[b] (``parents`` None: tokens 0..steps[b]) becomes pending: pending += its length, and for
    a tree the path's rows and gates (every layer) move to positions start + pending + j, in path
    order. A negative step accepts nothing (the fold still counts).

    cursor [M, 2], rows [L, M, C, dim], gates [L, M, C, G, H]: the ring, written. ring_slots,
    steps: [B]; parents [B, N] or None; int32/int64. ``num_draft``: N, and ``tree_depth``, as this
    step's verify had them.
    A row whose ring slot is negative or out of range, or whose cursor is not a ring position, is
    skipped. Same as ``torch.ops.convwin.ring_accept``.
    """


# ---------------------------------------------------------------------------------------------
# gdn_ring_flush: fold the pending tokens now, every layer
# ---------------------------------------------------------------------------------------------

_GDN_RING_FLUSH = "convwin.gdn_ring_flush"


def _prepare_gdn_ring_flush(real, ssm_state, conv_state, cursor, rows, gates, conv_weight, ring_slots, state_slots,
                            num_k_heads, head_k_dim, num_v_heads, head_v_dim, conv_bias, use_qk_l2norm, state_layout,
                            num_draft, tree_depth, sizes=None):
    """As _prepare_ring_conv1d_verify."""
    if sizes is None:
        sizes = check_gdn_ring_flush_args(ssm_state, conv_state, cursor, rows, gates, conv_weight, conv_bias,
                                          ring_slots, state_slots, num_k_heads, head_k_dim, num_v_heads, head_v_dim,
                                          state_layout, num_draft)
        check_flush_tree_depth(_GDN_RING_FLUSH, tree_depth, num_draft)
    if real:
        check_separate_storages(
            _GDN_RING_FLUSH, {"ssm_state": ssm_state, "conv_state": conv_state, "cursor": cursor},
            dict(rows=rows, gates=gates, conv_weight=conv_weight, conv_bias=conv_bias, ring_slots=ring_slots,
                 state_slots=state_slots),
        )
        if should_check_index_values(ssm_state):
            check_ring_index_values(_GDN_RING_FLUSH, sizes, ring_slots, cursor, state_slots=state_slots)
    args = (ssm_state, _kernel_state(conv_state, state_layout), cursor, rows, gates, conv_weight, conv_bias, ring_slots,
            state_slots)
    return args, dict(num_k_heads=num_k_heads, head_k_dim=head_k_dim, num_v_heads=num_v_heads, head_v_dim=head_v_dim,
                      use_qk_l2norm=bool(use_qk_l2norm), num_draft=num_draft, tree_depth=tree_depth), sizes


@declare_op(mutates=("ssm_state", "conv_state", "cursor"), prepare=_prepare_gdn_ring_flush,
            cpu=cpu_ring.gdn_ring_flush_cpu, cuda="launch_gdn_ring_flush", eager_plan="planned_gdn_ring_flush")
def gdn_ring_flush(
    ssm_state: torch.Tensor,
    conv_state: torch.Tensor,
    cursor: torch.Tensor,
    rows: torch.Tensor,
    gates: torch.Tensor,
    conv_weight: torch.Tensor,
    ring_slots: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    num_k_heads: int,
    head_k_dim: int,
    num_v_heads: int,
    head_v_dim: int,
    conv_bias: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    state_layout: str = DIM_MAJOR,
    num_draft: int | None = None,
    tree_depth: int | None = None,
) -> None:
    """Materialise the checkpoints of the given slots now, every layer: replay each row's pending
    tokens onto ``ssm_state[:, state_slots[b]]`` and write their last K-1 inputs into
    ``conv_state[:, state_slots[b]]`` (as ``gdn_ring_verify``'s fold), then cursor = ((start +
    pending) % C, 0). Afterwards both hold what eager ``gdn_commit`` after every step would have: the
    conv window bit for bit, the state within float32 rounding (a bfloat16 state is rounded once
    per fold instead of once per step). Between steps only (after ``ring_accept``, before the next
    verify): for prefix caching, preemption, eviction, a move to another pool.

    ``num_draft=N`` (and ``tree_depth``, the verify's): only the rows the next verify of N drafts
    would fold (pending > 0 and pending + T > capacity, T = tree_depth or N; a cursor with more than
    the capacity pending is skipped, as the verify skips it), the others untouched -- that step's
    folds done now for every layer in one launch, so the per-layer verifies find nothing to fold
    (where the verify runs the mma kernel, by its own fold
    code: the same checkpoints; a bfloat16 checkpoint's drafts then see it rounded, as a folding
    row's do there; the step's conv reads a folded row's history from ``conv_state``, in its dtype).
    Between steps only, as every flush.

    ssm_state [L, S, Hv, dk, dv], conv_state [L, S, dim, K-1] (or window-major): written.
    cursor [M, 2] written; rows [L, M, C, dim], gates [L, M, C, 2, Hv] read. conv_weight
    [L, dim, K], conv_bias [L, dim] or None. A row is skipped when a slot is negative or out of
    range or its cursor is not a ring position (0 <= start < C, 0 <= pending < C).
    Same as ``torch.ops.convwin.gdn_ring_flush``.
    """
