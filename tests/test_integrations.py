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
from sgl_convwin.integrations import (
    PAD_SLOT_ID,
    GatedDeltaNet,
    bytes_per_slot,
    sglang_accepted_steps,
    sglang_commit_args,
    sglang_parents,
    vllm_commit_args,
    vllm_uniform_view,
)
from support import DEVICES, make_replay, random_tree

K = 4  # conv kernel width in every test below, as in every model the package targets


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
    """accept_index [B, num_steps] (flat indices b*N + node, -1 after the path) and accept_length
    [B] (accepted drafts, the root not counted) as VerifyTreeGreedy computes them."""
    batch, num_nodes = candidates.shape
    accept_index = torch.full((batch, num_steps), -1, dtype=torch.int32)
    accept_length = torch.zeros(batch, dtype=torch.int32)
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
        accept_length[b] = accepted
    return accept_index, accept_length


def sglang_eagle_accepted_steps(accept_index, accept_length, num_nodes, tree: bool) -> torch.Tensor:
    """accepted_steps as the EAGLE worker's _mamba_verify_update computes them: accepted_length =
    accept_length + 1; chains: accepted_length - 1; trees: the flattened accepted indices (the -1
    padding dropped) at cumsum(accepted_length) - 1, minus b * N."""
    accepted_length = accept_length.to(torch.int64) + 1
    if not tree:
        return accepted_length - 1
    accepted_indices = accept_index.flatten()[accept_index.flatten() != -1].to(torch.int64)
    offsets = torch.arange(accept_index.shape[0], dtype=torch.int64) * num_nodes
    return accepted_indices[torch.cumsum(accepted_length, 0) - 1] - offsets


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
    accept_index, accept_length = sglang_verify_tree_greedy(next_token, next_sibling, candidates,
                                                            target_predict, num_steps=num_nodes)
    accepted_steps = sglang_eagle_accepted_steps(accept_index, accept_length, num_nodes, tree=True)
    assert accepted_steps.tolist() == accepted_nodes
    assert torch.equal(sglang_accepted_steps(accept_index, accept_length), accepted_steps)
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
    """Chains (topk 1): the EAGLE worker's accepted_length (+1 for the bonus token) and
    last_correct_step_indices both give the package's steps; every step 0..N-1, a padded row."""
    gen = torch.Generator().manual_seed(3)
    layers, dim, num_draft, pool = 2, 8, 4, 8
    pool_slots = [3, 6, 0, 1]
    accept_length = torch.tensor([0, 1, 2, 3], dtype=torch.int32)  # accepted drafts, bonus not counted
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
                        accept_length.to(device))
    accepted_length = (accept_length.to(torch.int64) + 1).to(device)  # _mamba_verify_update's accepted_length
    last_correct = sglang_eagle_accepted_steps(None, accept_length, num_draft, tree=False).to(device)
    for args in (sglang_commit_args(mamba_cache_indices, accept_lens=accepted_length),
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


def batch_row_sources(replay):
    """The replay problem's buffer and gates re-indexed by batch row (SGLang's speculative buffers
    hold request b's tokens at row b): slot src_slots[b] moved to row b."""
    order = replay.src_slots.long()
    return replay.buffer[:, order].contiguous(), replay.gates[:, order].contiguous()


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("layout", ["token_major", "dense"])
def test_sglang_gdn_commit(layout, tree):
    """The replay commit with SGLang's tensors: both states equal the package's convention; the
    raw retrieve_parent_token makes gdn_commit skip every request (each path passes the root)."""
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
# vLLM's tensors, recreated
# ---------------------------------------------------------------------------------------------


def vllm_spec_metadata(block_table, num_spec, num_spec_decodes, padded_batch, accepted_last_step):
    """GDNAttentionMetadataBuilder.build for a decode-only spec batch under full CUDA graphs:
    spec_state_indices_tensor = block_table[:, :num_spec + 1] with PAD_SLOT_ID rows after the real
    ones, spec_query_start_loc = cumsum of the query lengths (num_spec + 1 each) repeated at its last
    value for the padded rows, num_accepted_tokens padded with 1; int32 throughout."""
    spec_state_indices = torch.full((padded_batch, num_spec + 1), PAD_SLOT_ID, dtype=torch.int32)
    spec_state_indices[:num_spec_decodes] = block_table[:num_spec_decodes, : num_spec + 1]
    query_lens = torch.full((num_spec_decodes,), num_spec + 1, dtype=torch.int32)
    query_start_loc = torch.zeros(padded_batch + 1, dtype=torch.int32)
    query_start_loc[1 : num_spec_decodes + 1] = torch.cumsum(query_lens, 0)
    query_start_loc[num_spec_decodes + 1 :] = query_start_loc[num_spec_decodes]
    num_accepted_tokens = torch.ones(padded_batch, dtype=torch.int32)
    num_accepted_tokens[:num_spec_decodes] = accepted_last_step
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
    old[:, offset : offset + width] = committed_window
    return torch.cat([old[:, offset + 1 : offset + width], x_tokens.T], dim=1)


def vllm_conv_state(layers, blocks, dim, gen, device):
    """Each layer's conv state as vLLM stores it -- its own tensor [num_blocks, K-1, dim] (the
    shape calculator's swapped orientation) -- and the [num_blocks, dim, K-1] view _forward_core
    takes with .transpose(-1, -2)."""
    storages = [torch.randn(blocks, K - 1, dim, generator=gen).to(device) for _ in range(layers)]
    return storages, [storage.transpose(-1, -2) for storage in storages]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["channel_major", "token_major"])
def test_vllm_uniform_view_and_commit(layout, device):
    """vLLM's ragged spec batch through vllm_uniform_view into the verify conv (one 1-layer cache
    per GDN layer, as vLLM keeps one state tensor per layer), the commit with vllm_commit_args
    equals the package's convention, and the committed window is what vLLM's widened conv state
    holds at offset num_accepted_tokens - 1."""
    gen = torch.Generator().manual_seed(5)
    layers, dim, num_spec, real, padded, pool = 2, 8, 3, 3, 5, 10
    num_tokens = num_spec + 1
    block_table = torch.tensor([[4, 8, 9, 1], [2, 5, 6, 7], [0, 3, 1, 9]], dtype=torch.int32)
    spec_state_indices, qsl, _ = vllm_spec_metadata(block_table, num_spec, real, padded, torch.tensor([2, 1, 4]))
    output_token_ids = torch.tensor([[11, -1, -1, -1], [11, 12, 13, -1], [11, 12, 13, 14]])
    num_accepted = torch.ones(padded, dtype=torch.int32)
    num_accepted[:real] = vllm_num_accepted_tokens(output_token_ids)
    assert num_accepted.tolist() == [1, 3, 4, 1, 1]
    spec_state_indices, qsl, num_accepted = spec_state_indices.to(device), qsl.to(device), num_accepted.to(device)

    _, conv_states = vllm_conv_state(layers, pool, dim, gen, device)
    before = [state.clone() for state in conv_states]
    spec_caches = [sgl_convwin.ConvWindowCache(1, pool, dim, num_tokens, K, layout=layout, dtype=torch.float32,
                                               device=device, gate_heads=2) for _ in range(layers)]
    xs = []
    for layer in range(layers):
        mixed_qkv_spec = torch.randn(padded * num_tokens, dim, generator=gen).to(device)  # padded token rows too
        conv_weights = torch.randn(dim, K, generator=gen).to(device)
        xs.append(mixed_qkv_spec.clone())
        x, rows_ok = vllm_uniform_view(mixed_qkv_spec, qsl, num_tokens)
        assert rows_ok.tolist() == [True] * real + [False] * (padded - real)
        assert x.data_ptr() == mixed_qkv_spec.data_ptr()  # a view, no copy
        for b in range(real):
            assert torch.equal(x[b], mixed_qkv_spec[qsl[b] : qsl[b + 1]])
        slots = torch.where(rows_ok, spec_state_indices[:, 0], PAD_SLOT_ID)
        out = torch.empty_like(x)
        spec_caches[layer].causal_conv1d_verify(out, conv_states[layer][None], x, conv_weights, None, slots, 0,
                                                activation="silu")
        mixed_qkv_spec[: out.shape[0] * num_tokens] = out.view(-1, dim)  # the docs' write-back
        g_spec, beta_spec = torch.randn(2, padded * num_tokens, 2, generator=gen).to(device)  # [tokens, Hv]
        spec_caches[layer].capture_gates(vllm_uniform_view(g_spec, qsl, num_tokens)[0],
                                         vllm_uniform_view(beta_spec, qsl, num_tokens)[0], slots, 0)
        for b in range(real):
            slot = int(block_table[b, 0])
            assert torch.equal(spec_caches[layer].gates[0, slot, :, 1], beta_spec[qsl[b] : qsl[b + 1]])

    truth_slots = block_table[:, 0].to(device)
    truth_steps = torch.tensor([0, 2, 3], device=device)
    args = vllm_commit_args(spec_state_indices, num_accepted)
    assert torch.equal(args["dst_slots"], spec_state_indices[:, 0]) and args["steps"][real:].tolist() == [-1, -1]
    for layer in range(layers):
        expected = before[layer][None].clone()
        sgl_convwin.scatter(expected, spec_caches[layer].windows, truth_slots, truth_slots, truth_steps)
        sgl_convwin.scatter(conv_states[layer][None], spec_caches[layer].windows, **args)
        assert torch.equal(conv_states[layer][None], expected)

    for layer in range(layers):  # vLLM's own bookkeeping reaches the same windows
        for b in range(real):
            slot = int(block_table[b, 0])
            tokens = xs[layer][b * num_tokens : (b + 1) * num_tokens].cpu()
            widened = vllm_widened_conv_state(before[layer][slot].cpu(), previous_accepted=2, x_tokens=tokens)
            n = int(num_accepted[b])
            assert torch.equal(widened[:, n - 1 : n - 1 + K - 1], conv_states[layer][slot].cpu())
            if layout == "channel_major":  # the widened state IS the channel_major buffer row
                assert torch.equal(widened, spec_caches[layer].buffer[0, slot].cpu())


@pytest.mark.parametrize("layout", ["token_major", "channel_major"])
def test_vllm_gdn_commit(layout):
    """The replay commit with vLLM's tensors: spec_state_indices_tensor [B, 1 + num_spec] (column 0
    the request's slot, PAD_SLOT_ID rows), num_accepted_tokens with the bonus counted, the states
    stored as vLLM stores them (conv [blocks, K-1, dim], recurrent [blocks, Hv, dv, dk]); all layers
    at once, and one layer at a time on 1-layer views (vLLM's per-layer state tensors)."""
    replay = make_replay(layout=layout, num_rows=4, num_draft=4, seed=6, steps=torch.tensor([3, 0, 1, 2]))
    expected_ssm, expected_conv = replay.ssm_state.clone(), replay.conv_state.clone()
    sgl_convwin.gdn_commit(*replay.args(expected_ssm, expected_conv), **replay.kwargs)
    other_blocks = torch.randint(0, 5, (4, 3), generator=torch.Generator().manual_seed(0))
    spec_state_indices = torch.cat([replay.dst_slots[:, None], other_blocks], dim=1).to(torch.int32)
    spec_state_indices[replay.dst_slots < 0] = PAD_SLOT_ID
    num_accepted = torch.where(replay.dst_slots >= 0, replay.steps + 1, 1).to(torch.int32)
    args = vllm_commit_args(spec_state_indices, num_accepted, buffer_slots=replay.src_slots)

    def vllm_storage(state):  # the last two axes swapped in memory, seen in the package's order
        return state.transpose(-1, -2).contiguous().transpose(-1, -2)

    ssm, conv = vllm_storage(replay.ssm_state), vllm_storage(replay.conv_state)
    sgl_convwin.gdn_commit(ssm, conv, replay.buffer, replay.gates, replay.conv_weight, **args, **replay.kwargs)
    assert torch.equal(ssm, expected_ssm) and torch.equal(conv, expected_conv)

    ssm, conv = vllm_storage(replay.ssm_state), vllm_storage(replay.conv_state)
    kwargs = dict(replay.kwargs)
    conv_bias = kwargs.pop("conv_bias")
    for layer in range(ssm.shape[0]):
        sgl_convwin.gdn_commit(ssm[layer][None], conv[layer][None], replay.buffer[layer][None],
                               replay.gates[layer][None], replay.conv_weight[layer][None], **args,
                               conv_bias=conv_bias[layer][None], **kwargs)
    assert torch.equal(ssm, expected_ssm) and torch.equal(conv, expected_conv)


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
    with pytest.raises(ValueError, match="exactly one of last_correct_step_indices and accept_lens"):
        sglang_commit_args(idx)
    with pytest.raises(ValueError, match="exactly one"):
        sglang_commit_args(idx, idx, accept_lens=idx)
    with pytest.raises(TypeError, match="mamba_cache_indices must be int32 or int64"):
        sglang_commit_args(idx.float(), idx)
    with pytest.raises(TypeError, match="last_correct_step_indices must be a torch.Tensor"):
        sglang_commit_args(idx, [0, 1])
    with pytest.raises(ValueError, match="mamba_cache_indices has 2 rows, fewer than the 3 of accept_lens"):
        sglang_commit_args(idx, accept_lens=torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="accept_lens gives a chain's step"):
        sglang_commit_args(idx, accept_lens=idx, retrieve_parent_token=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="retrieve_parent_token must be 2-D"):
        sglang_parents(idx)
    with pytest.raises(ValueError, match="needs retrieve_parent_token, or both"):
        sglang_parents(retrieve_next_token=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="retrieve_next_token .* and retrieve_next_sibling .* same shape"):
        sglang_parents(retrieve_next_token=torch.zeros(2, 3, dtype=torch.long),
                       retrieve_next_sibling=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="state_indices has 2 rows but num_accepted_tokens 3"):
        vllm_commit_args(idx, torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="state_indices must be 1-D or 2-D"):
        vllm_commit_args(torch.zeros(2, 2, 2, dtype=torch.long), idx)
    with pytest.raises(ValueError, match="buffer_slots has 1 rows"):
        vllm_commit_args(idx, idx, buffer_slots=torch.tensor([0]))
    with pytest.raises(ValueError, match="x has 7 token rows, fewer than B \\* N = 2 \\* 4"):
        vllm_uniform_view(torch.zeros(7, 3), torch.tensor([0, 4, 8]), 4)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        vllm_uniform_view(None, torch.tensor([0, 4]), 4)
    with pytest.raises(ValueError, match="num_tokens must be an int >= 1"):
        vllm_uniform_view(torch.zeros(8, 3), torch.tensor([0, 4, 8]), 0)
    with pytest.raises(ValueError, match="accept_length has 1 rows, accept_index 2"):
        sglang_accepted_steps(torch.zeros(2, 3, dtype=torch.int32), torch.tensor([0]))
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
    accept_length = torch.tensor([2, 1], dtype=torch.int32)

    def adapters(next_token, next_sibling, indices, accept_index, accept_length, x, qsl):
        steps = sglang_accepted_steps(accept_index, accept_length)
        sg = sglang_commit_args(indices, steps, retrieve_next_token=next_token, retrieve_next_sibling=next_sibling)
        vl = vllm_commit_args(indices, accept_length)
        view, rows_ok = vllm_uniform_view(x, qsl, 4)
        return (sg["dst_slots"], sg["src_slots"], sg["steps"], sg["parents"], vl["steps"], view * 2, rows_ok,
                sglang_parents(sg["parents"].clamp(min=0)))

    inputs = (next_token, next_sibling, indices, accept_index, accept_length, torch.randn(8, 3),
              torch.tensor([0, 4, 4], dtype=torch.int32))
    eager = adapters(*inputs)
    compiled = torch.compile(adapters, fullgraph=True, backend="eager")(*inputs)
    for want, got in zip(eager, compiled):
        assert torch.equal(want, got)
    assert eager[2].tolist() == [3, -1] and eager[6].tolist() == [True, False]


def test_module_is_exported():
    assert sgl_convwin.integrations is integrations
    assert set(integrations.__all__) <= set(dir(integrations))
