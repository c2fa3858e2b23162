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


def walk_up(
    nodes: torch.Tensor, parents: torch.Tensor, history: int, steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of each node and the ``steps`` inputs before it on its path, oldest first.

    Positions index a sequence of ``history`` committed inputs followed by the nodes: node n sits
    at history+n; walking up, a node's predecessor is history+parents[n] and a history input's is
    the one before it. nodes: [B, J] (any values; the caller masks rows it does not write),
    parents: [B, N]. Returns (positions [B, J, steps+1], links_ok [B, J]); links_ok is False where
    a parent read on the walk lies outside [-1, n-1].
    """
    num_nodes = parents.shape[1]
    parents = parents.long()
    pos = history + nodes.long().clamp(0, max(num_nodes - 1, 0))
    links_ok = torch.ones_like(pos, dtype=torch.bool)
    newest_first = [pos]
    for _ in range(steps):
        is_node = pos >= history
        parent = parents.gather(1, (pos - history).clamp(0, num_nodes - 1))
        parent_ok = (parent >= -1) & (parent < pos - history)
        links_ok &= parent_ok | ~is_node
        pos = torch.where(is_node & parent_ok, history + parent, pos - 1).clamp(min=0)
        newest_first.append(pos)
    return torch.stack(newest_first[::-1], dim=-1), links_ok


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
    width = state.shape[3]
    positions, links_ok = walk_up(node[:, None], parents, history=width - 1, steps=width - 1)
    committed = (active & links_ok[:, 0]).nonzero().squeeze(1)
    if committed.numel() == 0:
        return
    windows = rows[:, src[committed, None], positions[committed, 0]]  # [L, R, K-1, dim]
    state[:, dst[committed]] = windows.transpose(-1, -2).to(state.dtype)


# ---------------------------------------------------------------------------------------------
# capture and causal_conv1d_verify. ``dest`` is the buffer seen as rows [L, M, N+K-2, dim]
# (token_major, or channel_major transposed) or, when ``dense``, as windows [L, M, N, dim, K-1].
# ---------------------------------------------------------------------------------------------


def _verify_rows(dest, state, x, buffer_slots, state_slots):
    """Rows of the batch that read and write in-range slots, and their slots."""
    dst, src = buffer_slots.long(), state_slots.long()
    active = (dst >= 0) & (dst < dest.shape[1]) & (src >= 0) & (src < state.shape[1])
    rows = active.nonzero().squeeze(1)
    return rows, dst[rows], src[rows]


def _inputs(state, x, layer, rows, src):
    """[R, K-1+N, dim]: each row's committed inputs (oldest first), then its draft tokens.
    torch.cat promotes to a dtype that holds both exactly, so the later cast rounds once."""
    return torch.cat([state[layer, src].transpose(-1, -2), x[rows]], dim=1)


def _paths(parents, rows, num_nodes, width):
    """Every node's K inputs (positions into _inputs, oldest first) and whether its links are ok."""
    if parents is None:  # a chain
        parents = torch.arange(-1, num_nodes - 1, device=rows.device).expand(rows.shape[0], num_nodes)
    else:
        parents = parents[rows]
    nodes = torch.arange(num_nodes, device=rows.device).expand(rows.shape[0], num_nodes)
    return walk_up(nodes, parents, history=width, steps=width)


def _write_captured(dest, dense, layer, dst, inputs, positions, links_ok):
    if not dense:
        dest[layer, dst] = inputs[:, 1:].to(dest.dtype)  # drop the oldest committed input
        return
    row, node = links_ok.nonzero(as_tuple=True)
    windows = inputs[row[:, None], positions[row, node, 1:]]  # [R', K-1, dim]
    dest[layer, dst[row], node] = windows.transpose(-1, -2).to(dest.dtype)


def capture_cpu(dest, state, x, buffer_slots, state_slots, layer, parents, *, dense):
    """state: [L, N_state, dim, K-1] (any strides); x: [B, N, dim]; dest: see above."""
    rows, dst, src = _verify_rows(dest, state, x, buffer_slots, state_slots)
    if rows.numel() == 0:
        return
    inputs = _inputs(state, x, layer, rows, src)
    positions, links_ok = _paths(parents, rows, x.shape[1], state.shape[3]) if dense else (None, None)
    _write_captured(dest, dense, layer, dst, inputs, positions, links_ok)


def causal_conv1d_verify_cpu(
    out, dest, state, x, weight, bias, buffer_slots, state_slots, layer, parents, *, dense, silu
):
    """capture_cpu, plus out[b, n] = act(bias + sum_k weight[:, k] * input k of node n's path)."""
    rows, dst, src = _verify_rows(dest, state, x, buffer_slots, state_slots)
    if rows.numel() == 0:
        return
    inputs = _inputs(state, x, layer, rows, src)
    positions, links_ok = _paths(parents, rows, x.shape[1], state.shape[3])
    taps = inputs[torch.arange(rows.shape[0])[:, None, None], positions].float()  # [R, N, K, dim]
    y = (taps * weight.float().t()).sum(dim=2)
    if bias is not None:
        y = y + bias.float()
    if silu:
        y = torch.nn.functional.silu(y)
    row, node = links_ok.nonzero(as_tuple=True)
    out[rows[row], node] = y[row, node].to(out.dtype)
    _write_captured(dest, dense, layer, dst, inputs, positions, links_ok)
