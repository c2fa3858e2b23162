"""Every ``python`` block of docs/integration.md runs here, against stand-ins of the engines'
pools and metadata with the engines' shapes, and the state it leaves is checked against the
package's float64 oracle -- so the integration guide cannot drift from the adapters.

A block is preceded by ``<!-- snippet: NAME -->`` (run by the test of that name below) or by
``<!-- engine code: not run -->`` (an engine's own code, quoted). An unmarked block, or a snippet
without a test, fails ``test_every_block_is_marked_and_tested``.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import sgl_convwin
from sgl_convwin.integrations import NULL_BLOCK_ID, GatedDeltaNet, bytes_per_slot
from test_integrations import (
    HEAD_DIMS,
    K,
    NUM_K_HEADS,
    NUM_V_HEADS,
    causal_conv_oracle,
    gates_from_raw,
    gdn_conv_dim,
    gdn_oracle,
    raw_gates,
    sglang_build_tree,
    sglang_mamba_cache_indices,
    vllm_spec_metadata,
)

DOC = Path(__file__).resolve().parent.parent / "docs" / "integration.md"
_BLOCK = re.compile(r"^(?P<indent>[ \t]*)```python\n(?P<code>.*?)^(?P=indent)```", re.M | re.S)
_MARK = re.compile(r"<!-- (?:snippet: (?P<name>[\w-]+)|(?P<engine>engine code: not run)) -->\s*$")


def doc_blocks() -> list[tuple[str | None, str]]:
    """(snippet name or None for quoted engine code, dedented code) of every python block, in order;
    ValueError for a block without a marker on the line before it."""
    text = DOC.read_text()
    blocks = []
    for match in _BLOCK.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        mark = _MARK.match(before)
        if mark is None:
            line = text[: match.start()].count("\n") + 1
            raise ValueError(f"docs/integration.md:{line}: a python block without a snippet / engine-code marker")
        blocks.append((mark.group("name"), textwrap.dedent(match.group("code"))))
    return blocks


def snippet(name: str) -> str:
    codes = [code for block_name, code in doc_blocks() if block_name == name]
    assert len(codes) == 1, f"snippet {name!r} appears {len(codes)} times in docs/integration.md"
    return codes[0]


def check_verify_outputs(o, out, g, beta, state, slots, parents, head_k_dim, head_v_dim):
    """gdn_verify's outputs o [B, N, Hv, dv] against the float64 oracle on the snippet's own conv
    outputs out [B, N, dim], the gates the engine's a, b give and the state as the package reads it."""
    q, k, v = out.split([NUM_K_HEADS * head_k_dim, NUM_K_HEADS * head_k_dim, NUM_V_HEADS * head_v_dim], dim=-1)
    expected, written = sgl_convwin.reference.gdn_verify_reference(
        q.unflatten(-1, (NUM_K_HEADS, head_k_dim)), k.unflatten(-1, (NUM_K_HEADS, head_k_dim)),
        v.unflatten(-1, (NUM_V_HEADS, head_v_dim)), g, beta, state, slots, parents)
    assert written == list(range(o.shape[0]))
    torch.testing.assert_close(o.double(), expected, atol=1e-4, rtol=1e-4)


def run(name: str, **names) -> dict:
    namespace = {"torch": torch, "sgl_convwin": sgl_convwin, **names}
    exec(compile(snippet(name), f"docs/integration.md:{name}", "exec"), namespace)
    return namespace


TESTED = {"allocate", "verify", "commit", "pytorch-198068", "ring-allocate", "ring-verify", "ring-due", "ring-accept",
          "ring-flush",
          "sglang-sizing", "sglang-pool", "sglang-verify", "sglang-commit", "vllm-sizing", "vllm-verify", "vllm-commit",
          "transformers-commit"}


def test_every_block_is_marked_and_tested():
    names = [name for name, _ in doc_blocks() if name is not None]
    assert len(names) == len(set(names)), "a snippet name is used twice"
    assert set(names) == TESTED


# ---------------------------------------------------------------------------------------------
# The generic sections
# ---------------------------------------------------------------------------------------------


def generic_problem():
    gen = torch.Generator().manual_seed(21)
    layers, slots, dim, draft = 2, 6, 8, 4
    return SimpleNamespace(
        gen=gen, layers=layers, dim=dim, draft=draft,
        conv_state=torch.randn(layers, slots, dim, K - 1, generator=gen),
        x=[torch.randn(3, draft, dim, generator=gen) for _ in range(layers)],
        weight=[torch.randn(dim, K, generator=gen) * 0.5 for _ in range(layers)],
        bias=[torch.randn(dim, generator=gen) * 0.1 for _ in range(layers)],
        cache_indices=torch.tensor([4, 1, 5]))


def test_allocate():
    conv_state = torch.zeros(2, 5, 8, K - 1)
    ns = run("allocate", server_args=SimpleNamespace(speculative_num_draft_tokens=4), num_conv_layers=2,
             max_running_requests=4, conv_dim=16, tp_size=2, conv_kernel=K, conv_state=conv_state)
    cache = ns["conv_windows"]
    assert cache.buffer.shape == (2, 5, 4 + K - 2, 8) and cache.buffer.dtype == conv_state.dtype
    assert ns["pool_bytes_used"] == sgl_convwin.physical_nbytes("token_major", 2, 5, 8, 4, K, conv_state.dtype)


def verify_all_layers(problem):
    cache = sgl_convwin.ConvWindowCache(problem.layers, 6, problem.dim, problem.draft, K, dtype=torch.float32)
    outs = []
    for layer in range(problem.layers):
        ns = run("verify", conv_windows=cache, conv_state=problem.conv_state, x=problem.x[layer],
                 conv_weight=problem.weight[layer], conv_bias=problem.bias[layer],
                 cache_indices=problem.cache_indices, layer_id=layer, tree_parents=None)
        outs.append(ns["out"])
    return cache, outs


def test_verify():
    problem = generic_problem()
    before = problem.conv_state.clone()
    _, outs = verify_all_layers(problem)
    assert torch.equal(problem.conv_state, before)  # verify reads the committed state, never writes it
    for layer, out in enumerate(outs):
        for row, slot in enumerate(problem.cache_indices.tolist()):
            want = causal_conv_oracle(before[layer, slot], problem.x[layer][row], problem.weight[layer],
                                      problem.bias[layer])
            torch.testing.assert_close(out[row].double(), want, atol=1e-5, rtol=1e-5)


def test_commit():
    problem = generic_problem()
    cache, _ = verify_all_layers(problem)
    before = problem.conv_state.clone()
    accept_lens = torch.tensor([2, 1, 4], dtype=torch.int32)
    run("commit", conv_windows=cache, conv_state=problem.conv_state, cache_indices=problem.cache_indices,
        accept_lens=accept_lens)
    expected = before.clone()
    for layer in range(problem.layers):
        for row, slot in enumerate(problem.cache_indices.tolist()):
            inputs = torch.cat([before[layer, slot].T, problem.x[layer][row, : int(accept_lens[row])]])
            expected[layer, slot] = inputs[-(K - 1):].T  # the last K-1 inputs of the accepted tokens
    assert torch.equal(problem.conv_state, expected)


def test_pytorch_198068():
    """The documented reproduction still reproduces (if torch fixes the bug, the docs must change)."""
    ns = run("pytorch-198068")
    assert not torch.equal(ns["out"], ns["x"])


def test_ring_recipe_matches_the_eager_step():
    """Section 8's ring, step after step (chains, folds every few steps at capacity 4, a padded row),
    against the eager step of sections 2-3 with gdn_verify and gdn_commit on a twin: every step's
    outputs agree, and after ring-flush both states equal the eager ones (the conv window bit for
    bit); a reset slot starts over from what its prefill wrote; every other step begins with ring-due
    (on the others ring-verify's after_due_flush hint is wrong: the results must not care)."""
    gen = torch.Generator().manual_seed(5)
    hk, dk, hv, dv, layers, slots, draft = 2, 4, 4, 8, 2, 5, 3
    dim = GatedDeltaNet(hk, dk, hv, dv).conv_dim
    ns = run("ring-allocate", num_gdn_layers=layers, max_running_requests=slots - 1, conv_dim=dim, tp_size=1,
             num_draft=draft, num_v_heads_per_rank=hv, conv_state=torch.zeros(layers, slots, dim, K - 1))
    assert ns["ring"].rows.shape == (layers, slots, 16 + draft, dim) and ns["ring"].gates.shape[-1] == hv
    assert ns["pool_bytes_used"] == slots * bytes_per_slot(layers, dim, draft, K, dtype=torch.float32,
                                                           mixer=GatedDeltaNet(hk, dk, hv, dv), capacity=16).ring
    ring = sgl_convwin.RingCache(layers, slots, dim, draft, hv, capacity=4, dtype=torch.float32)  # folds often
    conv_weights = torch.randn(layers, dim, K, generator=gen) * 0.5
    conv_biases = torch.randn(layers, dim, generator=gen) * 0.1
    worlds = {name: (torch.randn(layers, slots, hv, dk, dv, generator=torch.Generator().manual_seed(1)) * 0.1,
                     torch.randn(layers, slots, dim, K - 1, generator=torch.Generator().manual_seed(2)))
              for name in ("ring", "eager")}
    eager = sgl_convwin.ConvWindowCache(layers, slots, dim, draft, K, dtype=torch.float32, gate_heads=hv)
    heads = dict(num_k_heads=hk, head_k_dim=dk, num_v_heads=hv, head_v_dim=dv)
    cache_indices = torch.tensor([3, -1, 0])
    first_ssm = worlds["ring"][0].clone()
    for step in range(7):
        x = torch.randn(layers, 3, draft, dim, generator=gen)
        g, beta = -torch.rand(layers, 3, draft, hv, generator=gen), torch.rand(layers, 3, draft, hv, generator=gen)
        accept_lens = torch.randint(1, draft + 1, (3,), generator=gen)
        if step % 2:
            run("ring-due", ring=ring, ssm_state=worlds["ring"][0], conv_state=worlds["ring"][1],
                conv_weights=conv_weights, conv_biases=conv_biases, cache_indices=cache_indices, hk=hk, dk=dk, hv=hv,
                dv=dv)
        for layer in range(layers):
            ssm_state, conv_state = worlds["ring"]
            got = run("ring-verify", ring=ring, conv_state=conv_state, ssm_state=ssm_state, x=x[layer],
                      conv_weight=conv_weights[layer], conv_bias=conv_biases[layer], cache_indices=cache_indices,
                      layer_id=layer, tree_parents=None, hk=hk, dk=dk, hv=hv, dv=dv, g=g[layer], beta=beta[layer])["o"]
            ssm_e, conv_e = worlds["eager"]
            out = torch.empty_like(x[layer])
            eager.causal_conv1d_verify(out, conv_e, x[layer], conv_weights[layer], conv_biases[layer],
                                       cache_indices, layer, activation="silu")
            eager.capture_gates(g[layer], beta[layer], cache_indices, layer)
            q, k, v = out.split([hk * dk, hk * dk, hv * dv], dim=-1)
            want = torch.empty(3, draft, hv, dv)
            sgl_convwin.gdn_verify(want, q.unflatten(-1, (hk, dk)), k.unflatten(-1, (hk, dk)),
                                   v.unflatten(-1, (hv, dv)), g[layer], beta[layer], ssm_e[layer], cache_indices)
            torch.testing.assert_close(got[[0, 2]], want[[0, 2]], atol=1e-5, rtol=1e-5)
        run("ring-accept", ring=ring, cache_indices=cache_indices, accept_lens=accept_lens)
        eager.gdn_commit(ssm_e, conv_e, conv_weights, cache_indices, num_accepted=accept_lens, conv_bias=conv_biases,
                         **heads)
        if step == 4:  # slot 0 finishes; a new request's prefill writes its states, then it decodes
            flushed = torch.tensor([0])
            run("ring-flush", ring=ring, ssm_state=worlds["ring"][0], conv_state=worlds["ring"][1],
                conv_weights=conv_weights, conv_biases=conv_biases, flushed=flushed, hk=hk, dk=dk, hv=hv, dv=dv,
                new_requests=flushed)
            torch.testing.assert_close(worlds["ring"][0][:, 0], ssm_e[:, 0], atol=1e-6, rtol=1e-5)
            assert torch.equal(worlds["ring"][1][:, 0], conv_e[:, 0])
            for ssm, conv in worlds.values():
                ssm[:, 0], conv[:, 0] = 0.05, -0.5  # (the new request's prefill, alike in both worlds)
    assert not torch.equal(worlds["ring"][0][:, 3], first_ssm[:, 3])  # the verifies folded
    flushed = torch.tensor([0, 3])
    run("ring-flush", ring=ring, ssm_state=worlds["ring"][0], conv_state=worlds["ring"][1], conv_weights=conv_weights,
        conv_biases=conv_biases, flushed=flushed, hk=hk, dk=dk, hv=hv, dv=dv, new_requests=torch.tensor([-1]))
    torch.testing.assert_close(worlds["ring"][0], worlds["eager"][0], atol=1e-6, rtol=1e-5)
    assert torch.equal(worlds["ring"][1], worlds["eager"][1])


# ---------------------------------------------------------------------------------------------
# SGLang
# ---------------------------------------------------------------------------------------------


def sglang_params(layers, dim, temporal, dtype_conv=torch.bfloat16):
    hv, dv, dk = temporal
    per_req = (dim * (K - 1) * dtype_conv.itemsize + hv * dv * dk * 4) * layers  # BaseLinearStateParams
    return SimpleNamespace(shape=SimpleNamespace(conv=[(dim, K - 1)], temporal=temporal, num_k_heads_per_tp=2),
                           layers=list(range(layers)), dtype=SimpleNamespace(conv=dtype_conv, temporal=torch.float32),
                           mamba_cache_per_req=per_req)


def test_sglang_sizing():
    """Mamba2StateShape's (dim, K-1) conv and (Hv, dv, dk) temporal, dk != dv so a swapped read fails."""
    hk, dk, hv, dv, layers, draft = 2, 4, 4, 8, 3, 4
    dim = GatedDeltaNet(hk, dk, hv, dv).conv_dim
    params = sglang_params(layers, dim, (hv, dv, dk))
    budget, ratio = 10 * 2**20, 2
    ns = run("sglang-sizing", config=SimpleNamespace(mamba2_cache_params=params),
             server_args=SimpleNamespace(speculative_num_draft_tokens=draft), mamba_budget_bytes=budget,
             ratio=ratio, capped_reqs=8)
    cache = sgl_convwin.ConvWindowCache(layers, 1, dim, draft, K, dtype=torch.bfloat16, gate_heads=hv)
    assert ns["slot"].total == cache.nbytes
    assert ns["intermediate_size"] == 8 * cache.nbytes
    per_req = params.mamba_cache_per_req
    assert ns["max_mamba_cache_size"] == int(budget // (per_req + cache.nbytes / ratio))
    assert ns["max_mamba_cache_size"] > int(budget // (per_req * (1 + draft / ratio)))  # SGLang's solve today


def test_sglang_pool():
    hk, dk, hv, dv = 2, 4, 4, 8
    dim = GatedDeltaNet(hk, dk, hv, dv).conv_dim
    ns = run("sglang-pool", num_mamba_layers=3, spec_state_size=5, conv_shape=(dim, K - 1),
             speculative_num_draft_tokens=4, conv_dtype=torch.bfloat16, device="cpu",
             temporal_state_shape=(hv, dv, dk))
    slot = bytes_per_slot(3, dim, 4, K, mixer=GatedDeltaNet(hk, dk, hv, dv))
    assert ns["spec_cache"].nbytes == 6 * slot.total


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("head_k_dim, head_v_dim", HEAD_DIMS)
def test_sglang_verify_and_commit(head_k_dim, head_v_dim, tree):
    """The SGLang verify and commit snippets on a MambaPool stand-in (temporal [L, size + 1, Hv, dv, dk],
    conv [L, size + 1, dim, K-1]), a padded cuda-graph batch (mamba_cache_indices -1), the commit
    site's accept_lens / accept_index; checked against the float64 oracle."""
    gen = torch.Generator().manual_seed(22)
    layers, pool_size, draft, padded = 2, 6, 4, 4
    dim = gdn_conv_dim(head_k_dim, head_v_dim)
    pool_slots = [3, 0, 5]
    temporal = torch.randn(layers, pool_size, NUM_V_HEADS, head_v_dim, head_k_dim, generator=gen) * 0.5
    conv = torch.randn(layers, pool_size, dim, K - 1, generator=gen)
    conv_weight = torch.randn(layers, dim, K, generator=gen) * 0.5
    conv_bias = torch.randn(layers, dim, generator=gen) * 0.1
    before_temporal, before_conv = temporal.clone(), conv.clone()
    trees = [[-1, 0, 0, 2], [-1, 0, 1, 0], [-1, 0, 1, 2]] if tree else [[-1, 0, 1, 2]] * 3
    paths = [[0, 2, 3], [0], [0, 1, 2, 3]] if tree else [[0, 1, 2], [0], [0, 1, 2, 3]]
    accept_lens = torch.tensor([len(path) for path in paths], dtype=torch.int32)
    accept_index = torch.full((3, draft), -1, dtype=torch.int32)
    for row, path in enumerate(paths):
        accept_index[row, : len(path)] = torch.tensor(path, dtype=torch.int32) + row * draft
    next_token = next_sibling = None
    if tree:
        next_token, next_sibling = sglang_build_tree(trees + [[-1] * draft], draft)
    meta = SimpleNamespace(mamba_cache_indices=sglang_mamba_cache_indices(pool_slots, padded),
                           retrieve_next_token=next_token, retrieve_next_sibling=next_sibling)
    mamba_pool = SimpleNamespace(mamba_cache=SimpleNamespace(conv=[conv], temporal=temporal))
    spec_cache = sgl_convwin.ConvWindowCache(layers, padded, dim, draft, K, layout="token_major",
                                             dtype=torch.float32, gate_heads=NUM_V_HEADS)
    tokens = torch.randn(layers, padded, draft, dim, generator=gen)
    a, b, A_log, dt_bias = raw_gates(gen, layers, padded * draft)
    g, beta = (gate.view(layers, padded, draft, -1)[:, :3] for gate in gates_from_raw(a, b, A_log, dt_bias))
    for layer in range(layers):
        ns = run("sglang-verify", self=SimpleNamespace(forward_metadata=meta),
                 spec_info=SimpleNamespace(draft_token_num=draft), mixed_qkv=tokens[layer].reshape(-1, dim),
                 spec_cache=spec_cache, pool=mamba_pool, conv_weights=conv_weight[layer], bias=conv_bias[layer],
                 layer_idx=layer, a=a[layer], b=b[layer], A_log=A_log, dt_bias=dt_bias, hk=NUM_K_HEADS,
                 dk=head_k_dim, hv=NUM_V_HEADS, dv=head_v_dim)
        check_verify_outputs(ns["o"][:3], ns["out"][:3], g[layer], beta[layer], before_temporal[layer].transpose(-1, -2),
                             torch.tensor(pool_slots), torch.tensor(trees) if tree else None, head_k_dim, head_v_dim)
    run("sglang-commit", self=SimpleNamespace(linear_attn_backend=SimpleNamespace(forward_metadata=meta)),
        accept_lens=accept_lens, accept_index=accept_index, req_pool=SimpleNamespace(mamba_pool=mamba_pool),
        spec_cache=spec_cache, conv_weight=conv_weight, conv_bias=conv_bias, hk=NUM_K_HEADS, dk=head_k_dim,
        hv=NUM_V_HEADS, dv=head_v_dim)

    expected_ssm, expected_conv, written = gdn_oracle(
        before_temporal.transpose(-1, -2), before_conv, tokens[:, :3], g, beta, conv_weight, conv_bias,
        torch.tensor(pool_slots), torch.tensor([path[-1] for path in paths]),
        torch.tensor(trees) if tree else None, head_k_dim=head_k_dim, head_v_dim=head_v_dim)
    assert written == set(pool_slots)
    torch.testing.assert_close(temporal.transpose(-1, -2).double(), expected_ssm, atol=1e-4, rtol=1e-4)
    assert torch.equal(conv, expected_conv)


# ---------------------------------------------------------------------------------------------
# vLLM
# ---------------------------------------------------------------------------------------------


def test_vllm_sizing():
    hk, dk, hv, dv, tp = 4, 4, 8, 8, 2
    conv_dim = GatedDeltaNet(hk, dk, hv, dv).conv_dim
    ns = run("vllm-sizing", num_gdn_layers=3, conv_dim=conv_dim, tp=tp, num_spec=3, conv_kernel_size=K,
             conv_dtype=torch.bfloat16, hk=hk, dk=dk, hv=hv, dv=dv)
    cache = sgl_convwin.ConvWindowCache(3, 1, conv_dim // tp, 4, K, dtype=torch.bfloat16, gate_heads=hv // tp)
    assert ns["extra_bytes_per_request"] == cache.nbytes


@pytest.mark.parametrize("head_k_dim, head_v_dim", HEAD_DIMS)
def test_vllm_verify_and_commit(head_k_dim, head_v_dim):
    """The vLLM verify and commit snippets on per-layer state stand-ins (ssm [blocks, Hv, dv, dk], conv
    stored [blocks, K-1, dim]), a ragged spec batch (query lengths 4, 1, 3 of num_spec + 1 = 4) with
    two NULL_BLOCK_ID padded rows; checked against the float64 oracle."""
    gen = torch.Generator().manual_seed(23)
    layers, blocks, num_spec, padded = 2, 8, 3, 5
    n = num_spec + 1
    dim = gdn_conv_dim(head_k_dim, head_v_dim)
    block_table = torch.tensor([[6, 1, 2, 3], [3, 4, 5, 6], [1, 7, 2, 4]], dtype=torch.int32)
    query_lens, accepted = [4, 1, 3], [3, 1, 2]
    state_indices, qsl, num_accepted_tokens = vllm_spec_metadata(block_table, num_spec, query_lens, padded, accepted)
    meta = SimpleNamespace(spec_state_indices_tensor=state_indices, spec_query_start_loc=qsl, num_spec_decodes=3)
    cache_config = SimpleNamespace(mamba_cache_mode="none")  # vllm_config.cache_config, prefix caching off
    ssm_states = [torch.randn(blocks, NUM_V_HEADS, head_v_dim, head_k_dim, generator=gen) * 0.5 for _ in range(layers)]
    conv_storages = [torch.randn(blocks, K - 1, dim, generator=gen) for _ in range(layers)]
    conv_states = [storage.transpose(-1, -2) for storage in conv_storages]
    conv_weights = torch.randn(layers, dim, K, generator=gen) * 0.5
    conv_biases = torch.randn(layers, dim, generator=gen) * 0.1
    before_ssm = torch.stack([state.transpose(-1, -2) for state in ssm_states])
    before_conv = torch.stack(conv_states).clone()
    spec_caches = [sgl_convwin.ConvWindowCache(1, blocks, dim, n, K, dtype=torch.float32, gate_heads=NUM_V_HEADS)
                   for _ in range(layers)]
    mixed = torch.randn(layers, padded * n, dim, generator=gen)
    a, b, A_log, dt_bias = raw_gates(gen, layers, padded * n)
    total = int(qsl[-1])
    g, beta = gates_from_raw(a, b, A_log, dt_bias)
    for layer in range(layers):
        mixed_qkv_spec = mixed[layer].clone()
        layer_self = SimpleNamespace(spec_cache=spec_caches[layer], conv1d=SimpleNamespace(bias=conv_biases[layer]),
                                     activation="silu", A_log=A_log, dt_bias=dt_bias)
        core_attn_out_spec = torch.full((padded * n, NUM_V_HEADS, head_v_dim), 7.0)
        ns = run("vllm-verify", self=layer_self, attn_metadata=meta, cache_config=cache_config,
                 mixed_qkv_spec=mixed_qkv_spec, conv_state=conv_states[layer], conv_weights=conv_weights[layer],
                 a_spec=a[layer], b_spec=b[layer], ssm_state=ssm_states[layer], core_attn_out_spec=core_attn_out_spec,
                 hk=NUM_K_HEADS, dk=head_k_dim, hv=NUM_V_HEADS, dv=head_v_dim)
        starts = qsl[:3].long()[:, None] + torch.arange(n)
        rows = torch.minimum(starts, qsl[1:4].long()[:, None] - 1)  # request b's tokens at row b, as verified
        check_verify_outputs(ns["o"][:3], ns["out"][:3], g[layer, rows], beta[layer, rows], before_ssm[layer],
                             block_table[:, 0].long(), None, head_k_dim, head_v_dim)
        for row, count in enumerate(query_lens):  # the outputs ragged again, the padded tail untouched
            start = int(qsl[row])
            assert torch.equal(core_attn_out_spec[start: start + count], ns["o"][row, :count])
        assert torch.equal(core_attn_out_spec[total:], torch.full_like(core_attn_out_spec[total:], 7.0))
        for row, count in enumerate(query_lens):
            start = int(qsl[row])
            want = causal_conv_oracle(before_conv[layer, int(block_table[row, 0])], mixed[layer, start: start + count],
                                      conv_weights[layer], conv_biases[layer])
            torch.testing.assert_close(mixed_qkv_spec[start: start + count].double(), want, atol=1e-5, rtol=1e-5)
        assert torch.equal(mixed_qkv_spec[total:], mixed[layer, total:])
    run("vllm-commit", meta=meta, cache_config=cache_config, num_accepted_tokens=num_accepted_tokens,
        spec_caches=spec_caches, ssm_states=ssm_states, conv_states=conv_states, conv_weights=conv_weights,
        conv_biases=conv_biases, hk=NUM_K_HEADS, dk=head_k_dim, hv=NUM_V_HEADS, dv=head_v_dim, tp=1)

    def padded_rows(t):  # request b's tokens at row b, as the verify saw them
        starts = qsl[:3].long()[:, None] + torch.arange(n)
        return t[:, torch.minimum(starts, qsl[1:4].long()[:, None] - 1)]

    g, beta = gates_from_raw(a, b, A_log, dt_bias)
    expected_ssm, expected_conv, written = gdn_oracle(
        before_ssm, before_conv, padded_rows(mixed), padded_rows(g), padded_rows(beta), conv_weights, conv_biases,
        block_table[:, 0].long(), torch.tensor(accepted) - 1, None, head_k_dim=head_k_dim, head_v_dim=head_v_dim)
    assert written == {6, 3, 1} and NULL_BLOCK_ID not in written
    got_ssm = torch.stack([state.transpose(-1, -2) for state in ssm_states])
    torch.testing.assert_close(got_ssm.double(), expected_ssm, atol=1e-4, rtol=1e-4)
    assert torch.equal(torch.stack(conv_states), expected_conv)


# ---------------------------------------------------------------------------------------------
# transformers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("head_k_dim, head_v_dim", HEAD_DIMS)
def test_transformers_commit(head_k_dim, head_v_dim, tree):
    """The transformers snippet on stand-ins of a DynamicCache's linear-attention layers
    (``conv_states[0]`` [B, dim, K], ``recurrent_states[0]`` [B, Hv, dk, dv]) and of
    Qwen3NextGatedDeltaNet modules (mixer layers 0 and 2, an attention layer between); buffer slots
    other than the batch rows, partial acceptance; checked against the float64 oracle, and the
    dead conv column 0 untouched. The real models: tests/test_hf_models.py."""
    gen = torch.Generator().manual_seed(29)
    layer_ids, batch, draft = [0, 2], 2, 4
    layers = len(layer_ids)
    dim = gdn_conv_dim(head_k_dim, head_v_dim)
    conv_states = [torch.randn(batch, dim, K, generator=gen) for _ in range(layers)]
    recurrent_states = [torch.randn(batch, NUM_V_HEADS, head_k_dim, head_v_dim, generator=gen) * 0.5
                        for _ in range(layers)]
    weights = torch.randn(layers, dim, K, generator=gen) * 0.5
    before_ssm = torch.stack(recurrent_states).clone()
    before_conv = torch.stack([state[..., 1:] for state in conv_states]).clone()
    dead = [state[..., 0].clone() for state in conv_states]
    cache = SimpleNamespace(layers={idx: SimpleNamespace(conv_states={0: conv}, recurrent_states={0: rec})
                                    for idx, conv, rec in zip(layer_ids, conv_states, recurrent_states)})
    gdn_mixers = [SimpleNamespace(layer_idx=idx, conv1d=SimpleNamespace(weight=weights[i][:, None]),
                                  num_k_heads=NUM_K_HEADS, head_k_dim=head_k_dim, num_v_heads=NUM_V_HEADS,
                                  head_v_dim=head_v_dim) for i, idx in enumerate(layer_ids)]
    spec_caches = {idx: sgl_convwin.ConvWindowCache(1, batch, dim, draft, K, dtype=torch.float32,
                                                    gate_heads=NUM_V_HEADS) for idx in layer_ids}
    buffer_slots, batch_rows = torch.tensor([1, 0]), torch.arange(batch)
    trees = [[-1, 0, 0, 2], [-1, 0, 1, 0]]
    parents = torch.tensor(trees) if tree else None
    tokens = torch.randn(layers, batch, draft, dim, generator=gen)
    g, beta = gates_from_raw(*raw_gates(gen, layers, batch, draft))
    for i, idx in enumerate(layer_ids):  # the verify pass, as the test's mixer forwards capture
        spec_caches[idx].capture(before_conv[i][None], tokens[i], buffer_slots, 0, state_slots=batch_rows,
                                 parents=parents)
        spec_caches[idx].capture_gates(g[i], beta[i], buffer_slots, 0)
    accepted = torch.tensor([3, 0]) if tree else torch.tensor([2, 0])
    run("transformers-commit", gdn_mixers=gdn_mixers, cache=cache, spec_caches=spec_caches,
        buffer_slots=buffer_slots, accepted=accepted, batch_rows=batch_rows, parents=parents)

    expected_ssm, expected_conv, written = gdn_oracle(
        before_ssm, before_conv, tokens, g, beta, weights, None, batch_rows, accepted, parents,
        head_k_dim=head_k_dim, head_v_dim=head_v_dim)
    assert written == {0, 1}
    torch.testing.assert_close(torch.stack(recurrent_states).double(), expected_ssm, atol=1e-4, rtol=1e-4)
    assert torch.equal(torch.stack([state[..., 1:] for state in conv_states]), expected_conv)
    assert all(torch.equal(state[..., 0], column) for state, column in zip(conv_states, dead))


def test_prefix_cache_tracking_recipe():
    """The guide's recipe for SGLang's mamba_track_indices / mamba_steps_to_track (no adapter): the
    committed state copied into the track slot, a gdn_commit of steps_to_track into it, then the
    main commit; each slot then holds the oracle's state after its own step."""
    generator = torch.Generator().manual_seed(11)
    hk, dk, hv, dv, draft, layers = 1, 8, 2, 8, 4, 2
    dims = dict(num_k_heads=hk, head_k_dim=dk, num_v_heads=hv, head_v_dim=dv)
    dim = 2 * hk * dk + hv * dv
    ssm = torch.randn(layers, 4, hv, dk, dv, generator=generator)
    conv = torch.randn(layers, 4, dim, K - 1, generator=generator)
    weight = torch.randn(layers, dim, K, generator=generator) * 0.5
    buffer = sgl_convwin.alloc_windows(layers, 2, dim, draft, K, dtype=torch.float32)
    gates = sgl_convwin.alloc_gates(layers, 2, draft, hv)
    main, track, src = torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([1, 0])
    for layer in range(layers):
        sgl_convwin.capture(buffer, conv, torch.randn(2, draft, dim, generator=generator), src, main, layer)
        sgl_convwin.capture_gates(gates, -torch.rand(2, draft, hv, generator=generator),
                                  torch.rand(2, draft, hv, generator=generator), src, layer)
    steps, steps_to_track = torch.tensor([3, 2]), torch.tensor([1, 0])
    want = {name: sgl_convwin.reference.gdn_commit_reference(ssm, conv, buffer, gates, weight, main, src, chosen,
                                                             layout="token_major", **dims)
            for name, chosen in (("main", steps), ("track", steps_to_track))}
    ssm[:, track], conv[:, track] = ssm[:, main], conv[:, main]  # the committed state into the track slots
    sgl_convwin.gdn_commit(ssm, conv, buffer, gates, weight, track, src, steps_to_track, **dims)
    sgl_convwin.gdn_commit(ssm, conv, buffer, gates, weight, main, src, steps, **dims)
    for name, slots in (("main", main), ("track", track)):
        want_ssm, want_conv, _ = want[name]
        torch.testing.assert_close(ssm[:, slots].double(), want_ssm[:, main], rtol=0,
                                   atol=1e-5 * want_ssm.abs().max())
        assert torch.equal(conv[:, slots], want_conv[:, main]), name
