"""The replay-commit operators: commit a Gated DeltaNet or Mamba2 layer's whole speculative state
-- the recurrent state and the conv window -- by replaying the accepted path from the conv-input
buffer that ``capture`` / ``causal_conv1d_verify`` fill, plus the per-token gates it needs. No
state snapshots: per draft token a layer keeps its conv input (one buffer row) and, per head, two
scalars (GDN: g, beta) or one (Mamba2: dt) (``alloc_gates``).
"""

from __future__ import annotations

import torch

from . import cpu
from .declare import declare_op
from .layout import CACHE_DTYPES, DEFAULT_LAYOUT, DIM_MAJOR, WINDOW_MAJOR, check_sizes, token_views
from .validation import (
    check_capture_gates_args,
    check_capture_gates_index_values,
    check_gdn_commit_args,
    check_mamba2_commit_args,
    check_no_shared_storages,
    check_replay_index_values,
    check_replay_storages,
    should_check_index_values,
)

# ---------------------------------------------------------------------------------------------
# alloc_gates: the per-token gates buffer
# ---------------------------------------------------------------------------------------------


def _gates_shape(num_layers, num_slots, num_draft, num_heads, num_gates, dtype):
    if dtype not in CACHE_DTYPES:
        raise TypeError(f"convwin.alloc_gates: dtype must be float32, float16 or bfloat16, got {dtype}")
    check_sizes(num_layers, num_slots, 1, num_draft, 2)
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, torch.SymInt)) or num_heads < 1:
        raise ValueError(f"convwin.alloc_gates: num_heads must be an int >= 1, got {num_heads!r}")
    if isinstance(num_gates, bool) or not isinstance(num_gates, (int, torch.SymInt)) or num_gates not in (1, 2):
        raise ValueError(f"convwin.alloc_gates: num_gates must be 2 (GDN: g, beta) or 1 (Mamba2: dt), got {num_gates!r}")
    return (num_layers, num_slots, num_draft, num_gates, num_heads)


@torch.library.custom_op("convwin::alloc_gates", mutates_args=())
def _alloc_gates(
    num_layers: int, num_slots: int, num_draft: int, num_heads: int, num_gates: int,
    dtype: torch.dtype, device: torch.device,
) -> torch.Tensor:
    shape = _gates_shape(num_layers, num_slots, num_draft, num_heads, num_gates, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


@_alloc_gates.register_fake
def _alloc_gates_fake(num_layers, num_slots, num_draft, num_heads, num_gates, dtype, device):
    shape = _gates_shape(num_layers, num_slots, num_draft, num_heads, num_gates, dtype)
    return torch.empty(shape, dtype=dtype, device=device)


def alloc_gates(
    num_layers: int,
    num_slots: int,
    num_draft: int,
    num_heads: int,
    *,
    num_gates: int = 2,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The zero-filled gates buffer ``[L, M, N, num_gates, H]``: ``[..., 0, :]`` = g (the log
    decay, <= 0) and ``[..., 1, :]`` = beta of draft token (or tree node) n of slot m, per value
    head (Gated DeltaNet, num_gates=2); with num_gates=1, ``[..., 0, :]`` = dt per head (Mamba2)."""
    _gates_shape(num_layers, num_slots, num_draft, num_heads, num_gates, dtype)  # clear errors first
    device = torch.get_default_device() if device is None else torch.device(device)
    return torch.ops.convwin.alloc_gates(num_layers, num_slots, num_draft, num_heads, num_gates, dtype, device)


# ---------------------------------------------------------------------------------------------
# capture_gates: the verify pass stores each token's gates
# ---------------------------------------------------------------------------------------------


_CAPTURE_GATES = "convwin.capture_gates"


def _prepare_capture_gates(real, gates, g, beta, buffer_slots, layer, a, b, A_log, dt_bias, sizes=None):
    """``sizes``: this call signature's, checked before (the eager plan); then only the checks
    that depend on the tensors' storage run (see declare.py)."""
    if sizes is None:
        sizes = check_capture_gates_args(gates, g, beta, buffer_slots, layer, a, b, A_log, dt_bias)
    if real:
        check_no_shared_storages(_CAPTURE_GATES, "gates", gates, g=g, beta=beta, a=a, b=b, A_log=A_log,
                                 dt_bias=dt_bias)
        if should_check_index_values(gates):
            check_capture_gates_index_values(gates, buffer_slots)
    if a is not None:  # the kernels read the raw inputs where g, beta go, and compute the gates
        return (gates, a, b, buffer_slots, layer, A_log, dt_bias), {}, sizes
    return (gates, g, beta, buffer_slots, layer, None, None), {}, sizes


@declare_op(mutates=("gates",), prepare=_prepare_capture_gates, cpu=cpu.capture_gates_cpu,
            cuda="launch_capture_gates", eager_plan="planned_capture_gates")
def capture_gates(
    gates: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    buffer_slots: torch.Tensor,
    layer: int,
    *,
    a: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
) -> None:
    """Store the verify pass's per-token gates of layer ``layer`` (one launch, no sync).

    gates: the whole buffer from ``alloc_gates`` ([L, M, N, G, H]). g, beta: [B, n, H] (n <= N),
    any float dtype and strides; beta None for a one-gate (Mamba2 dt) buffer. Writes
    ``gates[layer, buffer_slots[b], :n]``; a negative or out-of-range slot skips the row.
    Raw gates (Gated DeltaNet, what the engines' verify holds): g = beta = None and the model's
    ``a``, ``b`` [B, n, H] with ``A_log``, ``dt_bias`` [H]; the kernel computes, in float32,
    ``g = -exp(A_log) * softplus(a + dt_bias)`` (softplus(x) = x above 20) and ``beta = sigmoid(b)``.
    Same as ``torch.ops.convwin.capture_gates``.
    """


# ---------------------------------------------------------------------------------------------
# gdn_commit: replay the accepted path of every request, all layers, one call
# ---------------------------------------------------------------------------------------------

_GDN_COMMIT = "convwin.gdn_commit"


def _prepare_gdn_commit(
    real, ssm_state, conv_state, buffer, gates, conv_weight, dst_slots, src_slots, steps, parents, conv_bias,
    layout, num_k_heads, head_k_dim, num_v_heads, head_v_dim, use_qk_l2norm, state_layout, sizes=None,
):
    """As _prepare_capture_gates."""
    if sizes is None:
        sizes = check_gdn_commit_args(
            ssm_state, conv_state, buffer, gates, conv_weight, dst_slots, src_slots, steps, parents, conv_bias,
            layout, num_k_heads, head_k_dim, num_v_heads, head_v_dim, state_layout,
        )
    if real:
        check_replay_storages(_GDN_COMMIT, ssm_state, conv_state, buffer, gates, conv_weight, conv_bias)
        if should_check_index_values(ssm_state):
            check_replay_index_values(_GDN_COMMIT, sizes, dst_slots, src_slots, steps, parents)
    tokens, history = token_views(buffer, layout, sizes.width + 1)
    conv = conv_state.transpose(2, 3) if state_layout == WINDOW_MAJOR else conv_state
    args = (ssm_state, conv, tokens, history, gates, conv_weight, conv_bias, dst_slots, src_slots, steps, parents)
    kwargs = dict(num_k_heads=num_k_heads, head_k_dim=head_k_dim, num_v_heads=num_v_heads,
                  head_v_dim=head_v_dim, use_qk_l2norm=bool(use_qk_l2norm))
    return args, kwargs, sizes


@declare_op(mutates=("ssm_state", "conv_state"), prepare=_prepare_gdn_commit, cpu=cpu.gdn_commit_cpu,
            cuda="launch_gdn_commit", eager_plan="planned_gdn_commit")
def gdn_commit(
    ssm_state: torch.Tensor,
    conv_state: torch.Tensor,
    buffer: torch.Tensor,
    gates: torch.Tensor,
    conv_weight: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    steps: torch.Tensor,
    parents: torch.Tensor | None = None,
    *,
    layout: str = DEFAULT_LAYOUT,
    num_k_heads: int,
    head_k_dim: int,
    num_v_heads: int,
    head_v_dim: int,
    conv_bias: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    state_layout: str = DIM_MAJOR,
) -> None:
    """Commit the accepted draft tokens of every request into a Gated DeltaNet layer's state --
    recurrent state and conv window -- for all layers, in place, with no snapshots.

    For each row b with ``steps[b] >= 0`` and ``dst_slots[b] >= 0``, the accepted path is draft
    tokens 0..steps[b] (``parents`` None: a chain) or the path root -> node steps[b] (``parents``
    [B, N] as in ``scatter_tree``). Each path token is decoded from the state held at
    ``dst_slots[b]``, in float32: its conv input x (read from ``buffer`` at ``src_slots[b]``),
    c = silu(conv_bias + sum_k conv_weight[:, k] * input k) over the K inputs ending at x (the
    committed ones from conv_state, then the path's), q, k, v = split(c) at Hk*dk and 2*Hk*dk,
    k /= sqrt(|k|^2 + 1e-6) per key head (``use_qk_l2norm``), and per value head h, reading key
    head h // (Hv // Hk) and the token's g, beta from ``gates``:
    ``S = S * exp(g);  u = beta * (v - S^T k);  S = S + k u^T``.
    Then ``ssm_state[:, dst]`` holds the state after the path and ``conv_state[:, dst]`` its last
    K-1 inputs, exactly what ``scatter`` / ``scatter_tree`` write for the same buffer.

    ssm_state: [L, R, Hv, dk, dv], float32 or bfloat16, any strides (a [.., dv, dk]
        storage passed as ``.transpose(-1, -2)`` works). conv_state: [L, R, dim, K-1] (or
        [L, R, K-1, dim] with state_layout="window_major"), dim = 2*Hk*dk + Hv*dv.
    buffer: the physical conv-input buffer of ``layout`` (``alloc_windows(..., num_draft=N)``)
        that this step's ``capture`` / ``causal_conv1d_verify`` filled; gates: [L, M, N, 2, Hv]
        (``alloc_gates``) filled by ``capture_gates``. Both are read only, at ``src_slots``.
    conv_weight: [L, dim, K]; conv_bias: [L, dim] or None.
    dst_slots, src_slots, steps: [B]; parents: [B, N] or None; int32 or int64.
    A row is skipped (both states untouched) when its step or destination is negative, an index
    is out of range, or its path meets a parent link outside [-1, n-1]; ``index_checks()`` turns
    out-of-range values into an IndexError (host sync, for debugging). Two launches (the replay,
    then the windows), no sync, no allocation. Same as ``torch.ops.convwin.gdn_commit``.
    """


# ---------------------------------------------------------------------------------------------
# mamba2_commit: the same for Mamba2 layers
# ---------------------------------------------------------------------------------------------

_MAMBA2_COMMIT = "convwin.mamba2_commit"


def _prepare_mamba2_commit(
    real, ssm_state, conv_state, buffer, gates, conv_weight, A, dst_slots, src_slots, steps, parents, conv_bias,
    layout, num_heads, head_dim, n_groups, d_state, state_layout, sizes=None,
):
    """As _prepare_capture_gates."""
    if sizes is None:
        sizes = check_mamba2_commit_args(
            ssm_state, conv_state, buffer, gates, conv_weight, A, dst_slots, src_slots, steps, parents, conv_bias,
            layout, num_heads, head_dim, n_groups, d_state, state_layout,
        )
    if real:
        check_replay_storages(_MAMBA2_COMMIT, ssm_state, conv_state, buffer, gates, conv_weight, conv_bias, A)
        if should_check_index_values(ssm_state):
            check_replay_index_values(_MAMBA2_COMMIT, sizes, dst_slots, src_slots, steps, parents)
    tokens, history = token_views(buffer, layout, sizes.width + 1)
    conv = conv_state.transpose(2, 3) if state_layout == WINDOW_MAJOR else conv_state
    args = (ssm_state, conv, tokens, history, gates, conv_weight, conv_bias, A, dst_slots, src_slots, steps, parents)
    return args, dict(num_heads=num_heads, head_dim=head_dim, n_groups=n_groups, d_state=d_state), sizes


@declare_op(mutates=("ssm_state", "conv_state"), prepare=_prepare_mamba2_commit, cpu=cpu.mamba2_commit_cpu,
            cuda="launch_mamba2_commit", eager_plan="planned_mamba2_commit")
def mamba2_commit(
    ssm_state: torch.Tensor,
    conv_state: torch.Tensor,
    buffer: torch.Tensor,
    gates: torch.Tensor,
    conv_weight: torch.Tensor,
    A: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    steps: torch.Tensor,
    parents: torch.Tensor | None = None,
    *,
    layout: str = DEFAULT_LAYOUT,
    num_heads: int,
    head_dim: int,
    n_groups: int,
    d_state: int,
    conv_bias: torch.Tensor | None = None,
    state_layout: str = DIM_MAJOR,
) -> None:
    """Commit the accepted draft tokens of every request into a Mamba2 layer's state -- recurrent
    state and conv window -- for all layers, in place, with no snapshots.

    As ``gdn_commit``, with the Mamba2 recurrence: per path token, c = silu(conv_bias + conv) over
    the K inputs ending at it, x = c[:H*P] as [H, P], B = c[H*P : H*P + G*Ns] as [G, Ns]; head h
    (group h // (H // G)) with the token's dt: ``h_state = exp(dt * A[h]) * h_state + (dt * x[h]) B^T``.

    ssm_state: [L, R, H, P, Ns], float32 or bfloat16, any strides. conv_state: [L, R,
        dim, K-1] (or window-major), dim = H*P + 2*G*Ns (x, B, C). gates: [L, M, N, 1, H] from
        ``alloc_gates(..., num_gates=1)``: dt as the model uses it (after softplus(dt + dt_bias) and
        its limits). A: [L, H], the negative per-head rate (-exp(A_log)). conv_weight: [L, dim, K];
        conv_bias: [L, dim] or None. Everything else -- buffer, indices, parents, skip rules,
        checked mode, errors, two launches -- as ``gdn_commit``. Same as ``torch.ops.convwin.mamba2_commit``.
    """
