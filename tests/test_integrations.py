"""sgl_convwin.integrations: each engine's tensors, recreated as its public code builds them, go
through the adapters into the package's ops and must leave exactly the state the package's own
convention gives (bit for bit over the whole state tensors).

Engine code the recreations follow (read for facts; no engine code is copied or imported):
- sgl-kernel/csrc/speculative/eagle_utils.cu, build_tree_efficient and VerifyTreeGreedy (SGLang);
- python/sglang/kernels/ops/mamba/causal_conv1d_triton.py, _causal_conv1d_update_kernel (SGLang's
  derivation of retrieve_parent_token, root entry 0);
- python/sglang/srt/speculative/eagle_worker.py, _mamba_verify_update (accepted_length, accepted_steps);
- python/sglang/srt/layers/attention/hybrid_linear_attn_backend.py, _replay_metadata and
  update_mamba_state_after_mtp_verify (mamba_cache_indices, -1 padding, batch row as source);
- python/sglang/srt/mem_cache/memory_pool.py, MambaPool.SpeculativeState, and
  model_runner_kv_cache_mixin.py, handle_max_mamba_cache (SGLang's pool sizing);
- vllm/v1/attention/backends/gdn_attn.py, GDNAttentionMetadataBuilder.build (spec_state_indices_tensor,
  spec_query_start_loc, num_accepted_tokens, PAD_SLOT_ID padding under full CUDA graphs);
- vllm/v1/worker/gpu_model_runner.py, _update_states_after_model_execute (num_accepted_tokens);
- sglang's causal_conv1d_update kernel (vLLM's, adapted) with IS_SPEC_DECODING, and vLLM's
  mamba_utils.py gated_delta_net_state_shape (the conv state widened to K-1+num_spec columns).
"""

from __future__ import annotations

import pytest
import torch

import sgl_convwin
from sgl_convwin import integrations
from sgl_convwin import reference
from sgl_convwin.integrations import (
    NULL_BLOCK_ID,
    PAD_SLOT_ID,
    GatedDeltaNet,
    bytes_per_slot,
    sglang_accepted_steps,
    sglang_commit_args,
    sglang_parents,
    vllm_commit_args,
    vllm_pad_batch,
    vllm_token_counts,
    vllm_unpad_batch,
    vllm_verify_slots,
)
from support import DEVICES, make_replay, random_tree

K = 4  # conv kernel width in every test below, as in every model the package targets
VLLM = dict(mamba_cache_mode="none")  # vLLM without prefix caching: the one mode the adapters take


# ---------------------------------------------------------------------------------------------
# SGLang's tensors, recreated
# ---------------------------------------------------------------------------------------------


def sglang_build_tree(tree_parents: list[list[int]], num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """retrive_next_token / retrive_next_sibling [B, N] int64 as build_tree_efficient fills them:
    -1 everywhere, then for i = N-1 down to 1 node i is prepended to its parent's child list (the
    parent's next_token becomes i, i's next_sibling the former first child)."""
    batch = len(tree_parents)
    next_token = torch.full((batch, num_nodes), -1, dtype=torch.int64)
    next_sibling = torch.full((batch, num_nodes), -1, dtype=torch.int64)
    for b, parents in enumerate(tree_parents):
        for i in range(num_nodes - 1, 0, -1):
            parent = parents[i]
            if next_token[b, parent] != -1:
                next_sibling[b, i] = next_token[b, parent]
            next_token[b, parent] = i
    return next_token, next_sibling


def sglang_parent_token(next_token: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    """retrieve_parent_token as SGLang's verify conv kernel derives it: zeros, then in token order
    the first child of token t gets parent t and the next sibling of t gets t's parent. The root
    keeps 0 -- harmless there (its walk stops at token 0), a bad parent link for the package."""
    parents = torch.zeros_like(next_token)
    for b in range(next_token.shape[0]):
        for t in range(next_token.shape[1]):
            child, sibling = int(next_token[b, t]), int(next_sibling[b, t])
            if child != -1:
                parents[b, child] = t
            if sibling != -1:
                parents[b, sibling] = parents[b, t]
    return parents


def sglang_verify_tree_greedy(next_token, next_sibling, candidates, target_predict, num_steps):
    """accept_index [B, num_steps] (flat indices b*N + node, -1 after the path) and
    num_correct_drafts [B] (accepted drafts, the bonus not counted) as VerifyTreeGreedy fills them."""
    batch, num_nodes = candidates.shape
    accept_index = torch.full((batch, num_steps), -1, dtype=torch.int32)
    num_correct_drafts = torch.zeros(batch, dtype=torch.int32)
    for b in range(batch):
        last = b * num_nodes
        accept_index[b, 0] = last
        accepted, current = 0, 0
        for _ in range(1, num_steps):
            current = int(next_token[b, current])
            while current != -1:
                if int(candidates[b, current]) == int(target_predict[last]):
                    accepted += 1
                    last = b * num_nodes + current
                    accept_index[b, accepted] = last
                    break
                current = int(next_sibling[b, current])
            if current == -1:
                break
        num_correct_drafts[b] = accepted
    return accept_index, num_correct_drafts


def sglang_commit_step_indices(accept_index, accept_lens, draft_token_num) -> torch.Tensor:
    """last_correct_step_indices as spec_utils._verify_commit_step_indices computes them (chains and
    trees): accept_index[b, accept_lens[b] - 1] - b * draft_token_num, accept_lens counting the bonus."""
    offsets = torch.arange(accept_lens.shape[0], dtype=accept_lens.dtype) * draft_token_num
    rows = torch.arange(accept_lens.shape[0])
    return accept_index[rows, (accept_lens - 1).long()] - offsets


def sglang_chain_accept_index(accept_lens, draft_token_num) -> torch.Tensor:
    """accept_index [B, N] of a chain as verify_tree_greedy fills it: b*N, b*N+1, ... for the
    accepted tokens (the verified root first), -1 after them."""
    batch = accept_lens.shape[0]
    columns = torch.arange(draft_token_num)
    flat = torch.arange(batch)[:, None] * draft_token_num + columns
    return torch.where(columns < accept_lens[:, None], flat, -1).to(torch.int32)


def sglang_mamba_cache_indices(pool_slots: list[int], padded_batch: int) -> torch.Tensor:
    """forward_metadata.mamba_cache_indices of a cuda-graph batch: the static per-bs buffer full of
    PAD_SLOT_ID (-1) with the real requests' pool slots first, int32 (_replay_metadata)."""
    indices = torch.full((padded_batch,), PAD_SLOT_ID, dtype=torch.int32)
    indices[: len(pool_slots)] = torch.tensor(pool_slots, dtype=torch.int32)
    return indices


def depth(parents: list[int], node: int) -> int:
    hops = 0
    while parents[node] != -1:
        node, hops = parents[node], hops + 1
    return hops


def path_to(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] != -1:
        path.append(parents[path[-1]])
    return path[::-1]


def greedy_inputs_accepting(tree_parents, accepted_nodes, num_nodes):
    """candidates / target_predict under which VerifyTreeGreedy accepts root -> accepted_nodes[b]:
    token id = 100 + node; the target at each path node predicts the next path node's token, at
    the last one a token no node carries."""
    batch = len(tree_parents)
    candidates = (100 + torch.arange(num_nodes)).repeat(batch, 1)
    target_predict = torch.full((batch * num_nodes,), 7, dtype=torch.int64)
    for b, (parents, node) in enumerate(zip(tree_parents, accepted_nodes)):
        path = path_to(parents, node)
        for here, there in zip(path, path[1:]):
            target_predict[b * num_nodes + here] = 100 + there
    return candidates, target_predict


def rows_of(buffer: torch.Tensor, layout: str) -> torch.Tensor:
    return buffer.transpose(-1, -2) if layout == "channel_major" else buffer


# ---------------------------------------------------------------------------------------------
# SGLang: tree links, the root-0 trap, acceptance, padding
# ---------------------------------------------------------------------------------------------


def test_sglang_parents_from_links_and_from_retrieve_parent_token():
    gen = torch.Generator().manual_seed(1)
    num_nodes = 8
    trees = [random_tree(num_nodes, gen) for _ in range(50)]
    trees += [list(range(-1, num_nodes - 1)), [-1] + [0] * (num_nodes - 1)]  # a chain and a star
    next_token, next_sibling = sglang_build_tree(trees, num_nodes)
    truth = torch.tensor(trees)
    assert torch.equal(sglang_parents(retrieve_next_token=next_token, retrieve_next_sibling=next_sibling), truth)
    derived = sglang_parent_token(next_token, next_sibling)
    assert torch.equal(derived[:, 0], torch.zeros(len(trees), dtype=torch.int64))  # SGLang's root entry
    assert torch.equal(sglang_parents(derived), truth)
    # int32 links (SGLang's cuda-graph buffers) and a padded row of zeros (no links: a star, as SGLang reads it)
    padded = torch.cat([next_token[:2], torch.zeros(1, num_nodes, dtype=torch.int64)]).to(torch.int32)
    padded_sib = torch.cat([next_sibling[:2], torch.zeros(1, num_nodes, dtype=torch.int64)]).to(torch.int32)
    parents = sglang_parents(retrieve_next_token=padded, retrieve_next_sibling=padded_sib)
    assert parents.dtype == torch.int32
    assert parents.tolist() == trees[:2] + [[-1] + [0] * (num_nodes - 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["token_major", "channel_major"])
def test_sglang_tree_commit_root_trap(layout, device):
    """update_mamba_state_after_mtp_verify's tensors through sglang_commit_args into scatter_tree
    equal the package's convention; SGLang's retrieve_parent_token passed raw leaves every request
    whose accepted node is within K-2 hops of the root stale."""
    gen = torch.Generator().manual_seed(2)
    layers, dim, num_nodes, padded_batch, pool = 2, 8, 6, 5, 9
    trees = [[-1, 0, 1, 2, 3, 4], [-1, 0, 0, 1, 1, 2], [-1, 0, 0, 1, 2, 3], [-1, 0, 1, 1, 3, 3]]
    accepted_nodes = [0, 2, 4, 5]  # depths 0, 1, 2, 3: partial acceptance, and both sides of K-2 = 2
    pool_slots = [7, 2, 5, 0]
    batch = len(trees)
    next_token, next_sibling = sglang_build_tree(trees, num_nodes)
    candidates, target_predict = greedy_inputs_accepting(trees, accepted_nodes, num_nodes)
    accept_index, num_correct_drafts = sglang_verify_tree_greedy(next_token, next_sibling, candidates,
                                                                 target_predict, num_steps=num_nodes)
    accept_lens = num_correct_drafts + 1  # the commit site's count: the bonus token included
    accepted_steps = sglang_commit_step_indices(accept_index, accept_lens, num_nodes)
    assert accepted_steps.tolist() == accepted_nodes
    assert torch.equal(sglang_accepted_steps(accept_index, accept_lens=accept_lens), accepted_steps)
    assert torch.equal(sglang_accepted_steps(accept_index, num_correct_drafts=num_correct_drafts), accepted_steps)
    mamba_cache_indices = sglang_mamba_cache_indices(pool_slots, padded_batch).to(device)

    # the verify pass as the docs' SGLang section runs it: buffer slot = batch row (SGLang's
    # speculative buffers), state slot = mamba_cache_indices (padded row skipped), parents from links
    conv_state = torch.randn(layers, pool, dim, K - 1, generator=gen).to(device)
    spec_cache = sgl_convwin.ConvWindowCache(layers, padded_batch, dim, num_nodes, K, layout=layout,
                                             dtype=torch.float32, device=device, gate_heads=3)
    links_pad = torch.cat([next_token, torch.zeros(1, num_nodes, dtype=torch.int64)]).to(device)  # graph buffers:
    sib_pad = torch.cat([next_sibling, torch.zeros(1, num_nodes, dtype=torch.int64)]).to(device)  # zeros when padded
    parents = sglang_parents(retrieve_next_token=links_pad, retrieve_next_sibling=sib_pad)
    rows = torch.arange(padded_batch, device=device)
    for layer in range(layers):
        x = torch.randn(padded_batch, num_nodes, dim, generator=gen).to(device)
        out = torch.zeros_like(x)
        weight = torch.randn(dim, K, generator=gen).to(device)
        spec_cache.causal_conv1d_verify(out, conv_state, x, weight, None, rows, layer,
                                        state_slots=mamba_cache_indices, parents=parents, activation="silu")
        assert torch.equal(out[-1], torch.zeros_like(out[-1]))  # the padded row wrote nothing
        g, beta = torch.randn(2, padded_batch * num_nodes, 3, generator=gen).to(device)  # SGLang's [tokens, Hv]
        spec_cache.capture_gates(g.view(padded_batch, num_nodes, -1), beta.view(padded_batch, num_nodes, -1),
                                 rows, layer)
        assert torch.equal(spec_cache.gates[layer, :, :, 0], g.view(padded_batch, num_nodes, -1))
    buffer = spec_cache.buffer

    def commit(dst, src, steps, parents):
        state = conv_state.clone()
        sgl_convwin.scatter_tree(state, rows_of(buffer, layout), dst, src, steps, parents)
        return state

    # the package's convention, from the test's own truth
    truth_parents = torch.tensor(trees + [[-1] * num_nodes], device=device)
    truth_steps = torch.tensor(accepted_nodes + [-1], device=device)
    truth_dst = torch.tensor(pool_slots + [-1], device=device)
    expected = commit(truth_dst, rows, truth_steps, truth_parents)

    args = sglang_commit_args(mamba_cache_indices[:batch], accepted_steps.to(device),
                              retrieve_next_token=next_token.to(device), retrieve_next_sibling=next_sibling.to(device))
    assert set(args) == {"dst_slots", "src_slots", "steps", "parents"}
    assert torch.equal(commit(args["dst_slots"], args["src_slots"], args["steps"], args["parents"]), expected)
    state = conv_state.clone()  # the docs' conv-only commit through the cache
    spec_cache.commit(state, args["src_slots"], args["steps"], state_slots=args["dst_slots"], parents=args["parents"])
    assert torch.equal(state, expected)
    # the padded cuda-graph row: SGLang's buffers hold zeros there; the adapter keeps it skipped
    steps_pad = torch.cat([accepted_steps, torch.tensor([0])]).to(device)
    args = sglang_commit_args(mamba_cache_indices, steps_pad, retrieve_next_token=links_pad,
                              retrieve_next_sibling=sib_pad)
    assert args["steps"][-1] == -1
    assert torch.equal(commit(args["dst_slots"], args["src_slots"], args["steps"], args["parents"]), expected)
    # the trap: the kernel's retrieve_parent_token as parents
    raw_parents = sglang_parent_token(next_token, next_sibling).to(device)
    raw = commit(truth_dst[:batch], rows[:batch], truth_steps[:batch], raw_parents)
    for b, (parents, node) in enumerate(zip(trees, accepted_nodes)):
        slot = pool_slots[b]
        if depth(parents, node) < K - 2:  # skipped: the request's conv state silently stays stale
            assert torch.equal(raw[:, slot], conv_state[:, slot]) and not torch.equal(raw[:, slot], expected[:, slot])
        else:
            assert torch.equal(raw[:, slot], expected[:, slot])
    # and the adapter fixes the raw tensor too
    fixed = sglang_commit_args(mamba_cache_indices[:batch], accepted_steps.to(device), retrieve_parent_token=raw_parents)
    assert torch.equal(commit(fixed["dst_slots"], fixed["src_slots"], fixed["steps"], fixed["parents"]), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["token_major", "channel_major", "dense"])
def test_sglang_chain_commit_partial_acceptance_and_padding(layout, device):
    """Chains (topk 1), every step 0..N-1 and a padded row: the commit site's accept_lens (bonus
    counted) with or without accept_index, num_correct_drafts, and SGLang's own
    last_correct_step_indices (spec_utils._verify_commit_step_indices) all give the package's steps."""
    gen = torch.Generator().manual_seed(3)
    layers, dim, num_draft, pool = 2, 8, 4, 8
    pool_slots = [3, 6, 0, 1]
    num_correct_drafts = torch.tensor([0, 1, 2, 3], dtype=torch.int32)  # accepted drafts, bonus not counted
    accept_lens = num_correct_drafts + 1
    accept_index = sglang_chain_accept_index(accept_lens, num_draft)
    mamba_cache_indices = sglang_mamba_cache_indices(pool_slots, 6).to(device)
    conv_state = torch.randn(layers, pool, dim, K - 1, generator=gen).to(device)
    buffer = sgl_convwin.alloc_windows(layers, 6, dim, num_draft, K, layout=layout, dtype=torch.float32, device=device)
    rows = torch.arange(6, device=device)
    for layer in range(layers):
        x = torch.randn(6, num_draft, dim, generator=gen).to(device)
        sgl_convwin.capture(buffer, conv_state, x, rows, mamba_cache_indices, layer, layout=layout)
    windows = sgl_convwin.window_view(buffer, layout, num_draft, K)

    expected = conv_state.clone()
    sgl_convwin.scatter(expected, windows, torch.tensor(pool_slots, device=device), rows[:4],
                        num_correct_drafts.to(device))
    last_correct = sglang_commit_step_indices(accept_index, accept_lens, num_draft).to(device)
    accept_lens, accept_index = accept_lens.to(device), accept_index.to(device)
    for args in (sglang_commit_args(mamba_cache_indices, accept_lens=accept_lens),
                 sglang_commit_args(mamba_cache_indices, accept_lens=accept_lens, accept_index=accept_index),
                 sglang_commit_args(mamba_cache_indices, num_correct_drafts=num_correct_drafts.to(device)),
                 sglang_commit_args(mamba_cache_indices, last_correct)):
        assert "parents" not in args and torch.equal(args["dst_slots"], mamba_cache_indices[:4])
        state = conv_state.clone()
        sgl_convwin.scatter(state, windows, **args)
        assert torch.equal(state, expected)
    # the whole padded batch: the padding rows' steps become -1 and nothing else is written
    args = sglang_commit_args(mamba_cache_indices, torch.cat([last_correct, last_correct.new_zeros(2)]))
    assert args["steps"][4:].tolist() == [-1, -1]
    state = conv_state.clone()
    sgl_convwin.scatter(state, windows, **args)
    assert torch.equal(state, expected)


def test_sglang_accepted_steps_is_sglangs_own_test_case():
    """SGLang's test of commit_mamba_states_after_verify (test_mamba_verify_update_called_with_correct_indices):
    accept_lens [3, 1, 5] with its accept_index give last_correct_step_indices [2, 0, 4]. The count
    is a keyword: taken for a count without the bonus, it would skip partially accepted rows."""
    accept_lens = torch.tensor([3, 1, 5], dtype=torch.int32)
    accept_index = torch.tensor([[0, 1, 2, -1, -1], [5, -1, -1, -1, -1], [10, 11, 12, 13, 14]], dtype=torch.int32)
    assert sglang_commit_step_indices(accept_index, accept_lens, 5).tolist() == [2, 0, 4]
    assert sglang_accepted_steps(accept_index, accept_lens=accept_lens).tolist() == [2, 0, 4]
    assert sglang_accepted_steps(accept_index, num_correct_drafts=accept_lens - 1).tolist() == [2, 0, 4]
    assert sglang_accepted_steps(accept_index, num_correct_drafts=accept_lens).tolist() == [-1, -1, -1]
    # out of range counts (idle rows: 0; more than the row holds) are skipped
    assert sglang_accepted_steps(accept_index, accept_lens=torch.tensor([0, 2, 6])).tolist() == [-1, -1, -1]
    with pytest.raises(TypeError):
        sglang_accepted_steps(accept_index, accept_lens)  # a positional count: which one is it?
    args = sglang_commit_args(torch.tensor([4, 9, 2]), accept_lens=accept_lens, accept_index=accept_index)
    assert args["steps"].tolist() == [2, 0, 4]


def batch_row_sources(replay):
    """The replay problem's buffer and gates re-indexed by batch row (SGLang's speculative buffers
    hold request b's tokens at row b): slot src_slots[b] moved to row b."""
    order = replay.src_slots.long()
    return replay.buffer[:, order].contiguous(), replay.gates[:, order].contiguous()


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("layout", ["token_major", "dense"])
def test_sglang_gdn_commit(layout, tree):
    """The replay commit with SGLang's index tensors equals the package's convention bit for bit;
    the raw retrieve_parent_token makes gdn_commit skip every request (each path passes the root)."""
    replay = make_replay(layout=layout, tree=tree, num_rows=4, num_draft=5, seed=4,
                         steps=torch.tensor([4, 0, 2, 3]))
    expected_ssm, expected_conv = replay.ssm_state.clone(), replay.conv_state.clone()
    sgl_convwin.gdn_commit(*replay.args(expected_ssm, expected_conv), **replay.kwargs)
    buffer, gates = batch_row_sources(replay)
    mamba_cache_indices = replay.dst_slots.to(torch.int32)  # the last row is padding (-1)
    links = {}
    if tree:
        links = dict(zip(("retrieve_next_token", "retrieve_next_sibling"),
                         sglang_build_tree(replay.parents.tolist(), replay.parents.shape[1])))
        args = sglang_commit_args(mamba_cache_indices, replay.steps, **links)
    else:
        args = sglang_commit_args(mamba_cache_indices, accept_lens=replay.steps + 1)
    ssm, conv = replay.ssm_state.clone(), replay.conv_state.clone()
    sgl_convwin.gdn_commit(ssm, conv, buffer, gates, replay.conv_weight, **args, **replay.kwargs)
    assert torch.equal(ssm, expected_ssm) and torch.equal(conv, expected_conv)
    if tree:
        raw_args = dict(args, parents=sglang_parent_token(*links.values()))
        ssm, conv = replay.ssm_state.clone(), replay.conv_state.clone()
        sgl_convwin.gdn_commit(ssm, conv, buffer, gates, replay.conv_weight, **raw_args, **replay.kwargs)
        assert torch.equal(ssm, replay.ssm_state) and torch.equal(conv, replay.conv_state)  # all stale
        assert not torch.equal(ssm, expected_ssm)


# ---------------------------------------------------------------------------------------------
# Gated DeltaNet layers as the engines hold them, against the float64 oracle
# ---------------------------------------------------------------------------------------------

HEAD_DIMS = [pytest.param(4, 4, id="dk=dv"), pytest.param(2, 4, id="dk<dv")]
NUM_K_HEADS, NUM_V_HEADS = 1, 2


def gdn_conv_dim(head_k_dim, head_v_dim):
    return 2 * NUM_K_HEADS * head_k_dim + NUM_V_HEADS * head_v_dim


def raw_gates(gen, *shape):
    """A model's raw a, b per token and head, and its A_log, dt_bias per head (GDN's gate inputs)."""
    a, b = torch.randn(2, *shape, NUM_V_HEADS, generator=gen)
    A_log, dt_bias = torch.randn(2, NUM_V_HEADS, generator=gen) * 0.5
    return a, b, A_log, dt_bias


def gates_from_raw(a, b, A_log, dt_bias):
    """g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), as the engines' kernels compute them."""
    return -torch.exp(A_log) * torch.nn.functional.softplus(a + dt_bias), torch.sigmoid(b)


def gdn_oracle(ssm_state, conv_state, tokens, g, beta, conv_weight, conv_bias, dst_slots, steps, parents, *,
               head_k_dim, head_v_dim):
    """The committed states in float64 from the engine's raw data: ssm_state [L, S, Hv, dk, dv]
    and conv_state [L, S, dim, K-1] (the package's orientation, views of the engine's storage),
    tokens [L, B, N, dim] (request b's conv inputs), g, beta [L, B, N, Hv]. A token_major buffer
    and a gates buffer are filled by plain indexing (history: the destination's last K-2
    committed inputs, then the request's tokens) and replayed by reference.gdn_commit_reference."""
    layers, batch, num_tokens, dim = tokens.shape
    buffer = torch.zeros(layers, batch, num_tokens + K - 2, dim, dtype=tokens.dtype)
    gates = torch.zeros(layers, batch, num_tokens, 2, NUM_V_HEADS)
    for layer in range(layers):
        for row in range(batch):
            if dst_slots[row] >= 0:
                buffer[layer, row, : K - 2] = conv_state[layer, dst_slots[row], :, 1:].T
            buffer[layer, row, K - 2:] = tokens[layer, row]
            gates[layer, row, :, 0], gates[layer, row, :, 1] = g[layer, row], beta[layer, row]
    return reference.gdn_commit_reference(
        ssm_state, conv_state, buffer, gates, conv_weight, dst_slots, torch.arange(batch), steps, parents,
        layout="token_major", num_k_heads=NUM_K_HEADS, head_k_dim=head_k_dim, num_v_heads=NUM_V_HEADS,
        head_v_dim=head_v_dim, conv_bias=conv_bias)


def causal_conv_oracle(window, tokens, weight, bias):
    """silu(bias + sum_k weight[:, k] * input k) in float64 of each token over the committed window
    [dim, K-1] then the tokens [T, dim]: the verify conv's outputs [T, dim]."""
    inputs = torch.cat([window.T, tokens]).double()
    outputs = []
    for t in range(tokens.shape[0]):
        y = bias.double() + (weight.double() * inputs[t: t + K].T).sum(1)
        outputs.append(y * torch.sigmoid(y))
    return torch.stack(outputs)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("head_k_dim, head_v_dim", HEAD_DIMS)
def test_sglang_gdn_layer_with_engine_tensors(head_k_dim, head_v_dim, tree):
    """SGLang's pool and batch as its code builds them, through the docs' verify and commit into
    the float64 oracle: MambaPool's temporal [L, size + 1, Hv, dv, dk] (configs/mamba_utils.py,
    Mamba2StateShape.create with head_dim = dv, state_size = dk; fla/fused_sigmoid_gating_recurrent.py
    reads it at o_v * K + o_k) passed as .transpose(-1, -2); conv [L, size + 1, dim, K-1];
    mamba_cache_indices -1 in the padded cuda-graph row (hybrid_linear_attn_backend.py); the
    commit from accept_lens (bonus counted) and accept_index (spec_utils.py,
    commit_mamba_states_after_verify / _verify_commit_step_indices); trees from
    build_tree_efficient's links. Passing temporal untransposed is wrong when dk == dv (no shape error)."""
    gen = torch.Generator().manual_seed(11)
    layers, pool, num_draft, padded_batch = 2, 7, 4, 4
    dim = gdn_conv_dim(head_k_dim, head_v_dim)
    pool_slots = [5, 0, 3]
    batch = len(pool_slots)
    temporal = torch.randn(layers, pool, NUM_V_HEADS, head_v_dim, head_k_dim, generator=gen) * 0.5
    conv = torch.randn(layers, pool, dim, K - 1, generator=gen)
    conv_weight = torch.randn(layers, dim, K, generator=gen) * 0.5
    conv_bias = torch.randn(layers, dim, generator=gen) * 0.1
    before_temporal, before_conv = temporal.clone(), conv.clone()
    mamba_cache_indices = sglang_mamba_cache_indices(pool_slots, padded_batch)
    trees = [[-1, 0, 0, 1], [-1, 0, 1, 1], [-1, 0, 1, 2]] if tree else [[-1, 0, 1, 2]] * batch
    accept_paths = [[0, 1, 3], [0], [0, 1, 2, 3]] if tree else [[0, 1], [0], [0, 1, 2, 3]]  # partial, none, all
    accept_lens = torch.tensor([len(path) for path in accept_paths], dtype=torch.int32)
    accept_index = torch.full((batch, num_draft), -1, dtype=torch.int32)
    for row, path in enumerate(accept_paths):
        accept_index[row, : len(path)] = torch.tensor(path) + row * num_draft
    links = {}
    if tree:
        next_token, next_sibling = sglang_build_tree(trees + [[-1] * num_draft], num_draft)
        links = {"retrieve_next_token": next_token, "retrieve_next_sibling": next_sibling}

    spec_cache = sgl_convwin.ConvWindowCache(layers, padded_batch, dim, num_draft, K, layout="token_major",
                                             dtype=torch.float32, gate_heads=NUM_V_HEADS)
    tokens = torch.randn(layers, padded_batch, num_draft, dim, generator=gen)
    a, b, A_log, dt_bias = raw_gates(gen, layers, padded_batch * num_draft)
    g, beta = gates_from_raw(a, b, A_log, dt_bias)
    parents = sglang_parents(**links) if tree else None
    rows = torch.arange(padded_batch)
    for layer in range(layers):  # the docs' SGLang verify, per layer
        mixed_qkv = tokens[layer].reshape(padded_batch * num_draft, dim)
        x = mixed_qkv.view(padded_batch, num_draft, -1)
        out = torch.empty_like(x)
        spec_cache.causal_conv1d_verify(out, conv, x, conv_weight[layer], conv_bias[layer], rows, layer,
                                        state_slots=mamba_cache_indices, parents=parents, activation="silu")
        spec_cache.capture_gates(g[layer].view(padded_batch, num_draft, -1),
                                 beta[layer].view(padded_batch, num_draft, -1), rows, layer)
    args = sglang_commit_args(mamba_cache_indices, accept_lens=accept_lens, accept_index=accept_index, **links)
    kwargs = dict(layout="token_major", num_k_heads=NUM_K_HEADS, head_k_dim=head_k_dim, num_v_heads=NUM_V_HEADS,
                  head_v_dim=head_v_dim, conv_bias=conv_bias)
    sgl_convwin.gdn_commit(temporal.transpose(-1, -2), conv, spec_cache.buffer, spec_cache.gates, conv_weight,
                           **args, **kwargs)

    truth_parents = torch.tensor(trees) if tree else None
    truth_steps = torch.tensor([path[-1] for path in accept_paths])
    g_rows = g.view(layers, padded_batch, num_draft, -1)[:, :batch]
    beta_rows = beta.view(layers, padded_batch, num_draft, -1)[:, :batch]
    expected_ssm, expected_conv, written = gdn_oracle(
        before_temporal.transpose(-1, -2), before_conv, tokens[:, :batch], g_rows, beta_rows, conv_weight,
        conv_bias, torch.tensor(pool_slots), truth_steps, truth_parents, head_k_dim=head_k_dim,
        head_v_dim=head_v_dim)
    assert written == set(pool_slots)
    torch.testing.assert_close(temporal.transpose(-1, -2).double(), expected_ssm, atol=1e-4, rtol=1e-4)
    assert torch.equal(conv, expected_conv)
    if head_k_dim == head_v_dim:  # the trap: SGLang's temporal as it is, no shape error, wrong state
        wrong = before_temporal.clone()
        sgl_convwin.gdn_commit(wrong, before_conv.clone(), spec_cache.buffer, spec_cache.gates, conv_weight,
                               **args, **kwargs)
        assert not torch.allclose(wrong.transpose(-1, -2).double(), expected_ssm, atol=1e-2)


# ---------------------------------------------------------------------------------------------
# vLLM's tensors, recreated
# ---------------------------------------------------------------------------------------------


def vllm_spec_metadata(block_table, num_spec, query_lens, padded_batch, num_accepted_real):
    """GDNAttentionMetadataBuilder.build for a decode-only spec batch under full CUDA graphs
    (vllm/v1/attention/backends/gdn_attn.py): spec_state_indices_tensor = block_table[:, :num_spec + 1]
    with NULL_BLOCK_ID rows after the real ones, spec_query_start_loc = cumsum of the REAL query
    lengths (num_spec + 1 or fewer when drafts were dropped) repeated at its last value for the
    padded rows, num_accepted_tokens padded with 1; int32 throughout."""
    real = len(query_lens)
    spec_state_indices = torch.full((padded_batch, num_spec + 1), NULL_BLOCK_ID, dtype=torch.int32)
    spec_state_indices[:real] = block_table[:real, : num_spec + 1]
    query_start_loc = torch.zeros(padded_batch + 1, dtype=torch.int32)
    query_start_loc[1: real + 1] = torch.cumsum(torch.tensor(query_lens, dtype=torch.int32), 0)
    query_start_loc[real + 1:] = query_start_loc[real]
    num_accepted_tokens = torch.ones(padded_batch, dtype=torch.int32)
    num_accepted_tokens[:real] = torch.as_tensor(num_accepted_real, dtype=torch.int32)
    return spec_state_indices, query_start_loc, num_accepted_tokens


def vllm_num_accepted_tokens(output_token_ids: torch.Tensor) -> torch.Tensor:
    """_update_states_after_model_execute: the position of the first -1 in each row of the sampled
    tokens [B, num_spec + 1] (rejected positions are -1) -- tokens emitted, bonus included."""
    padded = torch.cat([output_token_ids, torch.full((output_token_ids.shape[0], 1), -1)], dim=1)
    return (padded == -1).int().argmax(dim=1).to(torch.int32)


def vllm_widened_conv_state(committed_window, previous_accepted, x_tokens):
    """The conv state [dim, K-1+num_spec] vLLM's spec-decoding conv update leaves: the state was
    read at offset previous_accepted - 1 (where the committed K-1 inputs sit), and the new state
    is the K-2 newest of them followed by the verify's num_spec + 1 inputs."""
    dim, width = committed_window.shape
    num_tokens = x_tokens.shape[0]
    old = torch.full((dim, width - 1 + num_tokens), float("nan"))  # columns vLLM would hold from earlier steps
    offset = previous_accepted - 1
    old[:, offset: offset + width] = committed_window
    return torch.cat([old[:, offset + 1: offset + width], x_tokens.T], dim=1)


def vllm_conv_state(storage, conv_layout):
    """The [blocks, dim, K-1] view _forward_core takes of a layer's conv state: vLLM stores it
    [blocks, K-1, dim] ("SD", the default of mamba_utils.get_conv_state_layout) and transposes, or
    [blocks, dim, K-1] ("DS")."""
    return storage.transpose(-1, -2) if conv_layout == "SD" else storage


@pytest.mark.parametrize("conv_layout", ["SD", "DS"])
@pytest.mark.parametrize("head_k_dim, head_v_dim", HEAD_DIMS)
def test_vllm_gdn_layer_ragged_batch_with_engine_tensors(head_k_dim, head_v_dim, conv_layout):
    """vLLM's per-layer states and spec metadata as its code builds them, through the docs' verify
    and commit into the float64 oracle: a ragged batch (request 1 verifies 2 tokens of num_spec+1 = 4:
    gdn_attn.py builds spec_query_start_loc from the real query lengths), padded rows with
    NULL_BLOCK_ID = 0 state indices and zero tokens (gdn_attn.py, GDNAttentionMetadataBuilder.build),
    block 0 holding a state that must stay untouched, the recurrent state [blocks, Hv, dv, dk]
    (mamba_utils.py, gated_delta_net_state_shape) passed as .transpose(-1, -2), the conv state in
    both of mamba_utils' layouts, num_accepted_tokens with the bonus counted
    (gpu_model_runner.py, _update_states_after_model_execute)."""
    gen = torch.Generator().manual_seed(12)
    layers, blocks, num_spec, padded_batch = 2, 8, 3, 5
    num_tokens = num_spec + 1
    dim = gdn_conv_dim(head_k_dim, head_v_dim)
    block_table = torch.tensor([[4, 6, 7, 1], [2, 5, 3, 6], [7, 1, 2, 3]], dtype=torch.int32)
    query_lens = [4, 2, 3]
    output_token_ids = torch.tensor([[11, 12, -1, -1], [21, 22, -1, -1], [31, 32, 33, -1]])
    num_accepted = vllm_num_accepted_tokens(output_token_ids)
    assert num_accepted.tolist() == [2, 2, 3]  # request 1 accepted both of its 2 tokens
    spec_state_indices, qsl, num_accepted_tokens = vllm_spec_metadata(block_table, num_spec, query_lens,
                                                                      padded_batch, num_accepted)
    assert spec_state_indices[3:, 0].tolist() == [0, 0] and num_accepted_tokens[3:].tolist() == [1, 1]

    ssm_states = [torch.randn(blocks, NUM_V_HEADS, head_v_dim, head_k_dim, generator=gen) * 0.5
                  for _ in range(layers)]
    conv_shape = (blocks, K - 1, dim) if conv_layout == "SD" else (blocks, dim, K - 1)
    conv_storages = [torch.randn(*conv_shape, generator=gen) for _ in range(layers)]
    conv_weights = torch.randn(layers, dim, K, generator=gen) * 0.5
    conv_biases = torch.randn(layers, dim, generator=gen) * 0.1
    before_ssm = torch.stack([state.transpose(-1, -2) for state in ssm_states])
    before_conv = torch.stack([vllm_conv_state(storage, conv_layout) for storage in conv_storages])
    spec_caches = [sgl_convwin.ConvWindowCache(1, blocks, dim, num_tokens, K, layout="token_major",
                                               dtype=torch.float32, gate_heads=NUM_V_HEADS) for _ in range(layers)]
    total = int(qsl[-1])
    mixed = torch.randn(layers, padded_batch * num_tokens, dim, generator=gen)  # rows past `total`: graph padding
    a, b, A_log, dt_bias = raw_gates(gen, layers, padded_batch * num_tokens)
    g, beta = gates_from_raw(a, b, A_log, dt_bias)
    for layer in range(layers):  # the docs' vLLM verify, per layer
        mixed_qkv_spec = mixed[layer].clone()
        conv_state = vllm_conv_state(conv_storages[layer], conv_layout)
        x = vllm_pad_batch(mixed_qkv_spec, qsl, num_tokens)
        slots = vllm_verify_slots(spec_state_indices, qsl, **VLLM)
        out = torch.empty_like(x)
        spec_caches[layer].causal_conv1d_verify(out, conv_state[None], x, conv_weights[layer], conv_biases[layer],
                                                slots, 0, activation="silu")
        vllm_unpad_batch(mixed_qkv_spec, out, qsl)
        spec_caches[layer].capture_gates(vllm_pad_batch(g[layer], qsl, num_tokens),
                                         vllm_pad_batch(beta[layer], qsl, num_tokens), slots, 0)
        for row, count in enumerate(query_lens):  # each request's outputs over its own tokens
            start = int(qsl[row])
            want = causal_conv_oracle(before_conv[layer, int(block_table[row, 0])], mixed[layer, start: start + count],
                                      conv_weights[layer], conv_biases[layer])
            torch.testing.assert_close(mixed_qkv_spec[start: start + count].double(), want, atol=1e-5, rtol=1e-5)
        assert torch.equal(mixed_qkv_spec[total:], mixed[layer, total:])  # the padded tail is left alone

    args = vllm_commit_args(spec_state_indices, num_accepted_tokens, query_start_loc=qsl, **VLLM)
    assert args["steps"].tolist() == [1, 1, 2, -1, -1] and args["dst_slots"].tolist() == [4, 2, 7, -1, -1]
    assert all(torch.equal(args[key], value) for key, value in
               vllm_commit_args(spec_state_indices, num_accepted_tokens, num_reqs=3, **VLLM).items())
    for layer in range(layers):  # the docs' vLLM commit, one launch pair per layer
        sgl_convwin.gdn_commit(ssm_states[layer].transpose(-1, -2)[None],
                               vllm_conv_state(conv_storages[layer], conv_layout)[None], spec_caches[layer].buffer,
                               spec_caches[layer].gates, conv_weights[layer][None], **args, layout="token_major",
                               num_k_heads=NUM_K_HEADS, head_k_dim=head_k_dim, num_v_heads=NUM_V_HEADS,
                               head_v_dim=head_v_dim, conv_bias=conv_biases[layer][None])

    tokens = torch.stack([vllm_pad_batch(mixed[layer], qsl, num_tokens)[:3] for layer in range(layers)])
    g_rows = torch.stack([vllm_pad_batch(g[layer], qsl, num_tokens)[:3] for layer in range(layers)])
    beta_rows = torch.stack([vllm_pad_batch(beta[layer], qsl, num_tokens)[:3] for layer in range(layers)])
    expected_ssm, expected_conv, written = gdn_oracle(
        before_ssm, before_conv, tokens, g_rows, beta_rows, conv_weights, conv_biases, block_table[:, 0].long(),
        torch.tensor([1, 1, 2]), None, head_k_dim=head_k_dim, head_v_dim=head_v_dim)
    assert written == {4, 2, 7}
    got_ssm = torch.stack([state.transpose(-1, -2) for state in ssm_states])
    torch.testing.assert_close(got_ssm.double(), expected_ssm, atol=1e-4, rtol=1e-4)
    assert torch.equal(torch.stack([vllm_conv_state(s, conv_layout) for s in conv_storages]), expected_conv)
    assert torch.equal(got_ssm[:, NULL_BLOCK_ID], before_ssm[:, NULL_BLOCK_ID])  # the null block is untouched


def test_vllm_padding_is_known_from_tokens_not_slots():
    """NULL_BLOCK_ID rows commit nothing only when vLLM's marks are passed: zero tokens in
    spec_query_start_loc or rows past num_reqs; without either the adapter refuses rather than
    commit several padded rows into block 0. Stale rows (num_accepted_tokens 0) and counts above a
    row's tokens are skipped; align / all cache modes are refused, and the mode must be given."""
    indices = torch.tensor([[3, 1], [5, 2], [0, 0], [0, 0]], dtype=torch.int32)
    qsl = torch.tensor([0, 2, 3, 3, 3], dtype=torch.int32)
    args = vllm_commit_args(indices, torch.tensor([2, 1, 1, 1], dtype=torch.int32), query_start_loc=qsl, **VLLM)
    assert args["steps"].tolist() == [1, 0, -1, -1] and args["dst_slots"].tolist() == [3, 5, -1, -1]
    args = vllm_commit_args(indices, torch.tensor([0, 2, 1, 1]), query_start_loc=qsl, **VLLM)
    assert args["steps"].tolist() == [-1, -1, -1, -1]  # stale row; 2 accepted of 1 verified
    args = vllm_commit_args(indices, torch.tensor([2, 1, 1, 1]), num_reqs=2, **VLLM)
    assert args["steps"].tolist() == [1, 0, -1, -1]
    with pytest.raises(ValueError, match="NULL_BLOCK_ID = 0, a real slot number"):
        vllm_commit_args(indices, torch.tensor([2, 1, 1, 1]), **VLLM)
    for mode in ("align", "all"):
        with pytest.raises(ValueError, match=f"mamba_cache_mode='{mode}' is not supported"):
            vllm_commit_args(indices, torch.tensor([2, 1, 1, 1]), num_reqs=2, mamba_cache_mode=mode)
        with pytest.raises(ValueError, match=f"mamba_cache_mode='{mode}' is not supported"):
            vllm_verify_slots(indices, qsl, mamba_cache_mode=mode)
    with pytest.raises(TypeError, match="mamba_cache_mode"):  # no default: vLLM's own is "align"
        vllm_commit_args(indices, torch.tensor([2, 1, 1, 1]), num_reqs=2)
    with pytest.raises(TypeError, match="mamba_cache_mode"):
        vllm_verify_slots(indices, qsl)
    assert vllm_verify_slots(indices, qsl, **VLLM).tolist() == [3, 5, -1, -1]
    assert vllm_token_counts(qsl).tolist() == [2, 1, 0, 0]


def test_vllm_pad_and_unpad_ragged_rows():
    """vllm_pad_batch puts request b's tokens at row b (its last token repeated after them);
    vllm_unpad_batch writes exactly the requests' rows back and leaves the padded tail."""
    x = torch.arange(7 * 2, dtype=torch.float32).view(7, 2)
    qsl = torch.tensor([0, 3, 4, 6, 6], dtype=torch.int32)
    padded = vllm_pad_batch(x, qsl, 3)
    assert padded.shape == (4, 3, 2)
    assert padded[:, :, 0].tolist() == [[0, 2, 4], [6, 6, 6], [8, 10, 10], [10, 10, 10]]
    dst = torch.full((7, 2), -1.0)
    vllm_unpad_batch(dst, padded * 10, qsl)
    expected = torch.cat([x[:6] * 10, torch.full((1, 2), -1.0)])
    assert torch.equal(dst, expected)
    empty = vllm_pad_batch(torch.zeros(0, 2), torch.zeros(3, dtype=torch.int32), 2)
    assert empty.shape == (2, 2, 2)


@pytest.mark.parametrize("layout", ["channel_major", "token_major"])
def test_vllm_widened_conv_state_is_the_committed_window(layout):
    """vLLM's own bookkeeping (the conv state widened to K-1+num_spec columns, read at offset
    num_accepted_tokens - 1: mamba_utils.py gated_delta_net_state_shape with num_spec, the
    IS_SPEC_DECODING conv update) reaches the window the package commits; the widened state IS the
    channel_major buffer row."""
    gen = torch.Generator().manual_seed(5)
    dim, num_spec, blocks = 8, 3, 10
    num_tokens = num_spec + 1
    block_table = torch.tensor([[4, 8, 9, 1], [2, 5, 6, 7], [9, 3, 1, 6]], dtype=torch.int32)
    spec_state_indices, qsl, _ = vllm_spec_metadata(block_table, num_spec, [4, 4, 4], 5, [2, 1, 4])
    output_token_ids = torch.tensor([[11, -1, -1, -1], [11, 12, 13, -1], [11, 12, 13, 14]])
    num_accepted = torch.ones(5, dtype=torch.int32)
    num_accepted[:3] = vllm_num_accepted_tokens(output_token_ids)
    conv_state = torch.randn(blocks, K - 1, dim, generator=gen).transpose(-1, -2)
    before = conv_state.clone()
    cache = sgl_convwin.ConvWindowCache(1, blocks, dim, num_tokens, K, layout=layout, dtype=torch.float32)
    mixed_qkv_spec = torch.randn(5 * num_tokens, dim, generator=gen)
    x = vllm_pad_batch(mixed_qkv_spec, qsl, num_tokens)
    cache.capture(conv_state[None], x, vllm_verify_slots(spec_state_indices, qsl, **VLLM), 0)
    args = vllm_commit_args(spec_state_indices, num_accepted, query_start_loc=qsl, **VLLM)
    cache.commit(conv_state[None], args["src_slots"], num_accepted=num_accepted, state_slots=args["dst_slots"])
    for row in range(3):
        slot = int(block_table[row, 0])
        widened = vllm_widened_conv_state(before[slot], previous_accepted=2, x_tokens=x[row])
        n = int(num_accepted[row])
        assert torch.equal(widened[:, n - 1: n - 1 + K - 1], conv_state[slot])
        if layout == "channel_major":
            assert torch.equal(widened, cache.buffer[0, slot])
    untouched = [slot for slot in range(blocks) if slot not in (4, 2, 9)]
    assert torch.equal(conv_state[untouched], before[untouched])


def test_cache_takes_engine_counts():
    """ConvWindowCache's commits take num_accepted (SGLang's accept_lens, vLLM's num_accepted_tokens:
    the verified token counted) as well as the ops' step index, and refuse both or neither, and a
    count for a tree."""
    replay = make_replay(num_rows=3, num_draft=4, seed=9, steps=torch.tensor([3, 0, 2]))
    cache = sgl_convwin.ConvWindowCache(2, replay.buffer.shape[1], replay.buffer.shape[-1], 4, K,
                                        layout="token_major", dtype=torch.float32, gate_heads=4)
    cache.buffer.copy_(replay.buffer)
    cache.gates.copy_(replay.gates)
    kwargs = {key: value for key, value in replay.kwargs.items() if key not in ("layout", "state_layout")}
    results = []
    for step_kwargs in ({"accepted": replay.steps}, {"num_accepted": (replay.steps + 1).to(torch.int32)}):
        ssm, conv = replay.ssm_state.clone(), replay.conv_state.clone()
        cache.gdn_commit(ssm, conv, replay.conv_weight, replay.src_slots, state_slots=replay.dst_slots,
                         **step_kwargs, **kwargs)
        results.append((ssm, conv))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    conv = replay.conv_state.clone()
    cache.commit(conv, replay.src_slots, num_accepted=replay.steps + 1, state_slots=replay.dst_slots)
    assert torch.equal(conv, results[0][1])
    with pytest.raises(ValueError, match="exactly one"):
        cache.commit(conv, replay.src_slots, replay.steps, num_accepted=replay.steps + 1)
    with pytest.raises(ValueError, match="exactly one"):
        cache.commit(conv, replay.src_slots)
    with pytest.raises(ValueError, match="for a tree pass accepted"):
        cache.commit(conv, replay.src_slots, num_accepted=replay.steps + 1, parents=torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="num_accepted must be an int32 or int64 tensor"):
        cache.commit(conv, replay.src_slots, num_accepted=(replay.steps + 1).float())


# ---------------------------------------------------------------------------------------------
# Pool sizing
# ---------------------------------------------------------------------------------------------


def test_bytes_per_slot_qwen3_next_and_sglang_pool():
    """Qwen3-Next TP1, D = 4, bf16: the planner's numbers; and SGLang's charge per running request
    (handle_max_mamba_cache: mamba_cache_per_req * speculative_num_draft_tokens) and its
    MambaPool.SpeculativeState per slot are both the snapshot design."""
    mixer = GatedDeltaNet(16, 128, 32, 128)
    layers, dim, draft = 36, 8192, 4
    sizes = bytes_per_slot(layers, dim, draft, K, mixer=mixer)
    assert sizes.total == 3_575_808 and sizes.snapshot == 309_067_776
    assert sizes.gates == layers * draft * 2 * 32 * 4
    conv_state_shape, temporal_state_shape = (dim, K - 1), (32, 128, 128)  # per layer, bf16 / fp32
    mamba_cache_per_req = (dim * (K - 1) * 2 + 32 * 128 * 128 * 4) * layers
    assert mamba_cache_per_req * draft == sizes.snapshot
    intermediate_ssm = torch.empty(layers, 1, draft, *temporal_state_shape, dtype=torch.float32, device="meta")
    intermediate_conv_window = torch.empty(layers, 1, draft, *conv_state_shape, dtype=torch.bfloat16, device="meta")
    assert intermediate_conv_window.nbytes == sizes.dense_conv
    assert intermediate_ssm.nbytes + intermediate_conv_window.nbytes == sizes.snapshot


@pytest.mark.parametrize("layout", ["token_major", "channel_major", "dense"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bytes_per_slot_is_what_the_cache_allocates(layout, dtype):
    mixer = GatedDeltaNet(2, 4, 4, 4)
    sizes = bytes_per_slot(3, mixer.conv_dim, 5, K, dtype=dtype, layout=layout, mixer=mixer, tree=True)
    cache = sgl_convwin.ConvWindowCache(3, 1, mixer.conv_dim, 5, K, layout=layout, dtype=dtype, gate_heads=4)
    assert sizes.total == cache.nbytes and sizes.conv == cache.buffer.nbytes and sizes.gates == cache.gates.nbytes
    conv_only = bytes_per_slot(3, mixer.conv_dim, 5, K, dtype=dtype, layout=layout)
    assert (conv_only.total, conv_only.gates, conv_only.snapshot) == (sizes.conv, 0, None)


def test_vllm_pool_sizing():
    """vLLM's MambaSpec page today (gated_delta_net_state_shape with num_spec: conv state widened to
    K-1+num_spec) against the plain page (num_spec=0) plus the package's slot."""
    mixer = GatedDeltaNet(16, 128, 32, 128)
    layers, dim, num_spec = 36, 8192, 3

    def page(spec):  # bf16 conv + fp32 temporal, per layer, times layers
        return ((K - 1 + spec) * dim * 2 + 32 * 128 * 128 * 4) * layers

    sizes = bytes_per_slot(layers, dim, num_spec + 1, K, mixer=mixer)
    assert page(num_spec) - page(0) == layers * num_spec * dim * 2
    assert sizes.total < (num_spec + 1) * page(num_spec) - page(0)  # vs one spec block per verified token


# ---------------------------------------------------------------------------------------------
# Errors and graph safety
# ---------------------------------------------------------------------------------------------


def test_errors_name_the_argument():
    idx = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="exactly one of last_correct_step_indices, accept_lens, num_correct_drafts"):
        sglang_commit_args(idx)
    with pytest.raises(ValueError, match="exactly one"):
        sglang_commit_args(idx, idx, accept_lens=idx)
    with pytest.raises(ValueError, match="last_correct_step_indices already is one"):
        sglang_commit_args(idx, idx, accept_index=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="mamba_cache_indices must be int32 or int64"):
        sglang_commit_args(idx.float(), idx)
    with pytest.raises(TypeError, match="last_correct_step_indices must be a torch.Tensor"):
        sglang_commit_args(idx, [0, 1])
    with pytest.raises(ValueError, match="mamba_cache_indices has 2 rows, fewer than the 3 of accept_lens"):
        sglang_commit_args(idx, accept_lens=torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="accept_lens counts a tree's accepted tokens but not which node"):
        sglang_commit_args(idx, accept_lens=idx, retrieve_parent_token=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="retrieve_parent_token must be 2-D"):
        sglang_parents(idx)
    with pytest.raises(ValueError, match="needs retrieve_parent_token, or both"):
        sglang_parents(retrieve_next_token=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="retrieve_next_token .* and retrieve_next_sibling .* same shape"):
        sglang_parents(retrieve_next_token=torch.zeros(2, 3, dtype=torch.long),
                       retrieve_next_sibling=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="state_indices has 2 rows but num_accepted_tokens 3"):
        vllm_commit_args(idx, torch.tensor([1, 1, 1]), num_reqs=2, **VLLM)
    with pytest.raises(ValueError, match="state_indices must be 1-D or 2-D"):
        vllm_commit_args(torch.zeros(2, 2, 2, dtype=torch.long), idx, num_reqs=2, **VLLM)
    with pytest.raises(ValueError, match="buffer_slots has 1 rows"):
        vllm_commit_args(idx, idx, num_reqs=2, buffer_slots=torch.tensor([0]), **VLLM)
    with pytest.raises(ValueError, match="num_reqs must be an int in \\[0, 2\\]"):
        vllm_commit_args(idx, idx, num_reqs=3, **VLLM)
    with pytest.raises(ValueError, match="query_start_loc has 2 rows, fewer than the 3"):
        vllm_commit_args(idx, idx, query_start_loc=torch.tensor([0, 4]), **VLLM)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        vllm_pad_batch(None, torch.tensor([0, 4]), 4)
    with pytest.raises(ValueError, match="num_tokens must be an int >= 1"):
        vllm_pad_batch(torch.zeros(8, 3), torch.tensor([0, 4, 8]), 0)
    with pytest.raises(ValueError, match="padded must be \\[B=2, N"):
        vllm_unpad_batch(torch.zeros(8, 3), torch.zeros(3, 4, 3), torch.tensor([0, 4, 8]))
    with pytest.raises(ValueError, match="query_start_loc must have B \\+ 1 >= 1 entries"):
        vllm_token_counts(torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="accept_lens has 1 rows, accept_index 2"):
        sglang_accepted_steps(torch.zeros(2, 3, dtype=torch.int32), accept_lens=torch.tensor([0]))
    with pytest.raises(ValueError, match="exactly one of accept_lens, num_correct_drafts"):
        sglang_accepted_steps(torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="mixer's conv_dim 64 differs from dim 65"):
        bytes_per_slot(2, 65, 4, mixer=GatedDeltaNet(4, 4, 8, 4))
    with pytest.raises(TypeError, match="dtype must be float32, float16 or bfloat16"):
        bytes_per_slot(2, 64, 4, dtype=torch.int8)
    with pytest.raises(TypeError, match="mixer must be a GatedDeltaNet or Mamba2"):
        bytes_per_slot(2, 64, 4, mixer=object())
    with pytest.raises(ValueError, match="layout must be one of"):
        bytes_per_slot(2, 64, 4, layout="rows")


def test_adapters_trace_without_graph_breaks():
    """Every adapter under torch.compile(fullgraph=True): no graph break, no host sync (a .item()
    or a data-dependent shape would break the graph), results equal eager."""
    next_token, next_sibling = sglang_build_tree([[-1, 0, 0, 1, 2], [-1, 0, 1, 2, 3]], 5)
    indices = torch.tensor([3, -1], dtype=torch.int32)
    accept_index = torch.tensor([[0, 1, 3], [5, 6, -1]], dtype=torch.int32)
    accept_lens = torch.tensor([3, 2], dtype=torch.int32)

    def adapters(next_token, next_sibling, indices, accept_index, accept_lens, x, qsl):
        sg = sglang_commit_args(indices, accept_lens=accept_lens, accept_index=accept_index,
                                retrieve_next_token=next_token, retrieve_next_sibling=next_sibling)
        vl = vllm_commit_args(indices, accept_lens, query_start_loc=qsl, **VLLM)
        padded = vllm_pad_batch(x, qsl, 4)
        dst = x.clone()
        vllm_unpad_batch(dst, padded * 2, qsl)
        return (sg["dst_slots"], sg["src_slots"], sg["steps"], sg["parents"], vl["steps"], vl["dst_slots"], dst,
                vllm_verify_slots(indices, qsl, **VLLM), sglang_parents(sg["parents"].clamp(min=0)))

    inputs = (next_token, next_sibling, indices, accept_index, accept_lens, torch.randn(8, 3),
              torch.tensor([0, 3, 3], dtype=torch.int32))
    eager = adapters(*inputs)
    compiled = torch.compile(adapters, fullgraph=True, backend="eager")(*inputs)
    for want, got in zip(eager, compiled):
        assert torch.equal(want, got)
    assert eager[2].tolist() == [3, -1] and eager[4].tolist() == [2, -1] and eager[7].tolist() == [3, -1]


def test_module_is_exported():
    assert sgl_convwin.integrations is integrations
    assert set(integrations.__all__) <= set(dir(integrations))


def test_transformers_layer_states_views_and_errors():
    """transformers' [B, dim, K] conv state seen as the package's K-1 newest columns (a view: a
    write lands in the cache, column 0 untouched); its recurrent state as a one-layer pool.
    The models themselves: tests/test_hf_models.py."""
    conv, rec = torch.zeros(2, 10, K), torch.zeros(2, 4, 3, 5)
    ssm_state, conv_state = integrations.transformers_layer_states(conv, rec)
    assert ssm_state.shape == (1, 2, 4, 3, 5) and conv_state.shape == (1, 2, 10, K - 1)
    conv_state.fill_(1.0)
    assert torch.equal(conv[..., 0], torch.zeros(2, 10)) and torch.equal(conv[..., 1:], torch.ones(2, 10, K - 1))
    with pytest.raises(ValueError, match="conv_states"):
        integrations.transformers_layer_states(torch.zeros(2, 10), rec)
    with pytest.raises(ValueError, match="recurrent_states"):
        integrations.transformers_layer_states(conv, torch.zeros(2, 4, 3))
    with pytest.raises(ValueError, match="rows"):
        integrations.transformers_layer_states(conv, torch.zeros(3, 4, 3, 5))
    with pytest.raises(TypeError):
        integrations.transformers_layer_states(None, rec)
