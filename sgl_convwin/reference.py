"""Oracles: loop-based definitions written to be obviously right, for tests only.

They share no code with the fast paths (no layout helpers, no views, no vectorised indexing):
each one spells out, row by row, what the cache is supposed to hold.
"""

from __future__ import annotations

import math

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


# ---------------------------------------------------------------------------------------------
# Verify pass: capture and the causal conv1d of the draft tokens
# ---------------------------------------------------------------------------------------------


def _state_columns(conv_state: torch.Tensor, layer: int, slot: int, state_layout: str) -> list[torch.Tensor]:
    """The K-1 committed inputs of one slot, oldest first, each a [dim] tensor."""
    if state_layout == "dim_major":  # [L, N, dim, K-1]
        return [conv_state[layer, slot, :, col] for col in range(conv_state.shape[3])]
    return [conv_state[layer, slot, col, :] for col in range(conv_state.shape[2])]  # [L, N, K-1, dim]


def _decode_node(history, x_row, parents_row, node, kernel_size, step):
    """Decode the path that ends at ``node`` one token at a time; return what ``step`` returned for
    the node's token and the conv state after it (K-1 [dim] tensors, oldest first), or None when
    a parent link among the K-1 above the node is outside [-1, n-1].

    ``history``: the committed state (K-1 inputs, oldest first). ``x_row[m]``: node m's input.
    ``parents_row``: None for a chain (node m's parent is m-1). ``step(state, token)`` gets the
    K-1 inputs before the token and the token itself.

    The conv state is a shift register of the last K-1 inputs, so the decode may start K-1 tokens
    above the node: by then every input of the starting state has been shifted out. When the path
    is longer than that, the decode starts from a state of NaNs, which would show if it were used.
    """
    ancestors = []  # nearest first
    current = node
    while current >= 0 and len(ancestors) < kernel_size - 1:
        parent = current - 1 if parents_row is None else parents_row[current]
        if not -1 <= parent < current:
            return None
        if parent >= 0:
            ancestors.append(parent)
        current = parent
    if current < 0:  # the path reaches the committed history
        state = list(history)
    else:
        state = [torch.full_like(history[0], float("nan")) for _ in history]
    result = None
    for m in ancestors[::-1] + [node]:
        result = step(state, x_row[m])
        state = state[1:] + [x_row[m]]
    return result, state


def capture_reference(
    buffer: torch.Tensor,
    conv_state: torch.Tensor,
    x: torch.Tensor,
    buffer_slots: torch.Tensor,
    state_slots: torch.Tensor,
    layer: int,
    layout: str,
    parents: torch.Tensor | None = None,
    state_layout: str = "dim_major",
) -> torch.Tensor:
    """What convwin.capture must leave in ``buffer`` (its physical tensor), as a new CPU tensor.

    Row b with both slots in range (negative ones skip the row) writes, into layer ``layer`` of
    buffer slot buffer_slots[b]: for token_major / channel_major, the K-2 newest committed inputs
    of conv_state slot state_slots[b] (oldest first) then x[b, n] for every node n; for dense,
    window n = the conv state after decoding node n's path (parents; None = a chain), skipping a
    node whose path has a bad parent link.
    """
    buffer, conv_state, x = buffer.cpu(), conv_state.cpu(), x.cpu()
    result = buffer.clone()
    num_nodes = x.shape[1]
    width = conv_state.shape[3] if state_layout == "dim_major" else conv_state.shape[2]
    kernel_size = width + 1
    num_state_slots = conv_state.shape[1]
    num_buffer_slots = buffer.shape[1]
    for row in range(x.shape[0]):
        dst, src = int(buffer_slots[row]), int(state_slots[row])
        if not (0 <= dst < num_buffer_slots and 0 <= src < num_state_slots):
            continue
        history = _state_columns(conv_state, layer, src, state_layout)
        inputs = history[1:] + [x[row, n] for n in range(num_nodes)]  # history K-2, then nodes
        if layout == "token_major":  # [L, M, N+K-2, dim]
            for position, value in enumerate(inputs):
                result[layer, dst, position, :] = value.to(buffer.dtype)
        elif layout == "channel_major":  # [L, M, dim, N+K-2]
            for position, value in enumerate(inputs):
                result[layer, dst, :, position] = value.to(buffer.dtype)
        elif layout == "dense":  # [L, M, N, dim, K-1]
            parents_row = None if parents is None else parents[row].tolist()
            for node in range(num_nodes):
                decoded = _decode_node(history, x[row], parents_row, node, kernel_size, lambda s, t: None)
                if decoded is None:
                    continue
                for col, value in enumerate(decoded[1]):
                    result[layer, dst, node, :, col] = value.to(buffer.dtype)
        else:
            raise ValueError(f"unknown layout {layout!r}")
    return result


def causal_conv1d_verify_reference(
    out: torch.Tensor,
    conv_state: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    buffer_slots: torch.Tensor,
    state_slots: torch.Tensor,
    num_buffer_slots: int,
    layer: int,
    parents: torch.Tensor | None = None,
    activation: str | None = None,
    state_layout: str = "dim_major",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs convwin.causal_conv1d_verify must write, in float64, and a bool mask of the
    [B, N] entries it writes (other entries of ``out`` must stay as they were).

    Every node's output is the single-step causal conv of decoding its path token by token from
    the committed state: y = bias + sum_k weight[:, k] * window[:, k] over the K inputs ending at
    the node (weight[:, K-1] multiplies the node's own input), then SiLU if asked.
    """
    conv_state, x = conv_state.cpu(), x.cpu()
    weight = weight.cpu().double()
    bias = None if bias is None else bias.cpu().double()
    num_rows, num_nodes, dim = x.shape
    kernel_size = weight.shape[1]
    expected = out.cpu().double().clone()
    written = torch.zeros(num_rows, num_nodes, dtype=torch.bool)

    def conv_step(state, token):
        y = torch.zeros(dim, dtype=torch.float64) if bias is None else bias.clone()
        for k, value in enumerate(state + [token]):
            y += weight[:, k] * value.double()
        if activation in ("silu", "swish"):
            y = y / (1 + torch.exp(-y))
        return y

    for row in range(num_rows):
        dst, src = int(buffer_slots[row]), int(state_slots[row])
        if not (0 <= dst < num_buffer_slots and 0 <= src < conv_state.shape[1]):
            continue
        history = _state_columns(conv_state, layer, src, state_layout)
        parents_row = None if parents is None else parents[row].tolist()
        for node in range(num_nodes):
            decoded = _decode_node(history, x[row], parents_row, node, kernel_size, conv_step)
            if decoded is not None:
                expected[row, node] = decoded[0]
                written[row, node] = True
    return expected, written


# ---------------------------------------------------------------------------------------------
# Replay commit of a Gated DeltaNet layer, and the gates it reads
# ---------------------------------------------------------------------------------------------


def capture_gates_reference(gates, g, beta, buffer_slots, layer):
    """What convwin.capture_gates must leave in ``gates`` [L, M, D, G, H], as a new CPU tensor:
    gates[layer, buffer_slots[b], n] = (g[b, n], beta[b, n]) for every row b whose slot is in
    range (beta None: only g, gate 0)."""
    result = gates.cpu().clone()
    g = g.cpu()
    beta = None if beta is None else beta.cpu()
    for row in range(g.shape[0]):
        slot = int(buffer_slots[row])
        if not 0 <= slot < gates.shape[1]:
            continue
        for node in range(g.shape[1]):
            for head in range(g.shape[2]):
                result[layer, slot, node, 0, head] = g[row, node, head].to(gates.dtype)
                if beta is not None:
                    result[layer, slot, node, 1, head] = beta[row, node, head].to(gates.dtype)
    return result


def capture_raw_gates_reference(gates, a, b, A_log, dt_bias, buffer_slots, layer):
    """What convwin.capture_gates with the raw a, b [B, N, H] and A_log, dt_bias [H] must leave in
    ``gates`` [L, M, N, 2, H], in float64 on the CPU: g = -exp(A_log[h]) * softplus(a + dt_bias[h])
    (softplus(x) = x above 20, as the engines' kernels) and beta = 1 / (1 + exp(-b)), scalar by scalar."""
    result = gates.cpu().double().clone()
    for row in range(a.shape[0]):
        slot = int(buffer_slots[row])
        if not 0 <= slot < gates.shape[1]:
            continue
        for node in range(a.shape[1]):
            for head in range(a.shape[2]):
                x = float(a[row, node, head]) + float(dt_bias[head])
                softplus = x if x > 20 else math.log1p(math.exp(x))
                result[layer, slot, node, 0, head] = -math.exp(float(A_log[head])) * softplus
                result[layer, slot, node, 1, head] = 1 / (1 + math.exp(-float(b[row, node, head])))
    return result


def accepted_path(step: int, parents_row: list[int] | None) -> list[int] | None:
    """Nodes a row accepted, root first: 0..step for a chain, else the walk up from ``step`` to
    the node whose parent is -1; None if a link on the way is outside [-1, n-1]."""
    if parents_row is None:
        return list(range(step + 1))
    path = [step]
    while True:
        parent = parents_row[path[-1]]
        if not -1 <= parent < path[-1]:
            return None
        if parent == -1:
            return path[::-1]
        path.append(parent)


def _buffer_input(buffer, layout, layer, slot, node, kernel_size):
    """Node ``node``'s conv input, read from the physical buffer of ``layout``."""
    if layout == "token_major":  # [L, M, N+K-2, dim]
        return buffer[layer, slot, kernel_size - 2 + node, :]
    if layout == "channel_major":  # [L, M, dim, N+K-2]
        return buffer[layer, slot, :, kernel_size - 2 + node]
    return buffer[layer, slot, node, :, kernel_size - 2]  # dense [L, M, N, dim, K-1]: its newest column


def _buffer_history(buffer, layout, layer, slot, root, column):
    """History input ``column`` (0 = oldest of the K-2 the buffer keeps), as the buffer holds it."""
    if layout == "token_major":
        return buffer[layer, slot, column, :]
    if layout == "channel_major":
        return buffer[layer, slot, :, column]
    return buffer[layer, slot, root, :, column]  # the root's window starts with the history


def _replayed_rows(steps, dst_slots, src_slots, parents, num_state_slots, num_src_slots, num_nodes):
    """(dst, src, accepted path) of every row a replay commit writes, in row order."""
    rows = []
    for row in range(steps.shape[0]):
        step, dst, src = int(steps[row]), int(dst_slots[row]), int(src_slots[row])
        if step < 0 or dst < 0:
            continue
        if step >= num_nodes or dst >= num_state_slots or not 0 <= src < num_src_slots:
            continue
        path = accepted_path(step, None if parents is None else parents[row].tolist())
        if path is not None:
            rows.append((dst, src, path))
    return rows


def _path_conv_outputs(conv, buffer, layout, weight, bias, layer, dst, src, path, state_layout):
    """silu(bias + sum_k w[:, k] * input k) of every path token in float64: the K inputs ending at
    the token are the committed ones (from conv_state), then the path's (from the buffer)."""
    kernel_size = weight.shape[2]
    if state_layout == "dim_major":
        committed = [conv[layer, dst, :, col].double() for col in range(kernel_size - 1)]
    else:
        committed = [conv[layer, dst, col, :].double() for col in range(kernel_size - 1)]
    inputs = committed + [_buffer_input(buffer, layout, layer, src, node, kernel_size).double() for node in path]
    outputs = []
    for j in range(len(path)):
        window = inputs[j: j + kernel_size]  # the K inputs ending at path token j
        y = torch.zeros_like(window[0]) if bias is None else bias[layer].clone()
        for tap in range(kernel_size):
            y = y + weight[layer, :, tap] * window[tap]
        outputs.append(y / (1 + torch.exp(-y)))
    return outputs


def _write_path_window(expected_conv, buffer, layout, layer, src, dst, path, kernel_size, state_layout):
    """The last K-1 inputs of the path, read from the buffer as scatter / scatter_tree would."""
    root, length, width = path[0], len(path), kernel_size - 1
    for col in range(width):
        position = length - width + col
        if position >= 0:
            value = _buffer_input(buffer, layout, layer, src, path[position], kernel_size)
        else:
            value = _buffer_history(buffer, layout, layer, src, root, width - 1 + position)
        if state_layout == "dim_major":
            expected_conv[layer, dst, :, col] = value.to(expected_conv.dtype)
        else:
            expected_conv[layer, dst, col, :] = value.to(expected_conv.dtype)


def gdn_commit_reference(
    ssm_state, conv_state, buffer, gates, conv_weight, dst_slots, src_slots, steps, parents=None, *,
    layout, num_k_heads, head_k_dim, num_v_heads, head_v_dim, conv_bias=None, use_qk_l2norm=True,
    state_layout="dim_major",
):
    """What convwin.gdn_commit must leave behind: (ssm_state in float64, conv_state exactly in its
    dtype, the set of destination slots written), all on the CPU.

    Token by token in float64 along each accepted path, from the state held at the destination:
    c = silu(bias + sum_k w[:, k] * input k) over the K inputs ending at the token (the committed
    ones from conv_state, then the path's), q, k, v = split(c), k /= sqrt(|k|^2 + 1e-6) per key
    head, and per value head h (key head h // (Hv / Hk)) with g, beta of the token:
    S = S * exp(g); u = beta * (v - S^T k); S = S + k u^T. The new conv window is the last K-1
    inputs of the path, read from the buffer as scatter / scatter_tree would.
    """
    ssm, conv = ssm_state.cpu(), conv_state.cpu()
    buffer, gates = buffer.cpu(), gates.cpu()
    weight = conv_weight.cpu().double()
    bias = None if conv_bias is None else conv_bias.cpu().double()
    expected_ssm = ssm.double().clone()
    expected_conv = conv.clone()
    key_width = num_k_heads * head_k_dim
    ratio = num_v_heads // num_k_heads
    rows = _replayed_rows(steps, dst_slots, src_slots, parents, ssm.shape[1], gates.shape[1], gates.shape[2])
    for dst, src, path in rows:
        for layer in range(ssm.shape[0]):
            outputs = _path_conv_outputs(conv, buffer, layout, weight, bias, layer, dst, src, path, state_layout)
            state = expected_ssm[layer, dst]  # [Hv, dk, dv], updated in place
            for node, c in zip(path, outputs):
                for head in range(num_v_heads):
                    k_head = head // ratio
                    k = c[key_width + k_head * head_k_dim: key_width + (k_head + 1) * head_k_dim]
                    if use_qk_l2norm:
                        k = k / torch.sqrt((k * k).sum() + 1e-6)
                    v_start = 2 * key_width + head * head_v_dim
                    v = c[v_start: v_start + head_v_dim]
                    g = gates[layer, src, node, 0, head].double()
                    beta = gates[layer, src, node, 1, head].double()
                    state[head] = state[head] * torch.exp(g)
                    u = beta * (v - state[head].t() @ k)
                    state[head] = state[head] + torch.outer(k, u)
            _write_path_window(expected_conv, buffer, layout, layer, src, dst, path, weight.shape[2], state_layout)
    return expected_ssm, expected_conv, {dst for dst, _, _ in rows}


def mamba2_commit_reference(
    ssm_state, conv_state, buffer, gates, conv_weight, A, dst_slots, src_slots, steps, parents=None, *,
    layout, num_heads, head_dim, n_groups, d_state, conv_bias=None, state_layout="dim_major",
):
    """What convwin.mamba2_commit must leave behind, as gdn_commit_reference returns it.

    Token by token in float64 along each accepted path: c = silu(bias + conv), x = c[:H*P] as
    [H, P], B = c[H*P : H*P + G*Ns] as [G, Ns]; per head h (group h // (H / G)) with the token's
    dt: h_state = exp(dt * A[h]) * h_state + (dt * x[h]) B[group]^T.
    """
    ssm, conv = ssm_state.cpu(), conv_state.cpu()
    buffer, gates, rates = buffer.cpu(), gates.cpu(), A.cpu().double()
    weight = conv_weight.cpu().double()
    bias = None if conv_bias is None else conv_bias.cpu().double()
    expected_ssm = ssm.double().clone()
    expected_conv = conv.clone()
    heads_per_group = num_heads // n_groups
    rows = _replayed_rows(steps, dst_slots, src_slots, parents, ssm.shape[1], gates.shape[1], gates.shape[2])
    for dst, src, path in rows:
        for layer in range(ssm.shape[0]):
            outputs = _path_conv_outputs(conv, buffer, layout, weight, bias, layer, dst, src, path, state_layout)
            state = expected_ssm[layer, dst]  # [H, P, Ns], updated in place
            for node, c in zip(path, outputs):
                for head in range(num_heads):
                    x = c[head * head_dim: (head + 1) * head_dim]
                    b_start = num_heads * head_dim + (head // heads_per_group) * d_state
                    b = c[b_start: b_start + d_state]
                    dt = gates[layer, src, node, 0, head].double()
                    state[head] = torch.exp(dt * rates[layer, head]) * state[head] + torch.outer(dt * x, b)
            _write_path_window(expected_conv, buffer, layout, layer, src, dst, path, weight.shape[2], state_layout)
    return expected_ssm, expected_conv, {dst for dst, _, _ in rows}


def _verified_rows(state_slots, num_state_slots, parents, num_nodes):
    """(row, slot, every node's root path) of each row a verify op writes: its slot in range and
    every parent link in [-1, n-1]."""
    for row in range(len(state_slots)):
        slot = int(state_slots[row])
        links = None if parents is None else [int(p) for p in parents[row]]
        paths = [accepted_path(node, links) for node in range(num_nodes)]
        if 0 <= slot < num_state_slots and all(path is not None for path in paths):
            yield row, slot, paths


def gdn_verify_reference(q, k, v, g, beta, ssm_state, state_slots, parents=None, *, scale=None,
                         use_qk_l2norm=True):
    """What convwin.gdn_verify must write: (out in float64 [B, N, Hv, dv], the rows written), on the CPU.

    Every node on its own, token by token in float64 from the state at its row's slot along its
    root path (a chain: nodes 0..n): per value head h (key head h // (Hv / Hk)), q and k divided by
    sqrt(|x|^2 + 1e-6) (``use_qk_l2norm``), S = S * exp(g); u = beta * (v - S^T k); S = S + k u^T
    for each path token, then out[b, n, h] = scale * S^T q_n. A row is written only if its slot is
    in range and every parent link lies in [-1, n-1].
    """
    num_rows, num_nodes, num_k_heads, head_k_dim = q.shape
    num_v_heads, head_v_dim = v.shape[2], v.shape[3]
    scale = head_k_dim ** -0.5 if scale is None else scale
    ratio = num_v_heads // num_k_heads
    q, k, v = q.cpu().double(), k.cpu().double(), v.cpu().double()
    g, beta, states = g.cpu().double(), beta.cpu().double(), ssm_state.cpu().double()
    expected = torch.zeros(num_rows, num_nodes, num_v_heads, head_v_dim, dtype=torch.float64)
    written = []

    def normalised(x):
        return x / torch.sqrt((x * x).sum() + 1e-6) if use_qk_l2norm else x

    for row, slot, paths in _verified_rows(state_slots, states.shape[0], parents, num_nodes):
        written.append(row)
        for node, path in enumerate(paths):
            for head in range(num_v_heads):
                k_head = head // ratio
                state = states[slot, head].clone()  # [dk, dv]
                for token in path:
                    key = normalised(k[row, token, k_head])
                    state = state * torch.exp(g[row, token, head])
                    u = beta[row, token, head] * (v[row, token, head] - state.t() @ key)
                    state = state + torch.outer(key, u)
                expected[row, node, head] = scale * (state.t() @ normalised(q[row, node, k_head]))
    return expected, written


def _softplus(d):
    """log(1 + e^d) without overflowing where d is large: max(d, 0) + log1p(e^-|d|)."""
    return d.clamp(min=0) + torch.log1p(torch.exp(-d.abs()))


def mamba2_verify_reference(x, dt, A, B, C, ssm_state, state_slots, parents=None, *, D=None, z=None, dt_bias=None,
                            dt_softplus=False):
    """What convwin.mamba2_verify must write: (out in float64 [B, N, H, P], the rows written), on the CPU.

    Every node on its own, token by token in float64 from the state at its row's slot along its
    root path (a chain: nodes 0..n), per head h reading group h // (H / G), as a selective state
    update decodes one token: d = dt (+ dt_bias), softplus(d) if dt_softplus; h = exp(d * A[h]) h +
    d x B^T for each path token; then out[b, n, h] = h C_n (+ D[h] x_n), times silu(z_n) if z is
    given. A row is written only if its slot is in range and every parent link lies in [-1, n-1].
    """
    num_rows, num_nodes, num_heads, head_dim = x.shape
    heads_per_group = num_heads // B.shape[2]
    x, dt, A, B, C = x.cpu().double(), dt.cpu().double(), A.cpu().double(), B.cpu().double(), C.cpu().double()
    states = ssm_state.cpu().double()
    D, z, dt_bias = (None if t is None else t.cpu().double() for t in (D, z, dt_bias))
    expected = torch.zeros(num_rows, num_nodes, num_heads, head_dim, dtype=torch.float64)
    written = []

    def step_size(row, token, head):
        d = dt[row, token, head]
        if dt_bias is not None:
            d = d + dt_bias[head]
        return _softplus(d) if dt_softplus else d

    for row, slot, paths in _verified_rows(state_slots, states.shape[0], parents, num_nodes):
        written.append(row)
        for node, path in enumerate(paths):
            for head in range(num_heads):
                group = head // heads_per_group
                state = states[slot, head].clone()  # [P, Ns]
                for token in path:
                    d = step_size(row, token, head)
                    state = torch.exp(d * A[head]) * state + torch.outer(d * x[row, token, head], B[row, token, group])
                y = state @ C[row, node, group]
                if D is not None:
                    y = y + D[head] * x[row, node, head]
                if z is not None:
                    gate = z[row, node, head]
                    y = y * gate / (1 + torch.exp(-gate))
                expected[row, node, head] = y
    return expected, written


# ---------------------------------------------------------------------------------------------
# The ring (no commit pass): its semantics as Python lists, step by step
# ---------------------------------------------------------------------------------------------


class _RingOracle:
    """The mixer-free half of the ring's oracle (tests only): the checkpoints, the pending tokens, the
    cursor, the conv, acceptance, flush and the fold rule, in float64 lists. A mixer's subclass gives
    ``_token_step`` (one token of its recurrence, from the token's conv output and stored gates) and
    its verify, which calls ``_state_before_drafts``.

    No ring buffer and no physical rows: per (layer, state slot) a checkpoint -- the recurrent
    state (float64, rounded to ssm_state's dtype whenever it is written) and the conv window (K-1
    inputs as conv_state holds them) -- per (layer, ring slot) the pending tokens (each one's conv
    input as the ring stores it, its gates as the ring holds them), and per ring slot the cursor
    (start, pending) the ops must show. The rules, one by one:
    - a row's verify folds when pending > 0 and pending + T > capacity, T the most tokens the step
      can accept (a tree's ``tree_depth`` if given, else N): the checkpoint becomes the state after
      the pending tokens (replayed token by token from their conv outputs), the window their last
      K-1 inputs;
    - a draft's conv reads the window, then the pending tokens' inputs, then its path's;
    - the drafts' outputs are decoded token by token from the state after the pending tokens;
    - accept: a folding slot's start moves past its pending tokens (mod capacity + N), then the
      accepted path's tokens are appended to the pending ones;
    - flush folds every pending token; a due flush, before a step, those of the rows its verify would
      fold, so that the step's conv reads their history from the window as conv_state holds it.
    The model (conv_weight [L, dim, K], conv_bias [L, dim] or None, the mixer's) is fixed. Per step,
    as an engine calls the ops: conv_verify then the mixer's verify for each layer, then accept.
    """

    def __init__(self, ssm_state, conv_state, conv_weight, conv_bias, *, num_ring_slots, capacity, num_draft,
                 ring_dtype, gates_dtype, state_layout, tree_depth=None):
        self.ssm_dtype = ssm_state.dtype
        self.ssm = ssm_state.cpu().double().clone()  # [L, S, *state]
        conv = conv_state.cpu()
        self.state_layout = state_layout
        self.conv = (conv if state_layout == "dim_major" else conv.transpose(2, 3)).clone()  # [L, S, dim, K-1]
        self.weight = conv_weight.cpu().double()
        self.bias = None if conv_bias is None else conv_bias.cpu().double()
        self.kernel_size = self.weight.shape[2]
        self.capacity, self.num_draft, self.ring_rows = capacity, num_draft, capacity + num_draft
        self.tree_depth = tree_depth
        self.ring_dtype, self.gates_dtype = ring_dtype, gates_dtype
        num_layers = self.ssm.shape[0]
        self.pending = [[[] for _ in range(num_ring_slots)] for _ in range(num_layers)]
        self.start = [0] * num_ring_slots
        self.count = [0] * num_ring_slots  # pending tokens of each ring slot (every layer holds as many)
        self.drafts = {}  # (layer, ring slot) -> this step's tokens, node by node

    # --- what the ops' tensors must hold --------------------------------------------------------

    def cursor(self) -> torch.Tensor:
        """[M, 2]: (start, pending) of every ring slot."""
        return torch.tensor([[start, count] for start, count in zip(self.start, self.count)])

    def conv_state(self) -> torch.Tensor:
        """The checkpoints' conv windows, laid out as conv_state."""
        return self.conv if self.state_layout == "dim_major" else self.conv.transpose(2, 3)

    def pending_tokens(self, layer: int, ring_slot: int) -> list[dict]:
        """The pending tokens of one slot, oldest first: dicts of x [dim] and the mixer's gates."""
        return self.pending[layer][ring_slot]

    # --- the engine's steps ---------------------------------------------------------------------

    def reset(self, ring_slot: int, state_slot: int, ssm_state, conv_state) -> None:
        """A new request: its checkpoint is what the prefill wrote at ``state_slot`` (every layer of
        the given tensors), its ring slot empty."""
        self.ssm[:, state_slot] = ssm_state[:, state_slot].cpu().double()
        conv = conv_state.cpu() if self.state_layout == "dim_major" else conv_state.cpu().transpose(2, 3)
        self.conv[:, state_slot] = conv[:, state_slot]
        for layer_pending in self.pending:
            layer_pending[ring_slot] = []
        self.start[ring_slot] = self.count[ring_slot] = 0

    def conv_verify(self, layer, x, ring_slots, state_slots, parents=None, activation="silu"):
        """The outputs ring_conv1d_verify must write, in float64 [B, N, dim], and a bool mask [B, N]
        of those it writes; records the drafts' inputs as the ring stores them."""
        num_rows, num_nodes, dim = x.shape
        weight = self.weight[layer]
        bias = None if self.bias is None else self.bias[layer]
        expected = torch.zeros(num_rows, num_nodes, dim, dtype=torch.float64)
        written = torch.zeros(num_rows, num_nodes, dtype=torch.bool)

        def conv_step(window, token):
            y = torch.zeros(dim, dtype=torch.float64) if bias is None else bias.clone()
            for tap, value in enumerate(window + [token]):
                y += weight[:, tap] * value.double()
            return y / (1 + torch.exp(-y)) if activation in ("silu", "swish") else y

        for row, ring_slot, state_slot in self._rows(ring_slots, state_slots):
            before = self._window(layer, state_slot) + [t["x"] for t in self.pending[layer][ring_slot]]
            history = before[len(before) - (self.kernel_size - 1):]
            links = None if parents is None else [int(p) for p in parents[row]]
            for node in range(num_nodes):
                decoded = _decode_node(history, x[row].cpu(), links, node, self.kernel_size, conv_step)
                if decoded is not None:
                    expected[row, node] = decoded[0]
                    written[row, node] = True
            self.drafts[layer, ring_slot] = [{"x": x[row, n].cpu().to(self.ring_dtype)} for n in range(num_nodes)]
        return expected, written

    def accept(self, ring_slots, steps, parents=None):
        """Every layer at once, as ring_accept: the fold's cursor move, then the accepted path."""
        for row in range(ring_slots.shape[0]):
            ring_slot = int(ring_slots[row])
            if not 0 <= ring_slot < len(self.start):
                continue
            if self._folds(self.count[ring_slot], parents is not None):  # this step's verify folded
                assert all(not layer_pending[ring_slot] for layer_pending in self.pending)
                self.start[ring_slot] = (self.start[ring_slot] + self.count[ring_slot]) % self.ring_rows
                self.count[ring_slot] = 0
            step = int(steps[row])
            path = None
            if 0 <= step < self.num_draft:
                path = accepted_path(step, None if parents is None else [int(p) for p in parents[row]])
            if path is None:
                continue
            for layer, layer_pending in enumerate(self.pending):
                layer_pending[ring_slot] = layer_pending[ring_slot] + [self.drafts[layer, ring_slot][n] for n in path]
            self.count[ring_slot] += len(path)
        self.drafts = {}

    def flush(self, ring_slots, state_slots, due_only=False):
        """Every layer: the checkpoint after all pending tokens, the cursor past them; with
        ``due_only`` (a due flush: the ops' flush given num_draft and tree_depth) only in the rows the
        next verify would fold, by the rule with tree_depth wherever one is told (as the ops' flush)."""
        for _, ring_slot, state_slot in self._rows(ring_slots, state_slots):
            if due_only and not self._folds(self.count[ring_slot], tree=True):
                continue
            for layer, layer_pending in enumerate(self.pending):
                if layer_pending[ring_slot]:
                    self._write_checkpoint(layer, state_slot, *self._replay(layer, state_slot, layer_pending[ring_slot]))
                layer_pending[ring_slot] = []
            self.start[ring_slot] = (self.start[ring_slot] + self.count[ring_slot]) % self.ring_rows
            self.count[ring_slot] = 0

    # --- one token at a time ------------------------------------------------------------------------

    def _rows(self, ring_slots, state_slots):
        """(row, ring slot, state slot) of every row with both slots in range."""
        for row in range(ring_slots.shape[0]):
            ring_slot, state_slot = int(ring_slots[row]), int(state_slots[row])
            if 0 <= ring_slot < len(self.start) and 0 <= state_slot < self.ssm.shape[1]:
                yield row, ring_slot, state_slot

    def _window(self, layer, state_slot) -> list[torch.Tensor]:
        """The checkpoint's K-1 inputs, oldest first."""
        return [self.conv[layer, state_slot, :, col] for col in range(self.kernel_size - 1)]

    def _folds(self, count, tree) -> bool:
        """The fold rule for ``count`` pending tokens in a step of trees (``tree``) or chains."""
        most_accepted = self.tree_depth if tree and self.tree_depth else self.num_draft
        return count > 0 and count + most_accepted > self.capacity

    def _state_before_drafts(self, layer, ring_slot, state_slot, draft_gates, parents):
        """The state after the slot's pending tokens (float64), folded into the checkpoint where the
        rule says so; ``draft_gates`` (one dict per node, as the ring holds them) recorded with the
        drafts' inputs."""
        pending = self.pending[layer][ring_slot]
        assert len(pending) == self.count[ring_slot]
        state, window = self._replay(layer, state_slot, pending)
        if self._folds(len(pending), parents is not None):
            self._write_checkpoint(layer, state_slot, state, window)
            self.pending[layer][ring_slot] = []
        for token, gates in zip(self.drafts[layer, ring_slot], draft_gates):
            token.update(gates)
        return state

    def _replay(self, layer, state_slot, tokens):
        """(the state after ``tokens`` from the checkpoint, float64; the last K-1 inputs): each token's
        conv output silu(bias + sum_k w[:, k] * input k) through the mixer's ``_token_step``."""
        inputs = self._window(layer, state_slot) + [token["x"] for token in tokens]
        state = self.ssm[layer, state_slot].clone()
        for j, token in enumerate(tokens):
            y = torch.zeros(self.weight.shape[1], dtype=torch.float64) if self.bias is None else self.bias[layer].clone()
            for tap in range(self.kernel_size):
                y = y + self.weight[layer, :, tap] * inputs[j + tap].double()
            state = self._token_step(layer, state, y / (1 + torch.exp(-y)), token)
        return state, inputs[len(inputs) - (self.kernel_size - 1):]

    def _token_step(self, layer, state, c, token):
        raise NotImplementedError

    def _write_checkpoint(self, layer, state_slot, state, window):
        self.ssm[layer, state_slot] = state.to(self.ssm_dtype).double()  # stored in ssm_state's dtype
        for col, value in enumerate(window):
            self.conv[layer, state_slot, :, col] = value.to(self.conv.dtype)


class RingReference(_RingOracle):
    """The Gated DeltaNet ring's oracle (``gdn_ring_verify``, ``gdn_ring_flush``; the rules in
    _RingOracle): a pending token holds x, g, beta; it is replayed as gdn_commit_reference does.
    The heads (Hk, dk, Hv, dv) and use_qk_l2norm are fixed with the model."""

    def __init__(self, ssm_state, conv_state, conv_weight, conv_bias, *, num_ring_slots, capacity, num_draft,
                 num_k_heads, head_k_dim, num_v_heads, head_v_dim, use_qk_l2norm=True, ring_dtype=torch.bfloat16,
                 gates_dtype=torch.float32, state_layout="dim_major", tree_depth=None):
        super().__init__(ssm_state, conv_state, conv_weight, conv_bias, num_ring_slots=num_ring_slots,
                         capacity=capacity, num_draft=num_draft, ring_dtype=ring_dtype, gates_dtype=gates_dtype,
                         state_layout=state_layout, tree_depth=tree_depth)
        self.heads = (num_k_heads, head_k_dim, num_v_heads, head_v_dim)
        self.use_qk_l2norm = use_qk_l2norm

    def gdn_verify(self, layer, q, k, v, g, beta, ring_slots, state_slots, parents=None, *, scale=None):
        """The outputs gdn_ring_verify must write, in float64 [B, N, Hv, dv], and the rows it writes;
        folds where the rule says so and records the drafts' gates as the ring stores them."""
        num_rows, num_nodes, _, head_k_dim = q.shape
        scale = head_k_dim ** -0.5 if scale is None else scale
        expected = torch.zeros(num_rows, num_nodes, self.heads[2], self.heads[3], dtype=torch.float64)
        written = []
        for row, ring_slot, state_slot in self._rows(ring_slots, state_slots):
            draft_gates = [{"g": g[row, n].cpu().to(self.gates_dtype), "beta": beta[row, n].cpu().to(self.gates_dtype)}
                           for n in range(num_nodes)]
            state = self._state_before_drafts(layer, ring_slot, state_slot, draft_gates, parents)
            links = None if parents is None else [int(p) for p in parents[row]]
            paths = [accepted_path(node, links) for node in range(num_nodes)]
            if any(path is None for path in paths):
                continue
            written.append(row)
            for node, path in enumerate(paths):
                decoded = state.clone()
                for token in path:
                    decoded = self._delta_step(decoded, k[row, token].cpu().double(), v[row, token].cpu().double(),
                                               g[row, token].cpu().double(), beta[row, token].cpu().double())
                query = q[row, node].cpu().double()
                for head in range(self.heads[2]):
                    q_head = self._normalised(query[head // (self.heads[2] // self.heads[0])])
                    expected[row, node, head] = scale * (decoded[head].t() @ q_head)
        return expected, written

    def _normalised(self, x):
        return x / torch.sqrt((x * x).sum() + 1e-6) if self.use_qk_l2norm else x

    def _delta_step(self, state, k, v, g, beta):
        """One token of every value head: k [Hk, dk], v [Hv, dv], g and beta [Hv]; a new state."""
        num_k_heads, _, num_v_heads, _ = self.heads
        state = state.clone()
        for head in range(num_v_heads):
            key = self._normalised(k[head // (num_v_heads // num_k_heads)])
            state[head] = state[head] * torch.exp(g[head])
            u = beta[head] * (v[head] - state[head].t() @ key)
            state[head] = state[head] + torch.outer(key, u)
        return state

    def _token_step(self, layer, state, c, token):
        """A pending token: k, v split from its conv output c, its stored g, beta."""
        num_k_heads, head_k_dim, num_v_heads, head_v_dim = self.heads
        key_width = num_k_heads * head_k_dim
        k = c[key_width:2 * key_width].reshape(num_k_heads, head_k_dim)
        v = c[2 * key_width:].reshape(num_v_heads, head_v_dim)
        return self._delta_step(state, k, v, token["g"].double(), token["beta"].double())


class Mamba2RingReference(_RingOracle):
    """The Mamba2 ring's oracle (``mamba2_ring_verify``, ``mamba2_ring_flush``; the rules in
    _RingOracle): a pending token holds x and dt, the dt its verify decoded with (after dt_bias and
    softplus, rounded to the gates' dtype); it is replayed as mamba2_commit_reference does. The heads
    (H, P, G, Ns) and A [L, H] are fixed with the model."""

    def __init__(self, ssm_state, conv_state, conv_weight, conv_bias, A, *, num_ring_slots, capacity, num_draft,
                 num_heads, head_dim, n_groups, d_state, ring_dtype=torch.bfloat16, gates_dtype=torch.float32,
                 state_layout="dim_major", tree_depth=None):
        super().__init__(ssm_state, conv_state, conv_weight, conv_bias, num_ring_slots=num_ring_slots,
                         capacity=capacity, num_draft=num_draft, ring_dtype=ring_dtype, gates_dtype=gates_dtype,
                         state_layout=state_layout, tree_depth=tree_depth)
        self.rates = A.cpu().double()  # [L, H]
        self.heads = (num_heads, head_dim, n_groups, d_state)

    def mamba2_verify(self, layer, x, dt, B, C, ring_slots, state_slots, parents=None, *, D=None, z=None,
                      dt_bias=None, dt_softplus=False):
        """The outputs mamba2_ring_verify must write, in float64 [B, N, H, P], and the rows it writes;
        folds where the rule says so and records each draft's dt, d = dt (+ dt_bias), softplus'd if
        ``dt_softplus``, as the ring stores it. The drafts decode with d unrounded."""
        num_heads, head_dim, n_groups, _ = self.heads
        num_rows, num_nodes = x.shape[:2]
        x, dt, B, C = x.cpu().double(), dt.cpu().double(), B.cpu().double(), C.cpu().double()
        D, z, dt_bias = (None if t is None else t.cpu().double() for t in (D, z, dt_bias))
        expected = torch.zeros(num_rows, num_nodes, num_heads, head_dim, dtype=torch.float64)
        written = []
        for row, ring_slot, state_slot in self._rows(ring_slots, state_slots):
            steps = []
            for node in range(num_nodes):
                d = dt[row, node] if dt_bias is None else dt[row, node] + dt_bias
                steps.append(_softplus(d) if dt_softplus else d)
            state = self._state_before_drafts(layer, ring_slot, state_slot,
                                              [{"dt": d.to(self.gates_dtype)} for d in steps], parents)
            links = None if parents is None else [int(p) for p in parents[row]]
            paths = [accepted_path(node, links) for node in range(num_nodes)]
            if any(path is None for path in paths):
                continue
            written.append(row)
            for node, path in enumerate(paths):
                decoded = state.clone()
                for token in path:
                    decoded = self._ssm_step(layer, decoded, x[row, token], B[row, token], steps[token])
                for head in range(num_heads):
                    y = decoded[head] @ C[row, node, head // (num_heads // n_groups)]
                    if D is not None:
                        y = y + D[head] * x[row, node, head]
                    if z is not None:
                        gate = z[row, node, head]
                        y = y * gate / (1 + torch.exp(-gate))
                    expected[row, node, head] = y
        return expected, written

    def _ssm_step(self, layer, state, x, b, dt):
        """One token of every head: x [H, P], b [G, Ns], dt [H]; h = exp(dt A) h + (dt x) B^T, a new state."""
        num_heads, _, n_groups, _ = self.heads
        state = state.clone()
        for head in range(num_heads):
            group = head // (num_heads // n_groups)
            state[head] = (torch.exp(dt[head] * self.rates[layer, head]) * state[head]
                           + torch.outer(dt[head] * x[head], b[group]))
        return state

    def _token_step(self, layer, state, c, token):
        """A pending token: x, B split from its conv output c, its stored dt."""
        num_heads, head_dim, n_groups, d_state = self.heads
        x_width = num_heads * head_dim
        x = c[:x_width].reshape(num_heads, head_dim)
        b = c[x_width:x_width + n_groups * d_state].reshape(n_groups, d_state)
        return self._ssm_step(layer, state, x, b, token["dt"].double())
