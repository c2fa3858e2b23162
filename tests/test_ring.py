"""The ring (no commit pass) against its float64 oracle, reference.RingReference, over long random
step sequences, and against the eager flow it replaces (causal_conv1d_verify + capture_gates +
gdn_commit after every step): every step's conv and recurrence outputs within tolerance, every
checkpoint within 1e-4 x max |S| (float32) and its conv window bit for bit, the cursor and every
pending row and gate exactly; at flush, the conv windows bit for bit what the eager commits left.
Then registration (opcheck), torch.compile(fullgraph=True), skipped rows, and bad input.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sgl_convwin
from ring_harness import (FILL, MANY_STEPS_CASES, RING_CASES, Harness, Mamba2Harness, replay_against_eager,
                          run_many_steps, run_sequence, run_strong_decays, through_kernels)
from support import random_tree

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


# ---------------------------------------------------------------------------------------------
# Long random step sequences
# ---------------------------------------------------------------------------------------------


RANDOM_STEPS = dict(data=st.data(), num_draft=st.integers(1, 4), tree=st.booleans(), extra=st.integers(0, 6),
                    kernel_size=st.sampled_from([2, 3, 4]), ring_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
                    state_layout=st.sampled_from(sgl_convwin.STATE_LAYOUTS), due_first=st.booleans())


@settings(max_examples=10)
@given(**RANDOM_STEPS)
def test_random_steps_match_oracle_and_eager(data, num_draft, tree, extra, kernel_size, ring_dtype, state_layout,
                                             due_first):
    """Random step sequences (due_first: each step's folds done first by flush(due_only=True))."""
    run_sequence(data, Harness, num_draft=num_draft, tree=tree and num_draft > 1, capacity=num_draft + extra,
                 num_steps=14, kernel_size=kernel_size, ring_dtype=ring_dtype, state_layout=state_layout,
                 due_first=due_first)


@pytest.mark.gpu
@settings(max_examples=4)  # each example compiles the kernels for its sizes
@given(**RANDOM_STEPS)
def test_random_steps_match_oracle_and_eager_on_gpu(data, num_draft, tree, extra, kernel_size, ring_dtype,
                                                    state_layout, due_first):
    run_sequence(data, Harness, num_draft=num_draft, tree=tree and num_draft > 1, capacity=num_draft + extra,
                 num_steps=14, kernel_size=kernel_size, ring_dtype=ring_dtype, state_layout=state_layout, device="cuda",
                 due_first=due_first)


@pytest.mark.slow
@settings(max_examples=15)
@given(data=st.data(), num_draft=st.integers(1, 5), tree=st.booleans(), capacity=st.integers(1, 32),
       kernel_size=st.sampled_from([2, 3, 4, 5]), ring_dtype=st.sampled_from([torch.bfloat16, torch.float32]),
       ssm_dtype=st.sampled_from([torch.float32, torch.bfloat16]), conv_dtype=st.sampled_from([torch.float32,
                                                                                              torch.bfloat16]),
       state_layout=st.sampled_from(sgl_convwin.STATE_LAYOUTS), ratio=st.sampled_from([1, 2]),
       due_first=st.booleans())
def test_long_random_steps_match_oracle_and_eager(data, num_draft, tree, capacity, kernel_size, ring_dtype, ssm_dtype,
                                                  conv_dtype, state_layout, ratio, due_first):
    run_sequence(data, Harness, num_draft=num_draft, tree=tree and num_draft > 1, capacity=max(capacity, num_draft),
                 num_steps=48, kernel_size=kernel_size, ring_dtype=ring_dtype, ssm_dtype=ssm_dtype,
                 conv_dtype=conv_dtype, state_layout=state_layout, ratio=ratio, due_first=due_first)


@pytest.mark.slow
@pytest.mark.parametrize("device, tree", MANY_STEPS_CASES)
def test_many_steps_flush_within_tolerance(device, tree):
    """1,000 steps of random acceptance with the default capacity (issue 39's accuracy target): the
    harness checks every checkpoint and, at the end, the flushed states against the float64 oracle
    (1e-4 x max |S|) and the conv windows against the eager commits' bit for bit."""
    run_many_steps(Harness, device, tree)


@pytest.mark.parametrize("case", RING_CASES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_strong_decays(case, tree, monkeypatch):
    """Decays that leave next to nothing of the state before them (GDN: log decays -1e4 .. -inf),
    folded and verified past: within tolerance of the oracle, not lost to the rounding of a sum; the
    "kernels" case holds the ring's Triton kernels themselves (the interpreter) to the oracle."""
    run_strong_decays(Harness, case, tree, monkeypatch)


# ---------------------------------------------------------------------------------------------
# The fold rule at every boundary
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_draft, capacity", [(1, 1), (1, 3), (3, 3), (3, 4), (3, 5), (2, 7)])
@pytest.mark.parametrize("accepted", ["one", "all", "cycle"])
def test_folds_exactly_when_the_ring_would_overflow(num_draft, capacity, accepted):
    """A checkpoint is written (both states) exactly when pending > 0 and pending + N > capacity,
    and is left bit for bit alone otherwise; every pending count 0..capacity is met where the
    acceptance pattern reaches it."""
    harness = Harness(num_draft=num_draft, capacity=capacity, num_ring_slots=1, num_state_slots=2, num_layers=1)
    seen = set()
    for step in range(2 * capacity + 3):
        count = {"one": 1, "all": num_draft, "cycle": 1 + step % num_draft}[accepted]
        pending = int(harness.ring.pending[0])
        before = harness.ssm_state[:, 1].clone(), harness.conv_state[:, 1].clone()
        harness.step([0], [1], [count - 1])
        wrote = not torch.equal(before[0], harness.ssm_state[:, 1]) or not torch.equal(before[1],
                                                                                        harness.conv_state[:, 1])
        assert wrote == (pending > 0 and pending + num_draft > capacity), (step, pending)
        assert int(harness.ring.pending[0]) == (0 if pending + num_draft > capacity else pending) + count
        seen.add(pending)
    if accepted == "one":
        assert seen == set(range(capacity - num_draft + 2))  # every pending count up to the first fold


@pytest.mark.parametrize("case", RING_CASES)
@pytest.mark.parametrize("harness_type", [Harness, Mamba2Harness], ids=["gdn", "mamba2"])
@pytest.mark.parametrize("tree_depth, capacity", [(1, 8), (3, 9), (4, 16)])
@pytest.mark.parametrize("due_first", [False, True], ids=["", "due-first"])
def test_trees_fold_by_their_depth(case, harness_type, tree_depth, capacity, due_first, monkeypatch):
    """With tree_depth T a tree of N = 8 nodes, T of them on its longest path, folds exactly when
    pending > 0 and pending + T > capacity -- not pending + N -- and accept agrees (the cursor);
    every pending count up to capacity - T + 1 is met, one token accepted a step, then the deepest
    path. Every output and checkpoint against the oracle, as in every harness run; on CUDA at
    widths where the GDN ring takes the mma kernel; "kernels": the Triton kernels interpreted."""
    if case == "kernels":
        through_kernels(monkeypatch)
    dims = ((dict(head_k_dim=32, head_v_dim=32) if harness_type is Harness else dict(head_dim=32, d_state=32))
            if case == "cuda" else {})
    harness = harness_type(num_draft=8, capacity=capacity, num_ring_slots=1, num_state_slots=2, num_layers=1,
                           device="cpu" if case == "kernels" else case, tree_depth=tree_depth, due_first=due_first,
                           **dims)
    parents = [[-1, *range(tree_depth - 1), *[-1] * (8 - tree_depth)]]
    seen = set()
    for step in range(capacity + 4):
        node = 0 if step < capacity else tree_depth - 1  # the root (1 token), then the deepest path (T)
        pending = int(harness.ring.pending[0])
        before = harness.ssm_state[:, 1].clone(), harness.conv_state[:, 1].clone()
        harness.step([0], [1], [node], parents)
        wrote = not torch.equal(before[0], harness.ssm_state[:, 1]) or not torch.equal(before[1],
                                                                                        harness.conv_state[:, 1])
        folds = pending > 0 and pending + tree_depth > capacity
        assert wrote == folds, (step, pending)
        assert int(harness.ring.pending[0]) == (0 if folds else pending) + node + 1
        seen.add(pending)
    assert set(range(capacity - tree_depth + 2)) <= seen


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_due_folds_first_leave_what_the_verifies_folds_leave(device, tree):
    """flush(due_only=True) before each step folds, every layer, exactly the rows the step's
    verifies would have folded (no other checkpoint, window or cursor changes) and leaves the same
    bits as those folds (the same arithmetic); the verifies then find nothing to fold. Chains and
    trees of 4 at capacity 8, three rows (one padded), 30 steps of random acceptance; on CUDA at
    dk = dv = 32, where both fold on the mma kernel."""
    dims = dict(head_k_dim=32, head_v_dim=32) if device == "cuda" else {}
    worlds = [Harness(num_draft=4, capacity=8, num_ring_slots=3, num_state_slots=4, num_layers=3, device=device,
                      seed=3, due_first=due_first, **dims) for due_first in (False, True)]
    generator = torch.Generator().manual_seed(4)
    parents = [[-1, 0, 0, 1]] * 3 if tree else None
    due_folds = 0
    for _ in range(30):
        steps = torch.randint(-1, 4, (3,), generator=generator)
        plain, due = worlds
        pending = plain.ring.pending.clone()
        before = due.ssm_state.clone(), due.conv_state.clone(), due.ring.cursor.clone()
        due.ring_flush(torch.tensor([2, 0, -1], device=device), torch.tensor([3, 1, -1], device=device),
                       due_only=True)
        folding = [(slot, state) for slot, state in ((2, 3), (0, 1)) if 0 < pending[slot] and pending[slot] + 4 > 8]
        due_folds += len(folding)
        untouched = [state for state in range(4) if state not in [s for _, s in folding]]
        assert torch.equal(due.ssm_state[:, untouched], before[0][:, untouched])
        assert torch.equal(due.conv_state[:, untouched], before[1][:, untouched])
        for slot in range(3):
            moved = slot in [r for r, _ in folding]
            want = (torch.tensor([(int(before[2][slot, 0]) + int(pending[slot])) % 12, 0]) if moved
                    else before[2][slot].cpu())
            assert torch.equal(due.ring.cursor[slot].cpu(), want.to(due.ring.cursor.dtype)), slot
        for world in worlds:  # (the due world's own flush finds nothing left to fold)
            world.step([2, 0, -1], [3, 1, -1], steps, parents)
        for a, b in ((plain.ssm_state, due.ssm_state), (plain.conv_state, due.conv_state),
                     (plain.ring.cursor, due.ring.cursor), (plain.ring.rows, due.ring.rows),
                     (plain.ring.gates, due.ring.gates)):
            assert torch.equal(a, b)
    assert due_folds > 0 and worlds[0].folds > 0 and worlds[1].folds == 0


# ---------------------------------------------------------------------------------------------
# Skipped rows, bad links, the checked mode
# ---------------------------------------------------------------------------------------------


def test_padded_and_out_of_range_rows_touch_nothing():
    """Rows with a negative or out-of-range slot, or whose cursor is not a ring position, are
    skipped by every op: their outputs keep their values, no state, row, gate or cursor changes."""
    harness = Harness(num_draft=2, capacity=3, num_ring_slots=3, num_state_slots=3)
    harness.step([0, 1, 2], [0, 1, 2], [1, 1, 1])  # something pending everywhere
    ring = harness.ring
    ring.cursor[2] = torch.tensor([ring.rows.shape[2], 0])  # not a ring position
    before = {name: t.clone() for name, t in (("ssm", harness.ssm_state), ("conv", harness.conv_state),
                                              ("rows", ring.rows), ("gates", ring.gates), ("cursor", ring.cursor))}
    ring_slots = torch.tensor([-1, 7, 0, 1, 2])
    state_slots = torch.tensor([0, 1, -1, 9, 2])
    dim, hv = harness.dim, harness.heads["num_v_heads"]
    x = torch.randn(5, 2, dim)
    conv_out = torch.full((5, 2, dim), FILL)
    ring.conv1d_verify(conv_out, harness.conv_state, x, harness.conv_weight[0], None, ring_slots, 0,
                       state_slots=state_slots)
    q = k = torch.randn(5, 2, 1, 4)
    v = torch.randn(5, 2, hv, 4)
    g, beta = -torch.rand(5, 2, hv), torch.rand(5, 2, hv)
    out = torch.full((5, 2, hv, 4), FILL)
    ring.gdn_verify(out, q, k, v, g, beta, harness.ssm_state, harness.conv_state, harness.conv_weight[0], None,
                    ring_slots, 0, state_slots=state_slots)
    ring.accept(torch.tensor([-1, 7, 2, -3, 2]), torch.tensor([0, 1, 1, 1, 0]))
    ring.flush(harness.ssm_state, harness.conv_state, harness.conv_weight, ring_slots, state_slots=state_slots,
               **harness.heads)
    assert torch.equal(conv_out, torch.full_like(conv_out, FILL)) and torch.equal(out, torch.full_like(out, FILL))
    after = dict(ssm=harness.ssm_state, conv=harness.conv_state, rows=ring.rows, gates=ring.gates, cursor=ring.cursor)
    for name, tensor in after.items():
        assert torch.equal(tensor, before[name]), name


def test_bad_parent_links():
    """A node with a bad link among the K-1 above it gets no conv output; a row with any bad link
    gets no recurrence output but still folds and stores its gates; an accepted path through a bad
    link accepts nothing. The harness holds the ops to the oracle's rules for all of that."""
    harness = Harness(num_draft=4, capacity=5)
    good = [-1, 0, 0, 1]
    harness.step([0, 1], [0, 1], [3, 2], [good, good])
    harness.step([0, 1], [0, 1], [3, 3], [[-1, 0, 5, 1], [-1, 0, 0, 2]])  # row 0: node 2's link is bad
    harness.step([0, 1], [0, 1], [2, 3], [[-1, 0, 0, -7], good])  # row 0's accepted path is good
    harness.flush([0, 1], [0, 1])


def test_checked_mode_names_bad_rows():
    harness = Harness(num_draft=2, capacity=2, num_ring_slots=2, num_state_slots=2)
    ring = harness.ring
    dim = harness.dim
    out, x = torch.zeros(1, 2, dim), torch.zeros(1, 2, dim)
    with sgl_convwin.index_checks():
        with pytest.raises(IndexError, match=r"state_slots\[0\] = -1 .* ring_slots\[0\] = 1 is active"):
            ring.conv1d_verify(out, harness.conv_state, x, harness.conv_weight[0], None, torch.tensor([1]), 0,
                               state_slots=torch.tensor([-1]))
        ring.cursor[1] = torch.tensor([0, 3])
        with pytest.raises(IndexError, match=r"cursor\[1\] = \(0, 3\)"):
            ring.accept(torch.tensor([1]), torch.tensor([0]))
        ring.cursor[1] = 0
        with pytest.raises(IndexError, match="both use ring slot 1"):
            ring.accept(torch.tensor([1, 1]), torch.tensor([0, 0]))
        with pytest.raises(IndexError, match=r"steps\[0\] = 2"):
            ring.accept(torch.tensor([1]), torch.tensor([2]))
        x2 = torch.zeros(2, 2, dim)
        with pytest.raises(IndexError, match="rows 0 and 1 both use state slot 0"):  # (one checkpoint, two rings)
            ring.conv1d_verify(torch.zeros_like(x2), harness.conv_state, x2, harness.conv_weight[0], None,
                               torch.tensor([0, 1]), 0, state_slots=torch.tensor([0, 0]))
        with pytest.raises(IndexError, match="rows 0 and 1 both use state slot 1"):
            ring.flush(harness.ssm_state, harness.conv_state, harness.conv_weight, torch.tensor([0, 1]),
                       state_slots=torch.tensor([1, 1]), **harness.heads)
        with pytest.raises(IndexError, match=r"ring_slots\[0\] = 5 is out of range for a ring of 2 slots"):
            ring.conv1d_verify(out, harness.conv_state, x, harness.conv_weight[0], None, torch.tensor([5]), 0,
                               state_slots=torch.tensor([0]))
        with pytest.raises(IndexError, match=r"parents\[0, 1\] = 1; a node's parent must be an earlier node"):
            ring.conv1d_verify(out, harness.conv_state, x, harness.conv_weight[0], None, torch.tensor([1]), 0,
                               state_slots=torch.tensor([0]), parents=torch.tensor([[-1, 1]]))
        with pytest.raises(IndexError, match=r"parents\[0, 1\] = 2"):
            ring.accept(torch.tensor([1]), torch.tensor([1]), parents=torch.tensor([[-1, 2]]))
        chain = torch.tensor([[-1, 0]])
        for call in (lambda: sgl_convwin.ring_accept(ring.cursor, ring.rows, ring.gates, torch.tensor([1]),
                                                     torch.tensor([1]), chain, num_draft=2, tree_depth=1),
                     lambda: sgl_convwin.gdn_ring_verify(**dict(verify_arguments(harness, 1), parents=chain,
                                                                state_slots=torch.tensor([0])), tree_depth=1)):
            with pytest.raises(IndexError, match=r"parents\[0\] = \[-1, 0\] has a root path of 2 nodes, more than "
                                                 r"tree_depth = 1"):
                call()


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors before any write
# ---------------------------------------------------------------------------------------------


def verify_arguments(harness, num_rows=2):
    """Arguments of one gdn_ring_verify call on the harness's ring, as a dict."""
    hk, dk, hv, dv = (harness.heads[n] for n in ("num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim"))
    n = harness.num_draft
    return dict(out=torch.zeros(num_rows, n, hv, dv), q=torch.randn(num_rows, n, hk, dk),
                k=torch.randn(num_rows, n, hk, dk), v=torch.randn(num_rows, n, hv, dv), g=-torch.rand(num_rows, n, hv),
                beta=torch.rand(num_rows, n, hv), ssm_state=harness.ssm_state, conv_state=harness.conv_state,
                rows=harness.ring.rows, gates=harness.ring.gates, cursor=harness.ring.cursor,
                conv_weight=harness.conv_weight[0], conv_bias=None, ring_slots=torch.tensor(list(range(num_rows))),
                state_slots=torch.tensor([0, 1]), layer=1)


BAD_VERIFY = [
    ("a ring too short for N", dict(rows=torch.zeros(2, 3, 5, 16), gates=torch.zeros(2, 3, 5, 2, 2)),
     ValueError, "at least 6"),
    ("gates of other heads", dict(gates=torch.zeros(2, 3, 6, 2, 3)), ValueError, "gates must be"),
    ("a cursor of floats", dict(cursor=torch.zeros(3, 2)), TypeError, "cursor must be int32 or int64"),
    ("a cursor of another shape", dict(cursor=torch.zeros(3, 3, dtype=torch.int32)), ValueError, r"cursor must be \[M, 2\]"),
    ("one layer's state pool", dict(ssm_state=torch.zeros(5, 2, 4, 4)), ValueError, "every layer's pool"),
    ("a layer out of range", dict(layer=2), ValueError, "layer 2 is out of range"),
    ("rows of another dim", dict(rows=torch.zeros(2, 3, 6, 15)), ValueError, "dim = 16"),
    ("a per-layer weight of all layers", dict(conv_weight=torch.zeros(2, 16, 4)), ValueError, r"conv_weight must be \[dim, K\]"),
    ("ring_slots of another length", dict(ring_slots=torch.tensor([0])), ValueError, "ring_slots has 1 rows"),
    ("an int64 gates tensor", dict(gates=torch.zeros(2, 3, 6, 2, 2, dtype=torch.int64)), TypeError, "gates must be float"),
    ("no gates", dict(gates=None), TypeError, "gates must be a torch.Tensor, got NoneType"),
    ("a ring of no slots", dict(rows=torch.zeros(2, 0, 6, 16), gates=torch.zeros(2, 0, 6, 2, 2),
                                cursor=torch.zeros(0, 2, dtype=torch.int32)), ValueError, r"at least one ring slot \(M >= 1\)"),
]


@pytest.mark.parametrize("name, change, error, message", BAD_VERIFY, ids=[case[0] for case in BAD_VERIFY])
def test_gdn_ring_verify_refuses_bad_input_before_writing(name, change, error, message):
    harness = Harness(num_draft=3, capacity=3)
    harness.step([0, 1], [0, 1], [2, 2])
    arguments = verify_arguments(harness)
    arguments.update(change)
    before = [t.clone() for t in (harness.ssm_state, harness.conv_state, harness.ring.gates, arguments["out"])]
    with pytest.raises(error, match=message):
        sgl_convwin.gdn_ring_verify(**arguments)
    after = (harness.ssm_state, harness.conv_state, harness.ring.gates, arguments["out"])
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_other_ops_refuse_bad_input():
    harness = Harness(num_draft=3, capacity=3)
    ring, dim = harness.ring, harness.dim
    with pytest.raises(ValueError, match="at least 8"):  # a ring allocated for 3 drafts verifying 4
        ring_conv = sgl_convwin.ring_conv1d_verify
        ring_conv(torch.zeros(1, 4, dim), ring.rows, harness.conv_state, torch.zeros(1, 4, dim),
                  harness.conv_weight[0], None, torch.tensor([0]), torch.tensor([0]), ring.cursor, 0)
    with pytest.raises(ValueError, match="share storage"):
        sgl_convwin.ring_conv1d_verify(ring.rows[0, :1, :3], ring.rows, harness.conv_state, torch.zeros(1, 3, dim),
                                       harness.conv_weight[0], None, torch.tensor([0]), torch.tensor([0]), ring.cursor, 0)
    with pytest.raises(ValueError, match="num_draft must be >= 1"):
        ring_accept_args = (ring.cursor, ring.rows, ring.gates, torch.tensor([0]), torch.tensor([0]))
        sgl_convwin.ring_accept(*ring_accept_args, num_draft=0)
    with pytest.raises(ValueError, match=r"parents must be \[B, N\] = \[1, 3\]"):
        sgl_convwin.ring_accept(*ring_accept_args, torch.zeros(1, 2, dtype=torch.long), num_draft=3)
    with pytest.raises(ValueError, match="num_v_heads .* must be a multiple"):
        sgl_convwin.gdn_ring_flush(harness.ssm_state, harness.conv_state, ring.cursor, ring.rows, ring.gates,
                                   harness.conv_weight, torch.tensor([0]), torch.tensor([0]), num_k_heads=2,
                                   head_k_dim=4, num_v_heads=3, head_v_dim=4)
    with pytest.raises(ValueError, match=r"conv_weight must be \[L, dim, K\]"):
        ring.flush(harness.ssm_state, harness.conv_state, harness.conv_weight[0], torch.tensor([0]), **harness.heads)
    flush_args = (harness.ssm_state, harness.conv_state, ring.cursor, ring.rows, ring.gates, harness.conv_weight,
                  torch.tensor([0]), torch.tensor([0]))
    with pytest.raises(ValueError, match="num_draft must be >= 1"):
        sgl_convwin.gdn_ring_flush(*flush_args, num_draft=0, **harness.heads)
    with pytest.raises(ValueError, match="at least 8"):  # (the verify's N: a ring of 6 rows verifies at most 3)
        sgl_convwin.gdn_ring_flush(*flush_args, num_draft=4, **harness.heads)
    with pytest.raises(ValueError, match="capacity .* must be >= num_draft"):
        sgl_convwin.alloc_ring(2, 3, 16, 4, 2, capacity=3)
    tree = torch.tensor([[-1, 0, 0]])
    for depth, error, message in ((0, ValueError, "tree_depth must be >= 1"), (True, TypeError, "tree_depth must be an int"),
                                  (4, ValueError, r"tree_depth \(4\) .* so at most 3")):
        with pytest.raises(error, match=message):
            sgl_convwin.ring_accept(*ring_accept_args, tree, num_draft=3, tree_depth=depth)
    with pytest.raises(ValueError, match="tree_depth = 2 with a chain .* accepts up to N tokens; pass None"):
        sgl_convwin.ring_accept(*ring_accept_args, num_draft=3, tree_depth=2)
    with pytest.raises(ValueError, match="tree_depth = 2 with a chain"):
        sgl_convwin.gdn_ring_verify(**verify_arguments(harness), tree_depth=2)
    with pytest.raises(ValueError, match="tree_depth .* needs num_draft"):
        sgl_convwin.gdn_ring_flush(*flush_args, tree_depth=2, **harness.heads)
    with pytest.raises(ValueError, match="tree_depth .* so at most 3"):
        sgl_convwin.gdn_ring_flush(*flush_args, num_draft=3, tree_depth=5, **harness.heads)
    with pytest.raises(ValueError, match="RingCache: tree_depth .* so at most 4"):
        sgl_convwin.RingCache(2, 3, 16, 4, 2, capacity=6, tree_depth=5)
    for op, args in ((sgl_convwin.ring_accept, (ring.cursor, ring.rows, None, torch.tensor([0]), torch.tensor([0]))),
                     (sgl_convwin.gdn_ring_flush, (*flush_args[:4], None, *flush_args[5:]))):
        kwargs = dict(num_draft=3) if op is sgl_convwin.ring_accept else harness.heads
        for device in ("cpu", "meta"):  # (the fake too: a compiled graph is refused when traced)
            moved = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
            call = op if device == "cpu" else op.op
            with pytest.raises(TypeError, match="gates must be a torch.Tensor, got NoneType"):
                call(*moved, **kwargs)


# ---------------------------------------------------------------------------------------------
# The engine-facing module and the memory it takes
# ---------------------------------------------------------------------------------------------


def test_ring_cache_buffers_reset_and_bytes():
    cache = sgl_convwin.RingCache(2, 3, 16, 4, 2, capacity=6, dtype=torch.bfloat16)
    assert cache.rows.shape == (2, 3, 10, 16) and cache.gates.shape == (2, 3, 10, 2, 2)
    assert cache.cursor.dtype == torch.int32 and set(dict(cache.named_buffers())) == {"rows", "gates", "cursor"}
    assert cache.state_dict() == {}
    cache.cursor.copy_(torch.tensor([[3, 2], [4, 5], [1, 1]]))
    cache.reset(torch.tensor([2, -1, 0, 9]))
    assert cache.cursor.tolist() == [[0, 0], [4, 5], [0, 0]] and cache.pending.tolist() == [0, 5, 0]
    cache.accept(torch.tensor([0, 1, -1]), num_accepted=torch.tensor([3, 1, 2]))  # slot 1 folded: start wraps
    assert cache.cursor.tolist() == [[0, 3], [9, 1], [0, 0]]
    assert cache.nbytes == 2 * 3 * 10 * 16 * 2 + 2 * 3 * 10 * 2 * 2 * 4 + 3 * 2 * 4


def test_ring_cache_refuses_another_number_of_drafts():
    """A ring verified with another N than it was made for would fold where accept does not (or the
    reverse), losing or repeating pending tokens: each verify method refuses it before any write
    (the calls are otherwise valid: dim 16 = 2 x 1 x 4 + 2 x 4 = 2 x 4 + 2 x 1 x 4)."""
    x, slots = torch.randn(1, 2, 16), torch.tensor([0])
    states = dict(ssm_state=torch.zeros(2, 3, 2, 4, 4), conv_state=torch.zeros(2, 3, 16, 3),
                  conv_weight=torch.randn(16, 4), conv_bias=None, slots=slots, layer=0)
    gdn = (torch.empty(1, 2, 2, 4), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 2, 4),
           -torch.rand(1, 2, 2), torch.rand(1, 2, 2))
    mamba2 = (torch.empty(1, 2, 2, 4), torch.randn(1, 2, 2, 4), torch.rand(1, 2, 2), -torch.rand(2),
              torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    for num_gates, verify in ((2, lambda c: c.gdn_verify(*gdn, **states)),
                              (1, lambda c: c.mamba2_verify(*mamba2, **states)),
                              (2, lambda c: c.conv1d_verify(torch.empty_like(x), states["conv_state"], x,
                                                            states["conv_weight"], None, slots, 0))):
        cache = sgl_convwin.RingCache(2, 3, 16, 4, 2, capacity=6, dtype=torch.float32, num_gates=num_gates)
        cache.cursor.copy_(torch.tensor([[0, 3], [0, 0], [0, 0]]))
        cache.rows.normal_()
        before = {name: t.clone() for name, t in cache.named_buffers()}
        with pytest.raises(ValueError, match="verifies 4 draft tokens a step .* got 2"):
            verify(cache)
        assert all(torch.equal(t, before[name]) for name, t in cache.named_buffers())
        cache.num_draft = 2  # (the same call on a ring of N = 2 runs)
        verify(cache)


def test_ring_cache_names_malformed_arguments():
    """RingCache's own steps before the op's checks name what is wrong instead of failing inside:
    drafts that are no [B, N, ...] tensor reach the op's checks; reset takes a 1-D int32/int64
    tensor of slots on the cursor's device (float slots would be truncated). Nothing is written."""
    cache = sgl_convwin.RingCache(2, 3, 16, 4, 2, capacity=6, dtype=torch.float32)
    cache.cursor.copy_(torch.tensor([[3, 2], [4, 5], [1, 1]]))
    before = {name: t.clone() for name, t in cache.named_buffers()}
    conv_state, weight, slots = torch.zeros(2, 3, 16, 3), torch.randn(16, 4), torch.tensor([0])
    for x, error, message in ((torch.randn(16), ValueError, "x must be \\[B, N, dim\\]"),
                              ([1.0, 2.0], TypeError, "x must be a torch.Tensor, got list")):
        with pytest.raises(error, match=message):
            cache.conv1d_verify(torch.empty(1, 4, 16), conv_state, x, weight, None, slots, 0)
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got NoneType"):
        cache.gdn_verify(torch.empty(1, 4, 2, 4), None, None, None, None, None, torch.zeros(2, 3, 2, 4, 4),
                         conv_state, weight, None, slots, 0)
    for bad, error, message in (([0, 2], TypeError, "slots must be a torch.Tensor, got list"),
                                (torch.tensor([[0, 2]]), ValueError, "slots must be 1-D"),
                                (torch.tensor([0.9, 2.5]), TypeError, "slots must be int32 or int64"),
                                (torch.tensor([0], device="meta"), ValueError,
                                 "slots is on meta but the ring's cursor")):
        with pytest.raises(error, match=f"RingCache.reset: {message}"):
            cache.reset(bad)
    assert all(torch.equal(t, before[name]) for name, t in cache.named_buffers())


@pytest.mark.parametrize("make", [lambda: sgl_convwin.RingCache(2, 3, 16, 4, 2, capacity=6, dtype=torch.float32),
                                  lambda: sgl_convwin.ConvWindowCache(2, 3, 16, 4, 4, dtype=torch.float32,
                                                                      gate_heads=2)],
                         ids=["ring", "conv-window"])
def test_caches_keep_float32_gates_through_to(make):
    """model.to(torch.bfloat16) or .half() converts a cache's other float buffer and takes the gates
    along without rounding them: the commits and the ring's replays must see the gates the verify
    saw."""
    cache = make()
    cache.gates.uniform_(-1, 1)
    gates = cache.gates.clone()
    for convert, dtype, device in ((lambda c: c.to(torch.bfloat16), torch.bfloat16, "cpu"),
                                   (lambda c: c.half(), torch.float16, "cpu"),
                                   (lambda c: c.to("meta", torch.float32), torch.float32, "meta")):
        converted = convert(cache)
        other = next(t for name, t in cache.named_buffers() if name != "gates" and t.is_floating_point())
        assert converted is cache and (other.dtype, other.device.type) == (dtype, device)
        assert (cache.gates.dtype, cache.gates.device.type) == (torch.float32, device)
        if device == "cpu":
            assert torch.equal(cache.gates, gates)


def test_ring_memory_at_qwen3_next():
    """Qwen3-Next TP1 (36 GDN layers, conv dim 8192, Hv 32), bf16 rows, D = 4, capacity 16: the
    ring takes at most 12 MiB per slot (the checkpoint states not counted)."""
    ring = sgl_convwin.alloc_ring(36, 1, 8192, 4, 32, capacity=16, device="meta")
    nbytes = sum(t.numel() * t.element_size() for t in ring)
    assert nbytes <= 12 * 2**20, nbytes / 2**20


# ---------------------------------------------------------------------------------------------
# Registration: opcheck, and one whole step under torch.compile(fullgraph=True)
# ---------------------------------------------------------------------------------------------


def op_samples(tree):
    """One call of each ring op on a ring with something pending (a fold due in the verify)."""
    harness = Harness(num_draft=3, capacity=4, num_ring_slots=3, num_state_slots=4, seed=2)
    links = [[-1, 0, 0], [-1, -1, 1], [-1, 0, 0], [-1, 0, 0]]  # (no root path of more than 2 nodes)
    harness.step([2, 0, 1], [3, 1, 0], [1, 2, 0], links[:3] if tree else None)  # pending 2, 3, 1: two fold next
    parents = torch.tensor(links) if tree else None
    ring, dim = harness.ring, harness.dim
    ring_slots, state_slots = torch.tensor([2, -1, 0, 1]), torch.tensor([3, -1, 1, 0], dtype=torch.int32)
    x = torch.randn(4, 3, dim)
    conv = ((torch.zeros(4, 3, dim), ring.rows, harness.conv_state, x, harness.conv_weight[0], harness.conv_bias[0],
             ring_slots, state_slots, ring.cursor, 1, parents), dict(activation="silu"))
    arguments = verify_arguments(harness, num_rows=4)
    arguments.update(ring_slots=ring_slots, state_slots=state_slots, parents=parents)
    depth = dict(tree_depth=2) if tree else {}
    verify = (tuple(arguments.values()), dict(scale=0.5, **({"after_due_flush": True} if tree else {}), **depth))
    accept = ((ring.cursor, ring.rows, ring.gates, ring_slots, torch.tensor([2, 0, 1, 2]), parents),
              dict(num_draft=3, **depth))
    flush = ((harness.ssm_state, harness.conv_state, ring.cursor, ring.rows, ring.gates, harness.conv_weight,
              ring_slots, state_slots, harness.conv_bias), dict(**harness.heads, num_draft=3 if tree else None, **depth))
    return dict(ring_conv1d_verify=conv, gdn_ring_verify=verify, ring_accept=accept, gdn_ring_flush=flush)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("name", ["ring_conv1d_verify", "gdn_ring_verify", "ring_accept", "gdn_ring_flush"])
def test_opcheck(name, tree, device):
    args, kwargs = op_samples(tree)[name]
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    torch.library.opcheck(getattr(torch.ops.convwin, name).default, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_after_due_flush_is_only_a_hint(device):
    """A verify told a due flush went first (after_due_flush) when none did -- two rows fold -- leaves
    the bits of one not told: the hint shapes the fold launch (a program a row), never the results."""
    args, kwargs = op_samples(False)["gdn_ring_verify"]
    worlds = [[a.to(device, copy=True) if isinstance(a, torch.Tensor) else a for a in args] for _ in range(2)]
    for world, hint in zip(worlds, (False, True)):
        sgl_convwin.gdn_ring_verify(*world, **kwargs, after_due_flush=hint)
    assert not torch.equal(worlds[0][6], args[6].to(device))  # (ssm_state: folded)
    for plain, hinted in zip(*worlds):
        if isinstance(plain, torch.Tensor):
            assert torch.equal(plain, hinted)


def ring_step(ring, ssm_state, conv_state, conv_weight, conv_bias, x, g, beta, slots, steps, flush_slots, heads,
              parents=None, tree_depth=None):
    """One decode step in ring mode as the recipe runs it -- the due flush, every layer told so, the
    acceptance -- then a flush; trees with ``parents`` and ``tree_depth``."""
    num_rows, num_nodes, _ = x.shape[1:]
    hk, dk, hv, dv = heads["num_k_heads"], heads["head_k_dim"], heads["num_v_heads"], heads["head_v_dim"]
    sgl_convwin.gdn_ring_flush(ssm_state, conv_state, ring.cursor, ring.rows, ring.gates, conv_weight, slots, slots,
                               conv_bias=conv_bias, **heads, num_draft=num_nodes, tree_depth=tree_depth)
    for layer in range(x.shape[0]):
        conv_out = torch.empty(num_rows, num_nodes, x.shape[3], device=x.device)
        sgl_convwin.ring_conv1d_verify(conv_out, ring.rows, conv_state, x[layer], conv_weight[layer], conv_bias[layer],
                                       slots, slots, ring.cursor, layer, parents, activation="silu")
        q, k, v = conv_out.split([hk * dk, hk * dk, hv * dv], dim=-1)
        out = torch.empty(num_rows, num_nodes, hv, dv, device=x.device)
        sgl_convwin.gdn_ring_verify(out, q.unflatten(-1, (hk, dk)), k.unflatten(-1, (hk, dk)),
                                    v.unflatten(-1, (hv, dv)), g[layer], beta[layer], ssm_state, conv_state, ring.rows,
                                    ring.gates, ring.cursor, conv_weight[layer], conv_bias[layer], slots, slots, layer,
                                    parents, after_due_flush=True, tree_depth=tree_depth)
    sgl_convwin.ring_accept(ring.cursor, ring.rows, ring.gates, slots, steps, parents, num_draft=num_nodes,
                            tree_depth=tree_depth)
    sgl_convwin.gdn_ring_flush(ssm_state, conv_state, ring.cursor, ring.rows, ring.gates, conv_weight, flush_slots,
                               flush_slots, conv_bias=conv_bias, **heads)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_compiled_step_matches_eager(device, dynamic, tree):
    """Four ring steps compiled with fullgraph=True (static or dynamic shapes) give the eager calls'
    bits, every ring op is in the graph, and the ring and states are written in place (no copy of
    them); trees of two roots told their depth (1)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()

    def make():
        harness = Harness(num_draft=2, capacity=3, num_ring_slots=2, num_state_slots=2, device=device, seed=4)
        return harness, [harness.ring, harness.ssm_state, harness.conv_state, harness.conv_weight, harness.conv_bias]

    heads = make()[0].heads
    generator = torch.Generator().manual_seed(0)
    inputs = [(torch.randn(2, 2, 2, 16, generator=generator), -torch.rand(2, 2, 2, 2, generator=generator),
               torch.rand(2, 2, 2, 2, generator=generator), torch.tensor([1, 0]),
               torch.randint(0, 2, (2,), generator=generator), torch.tensor([i % 2, -1])) for i in range(4)]
    inputs = [tuple(t.to(device) for t in step_inputs) for step_inputs in inputs]
    (_, eager), (_, compiled_args) = make(), make()
    compiled = torch.compile(ring_step, fullgraph=True, dynamic=dynamic)
    trees = dict(parents=torch.tensor([[-1, -1]] * 2, device=device), tree_depth=1) if tree else {}
    for step, step_inputs in enumerate(inputs):
        expected = ring_step(*eager, *step_inputs, heads, **trees)
        got, codes = run_and_get_code(compiled, *compiled_args, *step_inputs, heads, **trees)
        assert torch.equal(got, expected), step
    code = "\n".join(codes)
    for name in ("ring_conv1d_verify", "gdn_ring_verify", "ring_accept", "gdn_ring_flush"):
        assert f"torch.ops.convwin.{name}.default(" in code, name
    assert ".copy_(" not in code and "clone" not in code
    for name in ("rows", "gates", "cursor"):
        assert torch.equal(getattr(eager[0], name), getattr(compiled_args[0], name)), name
    for a, b in zip(eager[1:3], compiled_args[1:3]):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# CUDA graphs: a whole step captured once, replayed with everything rewritten between replays
# ---------------------------------------------------------------------------------------------


def ring_layers_step(ring, ssm_state, conv_state, conv_weight, conv_bias, out, x, g, beta, ring_slots, state_slots,
                     steps, parents, heads, due_first=False, tree_depth=None):
    """Every layer's ring conv and verify (outputs into out [L, B, N, Hv, dv]), then the acceptance;
    with due_first the step begins with the due flush and its verifies are told so (the recipe);
    tree_depth passed to every op that takes it."""
    hk, dk, hv, dv = heads["num_k_heads"], heads["head_k_dim"], heads["num_v_heads"], heads["head_v_dim"]
    if due_first:
        sgl_convwin.gdn_ring_flush(ssm_state, conv_state, ring.cursor, ring.rows, ring.gates, conv_weight, ring_slots,
                                   state_slots, conv_bias=conv_bias, **heads, num_draft=x.shape[2],
                                   tree_depth=tree_depth)
    for layer in range(x.shape[0]):
        conv_out = torch.empty(x.shape[1:], device=x.device)
        sgl_convwin.ring_conv1d_verify(conv_out, ring.rows, conv_state, x[layer], conv_weight[layer], conv_bias[layer],
                                       ring_slots, state_slots, ring.cursor, layer, parents, activation="silu")
        q, k, v = conv_out.split([hk * dk, hk * dk, hv * dv], dim=-1)
        sgl_convwin.gdn_ring_verify(out[layer], q.unflatten(-1, (hk, dk)), k.unflatten(-1, (hk, dk)),
                                    v.unflatten(-1, (hv, dv)), g[layer], beta[layer], ssm_state, conv_state, ring.rows,
                                    ring.gates, ring.cursor, conv_weight[layer], conv_bias[layer], ring_slots,
                                    state_slots, layer, parents, after_due_flush=due_first, tree_depth=tree_depth)
    sgl_convwin.ring_accept(ring.cursor, ring.rows, ring.gates, ring_slots, steps, parents, num_draft=x.shape[2],
                            tree_depth=tree_depth)


# The GDN ring's other launches, all at once (module defaults): the kinds of rows and the windows
# each in a launch of their own, the state chunks through registers
RING_VARIANTS = dict(RING_MMA_MERGED=False, RING_MMA_FUSED_WINDOW=False, RING_MMA_STATE_STAGES=0)


@pytest.mark.gpu
@pytest.mark.parametrize("launches", ["default", "variants", "due-first"])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_cuda_graph_steps_match_eager(tree, launches, monkeypatch):
    """One graph of a whole step and one of a flush, captured once; 40 steps replayed with new
    inputs, slots (a padded row, requests moving between rows), acceptance and tree links written
    into the static inputs, a flush replayed every few steps, and new requests between steps. Every
    output, checkpoint and ring tensor after every replay equals, bit for bit, what eager calls of
    the same ops leave on a twin. The ring verify's default launches, and its others (RING_VARIANTS:
    the kinds of rows and the windows each in a launch of their own, the state read through
    registers), and the recipe's step: the due flush first, the verifies told so (trees: at a
    tree_depth of 2, trees no deeper)."""
    if launches == "variants":
        from sgl_convwin._kernels import triton_kernels

        for name, value in RING_VARIANTS.items():
            monkeypatch.setattr(triton_kernels().gdn_ring_verify, name, value)
    layers, num_rows, num_draft, num_ring, num_state = 2, 3, 3, 4, 5
    tree_depth = 2 if tree and launches == "due-first" else None
    generator = torch.Generator().manual_seed(11)
    options = dict(num_layers=layers, num_draft=num_draft, capacity=5, num_ring_slots=num_ring,
                   num_state_slots=num_state, num_k_heads=2, head_k_dim=16, head_v_dim=32, device="cuda", seed=3)
    worlds = [Harness(**options) for _ in range(3)]  # graph, eager, warm-up
    heads, dim = worlds[0].heads, worlds[0].dim
    hv, dv = heads["num_v_heads"], heads["head_v_dim"]

    def state(world):
        return (world.ring, world.ssm_state, world.conv_state, world.conv_weight, world.conv_bias)

    def fresh_inputs():
        order = torch.randperm(num_ring, generator=generator)[:num_rows]
        ring_slots = torch.where(torch.rand(num_rows, generator=generator) < 0.15, -1, order)
        return dict(x=torch.randn(layers, num_rows, num_draft, dim, generator=generator),
                    g=-torch.rand(layers, num_rows, num_draft, hv, generator=generator),
                    beta=torch.rand(layers, num_rows, num_draft, hv, generator=generator),
                    ring_slots=ring_slots, state_slots=torch.where(ring_slots < 0, -1, ring_slots + 1),
                    steps=torch.randint(-1, num_draft, (num_rows,), generator=generator),
                    parents=torch.stack([torch.tensor(random_tree(num_draft, generator, tree_depth))
                                         for _ in range(num_rows)]))

    static = {name: t.cuda() for name, t in fresh_inputs().items()}
    if not tree:
        static["parents"] = None
    flush_slots = torch.tensor([0, -1], device="cuda")
    outs = [torch.full((layers, num_rows, num_draft, hv, dv), FILL, device="cuda") for _ in worlds]

    def step(world, out):
        ring_layers_step(*state(world), out, **static, heads=heads, due_first=launches == "due-first",
                         tree_depth=tree_depth)

    def flush(world):
        ring, ssm_state, conv_state, conv_weight, conv_bias = state(world)
        sgl_convwin.gdn_ring_flush(ssm_state, conv_state, ring.cursor, ring.rows, ring.gates, conv_weight, flush_slots,
                                   flush_slots + 1, conv_bias=conv_bias, **heads)

    replay_against_eager(worlds, outs, step, flush, fresh_inputs, static, flush_slots)
