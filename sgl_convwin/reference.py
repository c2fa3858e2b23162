"""Oracles: loop-based definitions written to be obviously right, for tests only.

They share no code with the fast paths (no layout helpers, no views, no vectorised indexing):
each one spells out, row by row, what the cache is supposed to hold.
"""

from __future__ import annotations

import torch


def windows_from_sequences(sequences: torch.Tensor, num_draft: int, kernel_size: int) -> torch.Tensor:
    """sequences: [L, M, D+K-2, dim] inputs per slot -> windows [L, M, D, dim, K-1].

    Window t holds inputs t, t+1, ..., t+K-2 of the sequence, oldest first.
    """
    sequences = sequences.cpu()
    num_layers, num_slots, seq_len, dim = sequences.shape
    width = kernel_size - 1
    assert seq_len == num_draft + kernel_size - 2
    windows = torch.empty(num_layers, num_slots, num_draft, dim, width, dtype=sequences.dtype)
    for layer in range(num_layers):
        for slot in range(num_slots):
            for step in range(num_draft):
                for col in range(width):
                    windows[layer, slot, step, :, col] = sequences[layer, slot, step + col, :]
    return windows


def pack_sequences(sequences: torch.Tensor, layout: str, num_draft: int, kernel_size: int) -> torch.Tensor:
    """The physical buffer of ``layout`` that stores ``sequences`` ([L, M, D+K-2, dim]), on the CPU."""
    sequences = sequences.cpu()
    num_layers, num_slots, seq_len, dim = sequences.shape
    width = kernel_size - 1
    if layout == "token_major":  # [L, M, S, dim]: one row per input
        packed = torch.empty(num_layers, num_slots, seq_len, dim, dtype=sequences.dtype)
        for layer in range(num_layers):
            for slot in range(num_slots):
                for position in range(seq_len):
                    packed[layer, slot, position, :] = sequences[layer, slot, position, :]
        return packed
    if layout == "channel_major":  # [L, M, dim, S]: one row per channel
        packed = torch.empty(num_layers, num_slots, dim, seq_len, dtype=sequences.dtype)
        for layer in range(num_layers):
            for slot in range(num_slots):
                for position in range(seq_len):
                    packed[layer, slot, :, position] = sequences[layer, slot, position, :]
        return packed
    if layout == "dense":  # [L, M, D, dim, K-1]: every window stored in full
        packed = torch.empty(num_layers, num_slots, num_draft, dim, width, dtype=sequences.dtype)
        for layer in range(num_layers):
            for slot in range(num_slots):
                for step in range(num_draft):
                    for col in range(width):
                        packed[layer, slot, step, :, col] = sequences[layer, slot, step + col, :]
        return packed
    raise ValueError(f"unknown layout {layout!r}")


def scatter_reference(
    conv_state: torch.Tensor,
    windows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    steps: torch.Tensor,
    state_layout: str = "dim_major",
) -> torch.Tensor:
    """What convwin.scatter must leave in conv_state, returned as a new CPU tensor.

    conv_state: [L, N, dim, K-1] ("dim_major") or [L, N, K-1, dim] ("window_major").
    windows: [L, M, D, dim, K-1]. A row is skipped when its step or destination is negative, or
    when any of its indices is out of range.
    """
    conv_state, windows = conv_state.cpu(), windows.cpu()
    dst_slots, src_slots, steps = dst_slots.cpu(), src_slots.cpu(), steps.cpu()
    result = conv_state.clone()
    num_layers, num_state_slots = conv_state.shape[0], conv_state.shape[1]
    num_src_slots, num_draft = windows.shape[1], windows.shape[2]
    for row in range(steps.shape[0]):
        step, dst, src = int(steps[row]), int(dst_slots[row]), int(src_slots[row])
        if step < 0 or dst < 0:
            continue
        if step >= num_draft or dst >= num_state_slots or not 0 <= src < num_src_slots:
            continue
        for layer in range(num_layers):
            window = windows[layer, src, step].to(conv_state.dtype)  # [dim, K-1]
            if state_layout == "dim_major":
                result[layer, dst] = window
            else:
                result[layer, dst] = window.t()  # stored as [K-1, dim]
    return result


def tree_window_positions(node: int, parents: list[int], kernel_size: int) -> list[int] | None:
    """Rows-buffer positions of node's window, oldest first; None if a parent link it uses is bad.

    Positions 0 .. K-3 are the history (oldest first); node n is position K-2+n. History row -1
    is the newest committed input, -2 the one before, and so on, so every step up the path is
    "the previous input": a node's parent, or for history the row before.
    """
    history = kernel_size - 2
    width = kernel_size - 1
    newest_first = []
    current = node  # a node index >= 0, or -1, -2, ... for history rows
    while True:
        newest_first.append(history + current)
        if len(newest_first) == width:
            break
        if current >= 0:
            parent = parents[current]
            if not -1 <= parent < current:
                return None
            current = parent
        else:
            current -= 1
    return newest_first[::-1]


def scatter_tree_reference(
    conv_state: torch.Tensor,
    rows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    nodes: torch.Tensor,
    parents: torch.Tensor,
    state_layout: str = "dim_major",
) -> torch.Tensor:
    """What convwin.scatter_tree must leave in conv_state, returned as a new CPU tensor.

    rows: [L, M, N+K-2, dim]; parents: [B, N]. A row is skipped when its node or destination is
    negative, when an index is out of range, or when a parent link on its window's path is bad.
    """
    conv_state, rows = conv_state.cpu(), rows.cpu()
    result = conv_state.clone()
    num_layers, num_state_slots = conv_state.shape[0], conv_state.shape[1]
    width = conv_state.shape[3] if state_layout == "dim_major" else conv_state.shape[2]
    kernel_size = width + 1
    num_src_slots, num_nodes = rows.shape[1], rows.shape[2] - (kernel_size - 2)
    for row in range(nodes.shape[0]):
        node, dst, src = int(nodes[row]), int(dst_slots[row]), int(src_slots[row])
        if node < 0 or dst < 0:
            continue
        if node >= num_nodes or dst >= num_state_slots or not 0 <= src < num_src_slots:
            continue
        positions = tree_window_positions(node, parents[row].tolist(), kernel_size)
        if positions is None:
            continue
        for layer in range(num_layers):
            for col, position in enumerate(positions):
                value = rows[layer, src, position].to(conv_state.dtype)  # [dim]
                if state_layout == "dim_major":
                    result[layer, dst, :, col] = value
                else:
                    result[layer, dst, col, :] = value
    return result
