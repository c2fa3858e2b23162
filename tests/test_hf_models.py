"""Speculative decoding of transformers' own Qwen3-Next and Nemotron-H layer code through the
package's ops, every token checked against the model's own greedy decoding.

transformers (5.23) defines these hybrids (and Qwen3.5, also here) with their real mixer code but
cannot roll a linear-attention cache back, so it has no speculative decoding for them. Here tiny
seeded random-weight models (built from config objects, nothing fetched; CPU, float32) decode a
batch of two requests greedily:

* prefill: the model's own forward, filling its own ``DynamicCache``;
* each step, ONE forward pass of the model over each request's pending token and its drafts (a
  chain, or a topk-3 tree): the attention layers run as they are, given the tree's mask and
  positions (rejected drafts' key/value entries stay in the cache, masked); each
  mixer layer's ``forward`` is swapped for a verify forward (``gdn_verify_forward`` /
  ``mamba2_verify_forward``) that keeps the model's own projections, head grouping, gates,
  norms and output projection and calls the package's ops where the model would touch its cache:
  ``causal_conv1d_verify`` (conv + capture into the package's buffer), ``capture_gates``, and for
  ``gdn_verify`` / ``mamba2_verify`` for the outputs;
* greedy acceptance on those logits, then ``gdn_commit`` / ``mamba2_commit`` replay the accepted
  path into the model's own cache tensors (``integrations.transformers_layer_states``); a
  request that has its tokens stays in the batch as a padded row (slots -1).

The tokens must equal ``model.generate(do_sample=False)``'s, and the committed states those of a
plain greedy loop over the model's forward. Conventions checked on the way
(``test_transformers_conventions``): the conv state is ``[B, dim, K]`` (K columns, the package's
K-1 plus a dead one), the recurrent states are already the package's ``[Hv, dk, dv]`` /
``[H, P, Ns]``, the conv input is ``cat(q, k, v)`` only after ``fix_query_key_value_ordering``
(the projection itself is grouped per key head), and value head h reads key head h // (Hv / Hk).
"""

from __future__ import annotations

import inspect
import random
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from types import MethodType
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import sgl_convwin
from sgl_convwin.integrations import transformers_layer_states

transformers = pytest.importorskip("transformers", reason="transformers is a test extra (pip install -e .[test])")
qwen3_next = pytest.importorskip(
    "transformers.models.qwen3_next.modeling_qwen3_next", reason="this transformers has no Qwen3-Next")
qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5", reason="this transformers has no Qwen3.5")
nemotron_h = pytest.importorskip(
    "transformers.models.nemotron_h.modeling_nemotron_h", reason="this transformers has no Nemotron-H")

K = 4
PROMPT_LEN = 6
NEW_TOKENS = 24
CHAIN_DRAFT = 3                 # D drafts after the pending token: N = 4 verify tokens
TREE_PARENTS = [-1, 0, 0, 0, 1, 1, 1]   # topk 3, depth 2: the pending token, 3 children, 3 under the first
BATCH = 2                               # two requests, accepting different lengths each step
BUFFER_SLOTS = [1, 0]                   # each request's buffer slot, not its batch row (its state row)


# ---------------------------------------------------------------------------------------------
# Tiny models
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def torch_gated_delta_rule():
    """transformers picks FLA's Triton kernels for the delta rule when FLA is installed (a test
    extra here), and those need a GPU; on the CPU use transformers' own torch implementations
    (``torch_chunk_gated_delta_rule``, ``torch_recurrent_gated_delta_rule``), unwrapped."""
    with ExitStack() as stack:
        for module in (qwen3_next, qwen3_5):
            for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
                stack.enter_context(mock.patch.object(module, name, inspect.unwrap(getattr(module, name))))
        yield


def seeded_weights(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Matrices ~ N(0, 1/fan_in) (embeddings N(0, 1)) so that every layer moves the logits: the
    models' default init (std 0.02) makes tiny random models repeat one token. Norm weights, A_log,
    dt_bias and D keep the models' own (seeded) init."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                fan_in = 1 if "embed" in name else param.shape[1]
                param.copy_(torch.randn(param.shape, generator=gen) * fan_in**-0.5)
            elif name.endswith("conv1d.weight"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
            elif name.endswith("conv1d.bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    return model.eval()


def tiny_qwen3_next(seed: int = 0):
    """Qwen3-Next: 3 Gated DeltaNet layers and 1 gated attention layer; GVA (Hv = 2 Hk) and dk != dv,
    so a transposed state or a wrong head grouping is a shape error or a wrong token."""
    torch.manual_seed(seed)
    config = transformers.Qwen3NextConfig(
        vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=0,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
        linear_conv_kernel_dim=K, attn_implementation="eager")
    return seeded_weights(transformers.Qwen3NextForCausalLM(config), seed)


def tiny_qwen3_5(seed: int = 0):
    """Qwen3.5 (text): its GDN layer has separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a,
    the first already in the conv's cat(q, k, v) order; otherwise as tiny_qwen3_next."""
    torch.manual_seed(seed)
    config = transformers.Qwen3_5TextConfig(
        vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
        linear_conv_kernel_dim=K, attn_implementation="eager")
    return seeded_weights(transformers.Qwen3_5ForCausalLM(config), seed)


def tiny_nemotron_h(seed: int = 0):
    """Nemotron-H: Mamba2, MLP, attention, Mamba2 blocks; H = 4 heads of P = 6 in G = 2 groups, Ns = 8."""
    torch.manual_seed(seed)
    config = transformers.NemotronHConfig(
        vocab_size=48, hidden_size=32, intermediate_size=48,
        layers_block_type=["linear_attention", "mlp", "full_attention", "linear_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, mamba_num_heads=4, mamba_head_dim=6,
        n_groups=2, ssm_state_size=8, conv_kernel=K, chunk_size=8, attn_implementation="eager")
    return seeded_weights(transformers.NemotronHForCausalLM(config), seed)


def is_gdn(model) -> bool:
    return not isinstance(model, transformers.NemotronHForCausalLM)


def mixers(model) -> list[torch.nn.Module]:
    """The model's linear-attention mixer modules, in layer order."""
    name = "linear_attn" if is_gdn(model) else "mixer"
    return [getattr(layer, name) for layer in model.model.layers if layer.block_type == "linear_attention"]


# ---------------------------------------------------------------------------------------------
# The verify forwards: the models' mixer code with the package's ops where the cache is touched
# ---------------------------------------------------------------------------------------------


@dataclass
class Verify:
    """What one verify pass hands every mixer layer: the requests' buffer slots and state rows
    (-1: a finished request, a padded row every op skips), the tree [B, N] (None: a chain), and
    per mixer layer the package's buffer (a one-layer cache each, as transformers keeps one state
    tensor per layer)."""

    caches: dict[int, sgl_convwin.ConvWindowCache]
    buffer_slots: torch.Tensor
    state_slots: torch.Tensor
    parents: torch.Tensor | None
    transpose_state: bool = False   # the mutation: pass the recurrent state as engines' [.., dv, dk]


def layer_states(cache, layer_idx: int, verify: Verify):
    ssm_state, conv_state = transformers_layer_states(
        cache.layers[layer_idx].conv_states[0], cache.layers[layer_idx].recurrent_states[0])
    return (ssm_state.transpose(-1, -2) if verify.transpose_state else ssm_state), conv_state


def gdn_verify_forward(self, hidden_states, cache_params=None, attention_mask=None, *, verify: Verify, **kwargs):
    """``Qwen3NextGatedDeltaNet.forward`` / ``Qwen3_5GatedDeltaNet.forward`` for the verify tokens.
    Mirrored from transformers: Qwen3-Next's ``in_proj_qkvz`` / ``in_proj_ba`` through
    ``fix_query_key_value_ordering`` then ``mixed_qkv = cat(q, k, v)``, or Qwen3.5's
    ``in_proj_qkv`` (already that order), ``in_proj_z``, ``in_proj_b``, ``in_proj_a``;
    ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)``, ``self.norm(o, z)``,
    ``out_proj``. Replaced: ``causal_conv1d_update`` by ``causal_conv1d_verify`` (the conv of every
    node from the committed state, capturing its input), ``torch_recurrent_gated_delta_rule`` by
    ``gdn_verify`` (every node's output from the committed state, l2norm of q, k in the op as
    ``use_qk_l2norm_in_kernel=True``); the gates go to ``capture_gates`` raw. The cache is only read."""
    spec = verify.caches[self.layer_idx]
    batch, num_nodes, _ = hidden_states.shape
    ssm_state, conv_state = layer_states(cache_params, self.layer_idx, verify)
    if hasattr(self, "in_proj_qkvz"):  # Qwen3-Next: one projection, grouped per key head
        query, key, value, z, b, a = self.fix_query_key_value_ordering(
            self.in_proj_qkvz(hidden_states), self.in_proj_ba(hidden_states))
        mixed_qkv = torch.cat([t.reshape(batch, num_nodes, -1) for t in (query, key, value)], dim=-1)
    else:  # Qwen3.5
        mixed_qkv = self.in_proj_qkv(hidden_states)
        z = self.in_proj_z(hidden_states).reshape(batch, num_nodes, -1, self.head_v_dim)
        b, a = self.in_proj_b(hidden_states), self.in_proj_a(hidden_states)
    conv_out = torch.zeros_like(mixed_qkv)  # padded rows are not written
    spec.causal_conv1d_verify(conv_out, conv_state, mixed_qkv, self.conv1d.weight.squeeze(1), self.conv1d.bias,
                              verify.buffer_slots, 0, state_slots=verify.state_slots, parents=verify.parents,
                              activation=self.activation)
    spec.capture_gates(None, None, verify.buffer_slots, 0, a=a, b=b, A_log=self.A_log, dt_bias=self.dt_bias)
    query, key, value = torch.split(conv_out, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    beta = b.sigmoid()
    g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    core = torch.zeros(batch, num_nodes, self.num_v_heads, self.head_v_dim)
    sgl_convwin.gdn_verify(
        core, query.view(batch, num_nodes, -1, self.head_k_dim), key.view(batch, num_nodes, -1, self.head_k_dim),
        value.view(batch, num_nodes, -1, self.head_v_dim), g, beta, ssm_state[0], verify.state_slots, verify.parents)
    core = self.norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(core.reshape(batch, num_nodes, -1))


def mamba2_verify_forward(self, hidden_states, cache_params=None, attention_mask=None, *, verify: Verify, **kwargs):
    """``NemotronHMamba2Mixer.forward``'s decode branch for the verify tokens. Mirrored from
    transformers: ``in_proj`` split into gate, xBC, dt; ``A = -exp(A_log)``; the recurrence of each
    node as transformers' one-token ``mamba2_selective_state_update`` decodes it (dt + dt_bias,
    softplus, D skip; no dt limit); ``self.norm(y, gate)``, ``out_proj``. Replaced:
    ``causal_conv1d_update`` by ``causal_conv1d_verify``; the per-token state update by
    ``mamba2_verify`` (every node's output from one read of the committed state, which it never
    writes); dt as the recurrence uses it, ``softplus(dt + dt_bias)``, goes to ``capture_gates``
    for ``mamba2_commit``."""
    spec = verify.caches[self.layer_idx]
    batch, num_nodes, _ = hidden_states.shape
    heads, head_dim, groups, d_state = self.num_heads, self.head_dim, self.n_groups, self.ssm_state_size
    ssm_state, conv_state = layer_states(cache_params, self.layer_idx, verify)
    gate, xbc, dt = self.in_proj(hidden_states).split([self.intermediate_size, self.conv_dim, heads], dim=-1)
    conv_out = torch.zeros_like(xbc)  # padded rows are not written
    spec.causal_conv1d_verify(conv_out, conv_state, xbc, self.conv1d.weight.squeeze(1), self.conv1d.bias,
                              verify.buffer_slots, 0, state_slots=verify.state_slots, parents=verify.parents,
                              activation=self.activation)
    spec.capture_gates(F.softplus(dt + self.dt_bias), None, verify.buffer_slots, 0)
    x, B, C = torch.split(conv_out, [self.intermediate_size, groups * d_state, groups * d_state], dim=-1)
    A = -torch.exp(self.A_log.float())
    y = torch.zeros(batch, num_nodes, heads, head_dim, dtype=x.dtype, device=x.device)  # padded rows: untouched
    sgl_convwin.mamba2_verify(y, x.unflatten(-1, (heads, head_dim)), dt, A, B.unflatten(-1, (groups, d_state)),
                              C.unflatten(-1, (groups, d_state)), ssm_state[0], verify.state_slots, verify.parents,
                              D=self.D, dt_bias=self.dt_bias, dt_softplus=True)
    return self.out_proj(self.norm(y.reshape(batch, num_nodes, -1), gate))


@contextmanager
def verify_forwards(model, verify: Verify):
    """Swap every mixer's forward for its verify forward for one pass."""
    forward = gdn_verify_forward if is_gdn(model) else mamba2_verify_forward
    with ExitStack() as stack:
        for mixer in mixers(model):
            bound = MethodType(lambda self, *a, **kw: forward(self, *a, verify=verify, **kw), mixer)
            stack.enter_context(mock.patch.object(mixer, "forward", bound))
        yield


def commit(model, cache, verify: Verify, accepted: torch.Tensor) -> None:
    """Replay the accepted path into the model's own states, one mixer layer at a time."""
    for mixer in mixers(model):
        spec = verify.caches[mixer.layer_idx]
        ssm_state, conv_state = layer_states(cache, mixer.layer_idx, verify)
        weight, bias = mixer.conv1d.weight.squeeze(1)[None], mixer.conv1d.bias
        bias = None if bias is None else bias[None]
        if is_gdn(model):
            spec.gdn_commit(ssm_state, conv_state, weight, verify.buffer_slots, accepted,
                            state_slots=verify.state_slots, parents=verify.parents, conv_bias=bias,
                            num_k_heads=mixer.num_k_heads, head_k_dim=mixer.head_k_dim,
                            num_v_heads=mixer.num_v_heads, head_v_dim=mixer.head_v_dim)
        else:
            spec.mamba2_commit(ssm_state, conv_state, weight, -torch.exp(mixer.A_log.float())[None],
                               verify.buffer_slots, accepted, state_slots=verify.state_slots,
                               parents=verify.parents, conv_bias=bias, num_heads=mixer.num_heads,
                               head_dim=mixer.head_dim, n_groups=mixer.n_groups, d_state=mixer.ssm_state_size)


def new_spec_caches(model, num_nodes: int) -> dict[int, sgl_convwin.ConvWindowCache]:
    caches = {}
    for mixer in mixers(model):
        gdn = is_gdn(model)
        caches[mixer.layer_idx] = sgl_convwin.ConvWindowCache(
            1, len(BUFFER_SLOTS), mixer.conv_dim, num_nodes, K, dtype=torch.float32,
            gate_heads=mixer.num_v_heads if gdn else mixer.num_heads, num_gates=2 if gdn else 1)
    return caches


# ---------------------------------------------------------------------------------------------
# The speculative decoding loop
# ---------------------------------------------------------------------------------------------


def depths(parents: list[int]) -> list[int]:
    out = []
    for parent in parents:
        out.append(0 if parent < 0 else out[parent] + 1)
    return out


def ancestors(parents: list[int], node: int) -> list[int]:
    """node's path from the root, root first."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def tree_attention_mask(parents: list[int], seen: torch.Tensor) -> torch.Tensor:
    """[B, 1, N, T + N] additive mask for transformers' eager attention: node n sees the key/value
    entries of its request's accepted tokens (``seen`` [B, T]; a rejected draft's entry stays in
    the cache, masked, so that requests of different lengths share one cache) and its own path."""
    batch, num_nodes = seen.shape[0], len(parents)
    path = torch.zeros(num_nodes, num_nodes, dtype=torch.bool)
    for node in range(num_nodes):
        path[node, ancestors(parents, node)] = True
    allowed = torch.cat([seen[:, None].expand(-1, num_nodes, -1), path.expand(batch, -1, -1)], dim=2)
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]


@dataclass
class Drafter:
    """A cheap drafter that knows the target's greedy continuation ``reference`` and proposes it
    at each position with probability ``hit`` (else a wrong token), so that drafts are accepted
    fully, partially and not at all. Siblings are distinct; a tree's first child is the guess."""

    reference: list[int]
    vocab: int
    seed: int
    hit: float = 0.6
    rng: random.Random = field(init=False)

    def __post_init__(self):
        self.rng = random.Random(self.seed)

    def children(self, position: int, on_reference: bool, count: int) -> list[int]:
        right = self.reference[position] if on_reference and position < len(self.reference) else None
        wrong = [t for t in self.rng.sample(range(self.vocab), count + 1) if t != right][:count]
        if right is None:
            return wrong
        if self.rng.random() < self.hit:
            return [right] + wrong[: count - 1]
        chosen = wrong[:count]
        if count > 1 and self.rng.random() < 0.5:  # the right token drafted, but not as the first guess
            chosen[self.rng.randrange(1, count)] = right
        return chosen

    def draft(self, parents: list[int], pending: int, position: int) -> list[int]:
        """Tokens of every node; node 0 is the pending token at output ``position``."""
        tokens, on_ref = [pending], [True]
        kids: dict[int, list[int]] = {}
        for node, parent in enumerate(parents):
            if parent >= 0:
                kids.setdefault(parent, []).append(node)
        for parent, nodes in sorted(kids.items()):
            guesses = self.children(position + depths(parents)[parent] + 1, on_ref[parent], len(nodes))
            for node, token in zip(nodes, guesses):
                assert len(tokens) == node, "nodes come in breadth-first order"
                tokens.append(token)
                at = position + depths(parents)[node]
                on_ref.append(on_ref[parent] and at < len(self.reference) and token == self.reference[at])
        return tokens


def speculative_decode(model, prompts: torch.Tensor, parents: list[int], drafters: list[Drafter],
                       new_tokens: int, transpose_state: bool = False):
    """Greedy speculative decoding of a batch of requests (prompts of one length) until each has
    ``new_tokens``; a finished request stays in the batch as a padded row (slots -1).
    Returns (tokens per request, cache, accepted paths per request)."""
    batch, prompt_len = prompts.shape
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        logits = model(prompts, past_key_values=cache, use_cache=True).logits
    emitted = [[int(token)] for token in logits[:, -1].argmax(-1)]
    paths = [[] for _ in range(batch)]
    lengths = [prompt_len] * batch   # tokens in each request's states (its next position)
    seen = torch.ones(batch, prompt_len, dtype=torch.bool)
    chain = parents == list(range(-1, len(parents) - 1))
    verify = Verify(new_spec_caches(model, len(parents)), torch.tensor(BUFFER_SLOTS[:batch]),
                    torch.arange(batch), None if chain else torch.tensor([parents] * batch), transpose_state)
    node_depths = depths(parents)
    while min(len(tokens) for tokens in emitted) < new_tokens:
        active = torch.tensor([len(tokens) < new_tokens for tokens in emitted])
        verify.buffer_slots = torch.where(active, torch.tensor(BUFFER_SLOTS[:batch]), -1)
        verify.state_slots = torch.where(active, torch.arange(batch), -1)
        tokens = torch.tensor([drafter.draft(parents, done[-1], len(done) - 1)
                               for drafter, done in zip(drafters, emitted)])
        masks = {"full_attention": tree_attention_mask(parents, seen), "linear_attention": None}
        positions = torch.tensor([[length + d for d in node_depths] for length in lengths])
        with torch.no_grad(), verify_forwards(model, verify):
            logits = model(tokens, past_key_values=cache, attention_mask=masks, position_ids=positions,
                           use_cache=True).logits
        target = logits.argmax(-1).tolist()
        accepted = torch.full((batch,), -1)
        new_seen = torch.zeros(batch, len(parents), dtype=torch.bool)
        for row in range(batch):
            if not active[row]:
                continue
            path = [0]
            while True:  # greedy acceptance: follow the child whose token the target predicts
                nxt = [n for n, p in enumerate(parents) if p == path[-1] and tokens[row, n] == target[row][path[-1]]]
                if not nxt:
                    break
                path.append(nxt[0])
            emitted[row].extend(target[row][node] for node in path)
            paths[row].append(path)
            accepted[row], new_seen[row, path] = path[-1], True
            lengths[row] += len(path)
        with torch.no_grad():
            commit(model, cache, verify, accepted)
        seen = torch.cat([seen, new_seen], dim=1)
    return emitted, cache, paths


def greedy_loop(model, prompt: torch.Tensor, count: int):
    """The plain decoder: the model's forward one token at a time with its own cache.
    Returns (tokens, cache after all but the last token)."""
    cache = transformers.DynamicCache(config=model.config)
    tokens, ids = [], prompt
    with torch.no_grad():
        for _ in range(count):
            logits = model(ids, past_key_values=cache, use_cache=True).logits
            tokens.append(int(logits[0, -1].argmax()))
            ids = torch.tensor([[tokens[-1]]])
    return tokens, cache


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

MODELS = {"qwen3_next": tiny_qwen3_next, "qwen3_5": tiny_qwen3_5, "nemotron_h": tiny_nemotron_h}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_and_reference(request):
    """A tiny model, a batch of prompts, and its own ``generate`` (greedy) continuations."""
    model = MODELS[request.param]()
    gen = torch.Generator().manual_seed(3)
    prompts = torch.randint(0, model.config.vocab_size, (BATCH, PROMPT_LEN), generator=gen)
    count = NEW_TOKENS + len(TREE_PARENTS)
    with torch.no_grad():
        # an explicit mask: without one generate takes a prompt's token 0 (Nemotron-H's pad_token_id) for padding
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                             max_new_tokens=count, min_new_tokens=count)
    return model, prompts, out[:, PROMPT_LEN:].tolist()


def decode_and_check(model, prompts, parents, references, new_tokens=NEW_TOKENS, transpose_state=False):
    """Speculative decoding must give each request's ``references`` row (the model's own greedy
    tokens), accept drafts fully, partly and not at all, and leave every request's conv and
    recurrent states where a plain greedy loop over the same tokens leaves them."""
    drafters = [Drafter(reference, model.config.vocab_size, seed=11 + row) for row, reference in enumerate(references)]
    emitted, cache, paths = speculative_decode(model, prompts, parents, drafters, new_tokens, transpose_state)
    for tokens, reference in zip(emitted, references):
        assert tokens == reference[: len(tokens)]
        assert len(set(tokens)) > 3  # the model does not just repeat a token
    accepted = [len(path) for request in paths for path in request]
    longest = max(depths(parents)) + 1
    # steps with no draft, some drafts (the partial acceptance layout bugs hide in) and all accepted
    assert 1 in accepted and longest in accepted and set(accepted) - {1, longest}, accepted
    assert [len(path) for path in paths[0]] != [len(path) for path in paths[1]]  # the rows diverge
    if parents != list(range(-1, len(parents) - 1)):  # a tree: some accepted path is not the first branch
        assert any(path[1] != 1 for request in paths for path in request if len(path) > 1), paths
    for row, tokens in enumerate(emitted):
        plain, plain_cache = greedy_loop(model, prompts[row: row + 1], len(tokens))
        assert plain == tokens
        for mixer in mixers(model):
            ours, theirs = cache.layers[mixer.layer_idx], plain_cache.layers[mixer.layer_idx]
            torch.testing.assert_close(ours.recurrent_states[0][row], theirs.recurrent_states[0][0],
                                       rtol=1e-4, atol=1e-5)
            # column 0 of transformers' K-column conv state is never read; the package keeps the K-1 others
            # (projections of N tokens at once round differently from one at a time: not bit for bit)
            torch.testing.assert_close(ours.conv_states[0][row, :, 1:], theirs.conv_states[0][0, :, 1:],
                                       rtol=1e-4, atol=1e-5)
    return paths


@pytest.mark.parametrize("draft", ["chain", "tree"])
def test_speculative_decoding_matches_generate(model_and_reference, draft):
    """Every token equals the model's own greedy ``generate``; drafts accepted fully and partly;
    the committed states equal a plain greedy loop's."""
    model, prompts, references = model_and_reference
    decode_and_check(model, prompts, list(range(-1, CHAIN_DRAFT)) if draft == "chain" else TREE_PARENTS, references)


def test_state_in_engine_orientation_is_caught():
    """The mutation the adapter guards against: Qwen3-Next with dk == dv (no shape error to warn)
    and its [Hv, dk, dv] state passed transposed, as SGLang's and vLLM's [Hv, dv, dk] pools need:
    the check above fails (the committed state is the transpose of the model's)."""
    torch.manual_seed(0)
    config = transformers.Qwen3NextConfig(
        vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        layer_types=["linear_attention", "full_attention", "linear_attention"], num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, num_experts=0, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=K, attn_implementation="eager")
    model = seeded_weights(transformers.Qwen3NextForCausalLM(config), 0)
    prompts = torch.randint(0, 48, (BATCH, PROMPT_LEN), generator=torch.Generator().manual_seed(3))
    references = [greedy_loop(model, prompts[row: row + 1], 16)[0] for row in range(BATCH)]
    parents = list(range(-1, CHAIN_DRAFT))
    decode_and_check(model, prompts, parents, references, new_tokens=12)
    with pytest.raises(AssertionError):
        decode_and_check(model, prompts, parents, references, new_tokens=12, transpose_state=True)


def test_transformers_conventions():
    """What differs between transformers' layers and the package, shown on the models themselves."""
    model = tiny_qwen3_next()
    cache = transformers.DynamicCache(config=model.config)
    prompt = torch.randint(0, 48, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True)
    mixer = mixers(model)[0]
    layer = cache.layers[mixer.layer_idx]
    # the conv state holds K columns, the package's K-1 plus a dead oldest one
    assert layer.conv_states[0].shape == (1, mixer.conv_dim, K)
    # the recurrent state is [B, Hv, dk, dv] (dk = 8 != dv = 6 here): the package's orientation
    assert layer.recurrent_states[0].shape == (1, mixer.num_v_heads, mixer.head_k_dim, mixer.head_v_dim)
    ssm_state, conv_state = transformers_layer_states(layer.conv_states[0], layer.recurrent_states[0])
    assert conv_state.shape == (1, 1, mixer.conv_dim, K - 1)
    assert conv_state.data_ptr() == layer.conv_states[0][..., 1:].data_ptr()  # a view: commits land in the cache
    assert ssm_state.data_ptr() == layer.recurrent_states[0].data_ptr()
    # the projection is grouped per key head ([q_h, k_h, v_h, z_h] for each h): its first conv_dim
    # channels are not the conv input; cat(q, k, v) after fix_query_key_value_ordering is
    h = torch.randn(1, 1, model.config.hidden_size)
    qkvz = mixer.in_proj_qkvz(h)
    q, k, v, _, _, _ = mixer.fix_query_key_value_ordering(qkvz, mixer.in_proj_ba(h))
    mixed = torch.cat([t.reshape(1, 1, -1) for t in (q, k, v)], dim=-1)
    assert not torch.equal(qkvz[..., : mixer.conv_dim], mixed)
    assert torch.equal(mixed[..., : mixer.head_k_dim], qkvz[..., : mixer.head_k_dim])  # key head 0's q first
    # GVA: value head h reads key head h // (Hv / Hk), as the package's ops (repeat_interleave there)
    assert mixer.num_v_heads // mixer.num_k_heads == 2
