"""Vectorised pure-PyTorch implementations, registered as the ops' CPU kernels.

They run eagerly even inside compiled graphs (the ops are opaque to torch.compile), so they may
use boolean masks; they share only validation with the Triton path, never its code.
"""

from __future__ import annotations

import torch


def _rows_in_range(
    accepted: torch.Tensor, num_accepted: int,
    dst: torch.Tensor, num_state_slots: int,
    src: torch.Tensor, num_src_slots: int,
) -> torch.Tensor:
    """[B] bool: the rows a commit writes (every index in range; negatives skip)."""
    in_range = (accepted >= 0) & (accepted < num_accepted)
    in_range &= (dst >= 0) & (dst < num_state_slots)
    in_range &= (src >= 0) & (src < num_src_slots)
    return in_range


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
    rows = _rows_in_range(step, num_draft, dst, num_state_slots, src, num_src_slots).nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    accepted = windows[:, src[rows], step[rows]]  # [L, R, dim, K-1]
    state[:, dst[rows]] = accepted.to(state.dtype)


def tree_positions(
    nodes: torch.Tensor, parents: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows-buffer positions of each row's window, oldest first: ([B, K-1], links_ok [B]).

    Node n sits at position K-2+n; walking up, a node's predecessor is K-2+parents[n] and a
    history row's is the one before it. links_ok is False where a parent read lies outside
    [-1, n-1]. Rows whose node is out of range get garbage positions (the caller masks them).
    """
    history = width - 1
    num_nodes = parents.shape[1]
    parents = parents.long()
    pos = history + nodes.long().clamp(0, max(num_nodes - 1, 0))
    links_ok = torch.ones_like(pos, dtype=torch.bool)
    newest_first = [pos]
    for _ in range(width - 1):
        is_node = pos >= history
        parent = parents.gather(1, (pos - history).clamp(0, num_nodes - 1)[:, None]).squeeze(1)
        parent_ok = (parent >= -1) & (parent < pos - history)
        links_ok &= parent_ok | ~is_node
        pos = torch.where(is_node & parent_ok, history + parent, pos - 1).clamp(min=0)
        newest_first.append(pos)
    return torch.stack(newest_first[::-1], dim=1), links_ok


def scatter_tree_cpu(
    state: torch.Tensor,
    rows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    nodes: torch.Tensor,
    parents: torch.Tensor,
) -> None:
    """state: [L, N_state, dim, K-1] (any strides), rows: [L, M, N+K-2, dim] (any strides)."""
    num_state_slots, num_src_slots, num_nodes = state.shape[1], rows.shape[1], parents.shape[1]
    dst, src, node = dst_slots.long(), src_slots.long(), nodes.long()
    active = _rows_in_range(node, num_nodes, dst, num_state_slots, src, num_src_slots)
    positions, links_ok = tree_positions(node, parents, state.shape[3])
    committed = (active & links_ok).nonzero().squeeze(1)
    if committed.numel() == 0:
        return
    windows = rows[:, src[committed, None], positions[committed]]  # [L, R, K-1, dim]
    state[:, dst[committed]] = windows.transpose(-1, -2).to(state.dtype)
