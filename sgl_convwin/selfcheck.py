"""``python -m sgl_convwin selfcheck``: every op, on small random tensors, against its oracle.

One verify step and its commit per layout and draft shape (a chain and a tree), as an engine runs
them: ``causal_conv1d_verify`` (and ``capture`` alone) fills the buffer, ``capture_gates`` the gates;
``scatter`` / ``scatter_tree`` commit the conv window, ``gdn_commit`` and ``mamba2_commit`` replay
the accepted paths onto both states; ``gdn_verify`` and ``mamba2_verify`` compute the drafts'
outputs from a layer's state. Each result is compared with sgl_convwin.reference over the whole
tensor it writes: copies bit for bit, arithmetic (the conv outputs, the replayed recurrent
states, all float32) within float32 rounding of the float64 oracle. A padded row (slot -1) and
slots no row names must stay untouched.
"""

from __future__ import annotations

import torch

from . import reference
from .layout import DENSE, LAYOUTS, TOKEN_MAJOR, dedup_ratio, physical_nbytes, window_view
from .ops import alloc_windows, capture, causal_conv1d_verify, scatter, scatter_tree
from .ops_replay import alloc_gates, capture_gates, gdn_commit, mamba2_commit
from .ops_verify import gdn_verify, mamba2_verify
from .validation import REPLAY_MAX_KERNEL_SIZE

LAYERS, BUFFER_SLOTS, STATE_SLOTS = 2, 4, 6
# One buffer serves both mixers: GDN Hk 2, dk 4, Hv 4, dv 4 and Mamba2 H 4, P 4, G 2, Ns 4 both
# have 32 conv channels.
GDN_DIMS = dict(num_k_heads=2, head_k_dim=4, num_v_heads=4, head_v_dim=4)
MAMBA2_DIMS = dict(num_heads=4, head_dim=4, n_groups=2, d_state=4)
DIM, HEADS = 32, 4
TOLERANCE = dict(atol=1e-4, rtol=1e-4)  # float32 arithmetic against the float64 oracle


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3f} GiB"


class _Step:
    """The tensors of one verify step and its commit (random, seeded)."""

    def __init__(self, device, num_draft, kernel_size, layout, tree, generator):
        def randn(*shape, scale=1.0):
            return (torch.randn(*shape, generator=generator) * scale).to(device)

        self.num_draft, self.kernel_size, self.layout = num_draft, kernel_size, layout
        width = kernel_size - 1
        # rows: three requests accepted at different depths, one padded row (state slot -1)
        self.state_slots = torch.tensor([4, 0, -1, 2], device=device)
        self.buffer_slots = torch.tensor([1, 3, 0, 2], device=device)
        if tree:
            links = [[-1] + [int(torch.randint(0, n, (), generator=generator)) for n in range(1, num_draft)]
                     for _ in range(4)]
            self.parents = torch.tensor(links, device=device)
        else:
            self.parents = None
        self.accepted = torch.tensor([num_draft - 1, 0, min(1, num_draft - 1), num_draft // 2], device=device)
        self.conv_state = randn(LAYERS, STATE_SLOTS, DIM, width).to(torch.bfloat16)
        self.x = randn(LAYERS, 4, num_draft, DIM).to(torch.bfloat16)  # each layer's conv inputs
        self.conv_weight = randn(LAYERS, DIM, kernel_size, scale=0.5)  # [L, dim, K]; verify takes [dim, K]
        self.conv_bias = randn(LAYERS, DIM, scale=0.1)
        self.g = -torch.nn.functional.softplus(randn(LAYERS, 4, num_draft, HEADS))
        self.beta = torch.sigmoid(randn(LAYERS, 4, num_draft, HEADS))
        self.dt = torch.nn.functional.softplus(randn(LAYERS, 4, num_draft, HEADS)) * 0.5
        self.A = -torch.exp(randn(LAYERS, HEADS, scale=0.5))
        self.mixed = randn(4, num_draft, DIM)  # one layer's silu(conv) output: q, k, v
        self.gdn_state = randn(LAYERS, STATE_SLOTS, HEADS, GDN_DIMS["head_k_dim"], GDN_DIMS["head_v_dim"])
        self.mamba2_state = randn(LAYERS, STATE_SLOTS, HEADS, MAMBA2_DIMS["head_dim"], MAMBA2_DIMS["d_state"])
        self.buffer = alloc_windows(LAYERS, BUFFER_SLOTS, DIM, num_draft, kernel_size, layout=layout,
                                    dtype=torch.bfloat16, device=device)

    def commit_indices(self):
        return self.state_slots, self.buffer_slots, self.accepted


def _check_verify(step: _Step) -> tuple[bool, bool]:
    """causal_conv1d_verify and capture, layer by layer: (conv outputs ok, buffer ok)."""
    outputs_ok = buffer_ok = True
    alone = step.buffer.clone()  # filled by capture alone
    for layer in range(LAYERS):
        x = step.x[layer]
        expected_buffer = reference.capture_reference(step.buffer, step.conv_state, x, step.buffer_slots,
                                                      step.state_slots, layer, step.layout, step.parents)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        expected_out, written = reference.causal_conv1d_verify_reference(
            out, step.conv_state, x, step.conv_weight[layer], step.conv_bias[layer], step.buffer_slots,
            step.state_slots, BUFFER_SLOTS, layer, step.parents, activation="silu")
        causal_conv1d_verify(out, step.buffer, step.conv_state, x, step.conv_weight[layer], step.conv_bias[layer],
                             step.buffer_slots, step.state_slots, layer, step.parents, layout=step.layout,
                             activation="silu")
        capture(alone, step.conv_state, x, step.buffer_slots, step.state_slots, layer, step.parents,
                layout=step.layout)
        outputs_ok &= bool(written.any()) and torch.allclose(out.cpu().double(), expected_out, **TOLERANCE)
        buffer_ok &= torch.equal(step.buffer.cpu(), expected_buffer) and torch.equal(alone.cpu(), expected_buffer)
    return outputs_ok, buffer_ok


def _check_conv_commit(step: _Step) -> bool:
    """scatter (chains, dense trees) or scatter_tree (trees in a rows layout) against its oracle."""
    conv_state = step.conv_state.clone()
    dst, src, accepted = step.commit_indices()
    if step.parents is not None and step.layout != DENSE:
        rows = step.buffer if step.layout == TOKEN_MAJOR else step.buffer.transpose(-1, -2)
        expected = reference.scatter_tree_reference(conv_state, rows, dst, src, accepted, step.parents)
        scatter_tree(conv_state, rows, dst, src, accepted, step.parents)
    else:
        windows = window_view(step.buffer, step.layout, step.num_draft, step.kernel_size)
        expected = reference.scatter_reference(conv_state, windows, dst, src, accepted)
        scatter(conv_state, windows, dst, src, accepted)
    return not torch.equal(expected, step.conv_state.cpu()) and torch.equal(conv_state.cpu(), expected)


def _check_gates(step: _Step, num_gates: int) -> tuple[bool, torch.Tensor]:
    gates = alloc_gates(LAYERS, BUFFER_SLOTS, step.num_draft, HEADS, num_gates=num_gates, device=step.buffer.device)
    ok = True
    for layer in range(LAYERS):
        first, second = (step.g[layer], step.beta[layer]) if num_gates == 2 else (step.dt[layer], None)
        expected = reference.capture_gates_reference(gates, first, second, step.buffer_slots, layer)
        capture_gates(gates, first, second, step.buffer_slots, layer)
        ok &= torch.equal(gates.cpu(), expected)
    return ok, gates


def _check_replay(step: _Step, mixer: str, gates: torch.Tensor) -> bool:
    """gdn_commit / mamba2_commit: the conv window bit for bit, the recurrent state within rounding,
    untouched slots untouched."""
    conv_state = step.conv_state.clone()
    dst, src, accepted = step.commit_indices()
    common = dict(layout=step.layout, conv_bias=step.conv_bias)
    if mixer == "gdn":
        ssm_state = step.gdn_state.clone()
        args = (ssm_state, conv_state, step.buffer, gates, step.conv_weight, dst, src, accepted, step.parents)
        expected_ssm, expected_conv, written = reference.gdn_commit_reference(*args, **common, **GDN_DIMS)
        gdn_commit(*args, **common, **GDN_DIMS)
        before = step.gdn_state
    else:
        ssm_state = step.mamba2_state.clone()
        args = (ssm_state, conv_state, step.buffer, gates, step.conv_weight, step.A, dst, src, accepted, step.parents)
        expected_ssm, expected_conv, written = reference.mamba2_commit_reference(*args, **common, **MAMBA2_DIMS)
        mamba2_commit(*args, **common, **MAMBA2_DIMS)
        before = step.mamba2_state
    untouched = [slot for slot in range(STATE_SLOTS) if slot not in written]
    return (len(written) == 3
            and torch.equal(conv_state.cpu(), expected_conv)
            and torch.equal(ssm_state[:, untouched].cpu(), before[:, untouched].cpu())
            and torch.allclose(ssm_state.cpu().double(), expected_ssm, **TOLERANCE))


def _verify_ok(state, out_shape, run, oracle) -> bool:
    """One verify op on layer 0: ``run(out)`` writes within rounding of ``oracle()`` (the float64
    outputs and written rows; tf32 products on a GPU), the padded row untouched, the state unchanged."""
    before = state.clone()
    out = torch.full(out_shape, 7.0, device=state.device)
    run(out)
    expected, written = oracle()
    got = out.cpu().double()
    skipped = [row for row in range(4) if row not in written]
    error = (got[written] - expected[written]).abs().max().item()
    return (written == [0, 1, 3] and torch.equal(state, before) and bool((got[skipped] == 7.0).all())
            and error <= 2e-3 * expected[written].abs().max().item())


def _check_gdn_verify(step: _Step) -> bool:
    hk, dk, hv, dv = (GDN_DIMS[name] for name in ("num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim"))
    q, k, v = step.mixed.split([hk * dk, hk * dk, hv * dv], dim=-1)
    q, k, v = q.unflatten(-1, (hk, dk)), k.unflatten(-1, (hk, dk)), v.unflatten(-1, (hv, dv))
    state, g, beta, slots, parents = step.gdn_state[0], step.g[0], step.beta[0], step.state_slots, step.parents
    return _verify_ok(state, v.shape, lambda out: gdn_verify(out, q, k, v, g, beta, state, slots, parents),
                      lambda: reference.gdn_verify_reference(q, k, v, g, beta, state, slots.cpu(), parents))


def _check_mamba2_verify(step: _Step) -> bool:
    """(x, B, C split from the same conv output as gdn_verify's q, k, v.)"""
    heads, head_dim, groups, d_state = (MAMBA2_DIMS[name] for name in ("num_heads", "head_dim", "n_groups", "d_state"))
    x, B, C = step.mixed.split([heads * head_dim, groups * d_state, groups * d_state], dim=-1)
    x, B, C = x.unflatten(-1, (heads, head_dim)), B.unflatten(-1, (groups, d_state)), C.unflatten(-1, (groups, d_state))
    state, dt, A, slots, parents = step.mamba2_state[0], step.dt[0], step.A[0], step.state_slots, step.parents
    return _verify_ok(state, x.shape, lambda out: mamba2_verify(out, x, dt, A, B, C, state, slots, parents),
                      lambda: reference.mamba2_verify_reference(x, dt, A, B, C, state, slots.cpu(), parents))


def selfcheck(device: str, num_draft: int, kernel_size: int, seed: int, out=None) -> bool:
    """Print one line per (op, layout, draft shape); True if every op matched its oracle."""
    generator = torch.Generator().manual_seed(seed)
    replay = kernel_size <= REPLAY_MAX_KERNEL_SIZE
    print(f"selfcheck on {device}: L={LAYERS} layers, N={num_draft} draft tokens (chain) or tree nodes, "
          f"K={kernel_size}, dim {DIM}, 4 rows (one padded), bf16 conv inputs, fp32 states", file=out)
    print(f"{'op':<24}{'layout':<15}{'chain':<7}tree", file=out)
    results: dict[tuple[str, str], dict[str, bool]] = {}  # (op, layout) -> {"chain": ok, "tree": ok}
    for layout in LAYOUTS:
        for shape in ("chain", "tree"):
            step = _Step(device, num_draft, kernel_size, layout, shape == "tree", generator)
            outputs_ok, buffer_ok = _check_verify(step)
            checks = [("causal_conv1d_verify", outputs_ok), ("capture", buffer_ok),
                      ("scatter / scatter_tree", _check_conv_commit(step))]
            for mixer, num_gates in (("gdn", 2), ("mamba2", 1)):
                gates_ok, gates = _check_gates(step, num_gates)
                checks.append(("capture_gates", gates_ok))
                if replay:
                    checks.append((f"{mixer}_commit", _check_replay(step, mixer, gates)))
            if layout == LAYOUTS[0]:  # (no buffer: one layout is enough)
                checks.append(("gdn_verify", _check_gdn_verify(step)))
                checks.append(("mamba2_verify", _check_mamba2_verify(step)))
            for name, ok in checks:
                recurrence = name in ("gdn_verify", "mamba2_verify")  # (no buffer: no layout)
                by_shape = results.setdefault((name, "-" if recurrence else layout), {})
                by_shape[shape] = by_shape.get(shape, True) and ok
    all_ok = all(ok for by_shape in results.values() for ok in by_shape.values())
    for (name, layout), by_shape in results.items():
        marks = ["ok" if by_shape[shape] else "FAIL" for shape in ("chain", "tree")]
        print(f"{name:<24}{layout:<15}{marks[0]:<7}{marks[1]}", file=out)
    if not replay:
        print(f"gdn_commit, mamba2_commit: not run (they take K <= {REPLAY_MAX_KERNEL_SIZE})", file=out)

    # What the dedup buffer saves at Qwen3-Next-80B's shape (36 GDN layers, conv_dim 8192, K=4).
    print("\nconv windows, Qwen3-Next-80B TP1 shape (36 layers, dim 8192, K=4), 256 slots, bf16", file=out)
    print(f"{'N':>3}  {'dense':>12}  {'token_major':>12}  {'ratio':>6}", file=out)
    for n in (2, 4, 8):
        dense = physical_nbytes("dense", 36, 256, 8192, n, 4)
        dedup = physical_nbytes("token_major", 36, 256, 8192, n, 4)
        print(f"{n:>3}  {_gib(dense):>12}  {_gib(dedup):>12}  {float(dedup_ratio(n, 4)):>6.3f}", file=out)
    print("\nOK: every op matched its oracle" if all_ok else "\nFAILED: see the FAIL lines above", file=out)
    return all_ok
