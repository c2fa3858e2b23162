"""The ring ops in vectorised PyTorch: their CPU kernels (on CUDA tensors the Triton launchers run).

A slot's ring is circular: logical position j (0 = the oldest pending token) is physical row
(start + j) % C. Every function here rolls the rows it reads into logical order (a gathered copy)
and hands them to the replay-commit and verify code of cpu.py, so a fold replays exactly as
``gdn_commit`` (``mamba2_commit``) would and a draft's conv is ``causal_conv1d_verify``'s. Not fast:
the GPU kernels fuse this into one read of each checkpoint.
"""

from __future__ import annotations

import torch

from . import cpu


def _live_rows(ring_slots, cursor, num_ring_slots, ring_rows, max_pending, state_slots=None, num_state_slots=0):
    """The rows a ring op processes -- (rows, ring slots, state slots or None, start, pending),
    each [B'] -- or None: every slot in range and the slot's cursor a ring position."""
    ring = ring_slots.long()
    active = (ring >= 0) & (ring < num_ring_slots)
    start, pending = cursor.long()[ring.clamp(0, num_ring_slots - 1)].unbind(-1)
    active &= (start >= 0) & (start < ring_rows) & (pending >= 0) & (pending <= max_pending)
    if state_slots is not None:
        state = state_slots.long()
        active &= (state >= 0) & (state < num_state_slots)
    rows = active.nonzero().squeeze(1)
    if rows.numel() == 0:
        return None
    state = None if state_slots is None else state_slots.long()[rows]
    return rows, ring[rows], state, start[rows], pending[rows]


def _positions(start, first, count, ring_rows):
    """[B', count] physical rows of logical positions first .. first+count-1 (first: [B'])."""
    return (start + first)[:, None].add(torch.arange(count, device=start.device)).remainder(ring_rows)


def _row_map(num_rows, rows):
    """[B] index of each batch row among the live ones (-1: not live), as cpu.py's kernels take slots."""
    mapping = torch.full((num_rows,), -1, dtype=torch.long, device=rows.device)
    mapping[rows] = torch.arange(rows.shape[0], device=rows.device)
    return mapping


def _window_before_drafts(conv, rows_buffer, layer, ring, state, start, pending):
    """[B', dim, K-1]: the last K-1 inputs before the drafts -- the checkpoint's window (conv
    [L, S, dim, K-1]) followed by the pending rows, oldest first -- in a dtype holding both exactly."""
    width, ring_rows = conv.shape[3], rows_buffer.shape[2]
    window = conv[layer, state].to(torch.promote_types(conv.dtype, rows_buffer.dtype))  # [B', dim, K-1] (a copy)
    logical = pending[:, None] - width + torch.arange(width, device=pending.device)  # [B', K-1]
    from_ring = rows_buffer[layer][ring[:, None], (start[:, None] + logical.clamp(min=0)) % ring_rows]
    from_state = window.gather(2, (width + logical).clamp(0, width - 1)[:, None, :].expand_as(window))
    return torch.where((logical >= 0)[:, None, :], from_ring.transpose(1, 2).to(window.dtype), from_state)


def ring_conv1d_verify_cpu(out, rows_buffer, conv, x, weight, bias, ring_slots, state_slots, cursor, layer, parents,
                           *, silu):
    """out [B, N, dim] (the layer's), rows_buffer [L, M, C, dim], conv [L, S, dim, K-1] (any strides)."""
    num_rows, num_nodes = x.shape[0], x.shape[1]
    ring_rows = rows_buffer.shape[2]
    live = _live_rows(ring_slots, cursor, rows_buffer.shape[1], ring_rows, ring_rows - num_nodes,
                      state_slots, conv.shape[1])
    if live is None:
        return
    rows, ring, state, start, pending = live
    window = _window_before_drafts(conv, rows_buffer, layer, ring, state, start, pending)[None]  # [1, B', dim, K-1]
    mapping = _row_map(num_rows, rows)
    discarded = torch.empty(1, rows.shape[0], num_nodes + conv.shape[3] - 1, x.shape[2], dtype=rows_buffer.dtype,
                            device=x.device)  # where causal_conv1d_verify_cpu copies its inputs
    cpu.causal_conv1d_verify_cpu(out, discarded, window, x, weight, bias, mapping, mapping, 0, parents, dense=False,
                                 silu=silu)
    rows_buffer[layer, ring[:, None], _positions(start, pending, num_nodes, ring_rows)] = x[rows].to(rows_buffer.dtype)


def _replay_pending(ssm, conv, rows_buffer, gates, layers, ring, state, start, pending, commit, weights, heads):
    """Replay every live row's pending tokens from its checkpoint on copies with ``commit`` (a replay
    commit of cpu.py: ``commit(ssm, conv, tokens, history, gates, *weights, dst, src, steps, parents,
    **heads)``): returns (states [L', B', *state] float32, windows [L', B', dim, K-1] in conv's dtype)."""
    ring_rows = rows_buffer.shape[2]
    positions = _positions(start, torch.zeros_like(start), ring_rows, ring_rows)  # [B', C], oldest pending first
    tokens = rows_buffer[layers][:, ring[:, None], positions]  # [L', B', C, dim]
    token_gates = gates[layers][:, ring[:, None], positions]  # [L', B', C, G, H]
    windows = conv[layers][:, state]  # [L', B', dim, K-1]
    # the K-2 newest committed inputs, where the replay commits read a short path's window from
    history = windows[..., 1:][:, :, None].expand(-1, -1, ring_rows, -1, -1)
    states = ssm[layers][:, state].float()
    index = torch.arange(ring.shape[0], device=ring.device)
    commit(states, windows, tokens, history, token_gates, *weights, index, index, pending - 1, None, **heads)
    return states, windows


def _folds(pending, capacity, depth):
    """[B'] bool: the rows a verify folds, pending > 0 and pending + T > capacity (T: the most tokens
    a step accepts, tree_depth or N)."""
    return (pending > 0) & (pending + depth > capacity)


def _state_before_drafts(ssm, conv, rows_buffer, gates, layer, live, num_nodes, tree_depth, commit, weights, heads):
    """[B', *state] float32: each live row's checkpoint after its pending tokens; written back to the
    checkpoint (both states) for the rows that fold (_folds)."""
    _, ring, state, start, pending = live
    capacity = rows_buffer.shape[2] - num_nodes
    states, windows = _replay_pending(ssm, conv, rows_buffer, gates, slice(layer, layer + 1), ring, state, start,
                                      pending, commit, weights, heads)
    folds = _folds(pending, capacity, tree_depth or num_nodes).nonzero().squeeze(1)
    if folds.numel():
        ssm[layer, state[folds]] = states[0, folds].to(ssm.dtype)
        conv[layer, state[folds]] = windows[0, folds]
    return states[0]


def gdn_ring_verify_cpu(out, q, k, v, g, beta, ssm, conv, rows_buffer, gates, cursor, weight, bias, ring_slots,
                        state_slots, layer, parents, *, scale, use_qk_l2norm, tree_depth=None, fold_tiles=1):
    """ssm [L, S, Hv, dk, dv], conv [L, S, dim, K-1] (any strides); see ops_ring.gdn_ring_verify
    (fold_tiles, its after_due_flush, shapes the CUDA launches only)."""
    num_rows, num_nodes, num_k_heads, head_k_dim = q.shape
    num_v_heads, head_v_dim = v.shape[2], v.shape[3]
    ring_rows = rows_buffer.shape[2]
    live = _live_rows(ring_slots, cursor, rows_buffer.shape[1], ring_rows, ring_rows - num_nodes, state_slots,
                      ssm.shape[1])
    if live is None:
        return
    rows, ring, _, start, pending = live
    heads = dict(num_k_heads=num_k_heads, head_k_dim=head_k_dim, num_v_heads=num_v_heads, head_v_dim=head_v_dim,
                 use_qk_l2norm=use_qk_l2norm)
    weights = (weight[None], None if bias is None else bias[None])
    states = _state_before_drafts(ssm, conv, rows_buffer, gates, layer, live, num_nodes, tree_depth,
                                  cpu.gdn_commit_cpu, weights, heads)
    cpu.gdn_verify_cpu(out, q, k, v, g, beta, states, _row_map(num_rows, rows), parents, scale=scale,
                       use_qk_l2norm=use_qk_l2norm)
    drafts = _positions(start, pending, num_nodes, ring_rows)
    gates[layer, ring[:, None], drafts, 0] = g[rows].to(gates.dtype)
    gates[layer, ring[:, None], drafts, 1] = beta[rows].to(gates.dtype)


def ring_accept_cpu(cursor, rows_buffer, gates, ring_slots, steps, parents, *, num_draft, tree_depth=None):
    """cursor [M, 2]; rows_buffer [L, M, C, dim], gates [L, M, C, G, H] (trees: the accepted path moved)."""
    ring_rows = rows_buffer.shape[2]
    capacity = ring_rows - num_draft
    live = _live_rows(ring_slots, cursor, rows_buffer.shape[1], ring_rows, capacity)
    if live is None:
        return
    rows, ring, _, start, pending = live
    folded = _folds(pending, capacity, tree_depth or num_draft)  # the pending tokens are in the checkpoint
    start = torch.where(folded, (start + pending) % ring_rows, start)
    pending = torch.where(folded, 0, pending)
    step = steps.long()[rows]
    paths, lengths, links_ok = cpu._accepted_paths(step, None if parents is None else parents[rows], num_draft)
    lengths = torch.where((step >= 0) & (step < num_draft) & links_ok, lengths, 0)
    if parents is not None:  # the accepted path's rows and gates, made contiguous after the pending ones
        row, j = (torch.arange(num_draft, device=rows.device) < lengths[:, None]).nonzero(as_tuple=True)
        source = (start[row] + pending[row] + paths[row, j]) % ring_rows
        target = (start[row] + pending[row] + j) % ring_rows
        rows_buffer[:, ring[row], target] = rows_buffer[:, ring[row], source]  # (the right side is a copy)
        gates[:, ring[row], target] = gates[:, ring[row], source]
    cursor[ring] = torch.stack([start, pending + lengths], dim=1).to(cursor.dtype)


def _flush(ssm, conv, cursor, rows_buffer, gates, ring_slots, state_slots, commit, weights, heads, num_draft,
           tree_depth):
    """Every layer of every live row with pending tokens (with num_draft: those the next verify of
    num_draft drafts, at tree_depth, would fold): its pending tokens folded into the checkpoint, the
    cursor past them."""
    ring_rows = rows_buffer.shape[2]
    max_pending = ring_rows - 1 if num_draft is None else ring_rows - num_draft
    live = _live_rows(ring_slots, cursor, rows_buffer.shape[1], ring_rows, max_pending, state_slots, ssm.shape[1])
    if live is None:
        return
    _, ring, state, start, pending = live
    folds = (pending > 0 if num_draft is None else _folds(pending, max_pending, tree_depth or num_draft))
    folds = folds.nonzero().squeeze(1)
    if folds.numel() == 0:
        return
    # a layer at a time over every live row, as a verify replays them: the same shapes, so the same
    # bits as the verify's folds (torch's CPU silu rounds a tensor's vectorised body and its tail apart)
    for layer in range(ssm.shape[0]):
        layer_weights = tuple(None if w is None else w[layer:layer + 1] for w in weights)
        states, windows = _replay_pending(ssm, conv, rows_buffer, gates, slice(layer, layer + 1), ring, state, start,
                                          pending, commit, layer_weights, heads)
        ssm[layer, state[folds]] = states[0, folds].to(ssm.dtype)
        conv[layer, state[folds]] = windows[0, folds]
    ring, start, pending = ring[folds], start[folds], pending[folds]
    cursor[ring] = torch.stack([(start + pending) % ring_rows, torch.zeros_like(pending)], dim=1).to(cursor.dtype)


def gdn_ring_flush_cpu(ssm, conv, cursor, rows_buffer, gates, weight, bias, ring_slots, state_slots, *,
                       num_k_heads, head_k_dim, num_v_heads, head_v_dim, use_qk_l2norm, num_draft=None,
                       tree_depth=None):
    """ssm [L, S, Hv, dk, dv], conv [L, S, dim, K-1] (any strides), every layer, in place."""
    heads = dict(num_k_heads=num_k_heads, head_k_dim=head_k_dim, num_v_heads=num_v_heads, head_v_dim=head_v_dim,
                 use_qk_l2norm=use_qk_l2norm)
    _flush(ssm, conv, cursor, rows_buffer, gates, ring_slots, state_slots, cpu.gdn_commit_cpu, (weight, bias), heads,
           num_draft, tree_depth)


# ---------------------------------------------------------------------------------------------
# Mamba2: the same ring, dt per head in the gates, mamba2_commit's replay and mamba2_verify's outputs
# ---------------------------------------------------------------------------------------------


def mamba2_ring_verify_cpu(out, x, dt, A, B, C, ssm, conv, rows_buffer, gates, cursor, weight, bias, ring_slots,
                           state_slots, layer, parents, D, z, dt_bias, *, dt_softplus, tree_depth=None,
                           fold_tiles=1):
    """ssm [L, S, H, P, Ns], conv [L, S, dim, K-1] (any strides); see ops_ring_mamba2.mamba2_ring_verify
    (fold_tiles, its after_due_flush, shapes the CUDA launches only)."""
    num_rows, num_nodes, num_heads, head_dim = x.shape
    ring_rows = rows_buffer.shape[2]
    live = _live_rows(ring_slots, cursor, rows_buffer.shape[1], ring_rows, ring_rows - num_nodes, state_slots,
                      ssm.shape[1])
    if live is None:
        return
    rows, ring, _, start, pending = live
    heads = dict(num_heads=num_heads, head_dim=head_dim, n_groups=B.shape[2], d_state=B.shape[3])
    weights = (weight[None], None if bias is None else bias[None], A[None])
    states = _state_before_drafts(ssm, conv, rows_buffer, gates, layer, live, num_nodes, tree_depth,
                                  cpu.mamba2_commit_cpu, weights, heads)
    step = dt.float()  # [B, N, H]: the dt each draft decodes with and the ring keeps, computed once
    if dt_bias is not None:
        step = step + dt_bias.float()
    if dt_softplus:
        step = torch.nn.functional.softplus(step)
    cpu.mamba2_verify_cpu(out, x, step, A, B, C, states, _row_map(num_rows, rows), parents, D, z, None,
                          dt_softplus=False)
    gates[layer, ring[:, None], _positions(start, pending, num_nodes, ring_rows), 0] = step[rows].to(gates.dtype)


def mamba2_ring_flush_cpu(ssm, conv, cursor, rows_buffer, gates, weight, bias, A, ring_slots, state_slots, *,
                          num_heads, head_dim, n_groups, d_state, num_draft=None, tree_depth=None):
    """ssm [L, S, H, P, Ns], conv [L, S, dim, K-1] (any strides), every layer, in place; A [L, H]."""
    heads = dict(num_heads=num_heads, head_dim=head_dim, n_groups=n_groups, d_state=d_state)
    _flush(ssm, conv, cursor, rows_buffer, gates, ring_slots, state_slots, cpu.mamba2_commit_cpu, (weight, bias, A),
           heads, num_draft, tree_depth)
