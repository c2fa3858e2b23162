"""The Mamba2 ring (mamba2_ring_verify, mamba2_ring_flush, with ops_ring's ring_conv1d_verify and
ring_accept) against its float64 oracle, reference.Mamba2RingReference, over random step sequences,
and against the eager flow it replaces (causal_conv1d_verify + capture_gates + mamba2_commit after
every step): every step's conv and recurrence outputs within tolerance, every checkpoint within
1e-4 x max |h| (float32) and its conv window bit for bit, the cursor and every pending row exactly
and every stored dt (computed in float32) within float32 rounding; at flush, the conv windows bit
for bit what the eager commits left. Then the fold rule at every boundary, skipped rows, bad input,
registration (opcheck) and torch.compile(fullgraph=True).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sgl_convwin
from ring_harness import (FILL, MANY_STEPS_CASES, RING_CASES, Mamba2Harness, replay_against_eager,
                          run_many_steps, run_sequence, run_strong_decays)

# ---------------------------------------------------------------------------------------------
# Random step sequences
# ---------------------------------------------------------------------------------------------

_OPTIONS = dict(dt_bias=st.booleans(), dt_softplus=st.booleans(), skip=st.booleans(), gate=st.booleans(),
                bias=st.booleans(), due_first=st.booleans())  # (due_first: each step's folds first, flush(due_only))


@settings(max_examples=4)
@given(data=st.data(), num_draft=st.integers(1, 4), tree=st.booleans(), extra=st.integers(0, 5),
       kernel_size=st.sampled_from([2, 3, 4]), ring_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
       state_layout=st.sampled_from(sgl_convwin.STATE_LAYOUTS), **_OPTIONS)
def test_random_steps_match_oracle_and_eager(data, num_draft, tree, extra, kernel_size, ring_dtype, state_layout,
                                             **options):
    run_sequence(data, Mamba2Harness, num_draft=num_draft, tree=tree and num_draft > 1, capacity=num_draft + extra,
                 num_steps=8, num_layers=1, kernel_size=kernel_size, ring_dtype=ring_dtype, state_layout=state_layout,
                 **options)


@pytest.mark.gpu
@settings(max_examples=4)
@given(data=st.data(), num_draft=st.integers(1, 4), tree=st.booleans(), extra=st.integers(0, 5),
       ring_dtype=st.sampled_from([torch.bfloat16, torch.float32]), **_OPTIONS)
def test_random_steps_match_oracle_and_eager_on_gpu(data, num_draft, tree, extra, ring_dtype, **options):
    run_sequence(data, Mamba2Harness, num_draft=num_draft, tree=tree and num_draft > 1, capacity=num_draft + extra,
                 num_steps=8, num_layers=1, ring_dtype=ring_dtype, device="cuda", **options)


@pytest.mark.slow
@settings(max_examples=12)
@given(data=st.data(), num_draft=st.integers(1, 5), tree=st.booleans(), capacity=st.integers(1, 32),
       kernel_size=st.sampled_from([2, 3, 4, 5]), ring_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
       ssm_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       conv_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       state_layout=st.sampled_from(sgl_convwin.STATE_LAYOUTS),
       n_groups=st.sampled_from([1, 2]), ratio=st.sampled_from([1, 2]), **_OPTIONS)
def test_long_random_steps_match_oracle_and_eager(data, num_draft, tree, capacity, **options):
    run_sequence(data, Mamba2Harness, num_draft=num_draft, tree=tree and num_draft > 1,
                 capacity=max(capacity, num_draft), num_steps=40, **options)


@pytest.mark.slow
@pytest.mark.parametrize("device, tree", MANY_STEPS_CASES)
def test_many_steps_flush_within_tolerance(device, tree):
    """1,000 steps of random acceptance with the default capacity (issue 40's accuracy target): the
    harness checks every checkpoint and, at the end, the flushed states against the float64 oracle
    (1e-4 x max |h|) and the conv windows against the eager commits' bit for bit."""
    run_many_steps(Mamba2Harness, device, tree)


def test_flush_mid_sequence_and_resume():
    """A flush between steps writes the checkpoint and empties the cursor past the pending tokens;
    the request then decodes on as before (the harness holds every later step to the oracle, which
    never flushed that slot's tokens any other way)."""
    harness = Mamba2Harness(num_draft=2, capacity=5, num_ring_slots=2, num_state_slots=3, seed=3)
    harness.step([0, 1], [2, 0], [1, 0], [[-1, 0], [-1, -1]])
    harness.step([1, 0], [0, 2], [1, 1])
    assert harness.ring.cursor.tolist() == [[0, 4], [0, 3]]
    before = harness.ssm_state[:, 0].clone()
    harness.flush([1, -1], [0, -1])
    assert harness.ring.cursor.tolist() == [[0, 4], [3, 0]] and not torch.equal(before, harness.ssm_state[:, 0])
    for step in range(4):
        harness.step([0, 1], [2, 0], [step % 2, 1])
    harness.flush([0, 1], [2, 0])
    assert harness.folds > 0


@pytest.mark.parametrize("case", RING_CASES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_strong_decays(case, tree, monkeypatch):
    """Decays that leave next to nothing of the state before them (steps dt of 3e2 .. 1e4),
    folded and verified past: within tolerance of the oracle, not lost to the rounding of a sum; the
    "kernels" case holds the ring's Triton kernels themselves (the interpreter) to the oracle."""
    run_strong_decays(Mamba2Harness, case, tree, monkeypatch)


# ---------------------------------------------------------------------------------------------
# The fold rule at every boundary
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_draft, capacity", [(1, 1), (1, 3), (3, 3), (3, 4), (3, 5), (2, 7)])
@pytest.mark.parametrize("accepted", ["one", "all", "cycle"])
def test_folds_exactly_when_the_ring_would_overflow(num_draft, capacity, accepted):
    """A checkpoint is written (both states) exactly when pending > 0 and pending + N > capacity,
    and is left bit for bit alone otherwise; every pending count 0..capacity is met where the
    acceptance pattern reaches it."""
    harness = Mamba2Harness(num_draft=num_draft, capacity=capacity, num_ring_slots=1, num_state_slots=2,
                            num_layers=1)
    seen = set()
    for step in range(2 * capacity + 3):
        count = {"one": 1, "all": num_draft, "cycle": 1 + step % num_draft}[accepted]
        pending = int(harness.ring.pending[0])
        before = harness.ssm_state[:, 1].clone(), harness.conv_state[:, 1].clone()
        harness.step([0], [1], [count - 1])
        wrote = (not torch.equal(before[0], harness.ssm_state[:, 1])
                 or not torch.equal(before[1], harness.conv_state[:, 1]))
        assert wrote == (pending > 0 and pending + num_draft > capacity), (step, pending)
        assert int(harness.ring.pending[0]) == (0 if pending + num_draft > capacity else pending) + count
        seen.add(pending)
    if accepted == "one":
        assert seen == set(range(capacity - num_draft + 2))  # every pending count up to the first fold


# ---------------------------------------------------------------------------------------------
# Skipped rows, bad links, the checked mode
# ---------------------------------------------------------------------------------------------


def verify_arguments(harness, num_rows=2, layer=1):
    """Arguments of one mamba2_ring_verify call on the harness's ring, as a dict."""
    h, p, g, n = (harness.heads[name] for name in ("num_heads", "head_dim", "n_groups", "d_state"))
    num_nodes = harness.num_draft
    return dict(out=torch.zeros(num_rows, num_nodes, h, p), x=torch.randn(num_rows, num_nodes, h, p),
                dt=torch.rand(num_rows, num_nodes, h), A=harness.A[layer], B=torch.randn(num_rows, num_nodes, g, n),
                C=torch.randn(num_rows, num_nodes, g, n), ssm_state=harness.ssm_state, conv_state=harness.conv_state,
                rows=harness.ring.rows, gates=harness.ring.gates, cursor=harness.ring.cursor,
                conv_weight=harness.conv_weight[layer], conv_bias=None, ring_slots=torch.arange(num_rows),
                state_slots=torch.arange(num_rows), layer=layer)


def test_padded_and_out_of_range_rows_touch_nothing():
    """Rows with a negative or out-of-range slot, or whose cursor is not a ring position, are
    skipped by every op: their outputs keep their values, no state, row, gate or cursor changes."""
    harness = Mamba2Harness(num_draft=2, capacity=3, num_ring_slots=3, num_state_slots=3)
    harness.step([0, 1, 2], [0, 1, 2], [1, 1, 1])  # something pending everywhere
    ring = harness.ring
    ring.cursor[2] = torch.tensor([ring.rows.shape[2], 0])  # not a ring position
    before = {name: t.clone() for name, t in (("ssm", harness.ssm_state), ("conv", harness.conv_state),
                                              ("rows", ring.rows), ("gates", ring.gates), ("cursor", ring.cursor))}
    ring_slots, state_slots = torch.tensor([-1, 7, 0, 1, 2]), torch.tensor([0, 1, -1, 9, 2])
    conv_out = torch.full((5, 2, harness.dim), FILL)
    ring.conv1d_verify(conv_out, harness.conv_state, torch.randn(5, 2, harness.dim), harness.conv_weight[0], None,
                       ring_slots, 0, state_slots=state_slots)
    arguments = verify_arguments(harness, num_rows=5, layer=0)
    arguments.update(out=torch.full((5, 2, 2, 4), FILL), ring_slots=ring_slots, state_slots=state_slots)
    sgl_convwin.mamba2_ring_verify(**arguments, dt_softplus=True)
    ring.accept(torch.tensor([-1, 7, 2, -3, 2]), torch.tensor([0, 1, 1, 1, 0]))
    ring.mamba2_flush(harness.ssm_state, harness.conv_state, harness.conv_weight, harness.A, ring_slots,
                      state_slots=state_slots, **harness.heads)
    assert torch.equal(conv_out, torch.full_like(conv_out, FILL))
    assert torch.equal(arguments["out"], torch.full_like(arguments["out"], FILL))
    after = dict(ssm=harness.ssm_state, conv=harness.conv_state, rows=ring.rows, gates=ring.gates, cursor=ring.cursor)
    for name, tensor in after.items():
        assert torch.equal(tensor, before[name]), name


def test_bad_parent_links():
    """A row with any bad link gets no recurrence output but still folds and stores its dt; an
    accepted path through a bad link accepts nothing. The harness holds the ops to the oracle's rules."""
    harness = Mamba2Harness(num_draft=4, capacity=5)
    good = [-1, 0, 0, 1]
    harness.step([0, 1], [0, 1], [3, 2], [good, good])
    harness.step([0, 1], [0, 1], [3, 3], [[-1, 0, 5, 1], [-1, 0, 0, 2]])  # row 0: node 2's link is bad
    harness.step([0, 1], [0, 1], [2, 3], [[-1, 0, 0, -7], good])  # row 0's accepted path is good
    harness.flush([0, 1], [0, 1])


def test_checked_mode_names_bad_rows():
    harness = Mamba2Harness(num_draft=2, capacity=2, num_ring_slots=2, num_state_slots=2)
    arguments = verify_arguments(harness)
    with sgl_convwin.index_checks():
        with pytest.raises(IndexError, match=r"state_slots\[1\] = 5 .* ring_slots\[1\] = 1 is active"):
            sgl_convwin.mamba2_ring_verify(**dict(arguments, state_slots=torch.tensor([0, 5])))
        with pytest.raises(IndexError, match="both use ring slot 1"):
            sgl_convwin.mamba2_ring_verify(**dict(arguments, ring_slots=torch.tensor([1, 1])))
        with pytest.raises(IndexError, match="rows 0 and 1 both use state slot 1"):
            sgl_convwin.mamba2_ring_verify(**dict(arguments, state_slots=torch.tensor([1, 1])))
        harness.ring.cursor[1] = torch.tensor([0, 4])  # pending 4 > C - 1 = 3
        with pytest.raises(IndexError, match=r"cursor\[1\] = \(0, 4\)"):
            harness.ring.mamba2_flush(harness.ssm_state, harness.conv_state, harness.conv_weight, harness.A,
                                      torch.tensor([1]), **harness.heads)


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors before any write
# ---------------------------------------------------------------------------------------------

BAD_VERIFY = [
    ("a ring too short for N", dict(rows=torch.zeros(2, 3, 5, 16), gates=torch.zeros(2, 3, 5, 1, 2)),
     ValueError, "at least 6"),
    ("a Gated DeltaNet ring's gates", dict(gates=torch.zeros(2, 3, 6, 2, 2)), ValueError, "gates must be"),
    ("gates of other heads", dict(gates=torch.zeros(2, 3, 6, 1, 4)), ValueError, "gates must be"),
    ("a cursor of floats", dict(cursor=torch.zeros(3, 2)), TypeError, "cursor must be int32 or int64"),
    ("one layer's state pool", dict(ssm_state=torch.zeros(5, 2, 4, 4)), ValueError, r"\[L, S, H, P, Ns\]"),
    ("a state pool of other heads", dict(ssm_state=torch.zeros(2, 5, 2, 4, 5)), ValueError, "B must be"),
    ("a conv state of another dim", dict(conv_state=torch.zeros(2, 5, 17, 3)), ValueError,
     r"H\*P \+ 2\*G\*Ns = 16 channels"),
    ("a layer out of range", dict(layer=2), ValueError, "layer 2 is out of range"),
    ("A of every layer", dict(A=torch.zeros(2, 2)), ValueError, r"A must be \[H\]"),
    ("dt of another shape", dict(dt=torch.zeros(2, 3, 3)), ValueError, r"dt must be \[B, N, H\]"),
    ("a per-layer weight of all layers", dict(conv_weight=torch.zeros(2, 16, 4)), ValueError,
     r"conv_weight must be \[dim, K\]"),
    ("ring_slots of another length", dict(ring_slots=torch.tensor([0])), ValueError, "ring_slots has 1 rows"),
    ("dt_softplus not a bool", dict(dt_softplus=1), TypeError, "dt_softplus must be a bool"),
    ("out sharing the state's storage", "out in ssm_state", ValueError, "share"),
]


@pytest.mark.parametrize("name, change, error, message", BAD_VERIFY, ids=[case[0] for case in BAD_VERIFY])
def test_mamba2_ring_verify_refuses_bad_input_before_writing(name, change, error, message):
    harness = Mamba2Harness(num_draft=3, capacity=3)
    harness.step([0, 1], [0, 1], [2, 2])  # a fold is due: a write would show
    arguments = verify_arguments(harness)
    if change == "out in ssm_state":
        change = dict(out=harness.ssm_state[1, :2, :, :3].transpose(1, 2))  # [B, N, H, P] over the pool
    arguments.update(change)
    before = [t.clone() for t in (harness.ssm_state, harness.conv_state, harness.ring.gates, arguments["out"])]
    with pytest.raises(error, match=message):
        sgl_convwin.mamba2_ring_verify(**arguments)
    after = (harness.ssm_state, harness.conv_state, harness.ring.gates, arguments["out"])
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_flush_alloc_and_cache_refuse_bad_input():
    harness = Mamba2Harness(num_draft=3, capacity=3)
    ring, heads = harness.ring, harness.heads
    flush_args = (harness.ssm_state, harness.conv_state, ring.cursor, ring.rows, ring.gates, harness.conv_weight,
                  harness.A, torch.tensor([0]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"num_heads \(3\) must be a multiple of n_groups \(2\)"):
        sgl_convwin.mamba2_ring_flush(*flush_args, **dict(heads, num_heads=3, n_groups=2))
    with pytest.raises(ValueError, match=r"A must be \[L, H\] = \[2, 2\]"):
        sgl_convwin.mamba2_ring_flush(*flush_args[:6], harness.A[0], *flush_args[7:], **heads)
    with pytest.raises(ValueError, match=r"conv_weight must be \[L, dim, K\]"):
        ring.mamba2_flush(harness.ssm_state, harness.conv_state, harness.conv_weight[0], harness.A, torch.tensor([0]),
                          **heads)
    with pytest.raises(ValueError, match="gates must be"):  # a Gated DeltaNet ring
        gdn_ring = sgl_convwin.alloc_ring(2, 3, harness.dim, 3, 2, capacity=3)
        sgl_convwin.mamba2_ring_flush(*flush_args[:2], gdn_ring.cursor, gdn_ring.rows, gdn_ring.gates,
                                      *flush_args[5:], **heads)
    with pytest.raises(ValueError, match=r"capacity \(3\) must be >= num_draft \(4\)"):
        sgl_convwin.alloc_mamba2_ring(2, 3, 24, 4, 2, capacity=3)
    with pytest.raises(ValueError, match="num_heads must be an int >= 1"):
        sgl_convwin.alloc_mamba2_ring(2, 3, 24, 4, 0)
    with pytest.raises(TypeError, match="dtype must be float32, float16 or bfloat16"):
        sgl_convwin.alloc_mamba2_ring(2, 3, 24, 4, 2, dtype=torch.int8)
    for num_gates in (3, True):  # (True == 1, but not a count)
        with pytest.raises(ValueError, match="num_gates must be 2 .* or 1"):
            sgl_convwin.RingCache(2, 3, 24, 4, 2, num_gates=num_gates)


# ---------------------------------------------------------------------------------------------
# The buffers and the memory they take
# ---------------------------------------------------------------------------------------------


def test_ring_cache_of_one_gate():
    cache = sgl_convwin.RingCache(2, 3, 24, 4, 2, capacity=6, dtype=torch.bfloat16, num_gates=1)
    ring = sgl_convwin.alloc_mamba2_ring(2, 3, 24, 4, 2, capacity=6, dtype=torch.bfloat16)
    for name, tensor in ring._asdict().items():
        got = getattr(cache, name)
        assert got.shape == tensor.shape and got.dtype == tensor.dtype and not got.any(), name
    assert cache.gates.shape == (2, 3, 10, 1, 2) and cache.gates.dtype == torch.float32
    assert cache.nbytes == 2 * 3 * 10 * 24 * 2 + 2 * 3 * 10 * 2 * 4 + 3 * 2 * 4


def test_ring_memory_at_nemotron_h_8b():
    """Nemotron-H-8B TP1 (24 Mamba2 layers, conv dim 10240, H 128), bf16 rows, N = 4, capacity 16:
    20 rows x 24 layers x (20 KiB of conv inputs + 512 B of dt) + the cursor, checkpoint excluded."""
    ring = sgl_convwin.alloc_mamba2_ring(24, 1, 10240, 4, 128, capacity=16, device="meta")
    nbytes = sum(t.numel() * t.element_size() for t in ring)
    assert nbytes == 20 * 24 * (10240 * 2 + 128 * 4) + 8 and nbytes <= 10 * 2**20


# ---------------------------------------------------------------------------------------------
# Registration: opcheck, and one whole step under torch.compile(fullgraph=True)
# ---------------------------------------------------------------------------------------------


def op_samples(tree):
    """One call of each op on a Mamba2 ring with something pending (a fold due in the verify)."""
    harness = Mamba2Harness(num_draft=3, capacity=4, num_ring_slots=3, num_state_slots=4, seed=2)
    links = [[-1, 0, 0], [-1, -1, 1], [-1, 0, 1], [-1, 0, 0]]
    harness.step([2, 0, 1], [3, 1, 0], [1, 2, 0], links[:3] if tree else None)  # pending 2, 3, 1: two fold next
    parents = torch.tensor(links) if tree else None
    ring = harness.ring
    ring_slots, state_slots = torch.tensor([2, -1, 0, 1]), torch.tensor([3, -1, 1, 0], dtype=torch.int32)
    arguments = verify_arguments(harness, num_rows=4)
    arguments.update(ring_slots=ring_slots, state_slots=state_slots, parents=parents,
                     D=harness.D[1], z=torch.randn(4, 3, 2, 4), dt_bias=harness.dt_bias[1])
    verify = (tuple(arguments.values()), dict(dt_softplus=True, **({"after_due_flush": True} if tree else {})))
    accept = ((ring.cursor, ring.rows, ring.gates, ring_slots, torch.tensor([2, 0, 1, 2]), parents),
              dict(num_draft=3))
    flush = ((harness.ssm_state, harness.conv_state, ring.cursor, ring.rows, ring.gates, harness.conv_weight,
              harness.A, ring_slots, state_slots, harness.conv_bias),
             dict(**harness.heads, num_draft=3 if tree else None))  # (tree: a due flush)
    return dict(mamba2_ring_verify=verify, ring_accept=accept, mamba2_ring_flush=flush)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_after_due_flush_is_only_a_hint(device):
    """mamba2_ring_verify told a due flush went first when none did (two rows fold) leaves the bits
    of one not told."""
    args, kwargs = op_samples(False)["mamba2_ring_verify"]
    worlds = [[a.to(device, copy=True) if isinstance(a, torch.Tensor) else a for a in args] for _ in range(2)]
    for world, hint in zip(worlds, (False, True)):
        torch.ops.convwin.mamba2_ring_verify(*world, **kwargs, after_due_flush=hint)  # (D, z, dt_bias positional)
    assert not torch.equal(worlds[0][6], args[6].to(device))  # (ssm_state: folded)
    for plain, hinted in zip(*worlds):
        if isinstance(plain, torch.Tensor):
            assert torch.equal(plain, hinted)


@pytest.mark.parametrize("name, tree", [("mamba2_ring_verify", False), ("mamba2_ring_verify", True),
                                        ("ring_accept", True), ("mamba2_ring_flush", False),
                                        ("mamba2_ring_flush", True)],
                         ids=["verify-chain", "verify-tree", "accept-tree", "flush", "flush-due"])
def test_opcheck(name, tree):
    """The Mamba2 ops, and ring_accept moving a tree's one-gate rows; the flush whole and due
    (op_samples' tree variant passes num_draft)."""
    args, kwargs = op_samples(tree)[name]
    torch.library.opcheck(getattr(torch.ops.convwin, name).default, args, kwargs)


def ring_step(ring, ssm_state, conv_state, conv_weight, conv_bias, A, dt_bias, x, dt, slots, steps, flush_slots,
              heads):
    """One decode step in ring mode as the recipe runs it -- the due flush, every layer told so, the
    acceptance -- then a flush."""
    num_rows, num_nodes, dim = x.shape[1:]
    h, p, g, n = heads["num_heads"], heads["head_dim"], heads["n_groups"], heads["d_state"]
    sgl_convwin.mamba2_ring_flush(ssm_state, conv_state, ring.cursor, ring.rows, ring.gates, conv_weight, A, slots,
                                  slots, conv_bias=conv_bias, **heads, num_draft=num_nodes)
    for layer in range(x.shape[0]):
        conv_out = torch.empty(num_rows, num_nodes, dim, device=x.device)
        sgl_convwin.ring_conv1d_verify(conv_out, ring.rows, conv_state, x[layer], conv_weight[layer], conv_bias[layer],
                                       slots, slots, ring.cursor, layer, activation="silu")
        xs, B, C = conv_out.split([h * p, g * n, g * n], dim=-1)
        out = torch.empty(num_rows, num_nodes, h, p, device=x.device)
        sgl_convwin.mamba2_ring_verify(out, xs.unflatten(-1, (h, p)), dt[layer], A[layer], B.unflatten(-1, (g, n)),
                                       C.unflatten(-1, (g, n)), ssm_state, conv_state, ring.rows, ring.gates,
                                       ring.cursor, conv_weight[layer], conv_bias[layer], slots, slots, layer,
                                       dt_bias=dt_bias[layer], dt_softplus=True, after_due_flush=True)
    sgl_convwin.ring_accept(ring.cursor, ring.rows, ring.gates, slots, steps, num_draft=num_nodes)
    sgl_convwin.mamba2_ring_flush(ssm_state, conv_state, ring.cursor, ring.rows, ring.gates, conv_weight, A,
                                  flush_slots, flush_slots, conv_bias=conv_bias, **heads)
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_step_matches_eager(device, dynamic):
    """Four ring steps compiled with fullgraph=True (static or dynamic shapes) give the eager calls'
    bits, every ring op is in the graph, and the ring and states are written in place (no copy of
    them)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()

    def make():
        harness = Mamba2Harness(num_draft=2, capacity=3, num_ring_slots=2, num_state_slots=2, device=device, seed=4)
        return harness, [harness.ring, harness.ssm_state, harness.conv_state, harness.conv_weight, harness.conv_bias,
                         harness.A, harness.dt_bias]

    harness = make()[0]
    generator = torch.Generator().manual_seed(0)
    inputs = [(torch.randn(2, 2, 2, harness.dim, generator=generator), torch.randn(2, 2, 2, 2, generator=generator),
               torch.tensor([1, 0]), torch.randint(0, 2, (2,), generator=generator), torch.tensor([i % 2, -1]))
              for i in range(4)]
    inputs = [tuple(t.to(device) for t in step_inputs) for step_inputs in inputs]
    (_, eager), (_, compiled_args) = make(), make()
    compiled = torch.compile(ring_step, fullgraph=True, dynamic=dynamic)
    for step, step_inputs in enumerate(inputs):
        expected = ring_step(*eager, *step_inputs, harness.heads)
        got, codes = run_and_get_code(compiled, *compiled_args, *step_inputs, harness.heads)
        assert torch.equal(got, expected), step
    code = "\n".join(codes)
    for name in ("ring_conv1d_verify", "mamba2_ring_verify", "ring_accept", "mamba2_ring_flush"):
        assert f"torch.ops.convwin.{name}.default(" in code, name
    assert ".copy_(" not in code and "clone" not in code
    for name in ("rows", "gates", "cursor"):
        assert torch.equal(getattr(eager[0], name), getattr(compiled_args[0], name)), name
    for a, b in zip(eager[1:3], compiled_args[1:3]):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("due_first", [False, True], ids=["verify-folds", "due-first"])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_cuda_graph_steps_match_eager(tree, due_first):
    """A whole Mamba2 step (every layer's conv and verify, then the acceptance; with due_first the
    recipe's, the due flush first and the verifies told so) and a flush, each captured once and
    replayed with new inputs, slots (a padded row), acceptance and tree links written into the
    static inputs, new requests between steps (ring_harness.replay_against_eager)."""
    from support import random_tree

    layers, num_rows, num_draft, num_ring = 2, 3, 3, 4
    generator = torch.Generator().manual_seed(12)
    worlds = [Mamba2Harness(num_layers=layers, num_draft=num_draft, capacity=5, num_ring_slots=num_ring,
                            num_state_slots=5, head_dim=32, d_state=16, device="cuda", seed=3)
              for _ in range(3)]
    heads, dim = worlds[0].heads, worlds[0].dim
    h, p, g, n = heads["num_heads"], heads["head_dim"], heads["n_groups"], heads["d_state"]

    def fresh_inputs():
        ring_slots = torch.where(torch.rand(num_rows, generator=generator) < 0.15, -1,
                                 torch.randperm(num_ring, generator=generator)[:num_rows])
        return dict(x=torch.randn(layers, num_rows, num_draft, dim, generator=generator),
                    dt=torch.randn(layers, num_rows, num_draft, h, generator=generator),
                    ring_slots=ring_slots, state_slots=torch.where(ring_slots < 0, -1, ring_slots + 1),
                    steps=torch.randint(-1, num_draft, (num_rows,), generator=generator),
                    parents=torch.stack([torch.tensor(random_tree(num_draft, generator)) for _ in range(num_rows)]))

    static = {name: t.cuda() for name, t in fresh_inputs().items()}
    if not tree:
        static["parents"] = None
    flush_slots = torch.tensor([0, -1], device="cuda")
    outs = [torch.full((layers, num_rows, num_draft, h, p), FILL, device="cuda") for _ in worlds]

    def step(world, out):
        ring, parents = world.ring, static["parents"]
        if due_first:
            sgl_convwin.mamba2_ring_flush(world.ssm_state, world.conv_state, ring.cursor, ring.rows, ring.gates,
                                          world.conv_weight, world.A, static["ring_slots"], static["state_slots"],
                                          conv_bias=world.conv_bias, **heads, num_draft=num_draft)
        for layer in range(layers):
            conv_out = torch.empty(num_rows, num_draft, dim, device="cuda")
            sgl_convwin.ring_conv1d_verify(conv_out, ring.rows, world.conv_state, static["x"][layer],
                                           world.conv_weight[layer], world.conv_bias[layer], static["ring_slots"],
                                           static["state_slots"], ring.cursor, layer, parents, activation="silu")
            xs, B, C = conv_out.split([h * p, g * n, g * n], dim=-1)
            sgl_convwin.mamba2_ring_verify(out[layer], xs.unflatten(-1, (h, p)), static["dt"][layer], world.A[layer],
                                           B.unflatten(-1, (g, n)), C.unflatten(-1, (g, n)), world.ssm_state,
                                           world.conv_state, ring.rows, ring.gates, ring.cursor,
                                           world.conv_weight[layer], world.conv_bias[layer], static["ring_slots"],
                                           static["state_slots"], layer, parents, D=world.D[layer],
                                           dt_bias=world.dt_bias[layer], dt_softplus=True, after_due_flush=due_first)
        sgl_convwin.ring_accept(ring.cursor, ring.rows, ring.gates, static["ring_slots"], static["steps"], parents,
                                num_draft=num_draft)

    def flush(world):
        sgl_convwin.mamba2_ring_flush(world.ssm_state, world.conv_state, world.ring.cursor, world.ring.rows,
                                      world.ring.gates, world.conv_weight, world.A, flush_slots, flush_slots + 1,
                                      conv_bias=world.conv_bias, **heads)

    replay_against_eager(worlds, outs, step, flush, fresh_inputs, static, flush_slots)
