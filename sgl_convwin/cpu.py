"""Vectorised pure-PyTorch implementations, registered as the ops' CPU kernels.

They run eagerly even inside compiled graphs (the ops are opaque to torch.compile), so they may
use boolean masks; they share only validation with the Triton path, never its code.
"""

from __future__ import annotations

import torch


def scatter_cpu(
    state: torch.Tensor,
    windows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    steps: torch.Tensor,
) -> None:
    """state: [L, N, dim, K-1] (any strides), windows: [L, M, D, dim, K-1] (any strides)."""
    num_state_slots, num_src_slots, num_draft = state.shape[1], windows.shape[1], windows.shape[2]
    dst, src, step = dst_slots.long(), src_slots.long(), steps.long()
    active = (step >= 0) & (step < num_draft)
    active &= (dst >= 0) & (dst < num_state_slots)
    active &= (src >= 0) & (src < num_src_slots)
    rows = active.nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    accepted = windows[:, src[rows], step[rows]]  # [L, R, dim, K-1]
    state[:, dst[rows]] = accepted.to(state.dtype)
