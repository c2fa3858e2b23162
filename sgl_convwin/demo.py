"""``python -m sgl_convwin demo``: speculative decoding of a tiny hybrid model through the ops.

The model (plain PyTorch, seeded random weights): an embedding, L mixer layers, a head. Mixers:

- ``gdn`` (the default): Gated DeltaNet -- mixed q/k/v projection -> depthwise causal conv1d ->
  SiLU -> q, k, v (l2-normalised q, k) -> gated delta rule ``S = S*exp(g); S += k (beta*(v - S^T k))^T``
  with g, beta from the layer input -> o = S^T q. Speculative decoding keeps NO recurrent-state
  snapshots: the verify pass captures each node's conv input (``causal_conv1d_verify``) and gates
  (``capture_gates``) and computes the outputs without writing any state; after acceptance
  ``gdn_commit`` replays the accepted path onto the recurrent state and commits the conv window.
- ``mamba2``: Mamba2 -- x/B/C projection -> conv + bias -> SiLU -> ``h = exp(dt*A) h + (dt x) B^T``,
  y = h C + D x, with dt from the layer input; committed by ``mamba2_commit`` the same way.
- ``linear``: a gated linear recurrence h = decay*h + silu(conv) whose per-node states are
  snapshotted during verify; the conv window is committed with ``scatter`` / ``scatter_tree``.

``--ring`` (gdn or mamba2): the ring design (docs/design.md, "The ring") instead of a commit: per
layer ``ring_conv1d_verify`` (its conv history from the checkpoint's window and the ring's pending
rows) and ``gdn_ring_verify`` / ``mamba2_ring_verify`` (replays the pending tokens, folds them into
the checkpoint when the ring would overflow, stores the drafts' gates), then ``ring_accept``;
``gdn_ring_flush`` / ``mamba2_ring_flush`` at the end.

A perturbed copy of the model drafts a chain (topk 1) or a tree (topk > 1); the target verifies
every draft node in one pass per step, greedy acceptance walks the tree. The emitted tokens must
equal plain one-token-at-a-time greedy decoding, exactly.

Why exactly: weights and the values between layers live on a grid of 2**-6 inside [-8, 8]
(rounded after each nonlinearity), so projections and convs are exact in float32 whatever the
order of summation, and the recurrences are computed with the same float32 operations by the plain
decoder, the verify pass and (on the CPU) the commit. An error anywhere in the cache or the replay
shows as a different token stream. (Caches are float32 here: bf16 could not hold these values.)

The recurrent state is the one value that is not on the grid: the decoder and a replay run the same
float32 operations, but PyTorch's CPU kernels can round the last bit differently at another batch
shape (the decoder steps B rows, a replay only the live ones; a request decoded alone already
differs from the batch in the last bit), so a replayed state can differ from the decoder's by an
ulp. The grid rounding after each layer absorbs that unless a value lands within an ulp of a
rounding boundary: rare, not impossible.

The ring mode keeps the same guarantee, no weaker. The ring verify's own outputs come from the
chunked form (a triangular solve for Gated DeltaNet, cumulative decays for Mamba2), which rounds
differently from the decoder's token-by-token steps in most values, not in an occasional last bit:
taking tokens from them would make a grid-boundary flip far likelier, with no bug anywhere. So the
tokens are computed, as in the other modes, by the decoder's recurrence along each draft path,
starting from the state after the pending tokens -- which the ring's own flush materialises on
scratch copies of the checkpoints (the real ones move only by the verify's folds). That flush, the
folds and the replays are ``gdn_commit``'s (``mamba2_commit``'s) float32 operations on what the ring
holds, so any error in the rows, gates, cursor or folds changes the streams. The Mamba2 ring is
given the model's dt (after dt_bias and softplus, as ``capture_gates`` stores it for
``mamba2_commit``), so the ring keeps the decoder's bits. Besides the streams, ring mode checks the
ring verify's outputs against the decoder's (float32 tolerance), and after the last step flushes
every request and compares the checkpoints with the decoder's states (conv windows bit for bit,
recurrent states within float32 rounding).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch

from . import layout as layouts
from .cache import RingCache
from .ops_ring import DEFAULT_CAPACITY, gdn_ring_flush
from .ops_ring_mamba2 import mamba2_ring_flush
from .validation import longest_root_path

GRID = 2.0**-6
LIMIT = 8.0


def on_grid(t: torch.Tensor) -> torch.Tensor:
    """Round to the 2**-6 grid inside [-LIMIT, LIMIT]: keeps later arithmetic exact."""
    return torch.clamp(torch.round(t / GRID) * GRID, -LIMIT, LIMIT)


def seeded_weights(seed: int):
    """weight(*shape, scale): seeded normal draws, one generator per model."""
    g = torch.Generator().manual_seed(seed)
    return lambda *shape, scale: torch.randn(*shape, generator=g) * scale


def set_weights(model, params: dict, seed: int, noise: float, device) -> None:
    """Put ``params`` on the grid as the model's attributes; a drafter (noise > 0) is the same
    model, perturbed."""
    if noise:
        noise_g = torch.Generator().manual_seed(seed + 1)
        params = {k: v + noise * torch.randn(v.shape, generator=noise_g) for k, v in params.items()}
    for name, value in params.items():
        setattr(model, name, on_grid(value).to(device))


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 64
    d_model: int = 32
    conv_dim: int = 32
    kernel_size: int = 4
    layers: int = 3


class TinyHybridLM:
    """Weights on the grid; ``step`` decodes one token per request, ``verify`` a tree of them."""

    def __init__(self, config: ModelConfig, seed: int, device: torch.device, noise: float = 0.0):
        c = config
        weight = seeded_weights(seed)

        params = dict(
            embed=weight(c.vocab, c.d_model, scale=1.0),
            w_in=weight(c.layers, c.d_model, 2 * c.conv_dim, scale=c.d_model**-0.5),
            conv_w=weight(c.layers, c.conv_dim, c.kernel_size, scale=0.5),
            conv_b=weight(c.layers, c.conv_dim, scale=0.1),
            decay=torch.sigmoid(weight(c.layers, c.conv_dim, scale=1.0)),
            w_out=weight(c.layers, c.conv_dim, c.d_model, scale=c.conv_dim**-0.5),
            head=weight(c.d_model, c.vocab, scale=c.d_model**-0.5),
        )
        self.config = config
        set_weights(self, params, seed, noise, device)

    def new_states(self, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero conv state [L, B, C, K-1] and recurrent state [L, B, C] for ``step``."""
        c = self.config
        return (torch.zeros(c.layers, batch, c.conv_dim, c.kernel_size - 1, device=device),
                torch.zeros(c.layers, batch, c.conv_dim, device=device))

    def new_cache(self, slots, num_nodes, layout, tree, device):
        return SpecCache(self.config, slots, num_nodes, layout, tree, device)

    def _project_in(self, x, layer):
        uz = on_grid(x @ self.w_in[layer])
        return uz[..., : self.config.conv_dim], uz[..., self.config.conv_dim :]

    def _mix_out(self, x, h, z, layer):
        y = on_grid(h * torch.nn.functional.silu(z))
        return on_grid(x + y @ self.w_out[layer])

    def step(self, tokens, conv_state, rec_state):
        """One token per request, plain PyTorch (the reference decoder). tokens: [B];
        conv_state: [L, B, C, K-1] and rec_state: [L, B, C], updated in place. Returns logits."""
        x = self.embed[tokens]
        for layer in range(self.config.layers):
            u, z = self._project_in(x, layer)
            window = torch.cat([conv_state[layer], u[:, :, None]], dim=2)  # [B, C, K]
            conv = (window * self.conv_w[layer]).sum(dim=2) + self.conv_b[layer]
            conv_state[layer] = window[:, :, 1:]
            h = on_grid(self.decay[layer] * rec_state[layer] + on_grid(torch.nn.functional.silu(conv)))
            rec_state[layer] = h
            x = self._mix_out(x, h, z, layer)
        return x @ self.head

    def verify(self, tokens, parents, cache, state_slots, buffer_slots):
        """Every node of every request's draft tree in one pass per layer, through the ops.

        tokens: [B, N]; parents: [B, N] (parents[b, 0] = -1: node 0 is the pending token).
        Captures the conv inputs into cache.buffer and the recurrent state after each node into
        cache.snapshots; returns logits [B, N, vocab]. Rows with slot -1 are padding.
        """
        c = self.config
        B, N = tokens.shape
        x = self.embed[tokens]
        read = state_slots.clamp(min=0)
        rows = torch.arange(B, device=tokens.device)
        for layer in range(c.layers):
            u, z = self._project_in(x, layer)
            conv = torch.zeros(B, N, c.conv_dim, device=tokens.device)
            torch.ops.convwin.causal_conv1d_verify(
                conv, cache.buffer, cache.conv_state, u, self.conv_w[layer], self.conv_b[layer],
                buffer_slots, state_slots, layer, cache.parents_arg(parents), layout=cache.layout,
            )
            drive = on_grid(torch.nn.functional.silu(conv))
            h = torch.empty(B, N, c.conv_dim, device=tokens.device)
            for node in range(N):  # the recurrence along each node's path
                parent = parents[:, node]
                previous = torch.where(
                    (parent >= 0)[:, None], h[rows, parent.clamp(min=0)], cache.rec_state[layer, read]
                )
                h[:, node] = on_grid(self.decay[layer] * previous + drive[:, node])
            active = buffer_slots >= 0
            cache.snapshots[layer, buffer_slots[active]] = h[active]
            x = self._mix_out(x, h, z, layer)
        return x @ self.head


@dataclass(frozen=True)
class GDNConfig:
    vocab: int = 64
    d_model: int = 32
    num_k_heads: int = 2
    head_k_dim: int = 8
    num_v_heads: int = 4
    head_v_dim: int = 8
    kernel_size: int = 4
    layers: int = 3

    @property
    def conv_dim(self) -> int:  # q, k, v
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    @property
    def state_shape(self) -> tuple[int, int, int]:
        return (self.num_v_heads, self.head_k_dim, self.head_v_dim)

    @property
    def dims(self) -> dict:
        return dict(num_k_heads=self.num_k_heads, head_k_dim=self.head_k_dim, num_v_heads=self.num_v_heads,
                    head_v_dim=self.head_v_dim)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def gated_delta_step(state, c, g, beta, config: GDNConfig):
    """One token of the gated delta rule for a batch: state [.., Hv, dk, dv] float32, c the conv
    output [.., conv_dim], g, beta [.., Hv]. Returns (new state, output o [.., Hv, dv]).

    The same float32 operations, in the same order, as the commit's CPU path, so that decoding
    token by token here and replaying with ``gdn_commit`` give the same bits."""
    hk, dk, hv, dv = config.num_k_heads, config.head_k_dim, config.num_v_heads, config.head_v_dim
    ratio = hv // hk
    q = _l2norm(c[..., : hk * dk].unflatten(-1, (hk, dk))).repeat_interleave(ratio, dim=-2)
    k = _l2norm(c[..., hk * dk: 2 * hk * dk].unflatten(-1, (hk, dk))).repeat_interleave(ratio, dim=-2)
    v = c[..., 2 * hk * dk:].unflatten(-1, (hv, dv))
    decayed = state * torch.exp(g[..., None, None])
    u = beta[..., None] * (v - (decayed * k[..., None]).sum(-2))
    state = decayed + k[..., None] * u[..., None, :]
    return state, (state * (q * dk**-0.5)[..., None]).sum(-2)


class ReplayLM:
    """A hybrid model whose mixer layers are committed by replay: ``step`` decodes one token per
    request, ``verify`` a tree of them without writing any state. Subclasses give the mixer:
    its weights, gates, one-token recurrence and commit op."""

    num_gates: int  # gates per head and token in the cache (GDN: g, beta; Mamba2: dt)

    def __init__(self, config, seed: int, device: torch.device, noise: float, mixer_params: dict):
        c = config
        weight = seeded_weights(seed)
        params = dict(
            embed=weight(c.vocab, c.d_model, scale=1.0),
            w_in=weight(c.layers, c.d_model, c.conv_dim, scale=c.d_model**-0.5),
            conv_w=weight(c.layers, c.conv_dim, c.kernel_size, scale=0.5),
            conv_b=weight(c.layers, c.conv_dim, scale=0.1),
            head=weight(c.d_model, c.vocab, scale=c.d_model**-0.5),
        )
        params.update({name: weight(*shape, scale=scale) for name, (shape, scale) in mixer_params.items()})
        self.config = config
        set_weights(self, params, seed, noise, device)

    def new_states(self, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero conv state [L, B, conv_dim, K-1] and recurrent state [L, B, *state_shape]."""
        c = self.config
        return (torch.zeros(c.layers, batch, c.conv_dim, c.kernel_size - 1, device=device),
                torch.zeros(c.layers, batch, *c.state_shape, device=device))

    def new_cache(self, slots, num_nodes, layout, tree, device):
        return ReplayCache(self, slots, num_nodes, layout, tree, device)

    def _mix_out(self, x, out, layer):
        return on_grid(x + on_grid(out.flatten(-2)) @ self.w_out[layer])

    def step(self, tokens, conv_state, rec_state):
        """One token per request (the reference decoder). tokens: [B]; conv_state [L, B, C, K-1]
        and rec_state [L, B, *state_shape], updated in place. Returns logits."""
        x = self.embed[tokens]
        for layer in range(self.config.layers):
            u = on_grid(x @ self.w_in[layer])
            window = torch.cat([conv_state[layer], u[:, :, None]], dim=2)  # [B, C, K]
            conv = (window * self.conv_w[layer]).sum(dim=2) + self.conv_b[layer]
            conv_state[layer] = window[:, :, 1:]
            gates = self._gates(x, layer)
            state, out = self._recurrence(rec_state[layer], torch.nn.functional.silu(conv), gates, layer)
            rec_state[layer] = state
            x = self._mix_out(x, out, layer)
        return x @ self.head

    def verify(self, tokens, parents, cache, state_slots, buffer_slots):
        """Every node of every request's draft tree in one pass per layer, writing no state.

        Captures each node's conv input and gates into the cache's buffers (what the commit
        replays); the recurrence along each node's path runs on temporaries. tokens, parents:
        [B, N] (parents[b, 0] = -1: node 0 is the pending token). Returns logits [B, N, vocab]."""
        c = self.config
        B, N = tokens.shape
        x = self.embed[tokens]
        read = state_slots.clamp(min=0)
        rows = torch.arange(B, device=tokens.device)
        for layer in range(c.layers):
            u = on_grid(x @ self.w_in[layer])
            conv = torch.zeros(B, N, c.conv_dim, device=tokens.device)
            torch.ops.convwin.causal_conv1d_verify(
                conv, cache.buffer, cache.conv_state, u, self.conv_w[layer], self.conv_b[layer],
                buffer_slots, state_slots, layer, cache.parents_arg(parents), layout=cache.layout,
                activation="silu",
            )
            gates = self._gates(x, layer)
            torch.ops.convwin.capture_gates(cache.gates, *gates, buffer_slots, layer)
            states = torch.empty(B, N, *c.state_shape, device=tokens.device)
            outs = []
            for node in range(N):  # along each node's path, from the committed state
                parent = parents[:, node]
                ancestor = states[rows, parent.clamp(min=0)]
                previous = torch.where((parent >= 0).view(-1, *[1] * len(c.state_shape)), ancestor,
                                       cache.rec_state[layer, read])
                node_gates = tuple(None if gate is None else gate[:, node] for gate in gates)
                states[:, node], out = self._recurrence(previous, conv[:, node], node_gates, layer)
                outs.append(out)
            x = self._mix_out(x, torch.stack(outs, dim=1), layer)
        return x @ self.head

    def ring_verify(self, tokens, parents, cache, state_slots, ring_slots):
        """``verify`` in ring mode (cache: a RingSpecCache): per layer ``ring_conv1d_verify`` and the
        mixer's ring verify (which folds and stores the gates); the outputs the tokens come from are the
        decoder's recurrence from the state after the pending tokens (the module docstring says why)."""
        c = self.config
        B, N = tokens.shape
        x = self.embed[tokens]
        pending_states = cache.states_after_pending(state_slots, ring_slots)  # [L, B, *state_shape]
        tree_parents = cache.parents_arg(parents)
        rows = torch.arange(B, device=tokens.device)
        live = state_slots >= 0
        for layer in range(c.layers):
            u = on_grid(x @ self.w_in[layer])
            conv = torch.zeros(B, N, c.conv_dim, device=tokens.device)
            cache.ring.conv1d_verify(conv, cache.conv_state, u, self.conv_w[layer], self.conv_b[layer], ring_slots,
                                     layer, state_slots=state_slots, parents=tree_parents, activation="silu")
            gates = self._gates(x, layer)
            ring_out = self._ring_mixer(cache, conv, gates, ring_slots, state_slots, layer, tree_parents)
            states = torch.empty(B, N, *c.state_shape, device=tokens.device)
            outs = []
            for node in range(N):  # along each node's path, from the state after the pending tokens
                parent = parents[:, node]
                previous = torch.where((parent >= 0).view(-1, *[1] * len(c.state_shape)),
                                       states[rows, parent.clamp(min=0)], pending_states[layer])
                node_gates = tuple(None if gate is None else gate[:, node] for gate in gates)
                states[:, node], out = self._recurrence(previous, conv[:, node], node_gates, layer)
                outs.append(out)
            outs = torch.stack(outs, dim=1)
            cache.note_outputs(ring_out[live], outs[live])
            x = self._mix_out(x, outs, layer)
        return x @ self.head


class TinyGDNLM(ReplayLM):
    """Gated DeltaNet layers: g, beta from the layer input, the gated delta rule, o = S^T q."""

    num_gates = 2
    ring_op = "gdn_ring_verify"  # named in the ring's check lines

    def __init__(self, config: GDNConfig, seed: int, device: torch.device, noise: float = 0.0):
        c = config
        super().__init__(config, seed, device, noise, dict(
            w_a=((c.layers, c.d_model, c.num_v_heads), c.d_model**-0.5),
            w_b=((c.layers, c.d_model, c.num_v_heads), c.d_model**-0.5),
            a_log=((c.layers, c.num_v_heads), 0.5),
            dt_bias=((c.layers, c.num_v_heads), 0.5),
            w_out=((c.layers, c.num_v_heads * c.head_v_dim, c.d_model), 0.5),
        ))

    def _gates(self, x, layer):
        """g = -exp(A_log) * softplus(a + dt_bias) <= 0 and beta = sigmoid(b), per value head."""
        a = x @ self.w_a[layer]
        g = -torch.exp(self.a_log[layer]) * torch.nn.functional.softplus(a + self.dt_bias[layer])
        return g, torch.sigmoid(x @ self.w_b[layer])

    def _recurrence(self, state, c, gates, layer):
        return gated_delta_step(state, c, *gates, self.config)

    def commit(self, cache, state_slots, buffer_slots, accepted, parents):
        torch.ops.convwin.gdn_commit(
            cache.rec_state, cache.conv_state, cache.buffer, cache.gates, self.conv_w, state_slots, buffer_slots,
            accepted, parents, self.conv_b, layout=cache.layout, **self.config.dims,
        )

    def _ring_mixer(self, cache, conv, gates, ring_slots, state_slots, layer, parents):
        """``gdn_ring_verify`` of one layer (folds, stores g, beta): its outputs [B, N, Hv, dv]."""
        c = self.config
        hk, dk, hv, dv = c.num_k_heads, c.head_k_dim, c.num_v_heads, c.head_v_dim
        q, k, v = conv.split([hk * dk, hk * dk, hv * dv], dim=-1)
        ring_out = torch.zeros(*conv.shape[:2], hv, dv, device=conv.device)
        cache.ring.gdn_verify(ring_out, q.unflatten(-1, (hk, dk)), k.unflatten(-1, (hk, dk)), v.unflatten(-1, (hv, dv)),
                              *gates, cache.rec_state, cache.conv_state, self.conv_w[layer], self.conv_b[layer],
                              ring_slots, layer, state_slots=state_slots, parents=parents)
        return ring_out

    def ring_flush(self, ssm_state, conv_state, cursor, rows, gates, ring_slots, state_slots):
        gdn_ring_flush(ssm_state, conv_state, cursor, rows, gates, self.conv_w, ring_slots, state_slots,
                       conv_bias=self.conv_b, **self.config.dims)


@dataclass(frozen=True)
class Mamba2Config:
    vocab: int = 64
    d_model: int = 32
    num_heads: int = 4
    head_dim: int = 8
    n_groups: int = 2
    d_state: int = 8
    kernel_size: int = 4
    layers: int = 3

    @property
    def conv_dim(self) -> int:  # x, B, C
        return self.num_heads * self.head_dim + 2 * self.n_groups * self.d_state

    @property
    def state_shape(self) -> tuple[int, int, int]:
        return (self.num_heads, self.head_dim, self.d_state)

    @property
    def dims(self) -> dict:
        return dict(num_heads=self.num_heads, head_dim=self.head_dim, n_groups=self.n_groups, d_state=self.d_state)


def mamba2_step(state, c, dt, rate, config: Mamba2Config):
    """One token of the Mamba2 recurrence for a batch: state [.., H, P, Ns] float32, c the conv
    output [.., conv_dim], dt [.., H], rate [H] (A = -exp(A_log)). Returns (new state, y [.., H, P]).
    The same float32 operations as the commit's CPU path."""
    h, p, g, n = config.num_heads, config.head_dim, config.n_groups, config.d_state
    x = c[..., : h * p].unflatten(-1, (h, p))
    b = c[..., h * p: h * p + g * n].unflatten(-1, (g, n)).repeat_interleave(h // g, dim=-2)
    c_out = c[..., h * p + g * n:].unflatten(-1, (g, n)).repeat_interleave(h // g, dim=-2)
    dt = dt[..., None, None]
    state = torch.exp(dt * rate[:, None, None]) * state + (dt * x[..., None]) * b[..., None, :]
    return state, (state * c_out[..., None, :]).sum(-1)


class TinyMamba2LM(ReplayLM):
    """Mamba2 layers: dt from the layer input, h = exp(dt A) h + (dt x) B^T, y = h C + D x."""

    num_gates = 1
    ring_op = "mamba2_ring_verify"

    def __init__(self, config: Mamba2Config, seed: int, device: torch.device, noise: float = 0.0):
        c = config
        super().__init__(config, seed, device, noise, dict(
            w_dt=((c.layers, c.d_model, c.num_heads), c.d_model**-0.5),
            dt_bias=((c.layers, c.num_heads), 0.5),
            a_log=((c.layers, c.num_heads), 0.5),
            d_skip=((c.layers, c.num_heads), 0.5),
            w_out=((c.layers, c.num_heads * c.head_dim, c.d_model), (c.num_heads * c.head_dim) ** -0.5),
        ))
        self.rate = -torch.exp(self.a_log)  # [L, H], what the commit takes

    def _gates(self, x, layer):
        """dt = softplus(x w_dt + dt_bias) > 0 per head (no beta)."""
        return torch.nn.functional.softplus(x @ self.w_dt[layer] + self.dt_bias[layer]), None

    def _recurrence(self, state, c, gates, layer):
        state, y = mamba2_step(state, c, gates[0], self.rate[layer], self.config)
        x = c[..., : self.config.num_heads * self.config.head_dim].unflatten(-1, self.config.state_shape[:2])
        return state, y + self.d_skip[layer][:, None] * x

    def commit(self, cache, state_slots, buffer_slots, accepted, parents):
        torch.ops.convwin.mamba2_commit(
            cache.rec_state, cache.conv_state, cache.buffer, cache.gates, self.conv_w, self.rate, state_slots,
            buffer_slots, accepted, parents, self.conv_b, layout=cache.layout, **self.config.dims,
        )

    def _ring_mixer(self, cache, conv, gates, ring_slots, state_slots, layer, parents):
        """``mamba2_ring_verify`` of one layer with the model's dt (folds, stores dt): its outputs
        [B, N, H, P], D x included."""
        c = self.config
        h, p, g, n = c.num_heads, c.head_dim, c.n_groups, c.d_state
        x, B, C = conv.split([h * p, g * n, g * n], dim=-1)
        ring_out = torch.zeros(*conv.shape[:2], h, p, device=conv.device)
        cache.ring.mamba2_verify(ring_out, x.unflatten(-1, (h, p)), gates[0], self.rate[layer], B.unflatten(-1, (g, n)),
                                 C.unflatten(-1, (g, n)), cache.rec_state, cache.conv_state, self.conv_w[layer],
                                 self.conv_b[layer], ring_slots, layer, state_slots=state_slots, parents=parents,
                                 D=self.d_skip[layer])
        return ring_out

    def ring_flush(self, ssm_state, conv_state, cursor, rows, gates, ring_slots, state_slots):
        mamba2_ring_flush(ssm_state, conv_state, cursor, rows, gates, self.conv_w, self.rate, ring_slots, state_slots,
                          conv_bias=self.conv_b, **self.config.dims)


def tree_parents(num_nodes: int, topk: int) -> list[int]:
    """Node 0 is the pending token; then each node in order gets topk children (topk 1: a chain)."""
    return [-1] + [(n - 1) // topk for n in range(1, num_nodes)]


class SpecCache:
    """The engine side: conv and recurrent state per slot, the window buffer of one layout, the
    recurrent snapshots per draft node (dense)."""

    def __init__(self, config, slots, num_nodes, layout, tree, device):
        c = config
        self.layout, self.tree = layout, tree
        self.num_nodes = num_nodes
        self.conv_state = torch.zeros(c.layers, slots, c.conv_dim, c.kernel_size - 1, device=device)
        self.rec_state = torch.zeros(c.layers, slots, c.conv_dim, device=device)
        self.buffer = torch.ops.convwin.alloc(
            c.layers, slots, c.conv_dim, num_nodes, c.kernel_size, layout, torch.float32, torch.device(device)
        )
        self.snapshots = torch.zeros(c.layers, slots, num_nodes, c.conv_dim, device=device)
        self.kernel_size = c.kernel_size

    def parents_arg(self, parents):
        return parents if self.tree else None

    def speculative_nbytes_per_slot(self) -> int:
        return (self.buffer[:, 0].numel() * self.buffer.element_size()
                + self.snapshots[:, 0].numel() * self.snapshots.element_size())

    def snapshot_nbytes_per_slot(self) -> int:
        c = self.buffer.shape
        windows = layouts.physical_nbytes(layouts.DENSE, c[0], 1, self.snapshots.shape[-1], self.num_nodes,
                                          self.kernel_size, torch.float32)
        return windows + self.snapshots[:, 0].numel() * self.snapshots.element_size()

    def commit(self, state_slots, buffer_slots, accepted, parents):
        """The accepted node's conv window (one launch, all layers) and recurrent snapshot."""
        if self.tree and self.layout != layouts.DENSE:
            rows = self.buffer if self.layout == layouts.TOKEN_MAJOR else self.buffer.transpose(-1, -2)
            torch.ops.convwin.scatter_tree(self.conv_state, rows, state_slots, buffer_slots, accepted, parents)
        else:
            windows = layouts.window_view(self.buffer, self.layout, self.num_nodes, self.kernel_size)
            torch.ops.convwin.scatter(self.conv_state, windows, state_slots, buffer_slots, accepted)
        active = accepted >= 0
        self.rec_state[:, state_slots[active]] = self.snapshots[:, buffer_slots[active], accepted[active]]


class ReplayCache:
    """The engine side of the replay design: conv and recurrent state per slot, the conv-input
    buffer of one layout and the gates -- no recurrent-state snapshots."""

    def __init__(self, model: ReplayLM, slots, num_nodes, layout, tree, device):
        c = model.config
        self.model, self.config, self.layout, self.tree, self.num_nodes = model, c, layout, tree, num_nodes
        self.conv_state, self.rec_state = model.new_states(slots, device)
        self.buffer = torch.ops.convwin.alloc(
            c.layers, slots, c.conv_dim, num_nodes, c.kernel_size, layout, torch.float32, torch.device(device)
        )
        self.gates = torch.ops.convwin.alloc_gates(c.layers, slots, num_nodes, c.state_shape[0], model.num_gates,
                                                   torch.float32, torch.device(device))

    def parents_arg(self, parents):
        return parents if self.tree else None

    def speculative_nbytes_per_slot(self) -> int:
        return (self.buffer[:, 0].numel() * self.buffer.element_size()
                + self.gates[:, 0].numel() * self.gates.element_size())

    def snapshot_nbytes_per_slot(self) -> int:
        """What a snapshot design keeps per slot: dense conv windows and a state per node."""
        c = self.config
        windows = c.layers * self.num_nodes * c.conv_dim * (c.kernel_size - 1) * 4
        return windows + c.layers * self.num_nodes * self.rec_state[0, 0].numel() * 4

    def commit(self, state_slots, buffer_slots, accepted, parents):
        """Replay the accepted path onto both states: all layers, no snapshots."""
        self.model.commit(self, state_slots, buffer_slots, accepted, self.parents_arg(parents))


class RingSpecCache:
    """The engine side of the ring design: conv and recurrent state per slot as CHECKPOINTS, and a
    RingCache (float32 rows, as the other caches here) holding the pending tokens and the drafts;
    trees fold by their depth (``tree_depth``)."""

    def __init__(self, model: ReplayLM, slots, num_nodes, parents, capacity, device):
        c = model.config
        self.model, self.config, self.tree, self.num_nodes = model, c, parents is not None, num_nodes
        self.conv_state, self.rec_state = model.new_states(slots, device)
        depth = None if parents is None else longest_root_path(parents)
        self.ring = RingCache(c.layers, slots, c.conv_dim, num_nodes, c.state_shape[0], capacity=capacity,
                              dtype=torch.float32, device=device, num_gates=model.num_gates, tree_depth=depth)
        self.most_accepted = depth or num_nodes  # (the fold rule's)
        self.folds = 0  # (request, step) pairs whose verify folded
        self.max_out_error = 0.0  # the ring verify's outputs against the decoder's, relative to max |o|

    def parents_arg(self, parents):
        return parents if self.tree else None

    def speculative_nbytes_per_slot(self) -> int:
        """alloc_ring's rows, gates and cursor of one slot (the checkpoints not counted)."""
        return self.ring.nbytes // self.ring.cursor.shape[0]

    def snapshot_nbytes_per_slot(self) -> int:
        c = self.config
        windows = c.layers * self.num_nodes * c.conv_dim * (c.kernel_size - 1) * 4
        return windows + c.layers * self.num_nodes * self.rec_state[0, 0].numel() * 4

    def states_after_pending(self, state_slots, ring_slots):
        """[L, B, *state_shape]: each row's checkpoint after its pending tokens, by the ring's flush on
        scratch copies (the checkpoints and the cursor stay as they are)."""
        ssm, conv, cursor = self.rec_state.clone(), self.conv_state.clone(), self.ring.cursor.clone()
        self.model.ring_flush(ssm, conv, cursor, self.ring.rows, self.ring.gates, ring_slots, state_slots)
        return ssm[:, state_slots.clamp(min=0)]

    def note_outputs(self, ring_out, decoder_out):
        if decoder_out.numel():
            error = (ring_out - decoder_out).abs().max() / decoder_out.abs().max().clamp(min=1e-30)
            self.max_out_error = max(self.max_out_error, float(error))

    def commit(self, state_slots, ring_slots, accepted, parents):
        """ring_accept: a cursor advance (a tree's accepted path made contiguous); counts the folds the
        verify made by the same rule (pending > 0 and pending + T > capacity, T: tree_depth or N)."""
        live = ring_slots >= 0
        pending = self.ring.pending[ring_slots[live]]
        self.folds += int(((pending > 0) & (pending + self.most_accepted > self.ring.capacity)).sum())
        self.ring.accept(ring_slots, accepted, parents=self.parents_arg(parents))

    def flush(self, slots):
        """Every pending token of ``slots`` into their checkpoints (the ring's flush), all layers."""
        self.model.ring_flush(self.rec_state, self.conv_state, self.ring.cursor, self.ring.rows, self.ring.gates, slots,
                              slots)


def decoder_states(target, contexts):
    """Each request's (conv state, recurrent state) after all but the last token of its context, by
    plain one-token steps of all requests in one batch, as ``greedy_reference`` decodes them (PyTorch's
    CPU kernels may round the last bit differently at another batch size): what a flushed
    checkpoint must hold, bit for bit."""
    device = target.embed.device
    lengths = [len(context) - 1 for context in contexts]
    longest = max(lengths)
    tokens = torch.tensor([context[:-1] + [0] * (longest - length) for context, length in zip(contexts, lengths)],
                          device=device)  # the padding tokens are decoded after the request's states are taken
    conv_state, rec_state = target.new_states(len(contexts), device)
    states = [None] * len(contexts)
    for position in range(longest + 1):
        for b, length in enumerate(lengths):
            if length == position:
                states[b] = (conv_state[:, b].clone(), rec_state[:, b].clone())
        if position < longest:
            target.step(tokens[:, position], conv_state, rec_state)
    return states


def greedy_reference(target, prompts, new_tokens):
    """Plain greedy decoding, one token at a time: the streams speculative decoding must equal."""
    B, device = len(prompts), target.embed.device
    conv_state, rec_state = target.new_states(B, device)
    prompt = torch.tensor(prompts, device=device)
    for t in range(prompt.shape[1]):
        logits = target.step(prompt[:, t], conv_state, rec_state)
    streams = [[] for _ in range(B)]
    for _ in range(new_tokens):
        token = logits.argmax(dim=-1)
        for b in range(B):
            streams[b].append(int(token[b]))
        logits = target.step(token, conv_state, rec_state)
    return streams


def draft_tree(drafter, contexts, parents_list, topk, window=12):
    """Tokens of every node (node 0 = the pending token, the context's last), from the drafter's
    top-k at each parent's path; the drafter re-reads the last ``window`` tokens (no cache)."""
    num_nodes = len(parents_list)
    trees = [[ctx[-1]] + [None] * (num_nodes - 1) for ctx in contexts]
    children = {p: [n for n in range(num_nodes) if parents_list[n] == p] for p in range(num_nodes)}
    for parent in range(num_nodes):
        if not children[parent]:
            continue
        paths = []
        for b, ctx in enumerate(contexts):
            path, node = [], parent
            while node > 0:
                path.append(trees[b][node])
                node = parents_list[node]
            paths.append((list(ctx) + path[::-1])[-window:])
        length = max(len(p) for p in paths)
        device = drafter.embed.device
        conv_state, rec_state = drafter.new_states(len(paths), device)
        padded = torch.tensor([[p[0]] * (length - len(p)) + p for p in paths], device=device)
        for t in range(length):
            logits = drafter.step(padded[:, t], conv_state, rec_state)
        ranked = logits.topk(max(topk, 1), dim=-1).indices.tolist()
        for b in range(len(contexts)):
            for rank, child in enumerate(children[parent]):
                trees[b][child] = ranked[b][rank]
    return trees


@dataclass
class DecodeResult:
    streams: list[list[int]]
    request_steps: int  # (request, verify step) pairs that were not padding
    accepted: int  # draft tokens accepted, over all requests
    cache: SpecCache | ReplayCache | RingSpecCache
    spare_slots_untouched: bool  # the slots no request used are still zero
    contexts: list[list[int]]  # each request's prompt and every token emitted (the last one not yet decoded)


def speculative_decode(target, drafter, prompts, new_tokens, layout, num_nodes, topk, device, progress=None,
                       capacity=None):
    """Speculative decoding of every prompt to ``new_tokens`` tokens with one cache layout, or, with
    ``capacity`` (a TinyGDNLM or TinyMamba2LM target), with a ring of that capacity, flushed after the
    last step."""
    B = len(prompts)
    tree = topk > 1
    parents_list = tree_parents(num_nodes, topk)
    if capacity is None:
        cache, verify = target.new_cache(B + 2, num_nodes, layout, tree, device), target.verify  # two spare slots
    else:
        cache = RingSpecCache(target, B + 2, num_nodes, parents_list if tree else None, capacity, device)
        verify = target.ring_verify
    slots = torch.arange(B, device=device) + 1  # slot 0 stays untouched
    # prefill: the prompt but its last token (the pending one), one token at a time
    prompt = torch.tensor(prompts, device=device)
    conv, rec = cache.conv_state[:, slots], cache.rec_state[:, slots]
    for t in range(prompt.shape[1] - 1):
        target.step(prompt[:, t], conv, rec)
    cache.conv_state[:, slots], cache.rec_state[:, slots] = conv, rec
    contexts = [list(p) for p in prompts]
    streams = [[] for _ in range(B)]
    parents = torch.tensor([parents_list] * B, device=device)
    request_steps = accepted_total = 0
    while any(len(s) < new_tokens for s in streams):
        done = torch.tensor([len(s) >= new_tokens for s in streams], device=device)
        state_slots = torch.where(done, -1, slots)  # finished requests: padding rows
        buffer_slots = state_slots
        tokens = torch.tensor(draft_tree(drafter, contexts, parents_list, topk), device=device)
        logits = verify(tokens, parents, cache, state_slots, buffer_slots)
        prediction = logits.argmax(dim=-1).tolist()
        accepted = []
        for b in range(B):
            if done[b]:
                accepted.append(-1)
                continue
            node, emitted = 0, []
            while True:
                want = prediction[b][node]
                child = next((m for m in range(num_nodes) if parents_list[m] == node and int(tokens[b, m]) == want), None)
                if child is None:
                    emitted.append(want)  # the bonus token: the target's own choice
                    break
                emitted.append(want)
                node = child
            accepted_total += len(emitted) - 1
            request_steps += 1
            accepted.append(node)
            room = new_tokens - len(streams[b])
            streams[b].extend(emitted[:room])
            contexts[b].extend(emitted)
        cache.commit(state_slots, buffer_slots, torch.tensor(accepted, device=device), parents)
        if progress is not None:
            progress(sum(min(len(s), new_tokens) for s in streams), B * new_tokens)
    spare = [0, B + 1]
    untouched = not cache.conv_state[:, spare].any() and not cache.rec_state[:, spare].any()
    if capacity is not None:
        untouched &= not cache.ring.rows[:, spare].any() and not cache.ring.cursor[spare].any()
        cache.flush(slots)
    return DecodeResult(streams, request_steps, accepted_total, cache, untouched, contexts)


def tree_levels(parents_list: list[int]) -> int:
    """The levels below the root (a chain of N: N - 1); the ops' tree_depth counts the root too."""
    return longest_root_path(parents_list) - 1


def progress_bar(label: str, stream=sys.stderr):
    def update(done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        stream.write(f"\r  {label:34} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} tokens")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return update


MIXERS = ("gdn", "mamba2", "linear")
RING_MIXERS = ("gdn", "mamba2")


def run_demo(
    device="cpu", new_tokens=24, batch=4, prompt_len=6, draft=4, tree_nodes=8, topk=3,
    layers=3, seed=0, noise=0.01, layouts_to_run=layouts.LAYOUTS, show_progress=True, out=None,
    mixer="gdn", ring=False, capacity=DEFAULT_CAPACITY,
) -> bool:
    """Run every layout (``ring``: the ring of ``capacity`` instead) with a chain and a tree; print the
    table; True if every stream matched."""
    if mixer not in MIXERS:
        raise ValueError(f"mixer must be one of {MIXERS}, got {mixer!r}")
    if ring and mixer not in RING_MIXERS:
        raise ValueError(f"the ring takes a replayed mixer: ring=True needs mixer 'gdn' or 'mamba2', got {mixer!r}")
    if ring and capacity < max(draft, tree_nodes):
        raise ValueError(f"ring capacity {capacity} must be >= the tokens verified per step "
                         f"({max(draft, tree_nodes)}: a slot holds its pending tokens and one step's drafts)")
    out = sys.stdout if out is None else out  # read at call time: the caller may have replaced it
    # The model's tensors are tiny: intra-op threads only spin (minutes instead of seconds on two
    # busy cores), so the demo runs on one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_demo(device, new_tokens, batch, prompt_len, draft, tree_nodes, topk, layers, seed, noise,
                         layouts_to_run, show_progress, out, mixer, capacity if ring else None)
    finally:
        torch.set_num_threads(threads)


def _run_demo(device, new_tokens, batch, prompt_len, draft, tree_nodes, topk, layers, seed, noise,
              layouts_to_run, show_progress, out, mixer, capacity) -> bool:
    model, config_type = {"gdn": (TinyGDNLM, GDNConfig), "mamba2": (TinyMamba2LM, Mamba2Config),
                          "linear": (TinyHybridLM, ModelConfig)}[mixer]
    config = config_type(layers=layers)
    target = model(config, seed, torch.device(device))
    drafter = model(config, seed, torch.device(device), noise=noise)
    g = torch.Generator().manual_seed(seed + 2)
    prompts = torch.randint(0, config.vocab, (batch, prompt_len), generator=g).tolist()
    expected = greedy_reference(target, prompts, new_tokens)
    shapes = [("chain", draft, 1), ("tree", tree_nodes, topk)]
    if capacity is not None:
        layouts_to_run = [f"ring R={capacity}"]
    speculative_decode(target, drafter, prompts[:1], 2, layouts_to_run[0], draft, 1, device,
                       capacity=capacity)  # warm-up
    rows, ring_lines, all_ok = [], [], True
    for shape_name, num_nodes, k in shapes:
        parents_list = tree_parents(num_nodes, k)
        for layout in layouts_to_run:
            label = f"{layout}, {shape_name} (N={num_nodes}, topk {k})"
            progress = progress_bar(label) if show_progress else None
            start = time.perf_counter()
            result = speculative_decode(target, drafter, prompts, new_tokens, layout, num_nodes, k, device, progress,
                                        capacity=capacity)
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
            identical = result.streams == expected and result.spare_slots_untouched
            if capacity is not None:
                identical &= _ring_checks(target, result, shape_name, num_nodes, k, ring_lines)
            all_ok &= identical
            nbytes = result.cache.speculative_nbytes_per_slot()
            snapshot = result.cache.snapshot_nbytes_per_slot()
            steps, depth = max(result.request_steps, 1), tree_levels(parents_list)
            rows.append((layout, f"{shape_name} N={num_nodes} topk {k}", identical,
                         result.accepted / (steps * depth) if depth else None,  # one node: nothing drafted
                         (result.accepted + result.request_steps) / steps, nbytes, nbytes / snapshot,
                         batch * new_tokens / seconds))
    what = {"gdn": "Gated DeltaNet layers, committed by replay (gdn_commit, no state snapshots)",
            "mamba2": "Mamba2 layers, committed by replay (mamba2_commit, no state snapshots)",
            "linear": "linear-recurrence layers, per-node state snapshots"}[mixer]
    if capacity is not None:
        title, prefix = {"gdn": ("Gated DeltaNet", "gdn"), "mamba2": ("Mamba2", "mamba2")}[mixer]
        what = (f"{title} layers on the ring, capacity {capacity} (ring_conv1d_verify, {prefix}_ring_verify, "
                f"ring_accept; no commit, {prefix}_ring_flush at the end)")
    print(f"\nspeculative decoding of a {config.layers}-layer hybrid model ({what}; dim {config.d_model}, conv "
          f"{config.conv_dim}, K={config.kernel_size}), {batch} requests x {new_tokens} tokens, "
          f"{device}, seed {seed}", file=out)
    print("| layout | draft | identical to greedy | acceptance rate | tokens per verify step | "
          "speculative state per slot (bytes) | vs snapshot design | tokens/s |", file=out)
    print("|---|---|---|---|---|---|---|---|", file=out)
    for layout, shape, identical, rate, per_step, nbytes, ratio, tps in rows:
        rate_text = "n/a" if rate is None else f"{rate:.0%}"
        print(f"| {layout} | {shape} | {'yes' if identical else 'NO'} | {rate_text} | {per_step:.2f} | "
              f"{nbytes} | {ratio:.3f}x | {tps:.0f} |", file=out)
    print("acceptance rate: accepted draft tokens / (request-steps x tree depth); tokens per verify step "
          "per request include the target's bonus token; speculative state: what the cache keeps per slot "
          "besides the committed states (the snapshot design: dense conv windows + one float32 state per "
          "draft node); tokens/s: wall time of this tiny model on this machine, not a benchmark", file=out)
    for line in ring_lines:
        print(line, file=out)
    print("all streams identical to greedy decoding" if all_ok else "STREAMS DIFFER", file=out)
    return all_ok


RING_OUT_TOL = 1e-4  # the ring verify's outputs (float32, chunked) against the decoder's, x max |o|
RING_STATE_TOL = 1e-5  # flushed recurrent states against the decoder's (float32 rounding), x max |S|


def _ring_checks(target, result, shape_name, num_nodes, topk, lines) -> bool:
    """The ring's own checks, one line: the flushed checkpoints hold the decoder's conv windows bit for
    bit and its recurrent states within RING_STATE_TOL, and the ring verify's outputs are the
    decoder's within RING_OUT_TOL. True if all hold."""
    cache = result.cache
    expected = decoder_states(target, result.contexts)
    slots = range(1, len(expected) + 1)
    windows_equal = all(torch.equal(cache.conv_state[:, slot], conv) for slot, (conv, _) in zip(slots, expected))
    state_error = max(float((cache.rec_state[:, slot] - rec).abs().max() / rec.abs().max().clamp(min=1e-30))
                      for slot, (_, rec) in zip(slots, expected))
    states_close, outputs_close = state_error <= RING_STATE_TOL, cache.max_out_error <= RING_OUT_TOL
    lines.append(f"ring, {shape_name} N={num_nodes} topk {topk}: {cache.folds} folds in {result.request_steps} "
                 f"request-steps; flushed checkpoints against the decoder's states: conv windows "
                 f"{'identical' if windows_equal else 'DIFFER'}, recurrent states max error {state_error:.1e} x "
                 f"max |S| ({'within' if states_close else 'BEYOND'} {RING_STATE_TOL:g}); {target.ring_op}'s outputs: "
                 f"max error {cache.max_out_error:.1e} x max |o| ({'within' if outputs_close else 'BEYOND'} "
                 f"{RING_OUT_TOL:g})")
    return windows_equal and states_close and outputs_close
