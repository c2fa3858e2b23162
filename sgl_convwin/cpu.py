"""Vectorised pure-PyTorch implementations, registered as the ops' CPU kernels.

They run eagerly even inside compiled graphs (the ops are opaque to torch.compile), so they may
use boolean masks; they share only validation with the Triton path, never its code.
"""

from __future__ import annotations

import torch

# The chunked forms floor each token's log decay before summing it along a path, as the kernels do
# (csrc_triton/_common.py says why): after -1e6 the small decays would drown in the sum's rounding.
LOG_DECAY_FLOOR = -64.0


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
    """state: [L, N, dim, K-1] (any strides), windows: [L, M, N, dim, K-1] (any strides)."""
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
    """state: [L, R, dim, K-1] (any strides), rows: [L, M, N+K-2, dim] (any strides)."""
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
    """state: [L, R, dim, K-1] (any strides); x: [B, N, dim]; dest: see above."""
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


# ---------------------------------------------------------------------------------------------
# Replay commit (Gated DeltaNet) and its gates. ``tokens [L, M, N, dim]`` and ``history
# [L, M, N, dim, K-2]`` are the buffer's layout-free views (see csrc_triton/gdn_commit.py).
# ---------------------------------------------------------------------------------------------


def capture_gates_cpu(gates, g, beta, buffer_slots, layer, A_log=None, dt_bias=None):
    """gates [L, M, N, G, H]; g, beta [B, n, H] (beta None: a single-gate buffer); with A_log,
    dt_bias [H], g and beta are the raw a, b: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)."""
    slots = buffer_slots.long()
    rows = ((slots >= 0) & (slots < gates.shape[1])).nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    if A_log is not None:
        g = -torch.exp(A_log.float()) * torch.nn.functional.softplus(g.float() + dt_bias.float(), threshold=20.0)
        beta = torch.sigmoid(beta.float())
    num_nodes = g.shape[1]
    gates[layer, slots[rows], :num_nodes, 0] = g[rows].to(gates.dtype)
    if beta is not None:
        gates[layer, slots[rows], :num_nodes, 1] = beta[rows].to(gates.dtype)


def _accepted_paths(steps, parents, num_nodes):
    """Per row: the accepted path, root first, as [B, N] node indices (valid up to its length),
    its length [B], and whether its links are all in [-1, n-1] [B]."""
    num_rows = steps.shape[0]
    node = steps.long().clamp(0, num_nodes - 1)
    index = torch.arange(num_nodes, device=steps.device)
    if parents is None:
        return index.expand(num_rows, num_nodes), node + 1, torch.ones_like(node, dtype=torch.bool)
    parents = parents.long()
    up = torch.zeros(num_rows, num_nodes, dtype=torch.long, device=steps.device)
    length = torch.zeros_like(node)
    links_ok = torch.ones_like(node, dtype=torch.bool)
    current = node
    for i in range(num_nodes):
        live = current >= 0
        up[:, i] = torch.where(live, current, 0)
        parent = parents.gather(1, current.clamp(min=0)[:, None]).squeeze(1)
        bad = live & ((parent < -1) | (parent >= current))
        links_ok &= ~bad
        length += live.long()
        current = torch.where(live & ~bad, parent, -1)
    flipped = (length[:, None] - 1 - index).clamp(min=0)
    return up.gather(1, flipped), length, links_ok


def _replay_rows(dst_slots, src_slots, steps, parents, num_state_slots, num_src_slots, num_nodes):
    """The rows a replay commit writes -- (dst, src, paths [R, N], lengths [R]) -- or None."""
    dst, src, step = dst_slots.long(), src_slots.long(), steps.long()
    paths, lengths, links_ok = _accepted_paths(step, parents, num_nodes)
    active = _rows_in_range(step, num_nodes, dst, num_state_slots, src, num_src_slots) & links_ok
    rows = active.nonzero().squeeze(1)
    if rows.numel() == 0:
        return None
    return dst[rows], src[rows], paths[rows], lengths[rows]


def _path_conv_outputs(conv, tokens, weight, bias, dst, src, paths, lengths):
    """For each path position j: (j, live [1, R], node [R], c [L, R, dim]), c = silu of the causal
    conv of path token j in float32 (inputs before the path from conv [L, R, dim, K-1])."""
    width = conv.shape[3]
    window = conv[:, dst].float()  # [L, R, dim, K-1]: the K-1 newest inputs, oldest first
    taps = weight.float()[:, None]  # [L, 1, dim, K]
    for j in range(tokens.shape[2]):
        live = (j < lengths)[None, :]
        node = paths[:, j]
        x = tokens[:, src, node].float()  # [L, R, dim]
        y = (window * taps[..., :width]).sum(-1) + x * taps[..., width]
        if bias is not None:
            y = y + bias.float()[:, None]
        yield j, live, node, torch.nn.functional.silu(y)
        window = torch.where(live[..., None, None], torch.cat([window[..., 1:], x[..., None]], dim=-1), window)


def _commit_path_windows(conv, tokens, history, dst, src, paths, lengths):
    """conv[:, dst] = the last K-1 inputs of each path, from the buffer (no arithmetic)."""
    width = conv.shape[3]
    columns = []
    for col in range(width):
        position = lengths - width + col  # [R]; < 0: history column width-1+position
        node = paths.gather(1, position.clamp(min=0)[:, None]).squeeze(1)
        from_token = tokens[:, src, node]  # [L, R, dim]
        if history.shape[-1] > 0:
            held = history[:, src, paths[:, 0]]  # [L, R, dim, K-2]: what the root's window holds
            history_col = (width - 1 + position).clamp(0, held.shape[-1] - 1)[None, :, None, None]
            from_history = held.gather(-1, history_col.expand(*held.shape[:-1], 1)).squeeze(-1)
            columns.append(torch.where((position >= 0)[None, :, None], from_token, from_history))
        else:
            columns.append(from_token)
    conv[:, dst] = torch.stack(columns, dim=-1).to(conv.dtype)


def gdn_commit_cpu(
    ssm, conv, tokens, history, gates, weight, bias, dst_slots, src_slots, steps, parents,
    *, num_k_heads, head_k_dim, num_v_heads, head_v_dim, use_qk_l2norm,
):
    """ssm [L, R, Hv, dk, dv], conv [L, R, dim, K-1] (any strides), in place."""
    replayed = _replay_rows(dst_slots, src_slots, steps, parents, ssm.shape[1], tokens.shape[1], tokens.shape[2])
    if replayed is None:
        return
    dst, src, paths, lengths = replayed
    key_width = num_k_heads * head_k_dim
    ratio = num_v_heads // num_k_heads
    state = ssm[:, dst].float()  # [L, R, Hv, dk, dv]
    for _, live, node, c in _path_conv_outputs(conv, tokens, weight, bias, dst, src, paths, lengths):
        k = c[..., key_width: 2 * key_width].unflatten(-1, (num_k_heads, head_k_dim))
        if use_qk_l2norm:
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        k = k.repeat_interleave(ratio, dim=2)  # [L, R, Hv, dk]: value head h reads key head h // ratio
        v = c[..., 2 * key_width:].unflatten(-1, (num_v_heads, head_v_dim))
        g = gates[:, src, node, 0].float()[..., None, None]  # [L, R, Hv, 1, 1]
        beta = gates[:, src, node, 1].float()[..., None]  # [L, R, Hv, 1]
        decayed = state * torch.exp(g)
        u = beta * (v - (decayed * k[..., None]).sum(-2))
        updated = decayed + k[..., None] * u[..., None, :]
        state = torch.where(live[..., None, None, None], updated, state)
    ssm[:, dst] = state.to(ssm.dtype)
    _commit_path_windows(conv, tokens, history, dst, src, paths, lengths)


def mamba2_commit_cpu(
    ssm, conv, tokens, history, gates, weight, bias, a, dst_slots, src_slots, steps, parents,
    *, num_heads, head_dim, n_groups, d_state,
):
    """ssm [L, R, H, P, Ns], conv [L, R, dim, K-1] (any strides), in place."""
    replayed = _replay_rows(dst_slots, src_slots, steps, parents, ssm.shape[1], tokens.shape[1], tokens.shape[2])
    if replayed is None:
        return
    dst, src, paths, lengths = replayed
    x_width = num_heads * head_dim
    state = ssm[:, dst].float()  # [L, R, H, P, Ns]
    rate = a.float()[:, None, :, None, None]  # [L, 1, H, 1, 1]
    for _, live, node, c in _path_conv_outputs(conv, tokens, weight, bias, dst, src, paths, lengths):
        x = c[..., :x_width].unflatten(-1, (num_heads, head_dim))  # [L, R, H, P]
        b = c[..., x_width: x_width + n_groups * d_state].unflatten(-1, (n_groups, d_state))
        b = b.repeat_interleave(num_heads // n_groups, dim=2)  # [L, R, H, Ns]: head h reads group h // (H/G)
        dt = gates[:, src, node, 0].float()[..., None, None]  # [L, R, H, 1, 1]
        updated = torch.exp(dt * rate) * state + (dt * x[..., None]) * b[..., None, :]
        state = torch.where(live[..., None, None, None], updated, state)
    ssm[:, dst] = state.to(ssm.dtype)
    _commit_path_windows(conv, tokens, history, dst, src, paths, lengths)


def _ancestry(parents, num_rows, num_nodes, device):
    """[R, N, N] bool: node i is node n's ancestor or n itself (chains: i <= n), and [R] whether
    every link lies in [-1, n-1]."""
    index = torch.arange(num_nodes, device=device)
    if parents is None:
        chain = index[None, :] <= index[:, None]
        return chain.expand(num_rows, num_nodes, num_nodes), torch.ones(num_rows, dtype=torch.bool, device=device)
    parents = parents.long()
    links_ok = ((parents >= -1) & (parents < index)).all(dim=1)
    up = torch.where(links_ok[:, None], parents, -1)  # [R, N]: each node's ancestor, one more hop per round
    ancestry = index[None, :, None] == index[None, None, :]
    ancestry = ancestry.expand(num_rows, num_nodes, num_nodes).clone()
    for _ in range(num_nodes - 1):
        ancestry |= up[..., None] == index
        up = torch.where(up >= 0, parents.gather(1, up.clamp(min=0)), -1)
    return ancestry, links_ok


def gdn_verify_cpu(out, q, k, v, g, beta, ssm, state_slots, parents, *, scale, use_qk_l2norm):
    """out [B, N, Hv, dv] from one read of ssm [S, Hv, dk, dv] per row, in the chunked form
    (csrc_triton/gdn_verify.py's formulas), float32; rows with a bad slot or link untouched."""
    num_rows, num_nodes, num_k_heads, _ = q.shape
    num_v_heads = v.shape[2]
    slots = state_slots.long()
    ancestry, links_ok = _ancestry(parents, num_rows, num_nodes, q.device)
    rows = ((slots >= 0) & (slots < ssm.shape[0]) & links_ok).nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    ratio = num_v_heads // num_k_heads

    def heads(x):  # [R, N, Hk, d] -> [R, Hv, N, d], value head h reading key head h // ratio
        x = x[rows].float()
        if use_qk_l2norm:
            x = x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)
        return x.repeat_interleave(ratio, dim=2).transpose(1, 2)

    queries, keys = heads(q) * scale, heads(k)
    values = v[rows].float().transpose(1, 2)  # [R, Hv, N, dv]
    log_decay = g[rows].float().transpose(1, 2).clamp(min=LOG_DECAY_FLOOR)  # [R, Hv, N]
    betas = beta[rows].float().transpose(1, 2)
    anc = ancestry[rows][:, None]  # [R, 1, N, N]
    cumulative = (anc * log_decay[:, :, None, :]).sum(-1)  # [R, Hv, N]
    gap = cumulative[..., :, None] - cumulative[..., None, :]
    decay = torch.where(anc, torch.exp(torch.where(anc, gap, 0.0)), 0.0)
    eye = torch.eye(num_nodes, dtype=torch.bool, device=q.device)
    strict = torch.where(eye, 0.0, decay)
    state = ssm[slots[rows]].float()  # [R, Hv, dk, dv]
    grown = torch.exp(cumulative)[..., None]
    system = torch.eye(num_nodes, device=q.device) + betas[..., None] * strict * (keys @ keys.transpose(-1, -2))
    rhs = betas[..., None] * (values - grown * (keys @ state))
    updates = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    o = grown * (queries @ state) + (decay * (queries @ keys.transpose(-1, -2))) @ updates
    out[rows] = o.transpose(1, 2).to(out.dtype)


def mamba2_verify_cpu(out, x, dt, A, B, C, ssm, state_slots, parents, D, z, dt_bias, *, dt_softplus):
    """out [B, N, H, P] from one read of ssm [S, H, P, Ns] per row, in the chunked (SSD) form
    (csrc_triton/mamba2_verify.py's formulas), float32; rows with a bad slot or link untouched."""
    num_rows, num_nodes, num_heads, _ = x.shape
    slots = state_slots.long()
    ancestry, links_ok = _ancestry(parents, num_rows, num_nodes, x.device)
    rows = ((slots >= 0) & (slots < ssm.shape[0]) & links_ok).nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    ratio = num_heads // B.shape[2]

    def heads(t):  # [R, N, G, Ns] -> [R, H, N, Ns], head h reading group h // ratio
        return t[rows].float().repeat_interleave(ratio, dim=2).transpose(1, 2)

    inputs, keys, queries = x[rows].float().transpose(1, 2), heads(B), heads(C)  # x: [R, H, N, P]
    step = dt[rows].float().transpose(1, 2)  # [R, H, N]
    if dt_bias is not None:
        step = step + dt_bias.float()[:, None]
    if dt_softplus:
        step = torch.nn.functional.softplus(step)
    anc = ancestry[rows][:, None]  # [R, 1, N, N]
    log_decay = (step * A.float()[:, None]).clamp(min=LOG_DECAY_FLOOR)
    cumulative = (anc * log_decay[:, :, None, :]).sum(-1)  # [R, H, N]: sum of d A over the path
    gap = cumulative[..., :, None] - cumulative[..., None, :]
    decay = torch.where(anc, torch.exp(torch.where(anc, gap, 0.0)), 0.0)  # [R, H, N, N]
    mix = decay * step[..., None, :] * (queries @ keys.transpose(-1, -2))
    state = ssm[slots[rows]].float()  # [R, H, P, Ns]
    y = torch.exp(cumulative)[..., None] * (queries @ state.transpose(-1, -2)) + mix @ inputs
    if D is not None:
        y = y + D.float()[:, None, None] * inputs
    y = y.transpose(1, 2)  # [R, N, H, P]
    if z is not None:
        y = y * torch.nn.functional.silu(z[rows].float())
    out[rows] = y.to(out.dtype)
