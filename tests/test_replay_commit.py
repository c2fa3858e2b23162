"""The replay commits (gdn_commit, mamba2_commit), capture_gates and alloc_gates against the
float64 oracles (reference.py).

Every implementation (the public function on the CPU, the registered op, the Triton kernels under
the interpreter, the CUDA kernels) replays chains and trees of every layout onto the state; the
recurrent state is compared with a tolerance (arithmetic), everything else bit for bit over the
whole tensor (the conv window is a copy; untouched slots stay untouched).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import sgl_convwin
from sgl_convwin import reference, validation
from sgl_convwin._kernels import triton_kernels
from support import HAS_TRITON, INTERPRET, Replay, make_replay

LAYOUTS = ("token_major", "channel_major", "dense")
MIXERS = ("gdn", "mamba2")


def run_public(replay, ssm_state, conv_state):
    replay.commit(*replay.args(ssm_state, conv_state), **replay.kwargs)


def run_op(replay, ssm_state, conv_state):
    kwargs = dict(replay.kwargs)
    conv_bias = kwargs.pop("conv_bias")
    replay.op(*replay.args(ssm_state, conv_state), conv_bias, **kwargs)


def run_triton(replay, ssm_state, conv_state):
    args, kwargs = replay.commit.kernel_arguments(*replay.args(ssm_state, conv_state), **replay.kwargs)
    getattr(triton_kernels(), replay.launcher)(*args, **kwargs)


IMPLS = [
    pytest.param(("cpu", run_public), id="cpu-public"),
    pytest.param(("cpu", run_op), id="cpu-op"),
    pytest.param(("cuda", run_public), id="cuda", marks=pytest.mark.gpu),
]
interpreted = pytest.mark.skipif(not (INTERPRET and HAS_TRITON), reason="Triton's interpreter runs on the CPU only")


def check_against_oracle(replay: Replay, run, atol=1e-4, rtol=1e-4) -> set:
    expected_ssm, expected_conv, written = replay.reference()
    ssm_state, conv_state = replay.ssm_state.clone(), replay.conv_state.clone()
    buffer, gates = replay.buffer.clone(), replay.gates.clone()
    run(replay, ssm_state, conv_state)
    assert torch.equal(conv_state.cpu(), expected_conv), "conv window differs from the oracle"
    got = ssm_state.cpu().double()
    untouched = [s for s in range(got.shape[1]) if s not in written]
    assert torch.equal(ssm_state.cpu()[:, untouched], replay.ssm_state.cpu()[:, untouched]), "an untouched slot changed"
    if ssm_state.dtype != torch.float32:
        expected_ssm = expected_ssm.to(ssm_state.dtype).double()  # the oracle's state, stored like the kernel's
    torch.testing.assert_close(got, expected_ssm, atol=atol, rtol=rtol)
    assert torch.equal(replay.buffer, buffer) and torch.equal(replay.gates, gates), "a source was written"
    return written


@pytest.mark.slow
@interpreted
@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_triton_interpreted_long_paths(mixer, tree):
    """Paths of 1 to 12 tokens (inputs loaded two tokens ahead, a tree walked link by link over 16
    node slots): the kernel against the oracle."""
    replay = make_replay(mixer=mixer, num_draft=12, num_rows=4, steps=[11, 6, 0, 11], seed=4)
    if tree:  # a deep tree with side branches (token_major rows do not depend on the links)
        row = [-1, 0, 1, 1, 3, 4, 4, 6, 7, 7, 9, 10]
        replay.parents = torch.tensor([row] * 4)
    check_against_oracle(replay, run_triton)


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_matches_oracle(mixer, impl, layout, tree):
    device, run = impl
    for seed in range(3):
        replay = make_replay(mixer=mixer, layout=layout, tree=tree, num_draft=4, num_rows=4, device=device,
                             seed=seed)
        assert check_against_oracle(replay, run), "no row was committed"


@pytest.mark.parametrize("mixer", MIXERS)
@interpreted
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_triton_interpreted_matches_oracle(mixer, layout, tree):
    replay = make_replay(mixer=mixer, layout=layout, tree=tree, num_draft=3, num_rows=3, seed=1)
    check_against_oracle(replay, run_triton)


DESCRIPTOR_DEVICES = [pytest.param("cpu", id="interpreted", marks=[interpreted, pytest.mark.slow]),
                      pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("device", DESCRIPTOR_DEVICES)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("ssm_dtype", [torch.float32, torch.bfloat16])
def test_state_tile_by_descriptor_or_pointers(mixer, device, tree, ssm_dtype):
    """The replay kernels' two ways to load a state tile (a tensor descriptor, per-element
    pointers) both match the oracle, on heads whose box runs past the tile (24: the box is 32 x 16
    and the second block half-full); a padded row and untouched slots stay as they were, and the
    conv windows are the same bits. The states too under the interpreter; compiled, the two loads
    may leave the tile in different register layouts, so a reduction may round in another order."""
    launch = getattr(triton_kernels(), f"launch_{mixer}_commit")
    block = {"block_v": 16} if mixer == "gdn" else {"block_p": 16}  # several blocks, the last one partial
    heads = ((24, 24),) if device == "cpu" else ((16, 16), (24, 24), (32, 8))  # (the interpreter is slow)
    atol = 1e-4 if ssm_dtype == torch.float32 else 3e-2
    for seed, (head_k, head_v) in enumerate(heads):
        replay = make_replay(mixer=mixer, tree=tree, head_k_dim=head_k, head_v_dim=head_v, num_draft=4, num_rows=3,
                             ssm_dtype=ssm_dtype, device=device, seed=seed)
        states = []
        for tma in (True, False):
            def run(replay, ssm_state, conv_state, tma=tma):
                args, kwargs = replay.commit.kernel_arguments(*replay.args(ssm_state, conv_state), **replay.kwargs)
                launch(*args, **kwargs, tma=tma, **block)
                states.append((ssm_state, conv_state))

            assert check_against_oracle(replay, run, atol=atol, rtol=atol), "no row was committed"
        assert torch.equal(states[0][1], states[1][1])
        if device == "cpu":
            assert torch.equal(states[0][0], states[1][0])
        else:
            tol = 1e-5 if ssm_dtype == torch.float32 else 1.6e-2  # a few roundings apart
            torch.testing.assert_close(states[0][0], states[1][0], rtol=tol, atol=tol)


def run_public_misaligned(replay, ssm_state, conv_state):
    """run_public on a copy of ssm_state whose base lies 4 bytes past a 16-byte boundary."""
    storage = torch.empty(ssm_state.numel() + 1, dtype=ssm_state.dtype, device=ssm_state.device)
    moved = storage[1:].view(ssm_state.shape)
    moved.copy_(ssm_state)
    run_public(replay, moved, conv_state)
    ssm_state.copy_(moved)


@pytest.mark.gpu
@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_state_tile_load_choice(mixer, tree):
    """On sm_90+ (Triton 3.6), a float32 state whose last axis is contiguous and 16-byte aligned
    replays with its tile in shared memory (chains and trees); anything else (a transposed state;
    a misaligned base, also when the signature's eager plan was made on an aligned one) takes the
    register kernel, whose tiles load through a descriptor on sm_90+ for aligned chains and by
    pointers otherwise. Every choice gives the oracle's states, whichever state the plan was made on."""
    from sgl_convwin.csrc_triton import gdn_commit, mamba2_commit

    hopper = torch.cuda.get_device_capability()[0] >= 9
    module = gdn_commit if mixer == "gdn" else mamba2_commit
    kernels = {"registers": module._gdn_replay_kernel if mixer == "gdn" else module._mamba2_replay_kernel}
    smem = hopper and module._smem() is not None
    if smem:
        kernels["smem"] = getattr(module._smem(), f"_{mixer}_replay_smem_kernel")
    seen = []
    originals = {name: kernel.run for name, kernel in kernels.items()}

    def spy(name):  # what each launch through Triton chose (the plans' first launches)
        def run(*args, **kwargs):
            seen.append("smem" if name == "smem" else f"registers, tma={kwargs['TMA_LOAD']}")
            return originals[name](*args, **kwargs)
        return run

    orders = ((False, (run_public, run_public_misaligned)), (False, (run_public_misaligned, run_public)),
              (True, (run_public,)))  # (each a fresh eager plan, made on the first call's state)
    for transposed, runs in orders:
        replay = make_replay(mixer=mixer, head_k_dim=16, head_v_dim=16, transposed_ssm=transposed, tree=tree,
                             device="cuda", seed=5)
        replay.commit.eager_plans.clear()
        for run in runs:
            seen.clear()
            for name, kernel in kernels.items():
                kernel.run = spy(name)
            try:
                check_against_oracle(replay, run)
            finally:
                for name, kernel in kernels.items():
                    kernel.run = originals[name]
            aligned = run is run_public and not transposed  # (a transposed state: its last axis is strided)
            if smem and aligned:
                want = "smem"
            else:
                want = f"registers, tma={hopper and aligned and not tree}"
            assert seen == [want], (transposed, run.__name__, seen)
        assert len(replay.commit.eager_plans) == 1  # one signature: the plan served every call


# (head_k_dim, head_v_dim, rows per pass): GDN dk, dv; Mamba2 d_state, head_dim (make_replay's names)
SMEM_CASES = {
    "gdn": [(16, 16, (16,)), (32, 64, (16, 32)), (128, 128, (16, 32, 64))],
    "mamba2": [(16, 16, (8, 16)), (64, 32, (2, 16, 32)), (128, 64, (8, 16, 32))],
}


@pytest.mark.gpu
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("mixer, case", [(m, c) for m in MIXERS for c in SMEM_CASES[m]],
                         ids=lambda v: v if isinstance(v, str) else f"{v[0]}x{v[1]}")
def test_cuda_smem_replay_kernel(mixer, case, tree):
    """The shared-memory replay kernels (gdn_commit_smem.py, mamba2_commit_smem.py) at several rows
    per pass match the oracle and the register kernel (within an order of summation), with a padded
    row, untouched slots and bit-equal conv windows."""
    from sgl_convwin.csrc_triton import gdn_commit, mamba2_commit

    module = gdn_commit if mixer == "gdn" else mamba2_commit
    if torch.cuda.get_device_capability()[0] < 9 or module._smem() is None:
        pytest.skip("the shared-memory replay needs sm_90+ and a Triton in replay.SMEM_TRITON_VERSIONS")
    launch = getattr(triton_kernels(), f"launch_{mixer}_commit")
    head_k, head_v, chunks = case
    replay = make_replay(mixer=mixer, tree=tree, head_k_dim=head_k, head_v_dim=head_v, num_draft=4, num_rows=4,
                         steps=[3, -1, 1, 2], buffer_dtype=torch.bfloat16, conv_dtype=torch.bfloat16, device="cuda",
                         seed=head_k + head_v)
    states = []
    for kernel in [dict(smem=False)] + [dict(smem=True, chunk=c) for c in chunks]:
        def run(replay, ssm_state, conv_state, kernel=kernel):
            args, kwargs = replay.commit.kernel_arguments(*replay.args(ssm_state, conv_state), **replay.kwargs)
            launch(*args, **kwargs, **kernel)
            states.append((ssm_state, conv_state))

        assert check_against_oracle(replay, run, atol=2e-4, rtol=2e-4), "no row was committed"
    for ssm_state, conv_state in states[1:]:
        assert torch.equal(conv_state, states[0][1])
        torch.testing.assert_close(ssm_state, states[0][0], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_smem_tile_layout():
    """The shared-memory replays' tile layouts: 4 adjacent columns per lane (gdn_commit's warps own
    whole value columns, mamba2_commit's split the rows), a pass covering at least the lanes along
    its rows; shapes they cannot lay out are refused (and take the register kernels)."""
    from sgl_convwin.csrc_triton import gdn_commit_smem, mamba2_commit_smem

    assert gdn_commit_smem.tile_layout(128, 64, 2, 64) == (4, 8, 64)  # Qwen3-Next: 8 lanes x 4 columns per warp
    assert gdn_commit_smem.tile_layout(16, 32, 2, 64) == (8, 4, 16)  # the chunk is clipped to dk
    assert gdn_commit_smem.tile_layout(16, 8, 2, 64) is None  # 1 lane of columns: 32 rows per pass > dk
    assert gdn_commit_smem.tile_layout(128, 64, 32, 64) is None  # 2 columns per warp
    assert gdn_commit_smem.tile_layout(128, 48, 2, 64) is None  # not a power of two
    assert mamba2_commit_smem.tile_layout(32, 128, 1, 16) == (1, 32, 16)  # Nemotron-H: a row per warp pass
    assert mamba2_commit_smem.tile_layout(16, 16, 1, 16) == (8, 4, 16)
    assert mamba2_commit_smem.tile_layout(16, 16, 1, 4) is None  # 4 rows per pass < 8 lanes of rows
    assert mamba2_commit_smem.tile_layout(32, 96, 1, 16) is None  # d_state not a power of two


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_smem_descriptor_maker():
    """The eager plans' per-call descriptor (replay_smem.descriptor_maker) is the one the
    checked constructor makes over the same state, and a plan made on a misaligned state (which
    that constructor refuses) can still make it for an aligned one."""
    from sgl_convwin.csrc_triton import replay_smem

    storage = torch.zeros(2 * 3 * 4 * 16 * 32 + 4)
    aligned = storage[:-4].view(2, 3, 4, 16, 32)
    misaligned = storage[1:-3].view(2, 3, 4, 16, 32)
    box = [1, 1, 1, 16, 32]
    want = vars(replay_smem.state_descriptor(aligned, box))
    for plan_state in (aligned, misaligned):
        made = replay_smem.descriptor_maker(plan_state, box)(aligned)
        assert type(made).__name__ == "TensorDescriptor" and made.base is aligned
        assert vars(made) == want
    with pytest.raises(AssertionError):  # what the plan would have hit had it built one on ``misaligned``
        replay_smem.state_descriptor(misaligned, box)


@pytest.mark.parametrize("mixer", MIXERS)
@interpreted
def test_triton_interpreted_odd_shapes(mixer):
    """dk, dv not powers of two, K = 2 (no history rows), GQA 1, window-major conv state,
    transposed bf16 state, no bias, no l2norm."""
    replay = make_replay(mixer=mixer, kernel_size=2, ratio=1, head_k_dim=3, head_v_dim=5, state_layout="window_major",
                         transposed_ssm=True, ssm_dtype=torch.bfloat16, bias=False, use_qk_l2norm=False,
                         tree=True, seed=3)
    check_against_oracle(replay, run_triton, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_partial_acceptance_at_every_step(mixer, impl, layout, tree):
    device, run = impl
    num_draft = 4
    for step in range(num_draft):
        replay = make_replay(mixer=mixer, layout=layout, tree=tree, num_draft=num_draft, num_rows=4, steps=[step] * 4,
                             device=device, seed=10 + step)
        check_against_oracle(replay, run)


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "case",
    [
        dict(kernel_size=2), dict(kernel_size=3), dict(kernel_size=5), dict(ratio=1), dict(ratio=4, num_k_heads=1),
        dict(head_k_dim=5, head_v_dim=3), dict(state_layout="window_major"), dict(transposed_ssm=True),
        dict(bias=False), dict(use_qk_l2norm=False), dict(num_rows=1), dict(num_draft=1),
        dict(buffer_dtype=torch.bfloat16, conv_dtype=torch.bfloat16),
        dict(buffer_dtype=torch.bfloat16, conv_dtype=torch.float32),
    ],
    ids=lambda case: "-".join(f"{k}={v}" for k, v in case.items()),
)
def test_shapes_and_layouts(mixer, impl, case):
    device, run = impl
    for tree in (False, True):
        check_against_oracle(make_replay(mixer=mixer, tree=tree, device=device, seed=20, **case), run)


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("impl", IMPLS)
def test_bf16_state(mixer, impl):
    device, run = impl
    for tree in (False, True):
        replay = make_replay(mixer=mixer, tree=tree, ssm_dtype=torch.bfloat16, device=device, seed=30)
        check_against_oracle(replay, run, atol=3e-2, rtol=2e-2)


def fuzz_cases(max_nodes: int, max_rows: int) -> dict:
    """Hypothesis strategies for a random replay problem (make_replay's knobs)."""
    return dict(
        mixer=st.sampled_from(MIXERS), layout=st.sampled_from(LAYOUTS), tree=st.booleans(),
        kernel_size=st.integers(2, 5), ratio=st.sampled_from([1, 2]), num_draft=st.integers(1, max_nodes),
        num_rows=st.integers(1, max_rows), state_layout=st.sampled_from(["dim_major", "window_major"]),
        transposed_ssm=st.booleans(), seed=st.integers(0, 2**16),
    )


@given(**fuzz_cases(max_nodes=5, max_rows=5))
def test_fuzz_cpu(**case):
    check_against_oracle(make_replay(**case), run_public)


@pytest.mark.gpu
@given(**fuzz_cases(max_nodes=9, max_rows=9))
def test_fuzz_cuda(**case):
    replay = make_replay(**case, num_slots=10, buffer_slots=10, head_k_dim=16, head_v_dim=32, device="cuda")
    check_against_oracle(replay, run_public)


@pytest.mark.gpu
def test_cuda_qwen3_next_head_shape():
    """The real head shape (dk = dv = 128, GQA 2) through the CUDA kernels."""
    for tree in (False, True):
        replay = make_replay(tree=tree, num_k_heads=2, ratio=2, head_k_dim=128, head_v_dim=128, num_draft=4,
                             num_rows=4, buffer_dtype=torch.bfloat16, conv_dtype=torch.bfloat16, device="cuda", seed=40)
        check_against_oracle(replay, run_public, atol=2e-4, rtol=2e-4)


@pytest.mark.gpu
def test_cuda_nemotron_h_head_shape():
    """Mamba2 at Nemotron-H's head shape (P = 64, Ns = 128, 16 heads per group) through CUDA."""
    for tree in (False, True):
        replay = make_replay(mixer="mamba2", tree=tree, num_k_heads=1, ratio=16, head_k_dim=128, head_v_dim=64,
                             num_draft=4, num_rows=4, buffer_dtype=torch.bfloat16, conv_dtype=torch.bfloat16,
                             device="cuda", seed=41)
        check_against_oracle(replay, run_public, atol=2e-4, rtol=2e-4)


# ---------------------------------------------------------------------------------------------
# Consistency with the package's other ops
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_conv_window_is_what_scatter_writes(mixer, device, layout):
    for tree in (False, True):
        replay = make_replay(mixer=mixer, layout=layout, tree=tree, buffer_dtype=torch.bfloat16, device=device,
                             seed=50)
        ssm_state, conv_state = replay.ssm_state.clone(), replay.conv_state.clone()
        run_public(replay, ssm_state, conv_state)
        expected = replay.conv_state.clone()
        if tree and layout != "dense":
            rows = replay.buffer if layout == "token_major" else replay.buffer.transpose(-1, -2)
            sgl_convwin.scatter_tree(expected, rows, replay.dst_slots, replay.src_slots, replay.steps, replay.parents)
        else:
            windows = sgl_convwin.window_view(replay.buffer, layout, replay.gates.shape[2], 4)
            sgl_convwin.scatter(expected, windows, replay.dst_slots, replay.src_slots, replay.steps)
        assert torch.equal(conv_state, expected)


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("state_k, state_v", [(8, 8), (16, 32)])
def test_replaying_a_chain_equals_one_token_at_a_time(mixer, device, layout, state_k, state_v):
    """Committing T accepted tokens at once leaves the same bits as T one-token decode steps
    (capture one token, commit it), so speculative decoding with replay emits the tokens of
    plain decoding. (On sm_90+, the commits take their register kernels at 8 x 8 and their
    shared-memory ones at 16 x 32.)"""
    gen = torch.Generator().manual_seed(60)
    num_layers, groups, heads, width, num_draft = 2, 2, 4, 3, 4
    if mixer == "gdn":
        dim = 2 * groups * state_k + heads * state_v
        state_shape = (num_layers, 2, heads, state_k, state_v)
        kwargs = dict(num_k_heads=groups, head_k_dim=state_k, num_v_heads=heads, head_v_dim=state_v)
        rate = ()
    else:
        dim = heads * state_v + 2 * groups * state_k
        state_shape = (num_layers, 2, heads, state_v, state_k)
        kwargs = dict(num_heads=heads, head_dim=state_v, n_groups=groups, d_state=state_k)
        rate = (-torch.rand(num_layers, heads, generator=gen).to(device),)
    commit = sgl_convwin.gdn_commit if mixer == "gdn" else sgl_convwin.mamba2_commit
    ssm = torch.randn(*state_shape, generator=gen).to(device)
    conv = torch.randn(num_layers, 2, dim, width, generator=gen).to(device)
    weight = (torch.randn(num_layers, dim, width + 1, generator=gen) * 0.5).to(device)
    bias = (torch.randn(num_layers, dim, generator=gen) * 0.1).to(device)
    x = torch.randn(num_layers, 1, num_draft, dim, generator=gen).to(device)
    g = -torch.rand(num_layers, 1, num_draft, heads, generator=gen).to(device)  # Mamba2: dt = -g
    beta = torch.rand(num_layers, 1, num_draft, heads, generator=gen).to(device)
    slot = torch.tensor([1], device=device)
    zero = torch.tensor([0], device=device)

    def step(ssm, conv, tokens, accepted):
        count = tokens.stop - tokens.start
        buffer = sgl_convwin.alloc_windows(num_layers, 1, dim, count, width + 1, layout=layout,
                                           dtype=torch.float32, device=device)
        gates = sgl_convwin.alloc_gates(num_layers, 1, count, heads, num_gates=2 if mixer == "gdn" else 1,
                                        device=device)
        for layer in range(num_layers):
            sgl_convwin.capture(buffer, conv, x[layer, :, tokens], zero, slot, layer, layout=layout)
            if mixer == "gdn":
                sgl_convwin.capture_gates(gates, g[layer, :, tokens], beta[layer, :, tokens], zero, layer)
            else:
                sgl_convwin.capture_gates(gates, -g[layer, :, tokens], None, zero, layer)
        commit(ssm, conv, buffer, gates, weight, *rate, slot, zero, torch.tensor([accepted], device=device),
               layout=layout, conv_bias=bias, **kwargs)

    for accepted in range(num_draft):
        at_once = (ssm.clone(), conv.clone())
        step(*at_once, slice(0, num_draft), accepted)
        one_by_one = (ssm.clone(), conv.clone())
        for token in range(accepted + 1):
            step(*one_by_one, slice(token, token + 1), 0)
        assert torch.equal(at_once[0], one_by_one[0]), f"state differs after {accepted + 1} tokens"
        assert torch.equal(at_once[1], one_by_one[1])
        assert not torch.equal(at_once[0], ssm)


def test_matches_fla_naive_recurrence():
    """The same replay against flash-linear-attention's naive recurrence, fed with q, k, v from
    a conv the test computes itself (an optional test dependency)."""
    naive = pytest.importorskip("fla.ops.gated_delta_rule.naive").naive_recurrent_gated_delta_rule
    num_draft = 4
    replay = make_replay(num_draft=num_draft, num_rows=1, num_layers=1, steps=[num_draft - 1], seed=70,
                         head_k_dim=8, head_v_dim=8)
    kw = replay.kwargs
    hk, dk, hv, dv = kw["num_k_heads"], kw["head_k_dim"], kw["num_v_heads"], kw["head_v_dim"]
    dst, src = int(replay.dst_slots[0]), int(replay.src_slots[0])
    rows = replay.buffer[0, src].double()  # token_major [D+K-2, dim]
    history = replay.conv_state[0, dst].double().t()  # [K-1, dim], oldest first
    inputs = torch.cat([history, rows[2:]])  # committed K-1 inputs, then the drafts
    weight, bias = replay.conv_weight[0].double(), kw["conv_bias"][0].double()
    c = torch.stack([torch.nn.functional.silu(bias + (inputs[t: t + 4].t() * weight).sum(-1))
                     for t in range(num_draft)])  # [T, dim]
    q = c[:, : hk * dk].view(num_draft, hk, dk).repeat_interleave(hv // hk, dim=1)
    k = c[:, hk * dk: 2 * hk * dk].view(num_draft, hk, dk).repeat_interleave(hv // hk, dim=1)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    v = c[:, 2 * hk * dk:].view(num_draft, hv, dv)
    g = replay.gates[0, src, :, 0].double()
    beta = replay.gates[0, src, :, 1].double()
    _, final = naive(q[None], k[None], v[None], beta[None], g[None], scale=dk**-0.5,
                     initial_state=replay.ssm_state[0, dst][None].double(), output_final_state=True)
    ssm_state, conv_state = replay.ssm_state.clone(), replay.conv_state.clone()
    run_public(replay, ssm_state, conv_state)
    torch.testing.assert_close(ssm_state[0, dst].double(), final[0].double(), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Skip rules, checked mode, errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("impl", IMPLS)
def test_skip_rules(mixer, impl):
    device, run = impl
    replay = make_replay(mixer=mixer, tree=True, num_rows=4, num_draft=4, device=device, seed=80)
    replay.dst_slots = torch.tensor([0, 1, 2, 3], device=device)
    replay.src_slots = torch.tensor([0, 1, 2, 9], device=device)  # row 3: source out of range
    replay.steps = torch.tensor([3, -1, 3, 0], device=device)  # row 1: padding
    replay.parents = torch.tensor([[-1, 0, 1, 2], [-1, 0, 0, 0], [-1, 0, 5, 2], [-1, 0, 0, 0]], device=device)
    # row 2's path 3 -> 2 -> 5 meets a bad link: skipped whole, although its window's K-1 inputs
    # (nodes 3, 2 and the link) would be enough for scatter_tree
    written = check_against_oracle(replay, run)
    assert written == {0}


@pytest.mark.parametrize("mixer", MIXERS)
def test_checked_mode_names_the_bad_row(mixer):
    for replay, match in (
        (make_replay(mixer=mixer, tree=True, num_rows=3, steps=[0, 2, 1], seed=90), r"parents\[1, 2\] = 2"),
        (make_replay(mixer=mixer, num_rows=3, steps=[0, 7, 1], seed=90), r"steps\[1\] = 7"),
    ):
        if replay.parents is not None:
            replay.parents[1, 2] = 2
        replay.dst_slots[2] = next(s for s in range(5) if s not in replay.dst_slots[:2].tolist())  # all active
        ssm_state, conv_state = replay.ssm_state.clone(), replay.conv_state.clone()
        with sgl_convwin.index_checks(), pytest.raises(IndexError, match=match):
            run_public(replay, ssm_state, conv_state)
        assert torch.equal(ssm_state, replay.ssm_state) and torch.equal(conv_state, replay.conv_state)


@pytest.mark.parametrize("mixer", MIXERS)
def test_conv_kernels_wider_than_five_are_refused(mixer):
    """The replay kernels hold at most K-1 = 4 previous conv inputs: a wider conv is refused on
    every device, never replayed with taps dropped."""
    replay = make_replay(mixer=mixer, kernel_size=6, seed=110)
    ssm_state, conv_state = replay.ssm_state.clone(), replay.conv_state.clone()
    for run in (run_public, run_op):
        with pytest.raises(ValueError, match="conv kernels of K <= 5 are supported.*K = 6"):
            run(replay, ssm_state, conv_state)
    assert torch.equal(ssm_state, replay.ssm_state) and torch.equal(conv_state, replay.conv_state)


@interpreted
@pytest.mark.parametrize("mixer", MIXERS)
def test_triton_interpreted_replay_kernel_refuses_a_wide_conv(mixer, monkeypatch):
    """Past the checks (raised here), the kernel itself refuses to compile a conv wider than K = 5."""
    monkeypatch.setattr(validation, "REPLAY_MAX_KERNEL_SIZE", 6)
    replay = make_replay(mixer=mixer, kernel_size=6, seed=111)
    with pytest.raises(Exception, match="at most 4 previous inputs"):
        run_triton(replay, replay.ssm_state.clone(), replay.conv_state.clone())


@pytest.mark.parametrize(
    "mutate, error, match",
    [
        (lambda r: setattr(r, "ssm_state", r.ssm_state[:, :, :1]), ValueError, "ssm_state must be"),
        (lambda r: r.kwargs.update(num_k_heads=3), ValueError, "multiple of num_k_heads"),
        (lambda r: r.kwargs.update(head_v_dim=8), ValueError, "dim"),
        (lambda r: setattr(r, "gates", r.gates[..., :1, :]), ValueError, "gates must be"),
        (lambda r: setattr(r, "buffer", r.buffer[:, :, 1:]), ValueError, "buffer"),
        (lambda r: setattr(r, "conv_weight", r.conv_weight[..., 1:]), ValueError, "conv_weight must be"),
        (lambda r: r.kwargs.update(conv_bias=torch.zeros(3)), ValueError, "conv_bias must be"),
        (lambda r: setattr(r, "steps", r.steps[:1]), ValueError, "rows"),
        (lambda r: setattr(r, "steps", r.steps.float()), TypeError, "steps must be int32 or int64"),
        (lambda r: setattr(r, "parents", torch.zeros(3, 2, dtype=torch.long)), ValueError, "parents must be"),
        (lambda r: r.kwargs.update(layout="rows"), ValueError, "layout must be one of"),
        (lambda r: setattr(r, "buffer", None), TypeError, "buffer must be a torch.Tensor"),
        (lambda r: setattr(r, "gates", r.ssm_state), ValueError, "share storage|gates must be"),
        (lambda r: setattr(r, "ssm_state", r.ssm_state.int()), TypeError, "ssm_state must be float"),
    ],
)
def test_errors_name_the_argument_and_write_nothing(mutate, error, match):
    replay = make_replay(seed=100)
    before = (replay.ssm_state.clone(), replay.conv_state.clone())
    mutate(replay)
    with pytest.raises(error, match=match):
        sgl_convwin.gdn_commit(*replay.args(), **replay.kwargs)
    if replay.ssm_state.shape == before[0].shape and replay.ssm_state.dtype == before[0].dtype:
        assert torch.equal(replay.ssm_state, before[0])
    assert torch.equal(replay.conv_state, before[1])


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("impl", IMPLS[:2])
def test_float16_state_is_refused(mixer, impl):
    """The recurrent state is float32 or bfloat16; float16 is refused before anything is written."""
    _, run = impl
    replay = make_replay(mixer=mixer, seed=102)
    ssm_state, conv_state = replay.ssm_state.half(), replay.conv_state.clone()
    before = ssm_state.clone()
    with pytest.raises(TypeError, match=f"{mixer}_commit: ssm_state must be float32 or bfloat16, got torch.float16"):
        run(replay, ssm_state, conv_state)
    assert torch.equal(ssm_state, before) and torch.equal(conv_state, replay.conv_state)


def test_states_may_not_share_storage():
    replay = make_replay(seed=101)
    with pytest.raises(ValueError, match="share storage"):
        sgl_convwin.gdn_commit(replay.ssm_state, replay.conv_state, replay.buffer, replay.gates,
                               replay.ssm_state.flatten()[: replay.conv_weight.numel()].view_as(replay.conv_weight),
                               replay.dst_slots, replay.src_slots, replay.steps, **replay.kwargs)


# ---------------------------------------------------------------------------------------------
# capture_gates and alloc_gates
# ---------------------------------------------------------------------------------------------


def run_capture_gates_triton(gates, g, beta, slots, layer):
    args, kwargs = sgl_convwin.capture_gates.kernel_arguments(gates, g, beta, slots, layer)
    triton_kernels().launch_capture_gates(*args, **kwargs)


GATE_IMPLS = [
    pytest.param(("cpu", sgl_convwin.capture_gates), id="cpu-public"),
    pytest.param(("cpu", lambda *a: torch.ops.convwin.capture_gates(*a)), id="cpu-op"),
    pytest.param(("cpu", run_capture_gates_triton), id="triton-interpreted", marks=interpreted),
    pytest.param(("cuda", sgl_convwin.capture_gates), id="cuda", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("impl", GATE_IMPLS)
@pytest.mark.parametrize("num_gates", [2, 1])
def test_capture_gates(impl, num_gates):
    device, run = impl
    gen = torch.Generator().manual_seed(110)
    gates = torch.randn(3, 5, 4, num_gates, 6, generator=gen).to(device)
    # strided, bf16 sources with fewer nodes than the buffer holds
    g = torch.randn(4, 6, 3, generator=gen).to(device=device, dtype=torch.bfloat16).transpose(1, 2)
    beta = torch.rand(4, 3, 6, generator=gen).to(device) if num_gates == 2 else None
    slots = torch.tensor([4, -1, 0, 5], device=device)
    expected = reference.capture_gates_reference(gates, g, beta, slots, 1)
    run(gates, g, beta, slots, 1)
    assert torch.equal(gates.cpu(), expected)


def run_raw_gates_triton(gates, slots, layer, **raw):
    args, kwargs = sgl_convwin.capture_gates.kernel_arguments(gates, None, None, slots, layer, **raw)
    triton_kernels().launch_capture_gates(*args, **kwargs)


RAW_GATE_IMPLS = [
    pytest.param(("cpu", lambda gates, slots, layer, **raw: sgl_convwin.capture_gates(gates, None, None, slots,
                                                                                       layer, **raw)), id="cpu-public"),
    pytest.param(("cpu", lambda gates, slots, layer, **raw: torch.ops.convwin.capture_gates(gates, None, None, slots,
                                                                                             layer, **raw)), id="cpu-op"),
    pytest.param(("cpu", run_raw_gates_triton), id="triton-interpreted", marks=interpreted),
    pytest.param(("cuda", lambda gates, slots, layer, **raw: sgl_convwin.capture_gates(gates, None, None, slots,
                                                                                        layer, **raw)),
                 id="cuda", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("impl", RAW_GATE_IMPLS)
def test_capture_gates_from_raw_a_b(impl):
    """The model's raw a, b (bf16, strided) with A_log, dt_bias: g = -exp(A_log) softplus(a + dt_bias),
    beta = sigmoid(b) computed in the kernel, against the float64 oracle; a + dt_bias above the
    softplus threshold included; skipped rows untouched."""
    device, run = impl
    gen = torch.Generator().manual_seed(111)
    gates = torch.randn(3, 5, 4, 2, 6, generator=gen).to(device)
    before = gates.clone()
    a = (torch.randn(4, 6, 3, generator=gen) * 4).to(device=device, dtype=torch.bfloat16).transpose(1, 2)
    b = (torch.randn(4, 3, 6, generator=gen) * 3).to(device)
    A_log = torch.randn(6, generator=gen).to(device)
    dt_bias = torch.tensor([0.0, 25.0, -3.0, 1.0, 0.5, -30.0]).to(device)  # 25: past softplus's threshold
    slots = torch.tensor([4, -1, 0, 5], device=device)
    expected = reference.capture_raw_gates_reference(gates, a, b, A_log, dt_bias, slots, 1)
    run(gates, slots, 1, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    torch.testing.assert_close(gates.cpu().double(), expected, atol=1e-6, rtol=1e-5)
    untouched = [slot for slot in range(5) if slot not in (4, 0)]
    assert torch.equal(gates[1, untouched], before[1, untouched]) and torch.equal(gates[0], before[0])


def test_capture_gates_raw_errors():
    gates = sgl_convwin.alloc_gates(2, 3, 4, 5)
    a = torch.zeros(2, 4, 5)
    heads = torch.zeros(5)
    slots = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="give g, beta or the raw a, b with A_log, dt_bias, not both"):
        sgl_convwin.capture_gates(gates, a, a, slots, 0, a=a, b=a, A_log=heads, dt_bias=heads)
    with pytest.raises(ValueError, match="the raw gates need a, b, A_log and dt_bias; dt_bias missing"):
        sgl_convwin.capture_gates(gates, None, None, slots, 0, a=a, b=a, A_log=heads)
    with pytest.raises(ValueError, match="A_log must be \\[H\\] with H = 5"):
        sgl_convwin.capture_gates(gates, None, None, slots, 0, a=a, b=a, A_log=torch.zeros(4), dt_bias=heads)
    with pytest.raises(ValueError, match="b must have a's shape"):
        sgl_convwin.capture_gates(gates, None, None, slots, 0, a=a, b=a[:, :2], A_log=heads, dt_bias=heads)
    with pytest.raises(ValueError, match="gates holds one per head"):
        sgl_convwin.capture_gates(sgl_convwin.alloc_gates(2, 3, 4, 5, num_gates=1), None, None, slots, 0,
                                  a=a, b=a, A_log=heads, dt_bias=heads)
    with pytest.raises(TypeError, match="dt_bias must be a floating-point"):
        sgl_convwin.capture_gates(gates, None, None, slots, 0, a=a, b=a, A_log=heads,
                                  dt_bias=torch.zeros(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="buffer_slots is on meta but gates is on cpu"):
        sgl_convwin.capture_gates(gates, None, None, slots.to("meta"), 0, a=a, b=a, A_log=heads, dt_bias=heads)
    for num_gates in (True, 2.0):  # (a count: not a bool, not a float)
        with pytest.raises(ValueError, match="num_gates must be 2 .* or 1"):
            sgl_convwin.alloc_gates(2, 3, 4, 5, num_gates=num_gates)
    assert not gates.any()


def test_capture_gates_errors():
    gates = sgl_convwin.alloc_gates(2, 3, 4, 5)
    g = torch.zeros(2, 4, 5)
    slots = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="beta must be given"):
        sgl_convwin.capture_gates(gates, g, None, slots, 0)
    with pytest.raises(ValueError, match="pass beta=None"):
        sgl_convwin.capture_gates(sgl_convwin.alloc_gates(2, 3, 4, 5, num_gates=1), g, g, slots, 0)
    with pytest.raises(ValueError, match="g must be"):
        sgl_convwin.capture_gates(gates, torch.zeros(2, 5, 5), torch.zeros(2, 5, 5), slots, 0)
    with pytest.raises(ValueError, match="layer 2 is out of range"):
        sgl_convwin.capture_gates(gates, g, g, slots, 2)
    with sgl_convwin.index_checks(), pytest.raises(IndexError, match=r"buffer_slots\[1\] = 3"):
        sgl_convwin.capture_gates(gates, g, g, torch.tensor([0, 3]), 0)
    assert not gates.any()


def test_alloc_gates():
    gates = sgl_convwin.alloc_gates(2, 3, 4, 5)
    assert gates.shape == (2, 3, 4, 2, 5) and gates.dtype == torch.float32 and not gates.any()
    assert sgl_convwin.alloc_gates(2, 3, 4, 5, num_gates=1, dtype=torch.bfloat16).shape == (2, 3, 4, 1, 5)
    with pytest.raises(ValueError, match="num_gates"):
        sgl_convwin.alloc_gates(2, 3, 4, 5, num_gates=3)
    with pytest.raises(TypeError, match="dtype"):
        sgl_convwin.alloc_gates(2, 3, 4, 5, dtype=torch.int32)


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("impl", IMPLS)
def test_int32_indices_bf16_gates_and_an_empty_batch(mixer, impl):
    device, run = impl
    replay = make_replay(mixer=mixer, tree=True, num_rows=4, num_draft=4, device=device, seed=120)
    replay.dst_slots, replay.src_slots = replay.dst_slots.int(), replay.src_slots.int()
    replay.steps, replay.parents = replay.steps.int(), replay.parents.int()
    replay.gates = replay.gates.to(torch.bfloat16)  # alloc_gates(..., dtype=torch.bfloat16)
    assert check_against_oracle(replay, run)
    empty = torch.empty(0, dtype=torch.int64, device=device)
    replay.dst_slots = replay.src_slots = replay.steps = empty
    replay.parents = torch.empty(0, 4, dtype=torch.int64, device=device)
    assert check_against_oracle(replay, run) == set()


@interpreted
@pytest.mark.parametrize("mixer", MIXERS)
def test_triton_interpreted_int32_indices_and_an_empty_batch(mixer):
    replay = make_replay(mixer=mixer, tree=True, num_rows=3, seed=121)
    replay.dst_slots, replay.steps, replay.parents = replay.dst_slots.int(), replay.steps.int(), replay.parents.int()
    check_against_oracle(replay, run_triton)
    empty = torch.empty(0, dtype=torch.int32)
    replay.dst_slots = replay.src_slots = replay.steps = empty
    replay.parents = torch.empty(0, 3, dtype=torch.int32)
    assert check_against_oracle(replay, run_triton) == set()
