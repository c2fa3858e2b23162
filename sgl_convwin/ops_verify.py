"""The verify recurrence operators: a layer's outputs for every draft token (or tree node) from the
committed recurrent state, which they only read -- one read of the state per step, no snapshots,
chains and trees alike.
"""

from __future__ import annotations

import torch

from . import cpu
from .declare import declare_op
from .validation import (
    check_gdn_verify_args,
    check_gdn_verify_index_values,
    check_mamba2_verify_args,
    check_no_shared_storages,
    should_check_index_values,
)

_GDN_VERIFY = "convwin.gdn_verify"
_MAMBA2_VERIFY = "convwin.mamba2_verify"


def _prepare_gdn_verify(real, out, q, k, v, g, beta, ssm_state, state_slots, parents, scale, use_qk_l2norm,
                        sizes=None):
    """As ops_replay._prepare_capture_gates."""
    if sizes is None:
        sizes = check_gdn_verify_args(out, q, k, v, g, beta, ssm_state, state_slots, parents, scale)
    if real:
        check_no_shared_storages(_GDN_VERIFY, "out", out, q=q, k=k, v=v, g=g, beta=beta, ssm_state=ssm_state)
        if should_check_index_values(ssm_state):
            check_gdn_verify_index_values(sizes, state_slots, parents)
    scale = q.shape[3] ** -0.5 if scale is None else float(scale)
    args = (out, q, k, v, g, beta, ssm_state, state_slots, parents)
    return args, dict(scale=scale, use_qk_l2norm=bool(use_qk_l2norm)), sizes


@declare_op(mutates=("out",), prepare=_prepare_gdn_verify, cpu=cpu.gdn_verify_cpu, cuda="launch_gdn_verify",
            eager_plan="planned_gdn_verify")
def gdn_verify(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    parents: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> None:
    """Write the Gated DeltaNet outputs of every draft token (or tree node) of one layer into
    ``out``, from the state at ``state_slots[b]``, which is read once and never written.

    Node n of row b is decoded along its root path (``parents`` None: a chain, the path is
    0..n; else n, parents[b, n], ... up to a node whose parent is -1), per value head h reading
    key head h // (Hv // Hk), in float32 (FLA's ``fused_recurrent_gated_delta_rule``): with
    ``use_qk_l2norm`` q and k divided by sqrt(|x|^2 + 1e-6) per head; per path token
    ``S = S * exp(g); u = beta * (v - S^T k); S = S + k u^T``; then
    ``out[b, n] = scale * S^T q_n`` with S after node n's own update.

    out: [B, N, Hv, dv], any float dtype and strides. q, k: [B, N, Hk, dk]; v: [B, N, Hv, dv];
        any float dtype and strides (views of one conv output split at Hk*dk and 2*Hk*dk work
        without copies). g (log decay), beta: [B, N, Hv], any float dtype.
    ssm_state: one layer's pool [S, Hv, dk, dv], float32 or bfloat16, any strides (a
        [.., dv, dk] storage passed as ``.transpose(-1, -2)``, a slice ``pool[layer]`` of
        [L, S, ...]). state_slots: [B] int32/int64. parents: [B, N] int32/int64 or None.
    scale: None for dk ** -0.5. A row whose slot is < 0 or >= S, or whose parents hold a link
    outside [-1, n-1], is skipped (its ``out`` rows untouched); ``index_checks()`` turns those
    into an IndexError (host sync, for debugging). One launch, no sync, no allocation.
    Same as ``torch.ops.convwin.gdn_verify``.
    """


def _prepare_mamba2_verify(real, out, x, dt, A, B, C, ssm_state, state_slots, parents, D, z, dt_bias, dt_softplus,
                           sizes=None):
    """As ops_replay._prepare_capture_gates."""
    if sizes is None:
        sizes = check_mamba2_verify_args(out, x, dt, A, B, C, ssm_state, state_slots, parents, D, z, dt_bias,
                                         dt_softplus)
    if real:
        check_no_shared_storages(_MAMBA2_VERIFY, "out", out, x=x, dt=dt, A=A, B=B, C=C, ssm_state=ssm_state, D=D, z=z,
                                 dt_bias=dt_bias)
        if should_check_index_values(ssm_state):
            check_gdn_verify_index_values(sizes, state_slots, parents, op=_MAMBA2_VERIFY)
    args = (out, x, dt, A, B, C, ssm_state, state_slots, parents, D, z, dt_bias)
    return args, dict(dt_softplus=dt_softplus), sizes


@declare_op(mutates=("out",), prepare=_prepare_mamba2_verify, cpu=cpu.mamba2_verify_cpu, cuda="launch_mamba2_verify",
            eager_plan="planned_mamba2_verify")
def mamba2_verify(
    out: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    parents: torch.Tensor | None = None,
    *,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
) -> None:
    """Write the Mamba2 outputs of every draft token (or tree node) of one layer into ``out``,
    from the state at ``state_slots[b]``, which is read once and never written.

    Node n of row b is decoded along its root path (``parents`` as in ``gdn_verify``), per head h
    reading group h // (H // G), in float32, as a selective state update decodes one token: per
    path token ``d = dt (+ dt_bias)``, ``softplus(d)`` if ``dt_softplus``, ``h = exp(d * A) * h +
    d * x B^T``; then ``out[b, n] = h C_n (+ D * x_n)``, times ``silu(z_n)`` if z is given, with h
    after node n's own update.

    out: [B, N, H, P], any float dtype and strides. x: [B, N, H, P]; B, C: [B, N, G, Ns]; any float
        dtype and strides (views of one conv output split at H*P and H*P + G*Ns work without
        copies). dt: [B, N, H]; A (negative), D, dt_bias: [H]; z: [B, N, H, P]; any float dtype.
    ssm_state: one layer's pool [S, H, P, Ns], float32 or bfloat16, any strides. state_slots: [B]
        int32/int64. parents: [B, N] int32/int64 or None.
    A row whose slot is < 0 or >= S, or whose parents hold a link outside [-1, n-1], is skipped
    (its ``out`` rows untouched); ``index_checks()`` turns those into an IndexError (host sync, for
    debugging). One launch, no sync, no allocation. Same as ``torch.ops.convwin.mamba2_verify``.
    """
