"""The ring ops, their oracle (reference.RingReference, Mamba2RingReference) and the eager flow they
replace (causal_conv1d_verify + capture_gates + gdn_commit / mamba2_commit) side by side, step by
step, on one model; and ``run_sequence``, a random run of decode steps through all three."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import sgl_convwin
from sgl_convwin import reference
from support import HAS_TRITON, INTERPRET, make_state, sprinkled, trees

FILL = 7.0  # what outputs hold before a call: entries left untouched keep it
CONV_TOL = 1e-5  # conv outputs (float32) against float64, x max |y|
OUT_TOL = {"cpu": 1e-4, "cuda": 2e-3}  # recurrence outputs (float32; tf32 products on GPUs) vs float64, x max |o|
# ... where the ops' bfloat16 checkpoint and the oracle's are each one's own rounding (an ulp apart at
# times), which later drafts read: on CUDA, and after a due flush; gdn_verify's bf16-state tolerance
ROUNDED_STATE_OUT_TOL = 2e-2
STATE_TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}  # checkpoints, x max |S|
GATE_RTOL = 1e-6  # a dt the op computed (dt_bias, softplus) in float32 against float64 rounded to float32


def within(got, expected, tol, what):
    scale = expected.abs().max().item()
    error = (got.cpu().double() - expected).abs().max().item() if expected.numel() else 0.0
    assert error <= tol * max(scale, 1e-30), f"{what}: max error {error:.3g} against max {scale:.3g}"


class RingHarness:
    """One model's states, a RingCache, the ring's oracle and an eager ConvWindowCache, on ``device``
    (the oracle on the CPU);
    the mixer (its dims, verify, commit and flush) comes from a subclass, which sets ``dim``,
    ``state_shape``, ``gate_heads`` and ``num_gates`` before calling this ``__init__``.

    L layers; M ring slots (the eager buffer has as many) and S state slots. ``step`` runs one
    decode step through all three and checks every output, checkpoint, cursor and pending row
    against the oracle. With ``due_first`` each step begins with the flush of the rows its verify
    would fold (``due_only``), the oracle's too: every check is the same, but a bfloat16
    checkpoint's outputs (ROUNDED_STATE_OUT_TOL)."""

    num_gates: int  # per head and token in the ring's gates (GDN: g, beta; Mamba2: dt)

    def __init__(self, *, num_layers, kernel_size, num_draft, capacity, num_ring_slots, num_state_slots, ring_dtype,
                 ssm_dtype, conv_dtype, x_dtype, state_layout, bias, device, seed, due_first=False,
                 strong_decays=False, tree_depth=None):
        self.gen = torch.Generator().manual_seed(seed)
        self.tree_depth = tree_depth
        self.due_first, self.strong_decays = due_first, strong_decays
        self.device = torch.device(device)
        self.num_layers, self.num_draft = num_layers, num_draft
        self.capacity = num_draft if capacity is None else capacity
        self.kernel_size = kernel_size
        self.num_ring_slots = num_ring_slots
        self.ssm_dtype, self.conv_dtype, self.x_dtype = ssm_dtype, conv_dtype, x_dtype
        self.state_layout = state_layout
        self.ssm_state = self.randn(num_layers, num_state_slots, *self.state_shape, scale=0.3).to(ssm_dtype)
        # values the ring's dtype holds, as a prefill in the model's dtype writes them: the eager capture
        # rounds the K-2 history columns it copies through its buffer's dtype, the ring keeps them as they are
        self.ring_dtype = ring_dtype
        self.conv_state = make_state(state_layout, num_layers, num_state_slots, self.dim, kernel_size - 1, ring_dtype,
                                     "cpu", self.gen).to(conv_dtype).to(self.device)
        self.conv_weight = self.randn(num_layers, self.dim, kernel_size, scale=0.5)
        self.conv_bias = self.randn(num_layers, self.dim, scale=0.1) if bias else None
        self.draw_mixer_weights()
        self.ring = sgl_convwin.RingCache(num_layers, num_ring_slots, self.dim, num_draft, self.gate_heads,
                                          capacity=self.capacity, dtype=ring_dtype, num_gates=self.num_gates,
                                          device=self.device, tree_depth=tree_depth)
        self.eager = sgl_convwin.ConvWindowCache(num_layers, num_ring_slots, self.dim, num_draft, kernel_size,
                                                 dtype=ring_dtype, gate_heads=self.gate_heads,
                                                 num_gates=self.num_gates, device=self.device)
        self.eager_ssm, self.eager_conv = self.ssm_state.clone(), self.conv_state.clone()
        self.oracle = self.make_oracle()
        self.folds = 0  # checkpoint writes seen in verifies, or the due folds before them (all layers)

    def randn(self, *shape, scale=1.0):
        return (torch.randn(*shape, generator=self.gen) * scale).to(self.device)

    def rand(self, *shape):
        return torch.rand(*shape, generator=self.gen).to(self.device)

    def with_strong_decays(self, gate, values):
        """``gate`` with about one entry in eight replaced by one of ``values`` if strong_decays."""
        return sprinkled(gate, values, 8, self.gen) if self.strong_decays else gate

    def layer_bias(self, layer):
        return None if self.conv_bias is None else self.conv_bias[layer]

    def step(self, ring_slots, state_slots, steps, parents=None):
        """One decode step: every layer's verify (conv, then the recurrence), then acceptance."""
        ring_slots, state_slots, steps = (torch.as_tensor(t).to(self.device) for t in (ring_slots, state_slots, steps))
        parents = None if parents is None else torch.as_tensor(parents).to(self.device)
        num_rows, num_nodes = ring_slots.shape[0], self.num_draft
        if self.due_first:
            ssm_before, conv_before = self.ssm_state.clone(), self.conv_state.clone()
            self.ring_flush(ring_slots, state_slots, due_only=True)
            self.oracle.flush(ring_slots, state_slots, due_only=True)
            self.folds += sum(int(not torch.equal(conv_before[layer], self.conv_state[layer])
                                  or not torch.equal(ssm_before[layer], self.ssm_state[layer]))
                              for layer in range(self.num_layers))
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
            ssm_before, conv_before = self.ssm_state[layer].clone(), self.conv_state[layer].clone()
            self.verify(layer, conv_out, ring_slots, state_slots, parents)
            self.check_checkpoints(layer)
            self.folds += int(not torch.equal(conv_before, self.conv_state[layer])
                              or not torch.equal(ssm_before, self.ssm_state[layer]))
        self.ring.accept(ring_slots, steps, parents=parents)
        self.oracle.accept(ring_slots, steps, parents)
        self.eager_commit(ring_slots, state_slots, steps, parents)
        self.check_ring()

    def check_verify_outputs(self, out, expected, rows, what):
        """The rows the oracle wrote within OUT_TOL, the others untouched."""
        got = out.cpu()
        skipped = [row for row in range(out.shape[0]) if row not in rows]
        assert torch.equal(got[skipped], torch.full_like(got[skipped], FILL)), "a skipped row was written"
        rounded = self.ssm_dtype == torch.bfloat16 and (self.due_first or self.device.type == "cuda")
        within(got[rows], expected[rows], ROUNDED_STATE_OUT_TOL if rounded else OUT_TOL[self.device.type], what)

    def flush(self, ring_slots, state_slots):
        """The ring's flush of these slots: the checkpoints against the oracle, the conv windows bit
        for bit against the eager commits', the states against the oracle within STATE_TOL."""
        ring_slots, state_slots = (torch.as_tensor(t).to(self.device) for t in (ring_slots, state_slots))
        self.ring_flush(ring_slots, state_slots)
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
        """The cursor, and every pending token's row and gates, as the oracle has them: rows and
        given gates exactly, gates the op computed within GATE_RTOL."""
        cursor, rows, gates = self.ring.cursor.cpu(), self.ring.rows.cpu(), self.ring.gates.cpu()
        assert torch.equal(cursor.long(), self.oracle.cursor()), (cursor, self.oracle.cursor())
        ring_rows = rows.shape[2]
        for layer in range(self.num_layers):
            for slot, (start, count) in enumerate(self.oracle.cursor().tolist()):
                for j, token in enumerate(self.oracle.pending_tokens(layer, slot)):
                    position = (start + j) % ring_rows
                    assert torch.equal(rows[layer, slot, position], token["x"]), (layer, slot, j)
                    for index, name in enumerate(self.gate_names):
                        got, expected = gates[layer, slot, position, index], token[name]
                        if name in self.computed_gates:
                            assert torch.allclose(got, expected, rtol=GATE_RTOL, atol=0), (layer, slot, j, name)
                        else:
                            assert torch.equal(got, expected), (layer, slot, j, name)

    # --- the mixer's (subclasses) ---------------------------------------------------------------

    gate_names: tuple[str, ...]  # the oracle's names of the gates, in the ring's order
    computed_gates: tuple[str, ...] = ()  # gates the op computes rather than copies

    def draw_mixer_weights(self):
        """The mixer's own weights, drawn before the oracle is made."""

    def make_oracle(self):
        raise NotImplementedError

    def verify(self, layer, conv_out, ring_slots, state_slots, parents):
        """The mixer's ring verify of one layer, its oracle and the eager capture of its gates."""
        raise NotImplementedError

    def eager_commit(self, ring_slots, state_slots, steps, parents):
        raise NotImplementedError

    def ring_flush(self, ring_slots, state_slots, due_only=False):
        raise NotImplementedError


class Harness(RingHarness):
    """Gated DeltaNet with Hk key heads, Hv = Hk * ratio value heads, dk, dv."""

    num_gates = 2
    gate_names = ("g", "beta")

    def __init__(self, *, num_layers=2, num_k_heads=1, ratio=2, head_k_dim=4, head_v_dim=4, kernel_size=4,
                 num_draft=3, capacity=None, num_ring_slots=3, num_state_slots=5, ring_dtype=torch.bfloat16,
                 ssm_dtype=torch.float32, conv_dtype=torch.float32, x_dtype=torch.float32, state_layout="dim_major",
                 bias=True, use_qk_l2norm=True, device="cpu", seed=0, due_first=False, strong_decays=False,
                 tree_depth=None):
        num_v_heads = num_k_heads * ratio
        self.heads = dict(num_k_heads=num_k_heads, head_k_dim=head_k_dim, num_v_heads=num_v_heads,
                          head_v_dim=head_v_dim)
        self.dim = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
        self.state_shape, self.gate_heads = (num_v_heads, head_k_dim, head_v_dim), num_v_heads
        self.use_qk_l2norm = use_qk_l2norm
        super().__init__(num_layers=num_layers, kernel_size=kernel_size, num_draft=num_draft, capacity=capacity,
                         num_ring_slots=num_ring_slots, num_state_slots=num_state_slots, ring_dtype=ring_dtype,
                         ssm_dtype=ssm_dtype, conv_dtype=conv_dtype, x_dtype=x_dtype, state_layout=state_layout,
                         bias=bias, device=device, seed=seed, due_first=due_first, strong_decays=strong_decays,
                         tree_depth=tree_depth)

    def make_oracle(self):
        return reference.RingReference(
            self.ssm_state, self.conv_state, self.conv_weight, self.conv_bias, num_ring_slots=self.num_ring_slots,
            capacity=self.capacity, num_draft=self.num_draft, use_qk_l2norm=self.use_qk_l2norm,
            ring_dtype=self.ring_dtype, state_layout=self.state_layout, tree_depth=self.tree_depth, **self.heads)

    def verify(self, layer, conv_out, ring_slots, state_slots, parents):
        hk, dk, hv, dv = (self.heads[n] for n in ("num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim"))
        num_rows, num_nodes = conv_out.shape[:2]
        q = conv_out[..., :hk * dk].unflatten(-1, (hk, dk))
        k = conv_out[..., hk * dk:2 * hk * dk].unflatten(-1, (hk, dk))
        v = conv_out[..., 2 * hk * dk:].unflatten(-1, (hv, dv))
        g = -torch.nn.functional.softplus(self.randn(num_rows, num_nodes, hv)) * 0.5
        g = self.with_strong_decays(g, (-1e4, -1e6, -1e30, float("-inf")))
        beta = torch.sigmoid(self.randn(num_rows, num_nodes, hv))
        out = torch.full((num_rows, num_nodes, hv, dv), FILL, device=self.device)
        self.ring.gdn_verify(out, q, k, v, g, beta, self.ssm_state, self.conv_state, self.conv_weight[layer],
                             self.layer_bias(layer), ring_slots, layer, state_slots=state_slots, parents=parents,
                             use_qk_l2norm=self.use_qk_l2norm, state_layout=self.state_layout,
                             after_due_flush=self.due_first)
        expected, rows = self.oracle.gdn_verify(layer, q, k, v, g, beta, ring_slots, state_slots, parents)
        self.check_verify_outputs(out, expected, rows, f"gdn out, layer {layer}")
        self.eager.capture_gates(g, beta, ring_slots, layer)

    def eager_commit(self, ring_slots, state_slots, steps, parents):
        self.eager.gdn_commit(self.eager_ssm, self.eager_conv, self.conv_weight, ring_slots, steps,
                              state_slots=state_slots, parents=parents, conv_bias=self.conv_bias,
                              use_qk_l2norm=self.use_qk_l2norm, state_layout=self.state_layout, **self.heads)

    def ring_flush(self, ring_slots, state_slots, due_only=False):
        self.ring.flush(self.ssm_state, self.conv_state, self.conv_weight, ring_slots, state_slots=state_slots,
                        conv_bias=self.conv_bias, use_qk_l2norm=self.use_qk_l2norm, state_layout=self.state_layout,
                        due_only=due_only, **self.heads)


class Mamba2Harness(RingHarness):
    """Mamba2 with H = G * ratio heads of P, G groups of Ns; A [L, H] negative. Each verify draws raw
    dt and passes ``dt_bias`` [H] (``dt_bias``) and ``dt_softplus``; ``D`` and ``z`` optional."""

    num_gates = 1
    gate_names = ("dt",)

    def __init__(self, *, num_layers=2, n_groups=1, ratio=2, head_dim=4, d_state=4, kernel_size=4, num_draft=3,
                 capacity=None, num_ring_slots=3, num_state_slots=5, ring_dtype=torch.bfloat16,
                 ssm_dtype=torch.float32, conv_dtype=torch.float32, x_dtype=torch.float32, state_layout="dim_major",
                 bias=True, dt_bias=True, dt_softplus=True, skip=True, gate=True, device="cpu", seed=0,
                 due_first=False, strong_decays=False, tree_depth=None):
        num_heads = n_groups * ratio
        self.heads = dict(num_heads=num_heads, head_dim=head_dim, n_groups=n_groups, d_state=d_state)
        self.dim = num_heads * head_dim + 2 * n_groups * d_state
        self.state_shape, self.gate_heads = (num_heads, head_dim, d_state), num_heads
        self.dt_softplus, self.options = dt_softplus, dict(dt_bias=dt_bias, D=skip, z=gate)
        self.computed_gates = ("dt",) if dt_bias or dt_softplus else ()
        super().__init__(num_layers=num_layers, kernel_size=kernel_size, num_draft=num_draft, capacity=capacity,
                         num_ring_slots=num_ring_slots, num_state_slots=num_state_slots, ring_dtype=ring_dtype,
                         ssm_dtype=ssm_dtype, conv_dtype=conv_dtype, x_dtype=x_dtype, state_layout=state_layout,
                         bias=bias, device=device, seed=seed, due_first=due_first, strong_decays=strong_decays,
                         tree_depth=tree_depth)

    def draw_mixer_weights(self):
        num_layers, num_heads = self.num_layers, self.heads["num_heads"]
        self.A = -torch.exp(self.randn(num_layers, num_heads, scale=0.5))
        self.dt_bias = self.randn(num_layers, num_heads, scale=0.3).abs() if self.options["dt_bias"] else None
        self.D = self.randn(num_layers, num_heads, scale=0.5) if self.options["D"] else None

    def make_oracle(self):
        return reference.Mamba2RingReference(
            self.ssm_state, self.conv_state, self.conv_weight, self.conv_bias, self.A,
            num_ring_slots=self.num_ring_slots, capacity=self.capacity, num_draft=self.num_draft,
            ring_dtype=self.ring_dtype, state_layout=self.state_layout, tree_depth=self.tree_depth, **self.heads)

    def layer_options(self, layer, num_rows, num_nodes):
        """dt (raw: any sign under softplus, else positive) and the layer's D, z, dt_bias."""
        h, p = self.heads["num_heads"], self.heads["head_dim"]
        dt = self.randn(num_rows, num_nodes, h) if self.dt_softplus else self.rand(num_rows, num_nodes, h) * 0.5
        dt = self.with_strong_decays(dt, (3e2, 1e4))  # (d A past -64; larger steps outgrow tf32's C S0^T)
        z = self.randn(num_rows, num_nodes, h, p) if self.options["z"] else None
        return dt, dict(D=None if self.D is None else self.D[layer], z=z,
                        dt_bias=None if self.dt_bias is None else self.dt_bias[layer], dt_softplus=self.dt_softplus)

    def verify(self, layer, conv_out, ring_slots, state_slots, parents):
        h, p, g, n = (self.heads[name] for name in ("num_heads", "head_dim", "n_groups", "d_state"))
        num_rows, num_nodes = conv_out.shape[:2]
        x, B, C = conv_out.split([h * p, g * n, g * n], dim=-1)
        x, B, C = x.unflatten(-1, (h, p)), B.unflatten(-1, (g, n)), C.unflatten(-1, (g, n))
        dt, options = self.layer_options(layer, num_rows, num_nodes)
        out = torch.full((num_rows, num_nodes, h, p), FILL, device=self.device)
        self.ring.mamba2_verify(out, x, dt, self.A[layer], B, C, self.ssm_state, self.conv_state,
                                self.conv_weight[layer], self.layer_bias(layer), ring_slots, layer,
                                state_slots=state_slots, parents=parents, state_layout=self.state_layout,
                                after_due_flush=self.due_first, **options)
        expected, rows = self.oracle.mamba2_verify(layer, x, dt, B, C, ring_slots, state_slots, parents, **options)
        self.check_verify_outputs(out, expected, rows, f"mamba2 out, layer {layer}")
        # an engine's dt as mamba2_commit takes it (after dt_bias and softplus), computed by the engine
        step = dt if options["dt_bias"] is None else dt + options["dt_bias"]
        self.eager.capture_gates(torch.nn.functional.softplus(step) if self.dt_softplus else step, None, ring_slots,
                                 layer)

    def eager_commit(self, ring_slots, state_slots, steps, parents):
        self.eager.mamba2_commit(self.eager_ssm, self.eager_conv, self.conv_weight, self.A, ring_slots, steps,
                                 state_slots=state_slots, parents=parents, conv_bias=self.conv_bias,
                                 state_layout=self.state_layout, **self.heads)

    def ring_flush(self, ring_slots, state_slots, due_only=False):
        self.ring.mamba2_flush(self.ssm_state, self.conv_state, self.conv_weight, self.A, ring_slots,
                               state_slots=state_slots, conv_bias=self.conv_bias, state_layout=self.state_layout,
                               due_only=due_only, **self.heads)


def run_sequence(data, harness_type, *, num_draft, tree, capacity, num_steps, num_ring_slots=3, num_state_slots=5,
                 **harness_options):
    """Requests in every ring slot, each with its own state slot; per step the batch in a random
    order with a padded row now and then, random acceptance (none, some, all), and between steps
    flushes (the request resumes afterwards) and finished requests replaced by new ones. Ends with
    a flush of every request. Trees: a ring of a random ``tree_depth`` (None: N) and trees no deeper."""
    if tree:
        harness_options.setdefault("tree_depth", data.draw(st.none() | st.integers(1, num_draft)))
    harness = harness_type(num_draft=num_draft, capacity=capacity, num_ring_slots=num_ring_slots,
                           num_state_slots=num_state_slots, **harness_options)
    state_of = {ring: state for ring, state in enumerate(data.draw(st.permutations(range(num_state_slots))))
                if ring < num_ring_slots}
    for _ in range(num_steps):
        order = data.draw(st.permutations(sorted(state_of)))
        padded = data.draw(st.booleans())
        ring_slots = list(order) + ([-1] if padded else [])
        state_slots = [state_of[ring] for ring in order] + ([-1] if padded else [])
        steps = [data.draw(st.integers(-1, num_draft - 1)) for _ in ring_slots]
        parents = [data.draw(trees(num_draft, harness.tree_depth)) for _ in ring_slots] if tree else None
        harness.step(ring_slots, state_slots, steps, parents)
        event = data.draw(st.sampled_from(["none", "none", "none", "flush", "new request"]))
        ring = data.draw(st.sampled_from(sorted(state_of)))
        if event == "flush":
            harness.flush([ring, -1], [state_of[ring], -1])
        elif event == "new request":
            free = sorted(set(range(num_state_slots)) - set(state_of.values()))
            state_of[ring] = data.draw(st.sampled_from(free))
            harness.new_request(ring, state_of[ring])
    harness.flush(sorted(state_of), [state_of[ring] for ring in sorted(state_of)])
    return harness


MANY_STEPS_CASES = [pytest.param("cpu", True, id="tree-cpu"),  # (CPU chains: the long random sequences)
                    pytest.param("cuda", False, marks=pytest.mark.gpu, id="chain-cuda"),
                    pytest.param("cuda", True, marks=pytest.mark.gpu, id="tree-cuda")]


def run_many_steps(harness_type, device, tree):
    """1,000 steps of random acceptance at the default capacity, then a flush: the harness checks
    every checkpoint, the flushed states and the conv windows (the issues' accuracy target)."""
    generator = torch.Generator().manual_seed(5)
    harness = harness_type(num_draft=4, capacity=16, num_ring_slots=2, num_state_slots=2, device=device, seed=5)
    tree_parents = [-1, 0, 0, 1]
    for _ in range(1000):
        steps = torch.randint(0, 4, (2,), generator=generator)
        harness.step([0, 1], [1, 0], steps, [tree_parents, tree_parents] if tree else None)
    harness.flush([0, 1], [1, 0])
    assert harness.folds > 0


# ring_conv1d_verify stays on its CPU path: the interpreter stores float32 into bfloat16 rows by
# truncation, the GPU to nearest, so the rows would differ from the oracle's for the interpreter's sake
RING_KERNEL_OPS = ("gdn_ring_verify", "gdn_ring_flush", "mamba2_ring_verify", "mamba2_ring_flush", "ring_accept")


def through_kernels(monkeypatch):
    """Bind the RingCache's RING_KERNEL_OPS to their Triton kernels, which run CPU tensors under the
    interpreter: the harness then holds the kernels themselves to the float64 oracle, at the GPU's
    tolerance."""
    from sgl_convwin import cache

    for name in RING_KERNEL_OPS:
        monkeypatch.setattr(cache, name, getattr(sgl_convwin, name).cuda_impl)
    monkeypatch.setitem(OUT_TOL, "cpu", OUT_TOL["cuda"])  # (tf32 products, as on the GPU)


# "kernels": the CPU run with the RingCache's ops bound to their kernels (through_kernels), fewer steps
RING_CASES = [
    "cpu", pytest.param("cuda", marks=pytest.mark.gpu),
    pytest.param("kernels", marks=[pytest.mark.slow, pytest.mark.skipif(
        not (INTERPRET and HAS_TRITON), reason="Triton's interpreter runs on the CPU only")])]


def run_strong_decays(harness_type, case, tree, monkeypatch):
    """Steps at capacity 8 with about one gate in eight a strong decay (with_strong_decays), so that
    rows fold past them: every output, checkpoint and flushed state checked as in any run; ``case``
    one of RING_CASES."""
    if case == "kernels":
        through_kernels(monkeypatch)
    generator = torch.Generator().manual_seed(7)
    harness = harness_type(num_draft=4, capacity=8, num_ring_slots=2, num_state_slots=3,
                           device="cpu" if case == "kernels" else case, seed=7, strong_decays=True)
    parents = [[-1, 0, 0, 1]] * 2 if tree else None
    for _ in range(20 if case == "kernels" else 40):
        harness.step([0, 1], [2, 0], torch.randint(0, 4, (2,), generator=generator), parents)
    harness.flush([0, 1], [2, 0])
    assert harness.folds > 0


def replay_against_eager(worlds, outs, step, flush, fresh_inputs, static, flush_slots, *, replays=40):
    """Both mixers' CUDA-graph test: ``step(world, out)`` (every layer, then the acceptance) and
    ``flush(world)`` run once on worlds[2] (every kernel compiled), then are each captured once on
    worlds[0]. Per replay, new inputs from ``fresh_inputs()`` are written into ``static``, the step
    graph replays beside an eager step on worlds[1]; every 5th a flush of ring slot i % M, every 13th
    a new request in ring slot 1 (its states, state slot 2, written; its ring emptied). Every output,
    checkpoint and ring tensor equal bit for bit after every replay; more than 3 replays folded."""
    step(worlds[2], outs[2])
    flush(worlds[2])
    torch.cuda.synchronize()
    step_graph, flush_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(step_graph):
        step(worlds[0], outs[0])
    with torch.cuda.graph(flush_graph):
        flush(worlds[0])

    def tensors(world, out):
        return [out, world.ssm_state, world.conv_state, world.ring.rows, world.ring.gates, world.ring.cursor]

    folds = 0
    for i in range(replays):
        for name, t in fresh_inputs().items():
            if static[name] is not None:
                static[name].copy_(t)
        before = worlds[1].ssm_state.clone()
        step_graph.replay()
        step(worlds[1], outs[1])
        folds += int(not torch.equal(before, worlds[1].ssm_state))
        if i % 5 == 4:
            flush_slots.copy_(torch.tensor([i % worlds[0].ring.cursor.shape[0], -1]))
            flush_graph.replay()
            flush(worlds[1])
        if i % 13 == 12:
            for world in worlds[:2]:
                world.ssm_state[:, 2] = 0.25
                world.conv_state[:, 2] = 0.5
                world.ring.reset(torch.tensor([1], device="cuda"))
        names = ("out", "ssm_state", "conv_state", "rows", "gates", "cursor")
        for name, a, b in zip(names, tensors(worlds[0], outs[0]), tensors(worlds[1], outs[1])):
            assert torch.equal(a, b), (i, name)
    assert folds > 3
