"""The ring ops, their oracle (reference.RingReference) and the eager flow they replace
(causal_conv1d_verify + capture_gates + gdn_commit) side by side, step by step, on one model."""

from __future__ import annotations

import torch

import sgl_convwin
from sgl_convwin import reference
from support import make_state

FILL = 7.0  # what outputs hold before a call: entries left untouched keep it
CONV_TOL = 1e-5  # conv outputs (float32) against float64, x max |y|
OUT_TOL = {"cpu": 1e-4, "cuda": 2e-3}  # gdn outputs (float32; tf32 products on the GPU) against float64, x max |o|
STATE_TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}  # checkpoints, x max |S|


def within(got, expected, tol, what):
    scale = expected.abs().max().item()
    error = (got.cpu().double() - expected).abs().max().item() if expected.numel() else 0.0
    assert error <= tol * max(scale, 1e-30), f"{what}: max error {error:.3g} against max {scale:.3g}"


class Harness:
    """One model's states, a RingCache, the oracle and an eager ConvWindowCache, on ``device``
    (the oracle on the CPU).

    Gated DeltaNet with Hk key heads, Hv = Hk * ratio value heads, dk, dv; L layers; M ring slots
    (the eager buffer has as many) and S state slots. ``step`` runs one decode step through all
    three and checks every output, checkpoint, cursor and pending row against the oracle."""

    def __init__(self, *, num_layers=2, num_k_heads=1, ratio=2, head_k_dim=4, head_v_dim=4, kernel_size=4,
                 num_draft=3, capacity=None, num_ring_slots=3, num_state_slots=5, ring_dtype=torch.bfloat16,
                 ssm_dtype=torch.float32, conv_dtype=torch.float32, x_dtype=torch.float32, state_layout="dim_major",
                 bias=True, use_qk_l2norm=True, device="cpu", seed=0):
        self.gen = torch.Generator().manual_seed(seed)
        self.device = torch.device(device)
        self.num_layers, self.num_draft = num_layers, num_draft
        self.capacity = num_draft if capacity is None else capacity
        self.kernel_size = kernel_size
        num_v_heads = num_k_heads * ratio
        self.heads = dict(num_k_heads=num_k_heads, head_k_dim=head_k_dim, num_v_heads=num_v_heads,
                          head_v_dim=head_v_dim)
        self.dim = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
        self.ssm_dtype, self.conv_dtype, self.x_dtype = ssm_dtype, conv_dtype, x_dtype
        self.state_layout, self.use_qk_l2norm = state_layout, use_qk_l2norm
        self.ssm_state = self.randn(num_layers, num_state_slots, num_v_heads, head_k_dim, head_v_dim,
                                    scale=0.3).to(ssm_dtype)
        # values the ring's dtype holds, as a prefill in the model's dtype writes them: the eager capture
        # rounds the K-2 history columns it copies through its buffer's dtype, the ring keeps them as they are
        self.ring_dtype = ring_dtype
        self.conv_state = make_state(state_layout, num_layers, num_state_slots, self.dim, kernel_size - 1, ring_dtype,
                                     "cpu", self.gen).to(conv_dtype).to(self.device)
        self.conv_weight = self.randn(num_layers, self.dim, kernel_size, scale=0.5)
        self.conv_bias = self.randn(num_layers, self.dim, scale=0.1) if bias else None
        self.ring = sgl_convwin.RingCache(num_layers, num_ring_slots, self.dim, num_draft, num_v_heads,
                                          capacity=self.capacity, dtype=ring_dtype, device=self.device)
        self.eager = sgl_convwin.ConvWindowCache(num_layers, num_ring_slots, self.dim, num_draft, kernel_size,
                                                 dtype=ring_dtype, gate_heads=num_v_heads, device=self.device)
        self.eager_ssm, self.eager_conv = self.ssm_state.clone(), self.conv_state.clone()
        self.oracle = reference.RingReference(
            self.ssm_state, self.conv_state, self.conv_weight, self.conv_bias, num_ring_slots=num_ring_slots,
            capacity=self.capacity, num_draft=num_draft, use_qk_l2norm=use_qk_l2norm, ring_dtype=ring_dtype,
            state_layout=state_layout, **self.heads)
        self.folds = 0  # checkpoint writes seen in verifies (all layers)

    def randn(self, *shape, scale=1.0):
        return (torch.randn(*shape, generator=self.gen) * scale).to(self.device)

    def layer_bias(self, layer):
        return None if self.conv_bias is None else self.conv_bias[layer]

    def step(self, ring_slots, state_slots, steps, parents=None):
        """One decode step: every layer's verify (conv, then the recurrence), then acceptance."""
        ring_slots, state_slots, steps = (torch.as_tensor(t).to(self.device) for t in (ring_slots, state_slots, steps))
        parents = None if parents is None else torch.as_tensor(parents).to(self.device)
        num_rows, num_nodes = ring_slots.shape[0], self.num_draft
        hk, dk, hv, dv = (self.heads[n] for n in ("num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim"))
        for layer in range(self.num_layers):
            x = self.randn(num_rows, num_nodes, self.dim).to(self.x_dtype)
            conv_out = torch.full((num_rows, num_nodes, self.dim), FILL, device=self.device)
            self.ring.conv1d_verify(conv_out, self.conv_state, x, self.conv_weight[layer], self.layer_bias(layer),
                                    ring_slots, layer, state_slots=state_slots, parents=parents, activation="silu",
                                    state_layout=self.state_layout)
            expected, written = self.oracle.conv_verify(layer, x, ring_slots, state_slots, parents)
            got = conv_out.cpu()
            assert torch.equal(got[~written], torch.full_like(got[~written], FILL)), "an unwritten conv output"
            within(got[written], expected[written], CONV_TOL, f"conv out, layer {layer}")
            self.eager.causal_conv1d_verify(torch.empty_like(conv_out), self.eager_conv, x, self.conv_weight[layer],
                                            self.layer_bias(layer), ring_slots, layer, state_slots=state_slots,
                                            parents=parents, activation="silu", state_layout=self.state_layout)

            q = conv_out[..., :hk * dk].unflatten(-1, (hk, dk))
            k = conv_out[..., hk * dk:2 * hk * dk].unflatten(-1, (hk, dk))
            v = conv_out[..., 2 * hk * dk:].unflatten(-1, (hv, dv))
            g = -torch.nn.functional.softplus(self.randn(num_rows, num_nodes, hv)) * 0.5
            beta = torch.sigmoid(self.randn(num_rows, num_nodes, hv))
            out = torch.full((num_rows, num_nodes, hv, dv), FILL, device=self.device)
            ssm_before, conv_before = self.ssm_state[layer].clone(), self.conv_state[layer].clone()
            self.ring.gdn_verify(out, q, k, v, g, beta, self.ssm_state, self.conv_state, self.conv_weight[layer],
                                 self.layer_bias(layer), ring_slots, layer, state_slots=state_slots, parents=parents,
                                 use_qk_l2norm=self.use_qk_l2norm, state_layout=self.state_layout)
            expected, rows = self.oracle.gdn_verify(layer, q, k, v, g, beta, ring_slots, state_slots, parents)
            skipped = [row for row in range(num_rows) if row not in rows]
            got = out.cpu()
            assert torch.equal(got[skipped], torch.full_like(got[skipped], FILL)), "a skipped row was written"
            within(got[rows], expected[rows], OUT_TOL[self.device.type], f"gdn out, layer {layer}")
            self.check_checkpoints(layer)
            self.folds += int(not torch.equal(conv_before, self.conv_state[layer])
                              or not torch.equal(ssm_before, self.ssm_state[layer]))
            self.eager.capture_gates(g, beta, ring_slots, layer)
        self.ring.accept(ring_slots, steps, parents=parents)
        self.oracle.accept(ring_slots, steps, parents)
        self.eager.gdn_commit(self.eager_ssm, self.eager_conv, self.conv_weight, ring_slots, steps,
                              state_slots=state_slots, parents=parents, conv_bias=self.conv_bias,
                              use_qk_l2norm=self.use_qk_l2norm, state_layout=self.state_layout, **self.heads)
        self.check_ring()

    def flush(self, ring_slots, state_slots):
        """gdn_ring_flush of these slots: the checkpoints against the oracle, the conv windows
        bit for bit against the eager commits', the states against the oracle within STATE_TOL."""
        ring_slots, state_slots = (torch.as_tensor(t).to(self.device) for t in (ring_slots, state_slots))
        self.ring.flush(self.ssm_state, self.conv_state, self.conv_weight, ring_slots, state_slots=state_slots,
                        conv_bias=self.conv_bias, use_qk_l2norm=self.use_qk_l2norm, state_layout=self.state_layout,
                        **self.heads)
        self.oracle.flush(ring_slots, state_slots)
        for layer in range(self.num_layers):
            self.check_checkpoints(layer)
        self.check_ring()
        flushed = [int(s) for r, s in zip(ring_slots, state_slots) if 0 <= r < self.ring.cursor.shape[0] and s >= 0]
        assert torch.equal(self.conv_state[:, flushed], self.eager_conv[:, flushed]), "conv window != eager commit's"
        if torch.promote_types(self.conv_dtype, self.ring_dtype) == self.conv_dtype:
            # (else eager reads earlier steps' inputs rounded to conv_state's dtype, the ring does not)
            within(self.eager_ssm[:, flushed], self.oracle.ssm[:, flushed], STATE_TOL[self.ssm_dtype],
                   "eager commits' state")
        return flushed

    def new_request(self, ring_slot, state_slot):
        """A new request: the prefill writes random states at ``state_slot``, the ring slot is emptied."""
        ssm = self.randn(*self.ssm_state[:, state_slot].shape, scale=0.3).to(self.ssm_dtype)
        conv = self.randn(*self.conv_state[:, state_slot].shape).to(self.ring_dtype).to(self.conv_dtype)
        for ssm_state, conv_state in ((self.ssm_state, self.conv_state), (self.eager_ssm, self.eager_conv)):
            ssm_state[:, state_slot] = ssm
            conv_state[:, state_slot] = conv
        self.ring.reset(torch.tensor([ring_slot, -1], device=self.device))
        self.oracle.reset(ring_slot, state_slot, self.ssm_state, self.conv_state)

    def check_checkpoints(self, layer):
        within(self.ssm_state[layer], self.oracle.ssm[layer], STATE_TOL[self.ssm_dtype], f"checkpoint, layer {layer}")
        window = self.conv_state[layer].cpu()
        assert torch.equal(window, self.oracle.conv_state()[layer]), f"checkpoint window, layer {layer}"

    def check_ring(self):
        """The cursor, and every pending token's row and gates, exactly as the oracle has them."""
        cursor, rows, gates = self.ring.cursor.cpu(), self.ring.rows.cpu(), self.ring.gates.cpu()
        assert torch.equal(cursor.long(), self.oracle.cursor()), (cursor, self.oracle.cursor())
        ring_rows = rows.shape[2]
        for layer in range(self.num_layers):
            for slot, (start, count) in enumerate(self.oracle.cursor().tolist()):
                for j, token in enumerate(self.oracle.pending_tokens(layer, slot)):
                    position = (start + j) % ring_rows
                    assert torch.equal(rows[layer, slot, position], token["x"]), (layer, slot, j)
                    assert torch.equal(gates[layer, slot, position, 0], token["g"]), (layer, slot, j)
                    assert torch.equal(gates[layer, slot, position, 1], token["beta"]), (layer, slot, j)
