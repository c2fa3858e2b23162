"""The ring operators for Mamba2 layers: ``mamba2_ring_verify`` and ``mamba2_ring_flush``, the twins
of ops_ring's ``gdn_ring_verify`` and ``gdn_ring_flush``, on a ring from ``alloc_mamba2_ring``. The
conv (``ring_conv1d_verify``) and the acceptance (``ring_accept``) are ops_ring's, mixer-free.

Per token the ring keeps its conv input (a row, as for Gated DeltaNet) and one gate per head: dt as
the recurrence uses it, after ``dt_bias`` and softplus -- what ``mamba2_commit``'s gates hold, so a
replay needs neither. The fold rule, the cursor and the skips are the Gated DeltaNet ring's. On
CUDA both ops are the Triton launches of csrc_triton/mamba2_ring_verify.py; on the CPU the
vectorised PyTorch code of cpu_ring.py. See docs/design.md, "The ring".
"""

from __future__ import annotations

import torch

from . import cpu_ring
from .declare import declare_op
from .layout import CACHE_DTYPES, DIM_MAJOR
from .ops_ring import DEFAULT_CAPACITY, Ring, _kernel_state
from .validation import (
    check_alloc_ring_args,
    check_flush_tree_depth,
    check_mamba2_ring_flush_args,
    check_mamba2_ring_verify_args,
    check_ring_index_values,
    check_separate_storages,
    check_tree_depth,
    should_check_index_values,
)


def alloc_mamba2_ring(
    num_layers: int,
    num_slots: int,
    dim: int,
    num_draft: int,
    num_heads: int,
    *,
    capacity: int = DEFAULT_CAPACITY,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
) -> Ring:
    """Zeros: ``rows [L, M, capacity + N, dim]`` in ``dtype``, ``gates [L, M, capacity + N, 1, H]``
    float32 (dt per head), ``cursor [M, 2]`` int32 (every slot empty); ``alloc_ring`` with one gate
    per head instead of two. ``capacity`` >= N, as there."""
    check_alloc_ring_args("alloc_mamba2_ring", num_layers=num_layers, num_slots=num_slots, dim=dim,
                          num_draft=num_draft, num_heads=num_heads, capacity=capacity)
    if dtype not in CACHE_DTYPES:
        raise TypeError(f"alloc_mamba2_ring: dtype must be float32, float16 or bfloat16, got {dtype}")
    ring_rows = capacity + num_draft
    return Ring(
        torch.zeros(num_layers, num_slots, ring_rows, dim, dtype=dtype, device=device),
        torch.zeros(num_layers, num_slots, ring_rows, 1, num_heads, dtype=torch.float32, device=device),
        torch.zeros(num_slots, 2, dtype=torch.int32, device=device),
    )


# ---------------------------------------------------------------------------------------------
# mamba2_ring_verify: replay the pending tokens, fold them if the ring would overflow, the drafts' outputs
# ---------------------------------------------------------------------------------------------

_MAMBA2_RING_VERIFY = "convwin.mamba2_ring_verify"


def _prepare_mamba2_ring_verify(real, out, x, dt, A, B, C, ssm_state, conv_state, rows, gates, cursor, conv_weight,
                                conv_bias, ring_slots, state_slots, layer, parents, D, z, dt_bias, dt_softplus,
                                state_layout, after_due_flush, tree_depth, sizes=None):
    """As ops_ring._prepare_ring_conv1d_verify."""
    if sizes is None:
        sizes = check_mamba2_ring_verify_args(out, x, dt, A, B, C, ssm_state, conv_state, rows, gates, cursor,
                                              conv_weight, conv_bias, ring_slots, state_slots, layer, parents, D, z,
                                              dt_bias, dt_softplus, state_layout)
        check_tree_depth(_MAMBA2_RING_VERIFY, tree_depth, sizes.num_nodes, parents is not None)
    if real:
        written = {"out": out, "ssm_state": ssm_state, "conv_state": conv_state, "gates": gates}
        check_separate_storages(
            _MAMBA2_RING_VERIFY, written,
            dict(x=x, dt=dt, A=A, B=B, C=C, rows=rows, cursor=cursor, conv_weight=conv_weight, conv_bias=conv_bias,
                 D=D, z=z, dt_bias=dt_bias, ring_slots=ring_slots, state_slots=state_slots, parents=parents),
        )
        if should_check_index_values(ssm_state):
            check_ring_index_values(_MAMBA2_RING_VERIFY, sizes, ring_slots, cursor, state_slots=state_slots,
                                    parents=parents, tree_depth=tree_depth)
    args = (out, x, dt, A, B, C, ssm_state, _kernel_state(conv_state, state_layout), rows, gates, cursor, conv_weight,
            conv_bias, ring_slots, state_slots, layer, parents, D, z, dt_bias)
    return args, dict(dt_softplus=dt_softplus, tree_depth=tree_depth, fold_tiles=0 if after_due_flush else 1), sizes


@declare_op(mutates=("out", "ssm_state", "conv_state", "gates"), prepare=_prepare_mamba2_ring_verify,
            cpu=cpu_ring.mamba2_ring_verify_cpu, cuda="launch_mamba2_ring_verify",
            eager_plan="planned_mamba2_ring_verify")
def mamba2_ring_verify(
    out: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
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
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_layout: str = DIM_MAJOR,
    after_due_flush: bool = False,
    tree_depth: int | None = None,
) -> None:
    """``mamba2_verify`` in ring mode, layer ``layer``: the drafts' outputs from the checkpoint plus
    the pending tokens, the fold when the ring would overflow, the drafts' dt into the ring.

    For row b, with (start, pending) = cursor[ring_slots[b]], capacity = C - N and T =
    ``tree_depth`` (None: N):
    1. h = the checkpoint ``ssm_state[layer, state_slots[b]]`` (float32) after the pending tokens,
       replayed as ``mamba2_commit`` replays a path: token j's conv input is ring row (start + j) % C,
       its conv reads the checkpoint's window ``conv_state[layer, state_slots[b]]`` before the
       first one, then SiLU and the split into x, B; its dt is ``gates[layer, ring_slots[b],
       (start + j) % C, 0]``; ``h = exp(dt * A) * h + (dt * x) B^T``.
    2. If pending > 0 and pending + T > capacity (fold): ``ssm_state[layer, state_slots[b]] = h``
       (cast) and ``conv_state[layer, state_slots[b]]`` = the last K-1 inputs (ring rows, else
       window columns). The cursor is not written: ``ring_accept`` applies the same rule.
    3. ``out[b, n]`` = mamba2_verify's output of node n from h (x, dt, B, C, D, z, dt_bias,
       dt_softplus as given).
    4. ``gates[layer, ring_slots[b], (start + pending + n) % C, 0]`` = d[b, n], the dt node n
       decoded with: ``dt (+ dt_bias)``, softplus'd if ``dt_softplus``, in float32.

    out, x [B, N, H, P]; B, C [B, N, G, Ns]; dt [B, N, H]; A (the layer's, negative), D, dt_bias
    [H]; z [B, N, H, P] (as mamba2_verify). ssm_state: every layer's pool [L, S, H, P, Ns], float32
    or bfloat16; conv_state [L, S, dim, K-1] (or window-major), dim = H*P + 2*G*Ns, K <= 5. rows
    [L, M, C, dim] (read), gates [L, M, C, 1, H] (``alloc_mamba2_ring``), cursor [M, 2] (read).
    conv_weight [dim, K], conv_bias [dim] or None: the layer's. Rows are skipped as in
    ``ring_conv1d_verify``; a bad parent link leaves the row's ``out`` untouched but still folds
    and stores the dt. ``after_due_flush``: as in ``gdn_ring_verify`` (a hint that the step began
    with ``mamba2_ring_flush(..., num_draft=N)``: the fold launch a program a row; never the results).
    ``tree_depth``: as in ``gdn_ring_verify``.
    Same as ``torch.ops.convwin.mamba2_ring_verify``.
    """


# ---------------------------------------------------------------------------------------------
# mamba2_ring_flush: fold the pending tokens now, every layer
# ---------------------------------------------------------------------------------------------

_MAMBA2_RING_FLUSH = "convwin.mamba2_ring_flush"


def _prepare_mamba2_ring_flush(real, ssm_state, conv_state, cursor, rows, gates, conv_weight, A, ring_slots,
                               state_slots, num_heads, head_dim, n_groups, d_state, conv_bias, state_layout,
                               num_draft, tree_depth, sizes=None):
    """As ops_ring._prepare_ring_conv1d_verify."""
    if sizes is None:
        sizes = check_mamba2_ring_flush_args(ssm_state, conv_state, cursor, rows, gates, conv_weight, conv_bias, A,
                                             ring_slots, state_slots, num_heads, head_dim, n_groups, d_state,
                                             state_layout, num_draft)
        check_flush_tree_depth(_MAMBA2_RING_FLUSH, tree_depth, num_draft)
    if real:
        check_separate_storages(
            _MAMBA2_RING_FLUSH, {"ssm_state": ssm_state, "conv_state": conv_state, "cursor": cursor},
            dict(rows=rows, gates=gates, conv_weight=conv_weight, conv_bias=conv_bias, A=A, ring_slots=ring_slots,
                 state_slots=state_slots),
        )
        if should_check_index_values(ssm_state):
            check_ring_index_values(_MAMBA2_RING_FLUSH, sizes, ring_slots, cursor, state_slots=state_slots)
    args = (ssm_state, _kernel_state(conv_state, state_layout), cursor, rows, gates, conv_weight, conv_bias, A,
            ring_slots, state_slots)
    return args, dict(num_heads=num_heads, head_dim=head_dim, n_groups=n_groups, d_state=d_state,
                      num_draft=num_draft, tree_depth=tree_depth), sizes


@declare_op(mutates=("ssm_state", "conv_state", "cursor"), prepare=_prepare_mamba2_ring_flush,
            cpu=cpu_ring.mamba2_ring_flush_cpu, cuda="launch_mamba2_ring_flush",
            eager_plan="planned_mamba2_ring_flush")
def mamba2_ring_flush(
    ssm_state: torch.Tensor,
    conv_state: torch.Tensor,
    cursor: torch.Tensor,
    rows: torch.Tensor,
    gates: torch.Tensor,
    conv_weight: torch.Tensor,
    A: torch.Tensor,
    ring_slots: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    num_heads: int,
    head_dim: int,
    n_groups: int,
    d_state: int,
    conv_bias: torch.Tensor | None = None,
    state_layout: str = DIM_MAJOR,
    num_draft: int | None = None,
    tree_depth: int | None = None,
) -> None:
    """Materialise the checkpoints of the given slots now, every layer: replay each row's pending
    tokens onto ``ssm_state[:, state_slots[b]]`` and write their last K-1 inputs into
    ``conv_state[:, state_slots[b]]`` (as ``mamba2_ring_verify``'s fold), then cursor = (start +
    pending, 0). Afterwards both hold what eager ``mamba2_commit`` after every step would have: the
    conv window bit for bit, the state within float32 rounding. Between steps only (after
    ``ring_accept``, before the next verify). ``num_draft=N`` (and ``tree_depth``): only the rows the
    next verify of N drafts would fold, as in ``gdn_ring_flush``.

    ssm_state [L, S, H, P, Ns], conv_state [L, S, dim, K-1] (or window-major): written. cursor
    [M, 2] written; rows [L, M, C, dim], gates [L, M, C, 1, H] read. conv_weight [L, dim, K],
    conv_bias [L, dim] or None, A [L, H] (as ``mamba2_commit``). Rows are skipped as in
    ``gdn_ring_flush``. Same as ``torch.ops.convwin.mamba2_ring_flush``.
    """
