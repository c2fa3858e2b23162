"""gdn_verify against its float64 oracle (reference.gdn_verify_reference), and FLA where installed.

Every implementation -- the public function on the CPU (the chunked PyTorch path), the registered
op, the Triton kernel under the interpreter, the CUDA kernel -- computes chains and trees of every
head grouping, with l2norm on and off, from strided views and transposed or sliced state pools.
Outputs are compared with a tolerance relative to the largest output (arithmetic); rows that must
be skipped, and the state (read only), are compared bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sgl_convwin
from sgl_convwin import cpu, reference
from sgl_convwin._kernels import triton_kernels
from support import HAS_TRITON, INTERPRET, CountingBackend, check_chained_pdl, trees

FILL = 7.0  # what out holds before the call: rows left untouched keep it


def run_public(*args, **kwargs):
    sgl_convwin.gdn_verify(*args, **kwargs)


def run_op(*args, **kwargs):
    torch.ops.convwin.gdn_verify(*args, **kwargs)


def run_triton(*args, **kwargs):
    kernel_args, kernel_kwargs = sgl_convwin.gdn_verify.kernel_arguments(*args, **kwargs)
    triton_kernels().launch_gdn_verify(*kernel_args, **kernel_kwargs)


def kernel_runner(mma, **tuning):
    def run(*args, **kwargs):
        kernel_args, kernel_kwargs = sgl_convwin.gdn_verify.kernel_arguments(*args, **kwargs)
        triton_kernels().launch_gdn_verify(*kernel_args, **kernel_kwargs, mma=mma, **tuning)
    return run


interpreted = pytest.mark.skipif(not (INTERPRET and HAS_TRITON), reason="Triton's interpreter runs on the CPU only")
IMPLS = [
    pytest.param(("cpu", run_public), id="cpu-public"),
    pytest.param(("cpu", run_op), id="cpu-op"),
    pytest.param(("cpu", run_triton), id="triton-interpret", marks=interpreted),
    pytest.param(("cuda", run_public), id="cuda", marks=pytest.mark.gpu),
    pytest.param(("cuda", run_op), id="cuda-op", marks=pytest.mark.gpu),
    # both CUDA kernels whatever the batch (the launcher picks by batch size and node count)
    pytest.param(("cuda", kernel_runner(True)), id="cuda-mma-kernel", marks=pytest.mark.gpu),
    pytest.param(("cuda", kernel_runner(False)), id="cuda-triton-kernel", marks=pytest.mark.gpu),
    # the stacked products (the effective queries are each kernel's default for float32 states)
    pytest.param(("cpu", kernel_runner(False, q_eff=False)), id="triton-interpret-stacked", marks=interpreted),
    pytest.param(("cuda", kernel_runner(True, q_eff=False)), id="cuda-mma-stacked", marks=pytest.mark.gpu),
    pytest.param(("cuda", kernel_runner(False, q_eff=False)), id="cuda-triton-stacked", marks=pytest.mark.gpu),
]


def make_problem(*, num_rows=3, num_nodes=4, num_k_heads=2, ratio=2, head_k_dim=16, head_v_dim=32, num_slots=5,
                 parents=None, slots=None, qkv_dtype=torch.float32, gate_dtype=torch.float32,
                 state_dtype=torch.float32, fused=False, transposed=False, pooled=False, device="cpu", seed=0):
    """One layer's verify inputs. fused: q, k, v as views of one [B, N, 2*Hk*dk + Hv*dv] conv output;
    transposed: the pool stored [S, Hv, dv, dk] and passed transposed; pooled: a slice of [2, S, ...]."""
    gen = torch.Generator().manual_seed(seed)
    num_v_heads = num_k_heads * ratio
    key_width = num_k_heads * head_k_dim

    def randn(*shape, std=1.0):
        return torch.randn(shape, generator=gen) * std

    if fused:  # (the views taken on the device: .to() of a view would copy it into a tensor of its own)
        mixed = randn(num_rows, num_nodes, 2 * key_width + num_v_heads * head_v_dim).to(qkv_dtype).to(device)
        q = mixed[..., :key_width].unflatten(-1, (num_k_heads, head_k_dim))
        k = mixed[..., key_width:2 * key_width].unflatten(-1, (num_k_heads, head_k_dim))
        v = mixed[..., 2 * key_width:].unflatten(-1, (num_v_heads, head_v_dim))
    else:
        q = randn(num_rows, num_nodes, num_k_heads, head_k_dim).to(qkv_dtype)
        k = randn(num_rows, num_nodes, num_k_heads, head_k_dim).to(qkv_dtype)
        v = randn(num_rows, num_nodes, num_v_heads, head_v_dim).to(qkv_dtype)
    g = (-torch.nn.functional.softplus(randn(num_rows, num_nodes, num_v_heads)) * 0.5).to(gate_dtype)
    beta = torch.sigmoid(randn(num_rows, num_nodes, num_v_heads)).to(gate_dtype)
    state_shape = (num_slots, num_v_heads, head_v_dim, head_k_dim) if transposed else (
        num_slots, num_v_heads, head_k_dim, head_v_dim)
    ssm = randn(2 if pooled else 1, *state_shape, std=0.3).to(state_dtype).to(device)[-1]
    if transposed:
        ssm = ssm.transpose(-1, -2)
    slots = torch.arange(num_rows) % num_slots if slots is None else torch.as_tensor(slots)
    if parents is not None:
        parents = torch.as_tensor(parents)
        if parents.dim() == 1:
            parents = parents.expand(num_rows, num_nodes).clone()
    tensors = [q, k, v, g, beta, ssm, slots, parents]
    return [None if t is None else t.to(device) for t in tensors]


def check(device, run, problem, *, out_dtype=torch.float32, tol=2e-3, **kwargs):
    """Run gdn_verify into a filled ``out`` and compare it with the oracle: written rows within
    ``tol`` x max |o|, every other row untouched, the state unchanged."""
    q, k, v, g, beta, ssm, slots, parents = problem
    expected, written = reference.gdn_verify_reference(q, k, v, g, beta, ssm, slots.cpu(), parents, **kwargs)
    state_before = ssm.clone()
    out = torch.full(v.shape, FILL, dtype=out_dtype, device=device)
    run(out, q, k, v, g, beta, ssm, slots, parents, **kwargs)
    assert torch.equal(ssm, state_before), "the state was written"
    got = out.cpu()
    skipped = [row for row in range(v.shape[0]) if row not in written]
    assert torch.equal(got[skipped], torch.full_like(got[skipped], FILL)), "a skipped row was written"
    if written:
        error = (got[written].double() - expected[written]).abs().max().item()
        assert error <= tol * expected[written].abs().max().item(), f"max error {error:.3g}"
    return written


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_matches_oracle(impl, ratio, tree):
    device, run = impl
    parents = [-1, 0, 0, 1, 1, 2] if tree else None
    problem = make_problem(num_nodes=6, ratio=ratio, parents=parents, num_slots=4, slots=[3, 0, 1], device=device)
    assert check(device, run, problem) == [0, 1, 2]


@pytest.mark.parametrize("impl", IMPLS)
def test_no_l2norm_custom_scale_and_views(impl):
    device, run = impl
    problem = make_problem(fused=True, transposed=True, pooled=True, parents=[-1, -1, 0, 2], device=device)
    q, k, v, ssm = problem[0], problem[1], problem[2], problem[5]
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    assert ssm.storage_offset() > 0 and not ssm.is_contiguous()  # (views on every device)
    check(device, run, problem, scale=0.3, use_qk_l2norm=False)


@pytest.mark.parametrize("impl", IMPLS)
def test_low_precision_inputs_and_state(impl):
    device, run = impl
    problem = make_problem(qkv_dtype=torch.bfloat16, gate_dtype=torch.bfloat16, state_dtype=torch.bfloat16,
                           fused=True, device=device)
    check(device, run, problem, out_dtype=torch.bfloat16, tol=2e-2)
    problem = make_problem(qkv_dtype=torch.float16, parents=[-1, 0, 0, 1], device=device, seed=1)
    check(device, run, problem, out_dtype=torch.float16, tol=2e-2)
    # q and k of two dtypes (each "any float dtype"), either way round
    q, k, *rest = make_problem(parents=[-1, 0, 0, 1], device=device, seed=2)
    check(device, run, [q.bfloat16(), k, *rest], tol=2e-2)
    check(device, run, [q, k.to(torch.float16), *rest], tol=2e-2)


@pytest.mark.parametrize("impl", IMPLS)
def test_skipped_rows(impl):
    """Slots < 0 or >= S and bad links (self, forward, below -1) skip their row; rows sharing a slot
    both read it."""
    device, run = impl
    slots = [4, -1, 5, 2, 2, 0, 1, 3]
    links = [[-1, 0, 1, 2]] * 3 + [[-1, 0, 0, 1], [-1, 0, 0, 1], [-1, 1, 0, 1], [-1, 0, 2, 1], [-1, 0, -2, 1]]
    problem = make_problem(num_rows=8, num_slots=5, slots=slots, parents=links, device=device)
    assert check(device, run, problem) == [0, 3, 4]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the interpreter's numpy, on the NaN row)
@pytest.mark.parametrize("impl", IMPLS)
def test_non_finite_input_stays_in_its_row(impl):
    """A NaN or infinity in one row's inputs (documented: it may reach every output of that row)
    leaves the other rows' outputs bit for bit as they were."""
    device, run = impl
    q, k, v, g, beta, ssm, slots, parents = make_problem(parents=[-1, 0, 0, 1], device=device)
    clean = torch.full(v.shape, FILL, device=device)
    run(clean, q, k, v, g, beta, ssm, slots, parents)
    for name, value in (("k", float("nan")), ("v", float("inf")), ("g", float("nan"))):
        bad = dict(q=q, k=k.clone(), v=v.clone(), g=g.clone())
        bad[name][0, 2] = value
        out = torch.full(v.shape, FILL, device=device)
        run(out, bad["q"], bad["k"], bad["v"], bad["g"], beta, ssm, slots, parents)
        assert torch.equal(out[1:], clean[1:]), name


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_strong_decays(impl, tree):
    """Log decays of -1e3 down to -inf before small ones (the state before them as good as wiped):
    the outputs after them stay within the tolerance, not lost to the rounding of a path's sum."""
    device, run = impl
    q, k, v, g, beta, *rest = make_problem(num_rows=4, num_nodes=6, parents=[-1, 0, 1, 1, 3, -1] if tree else None,
                                           device=device)
    g = g.clone()
    for row, value in enumerate((-1e3, -1e6, -1e30, float("-inf"))):
        g[row, row % 2, 0] = value  # a root (or the chain's first token), then the next node
        g[row, 3, 1] = value  # a node in the middle of a path (tree: node 4's parent)
    check(device, run, [q, k, v, g, beta, *rest])


Q_EFF_RUNNERS = [
    pytest.param(("cpu", run_public), id="cpu-public"),
    pytest.param(("cpu", kernel_runner(False)), id="triton-interpret", marks=interpreted),
    pytest.param(("cuda", kernel_runner(False)), id="cuda-triton-kernel", marks=pytest.mark.gpu),
    pytest.param(("cuda", kernel_runner(True, state_stages=0, q_eff=True)), id="cuda-mma-registers",
                 marks=pytest.mark.gpu),
    pytest.param(("cuda", kernel_runner(True, state_stages=2)), id="cuda-mma-staged", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("impl", Q_EFF_RUNNERS)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_state_much_larger_than_outputs(impl, tree):
    """A float32 state 100x the usual scale, each node's query its own key, betas near 1: the output
    is mostly the value just written, S0^T q two orders larger and cancelled by the node's own
    update. The kernels' effective queries (their default for float32 states) keep the error within
    the tolerance of max |o|; products with the state before the cancellation reach about 1e-2."""
    device, run = impl
    head_dim = 128 if device == "cuda" else 64
    q, k, v, g, beta, ssm, slots, parents = make_problem(
        num_rows=8 if device == "cuda" else 2, num_nodes=8 if tree else 4, head_k_dim=head_dim, head_v_dim=head_dim,
        num_slots=8, parents=[-1, 0, 0, 0, 1, 1, 1, 4] if tree else None, device=device)
    check(device, run, [k.clone(), k, v, g, torch.full_like(beta, 0.99), ssm * 100, slots, parents])


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")
def test_triton_kernel_q_eff_plans():
    """The Triton kernel's effective queries: by default for a float32 state up to
    TRITON_Q_EFF_MAX_NODES nodes (past them its W [k; q] product spills, past 32 nodes it would not
    fit shared memory), never for a bf16 one; asked for, whatever the sizes."""
    module = triton_kernels().gdn_verify

    def plan(num_nodes, state_dtype=torch.float32, **tuning):
        q, k, v, g, beta, ssm, slots, parents = make_problem(num_nodes=num_nodes, state_dtype=state_dtype)
        return module._verify_call(torch.empty(v.shape), q, k, v, g, beta, ssm, slots, parents, scale=0.25,
                                   use_qk_l2norm=True, mma=False, **tuning).constexprs["Q_EFF"]

    most = module.TRITON_Q_EFF_MAX_NODES
    assert [plan(most), plan(most + 1), plan(64), plan(4, torch.bfloat16)] == [True, False, False, False]
    assert [plan(4, q_eff=False), plan(64, q_eff=True)] == [False, True]


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")
def test_cpu_paths_and_kernels_floor_log_decays_alike():
    assert cpu.LOG_DECAY_FLOOR == triton_kernels()._common.LOG_DECAY_FLOOR.value


@pytest.mark.parametrize("impl", IMPLS)
def test_one_node_and_odd_sizes(impl):
    """N = 1, dk and dv that are not powers of two (the kernel pads and masks)."""
    device, run = impl
    check(device, run, make_problem(num_nodes=1, head_k_dim=12, head_v_dim=20, device=device))
    check(device, run, make_problem(num_nodes=5, head_k_dim=24, head_v_dim=40, parents=[-1, 0, -1, 2, 0],
                                    device=device))


@pytest.mark.parametrize("impl", IMPLS)
def test_deep_paths(impl):
    """Paths of 10 to 17 tokens: every power of the node matrices up to the padded size counts; and
    wide trees of 16 nodes whose paths are 2 and 5 long, the latter with the high powers weighing."""
    device, run = impl
    check(device, run, make_problem(num_nodes=12, device=device))
    check(device, run, make_problem(num_nodes=12, parents=[-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 10], device=device))
    check(device, run, make_problem(num_rows=2, num_nodes=17, ratio=1, device=device))
    check(device, run, make_problem(num_nodes=16, parents=[-1] + [0] * 15, device=device))
    # nearly parallel keys, large betas and slow decay: every power of A up to the 5-node paths weighs
    q, k, v, g, beta, *rest = make_problem(num_nodes=16, parents=[-1, 0, 0, 1, 1, 2, 3, 3, 4, 6, 7, 7, 8, -1, 13, 14],
                                           seed=5)
    k = k[:, :1] + 0.05 * k
    check(device, run, [t if t is None else t.to(device) for t in (q, k, v, torch.full_like(g, -0.05),
                                                                    torch.full_like(beta, 0.45), *rest)])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("num_nodes, parents", [(8, None), (16, None), (8, [-1, 0, 0, 0, 1, 1, 1, 4]),
                                                (8, [-1, 0, 1, 2, 3, 4, 5, 6])], ids=["chain8", "chain16", "tree8",
                                                                                      "tree8-deep"])
def test_repeated_token(impl, num_nodes, parents):
    """Every draft the same token (identical keys), betas of 0.9, no decay: the power series over a
    whole path, whose terms grow like binomials and cancel, did not survive tf32 (2.4e-3 x max |o| at 8
    nodes, 0.55 at 16); the blocked inverse keeps its intermediates small."""
    device, run = impl
    for seed in range(2):
        q, k, v, g, beta, *rest = make_problem(num_nodes=num_nodes, parents=parents, seed=seed)
        check(device, run, [t if t is None else t.to(device) for t in (
            q, k[:, :1].expand_as(k).contiguous(), v, torch.zeros_like(g), torch.full_like(beta, 0.9), *rest)])


TREE_WALKS = [pytest.param((device, mma, walk), marks=marks,
                           id=f"{kernel}-{device}-{'-'.join(f'{k}={v}' for k, v in walk.items()) or 'default'}")
              for device, marks in (("cpu", interpreted), ("cuda", pytest.mark.gpu))
              for kernel, mma, walk in (("triton", False, {}), ("triton", False, dict(doubling=False)),
                                        ("triton", False, dict(shallow=False)),
                                        ("triton", False, dict(doubling=False, shallow=False)),
                                        ("mma", True, {}), ("mma", True, dict(shallow=False)))
              if device == "cuda" or not mma]  # (the mma kernel runs on CUDA only)


@pytest.mark.parametrize("case", TREE_WALKS)
def test_tree_walks(case):
    """Trees walked by pointer jumping (the Triton kernel's) or link by link, inverted as one block
    where every root path has at most 4 nodes (the default) or blocked: paths of 4 (8 and 16 nodes, a
    forest), of 5 and 8 beside them in one batch; identical keys (the inverse's hardest case); broken
    links skip their row."""
    device, mma, walk = case
    run = kernel_runner(mma, **walk)
    shallow8, deep8 = [-1, 0, 0, 0, 1, 1, 1, 4], [-1, 0, 1, 2, 3, 4, 5, 6]
    shallow16 = [-1, 0, 0, 0, 1, 1, 1, 2, 2, 3, -1, 10, 10, 11, 12, 4]
    deep16 = shallow16[:14] + [13, 14]  # 15 under 14 under 13 under 11 under 10: 5
    for parents in ([shallow8, deep8, [-1, -1, 0, 1, 1, 2, 4, 4]], [shallow16, deep16, shallow16[:15] + [14]]):
        num_nodes = len(parents[0])
        problem = make_problem(num_nodes=num_nodes, parents=torch.tensor(parents), device=device)
        assert check(device, run, problem) == [0, 1, 2]
        q, k, v, g, beta, *rest = problem
        check(device, run, [k[:, :1].expand_as(k).contiguous() if t is k else t for t in (
            q, k, v, torch.zeros_like(g), torch.full_like(beta, 0.9), *rest)])
    broken = torch.tensor([shallow8, shallow8[:7] + [7], shallow8[:3] + [-2] + shallow8[4:]])
    assert check(device, run, make_problem(num_nodes=8, parents=broken, device=device)) == [0]


TUNINGS = [dict(mma=False), dict(block_v=16, mma=False), dict(block_v=16, num_warps=2, mma=False),
           dict(block_v=32, precision="tf32x3", num_warps=2, mma=False), dict(block_v=64, precision="ieee", mma=False),
           pytest.param(dict(mma=True, block_v=32, num_warps=4), marks=pytest.mark.gpu),
           pytest.param(dict(mma=True, block_v=64, chunk_k=16), marks=pytest.mark.gpu),
           pytest.param(dict(mma=True, block_v=128, chunk_k=16, num_warps=8), marks=pytest.mark.gpu),
           pytest.param(dict(mma=True, state_stages=2), marks=pytest.mark.gpu),  # the chunks through shared memory
           pytest.param(dict(mma=True, block_v=64, chunk_k=16, state_stages=3), marks=pytest.mark.gpu),
           # persistent: 2 or 5 programs walking the batch's 12 tiles (a partial last round), registers capped
           pytest.param(dict(mma=True, persistent=2), marks=pytest.mark.gpu),
           pytest.param(dict(mma=True, persistent=5, maxnreg=128, state_stages=2), marks=pytest.mark.gpu),
           # a plain launch (the default is a programmatic dependent one on sm_90)
           pytest.param(dict(mma=True, pdl=0), marks=pytest.mark.gpu),
           pytest.param(dict(mma=True, pdl=2, state_stages=2), marks=pytest.mark.gpu),
           # the effective queries (node matrices before the state products), chunks in registers or staged
           pytest.param(dict(mma=True, q_eff=True, block_v=64, chunk_k=16), marks=pytest.mark.gpu),
           pytest.param(dict(mma=True, q_eff=True, state_stages=2, pdl=2), marks=pytest.mark.gpu),
           # the small inputs loaded where they are used (0), the gates at the start (1), v too (2)
           pytest.param(dict(mma=True, early_loads=0), marks=pytest.mark.gpu),
           pytest.param(dict(mma=True, early_loads=2), marks=pytest.mark.gpu),
           pytest.param(dict(mma=True, early_loads=1, block_v=64, chunk_k=16), marks=pytest.mark.gpu),
           # the first state rows prefetched into L2 before the wait: a run a row, rows past dk
           pytest.param(dict(mma=True, prefetch_rows=16, block_v=32, num_warps=4), marks=pytest.mark.gpu),
           pytest.param(dict(mma=True, prefetch_rows=128, state_stages=2), marks=pytest.mark.gpu),
           # v and out an element a load / store from the accumulator's layout (the default: 16-byte runs)
           pytest.param(dict(mma=True, value_runs=False), marks=pytest.mark.gpu),
           pytest.param(dict(mma=True, value_runs=False, early_loads=2, block_v=32, num_warps=4),
                        marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=[interpreted, pytest.mark.slow]),
                                    pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("tuning", TUNINGS, ids=lambda t: "-".join(f"{k}={v}" for k, v in t.items()))
def test_launch_choices(device, tuning):
    """The launcher's choices: the Triton kernel beside the mma one (the GPU's default), narrow tiles
    (a partial last one too), warps, precisions and the mma kernel's row chunks."""
    def run(*args, **kwargs):
        kernel_args, kernel_kwargs = sgl_convwin.gdn_verify.kernel_arguments(*args, **kwargs)
        triton_kernels().launch_gdn_verify(*kernel_args, **kernel_kwargs, **tuning)

    check(device, run, make_problem(head_v_dim=40, head_k_dim=48, parents=[-1, 0, 0, 2], device=device))
    check(device, run, make_problem(head_v_dim=64, slots=[1, -1, 2], device=device))


def test_mma_launch_plans(monkeypatch):
    """The mma kernel's tiles checked before any compile; its state chunks through shared memory at
    most the tile's chunks, and only where each thread's cp.async is of 4 bytes or more (a pool
    stored transposed, as engines store it, copies 16 bytes down a column where the warp's lanes fit
    the chunk); the module's defaults read at each call."""
    def plan(problem, **tuning):
        q, k, v, g, beta, ssm, slots, parents = problem
        return triton_kernels().gdn_verify._verify_call(torch.empty(v.shape), q, k, v, g, beta, ssm, slots, parents,
                                                        scale=0.25, use_qk_l2norm=True, mma=True, **tuning)

    problem = make_problem(head_k_dim=64, head_v_dim=64)
    for tiles in (dict(chunk_k=8), dict(chunk_k=24), dict(block_v=48), dict(block_v=32, num_warps=3)):
        with pytest.raises(ValueError, match="powers of two"):
            plan(problem, **tiles)
    for stages, chunk_k, want in ((None, None, 2), (1, None, 1), (4, None, 4), (9, None, 4), (4, 32, 2),
                                  (9, 16, 4)):  # (dk 64: four chunks of 16 rows, two of 32)
        assert plan(problem, state_stages=stages, chunk_k=chunk_k).constexprs["STATE_STAGES"] == want
    # the effective queries by default where the chunks stage and the state is float32; the stacked
    # products keep their chunks in registers unless asked
    bf16_pool = make_problem(head_k_dim=64, head_v_dim=64, state_dtype=torch.bfloat16)
    for pool, tuning, want in ((problem, {}, (True, 2)), (problem, dict(q_eff=False), (False, 0)),
                               (problem, dict(q_eff=False, state_stages=3), (False, 3)),
                               (problem, dict(state_stages=0), (False, 0)),
                               (problem, dict(q_eff=True, state_stages=0), (True, 0)),
                               (bf16_pool, {}, (False, 0)), (bf16_pool, dict(q_eff=True), (True, 1))):
        call = plan(pool, **tuning)
        assert (call.constexprs["Q_EFF"], call.constexprs["STATE_STAGES"]) == want, tuning
    for dtype, transposed, want in ((torch.float32, True, 2), (torch.bfloat16, False, 2), (torch.bfloat16, True, 2)):
        pool = make_problem(head_k_dim=64, head_v_dim=64, state_dtype=dtype, transposed=transposed)
        assert plan(pool, state_stages=2, block_v=64, num_warps=2, chunk_k=32).constexprs["STATE_STAGES"] == want
    # a transposed pool's chunks stage by default, with either form (in registers: loads of one value);
    # not where the lanes over a chunk's columns outnumber them (16 bf16 rows: 16 lanes a warp, 2 warps)
    for dtype, want in ((torch.float32, (True, 2)), (torch.bfloat16, (False, 1))):  # (dk 64: one bf16 chunk)
        pool = make_problem(head_k_dim=64, head_v_dim=64, state_dtype=dtype, transposed=True)
        call = plan(pool)
        assert (call.constexprs["Q_EFF"], call.constexprs["STATE_STAGES"]) == want, dtype
    bf16_transposed = make_problem(head_k_dim=64, head_v_dim=64, state_dtype=torch.bfloat16, transposed=True)
    for block_v, want in ((32, 2), (16, 0)):
        assert plan(bf16_transposed, state_stages=2, block_v=block_v, num_warps=2,
                    chunk_k=16).constexprs["STATE_STAGES"] == want
    # persistent: a grid of that many programs (at most the tiles: 3 rows x 4 heads here), the row count passed
    for programs, grid in ((5, (5, 1)), (100, (12, 1))):
        call = plan(problem, persistent=programs, maxnreg=128)
        assert (call.grid, call.scalars[2], call.constexprs["maxnreg"]) == (grid, 3, 128)
        assert call.kernel.fn.__name__ == "_gdn_verify_mma_persistent_kernel"
    assert plan(problem).kernel.fn.__name__ == "_gdn_verify_mma_kernel"
    # a programmatic dependent launch by default (CPU tensors: as on sm_90), a plain one when asked for
    assert [plan(problem, **pdl).constexprs.get("PDL") for pdl in ({}, dict(pdl=0), dict(pdl=2))] == [1, 0, 2]
    assert [plan(problem, **pdl).constexprs.get("launch_pdl") for pdl in ({}, dict(pdl=0), dict(pdl=2))] == [
        True, None, True]
    # the L2 prefetch before a pdl 1 wait only (at most dk rows): a power of two, not the persistent kernel's
    assert [plan(problem, **tuning).constexprs["PREFETCH"] for tuning in (
        dict(prefetch_rows=32), dict(prefetch_rows=256), dict(prefetch_rows=32, pdl=0), dict(prefetch_rows=32, pdl=2),
        dict(prefetch_rows=0))] == [32, 64, 0, 0, 0]
    for tuning in (dict(prefetch_rows=48), dict(prefetch_rows=32, persistent=4)):
        with pytest.raises(ValueError, match="prefetch_rows is a power of two, of the non-persistent kernel"):
            plan(problem, **tuning)
    # none on a float32 pool by default, 32 rows on a 2-byte one (MMA_PREFETCH_ROWS), the default checked alike
    bf16_pool = (*problem[:5], problem[5].to(torch.bfloat16), *problem[6:])
    assert [plan(pool).constexprs["PREFETCH"] for pool in (problem, bf16_pool)] == [0, 32]
    monkeypatch.setattr(triton_kernels().gdn_verify, "MMA_PREFETCH_ROWS", (0, 24))
    with pytest.raises(ValueError, match="prefetch_rows is a power of two, of the non-persistent kernel; got 24"):
        plan(bf16_pool)
    monkeypatch.setattr(triton_kernels().gdn_verify, "MMA_PREFETCH_ROWS", (0, 0))
    # the small inputs at the program's start by default (MMA_EARLY_LOADS); a load order the mma kernel's
    tree = make_problem(head_k_dim=64, head_v_dim=64, parents=[-1, 0, 0, 2])
    assert [plan(pool, **early).constexprs["EARLY"] for pool, early in (
        (problem, {}), (tree, {}), (problem, dict(early_loads=2)), (tree, dict(early_loads=1)))] == [1, 0, 2, 1]
    for tuning in (dict(early_loads=1), dict(prefetch_values=True)):
        with pytest.raises(ValueError, match="early_loads, native_products, prefetch_rows, value_runs and "
                                             "prefetch_values are the mma kernel's"):
            triton_kernels().gdn_verify._verify_call(torch.empty(problem[2].shape), *problem, scale=0.25,
                                                     use_qk_l2norm=True, mma=False, **tuning)
    # v's rows prefetched into L2 where asked for (MMA_PREFETCH_VALUES) and they are contiguous; never
    # by the persistent kernel
    strided_v = list(problem)
    strided_v[2] = problem[2].transpose(-1, -2).contiguous().transpose(-1, -2)
    assert [plan(pool, **tuning).constexprs["PREFETCH_V"] for pool, tuning in (
        (problem, {}), (problem, dict(prefetch_values=True)), (strided_v, dict(prefetch_values=True)))] == [
        triton_kernels().gdn_verify.MMA_PREFETCH_VALUES, True, False]
    with pytest.raises(ValueError, match="prefetch_values is the non-persistent kernel's"):
        plan(problem, prefetch_values=True, persistent=4)
    # the stacked products in the pool's 16-bit type only where q, k and the pool share it
    # (by default for a transposed pool's only: MMA_NATIVE_PRODUCTS)
    halves = make_problem(head_k_dim=64, head_v_dim=64, qkv_dtype=torch.bfloat16, state_dtype=torch.bfloat16)
    halves_t = make_problem(head_k_dim=64, head_v_dim=64, qkv_dtype=torch.bfloat16, state_dtype=torch.bfloat16,
                            transposed=True)
    native_defaults = triton_kernels().gdn_verify.MMA_NATIVE_PRODUCTS
    assert [plan(pool, native_products=on).constexprs["NATIVE"] for pool in (halves, halves_t)
            for on in (None, False, True)] == [native_defaults[0], False, True, native_defaults[1], False, True]
    for pool, tuning in ((problem, {}), (bf16_pool, {}), (halves, dict(q_eff=True))):
        with pytest.raises(ValueError, match="native_products are the stacked products'"):
            plan(pool, native_products=True, **tuning)
    # 16 rows a chunk of a 4-byte state (32 stored transposed), 64 of a 2-byte one (at most dk)
    for dtype, transposed, head_k_dim, want in ((torch.float32, False, 128, 16), (torch.float32, True, 128, 32),
                                                (torch.bfloat16, False, 128, 64), (torch.bfloat16, True, 128, 64),
                                                (torch.bfloat16, False, 32, 32)):
        pool = make_problem(head_k_dim=head_k_dim, head_v_dim=64, state_dtype=dtype, transposed=transposed)
        assert plan(pool).constexprs["CHUNK_K"] == want, (dtype, transposed)
    module = triton_kernels().gdn_verify
    defaults = module.MMA_STATE_STAGES, module.MMA_CHUNK_K, module.MMA_Q_EFF
    # the mma kernel by default from MMA_MIN_PROGRAMS programs (a row's value heads x column tiles) and
    # up to MMA_MAX_NODES nodes, where it runs (here: as if on a GPU)
    monkeypatch.setattr(module, "_mma_kernel_runs_on", lambda ssm: True)
    assert module.MMA_MIN_PROGRAMS == 128
    for rows, nodes, want in ((31, 4, False), (32, 4, True), (32, 17, False)):  # (4 value heads of 32 columns)
        chosen = make_problem(num_rows=rows, num_nodes=nodes)
        call = module._verify_call(torch.empty(chosen[2].shape), *chosen, scale=0.25, use_qk_l2norm=True)
        assert (call.kernel.fn.__name__ == "_gdn_verify_mma_kernel") == want, (rows, nodes)
    # with MMA_SPREAD_BLOCK_V, narrower tiles where MMA_BLOCK_V's are too few (4 value heads of 128 columns)
    for spread, rows, want in ((0, 16, None), (64, 15, None), (64, 16, 64), (64, 32, 128)):
        monkeypatch.setattr(module, "MMA_SPREAD_BLOCK_V", spread)
        chosen = make_problem(num_rows=rows, head_v_dim=128)
        call = module._verify_call(torch.empty(chosen[2].shape), *chosen, scale=0.25, use_qk_l2norm=True)
        mma = call.kernel.fn.__name__ == "_gdn_verify_mma_kernel"
        assert (call.constexprs["BLOCK_V"] if mma else None) == want, (spread, rows)
    try:
        module.MMA_STATE_STAGES, module.MMA_CHUNK_K = 3, (32, 32)
        assert [plan(problem).constexprs[name] for name in ("STATE_STAGES", "CHUNK_K")] == [2, 32]  # (dk 64)
        module.MMA_Q_EFF = False
        assert [plan(problem).constexprs[name] for name in ("STATE_STAGES", "Q_EFF")] == [0, False]
    finally:
        module.MMA_STATE_STAGES, module.MMA_CHUNK_K, module.MMA_Q_EFF = defaults


def path_masks(links):
    """Each node's path mask, its ancestors followed one link at a time (the obvious loop)."""
    masks = []
    for row in links.tolist():
        masks.append([])
        for node in range(len(row)):
            mask, up = 0, node
            while up >= 0:
                mask, up = mask | 1 << up, row[up]
            masks[-1].append(mask)
    return torch.tensor(masks, dtype=links.dtype)


def test_tree_path_masks():
    """The launcher's tree_masks: each node's path mask as the obvious loop has it; only a tree's,
    on the mma kernel (and doubling the Triton kernel's only)."""
    links = torch.tensor([[-1, 0, 0, 0, 1, 1, 1, 4], [-1, -1, 0, 1, 2, 3, 4, 5], [-1, 0, 1, 2, 3, 4, 5, 6]])
    assert torch.equal(triton_kernels().gdn_verify.tree_path_masks(links), path_masks(links))
    q, k, v, g, beta, ssm, slots, parents = make_problem(parents=[-1, 0, 0, 2])
    for chosen in (dict(parents=None, mma=True), dict(parents=parents, mma=False)):
        with pytest.raises(ValueError, match="tree_masks"):
            triton_kernels().gdn_verify._verify_call(torch.empty(v.shape), q, k, v, g, beta, ssm, slots,
                                                     chosen["parents"], scale=0.25, use_qk_l2norm=True,
                                                     mma=chosen["mma"], tree_masks=True)
    with pytest.raises(ValueError, match="doubling"):
        triton_kernels().gdn_verify._verify_call(torch.empty(v.shape), q, k, v, g, beta, ssm, slots, parents,
                                                 scale=0.25, use_qk_l2norm=True, mma=True, doubling=True)


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [{}, dict(state_stages=0), dict(state_stages=2, chunk_k=32),
                                    dict(chunk_k=16, block_v=64, num_warps=1)],
                         ids=["default", "registers", "staged", "narrow"])
def test_cuda_native_products(tuning):
    """The stacked products in the pool's bf16 (native_products): the oracle's outputs for
    chains and trees, fused views of one conv output, pools sliced or stored transposed, odd sizes,
    a skipped row; the tf32 products' outputs within the accumulation order's rounding."""
    def run(native):
        def launch(out, q, k, v, g, beta, ssm, slots, parents, **kwargs):
            kernel_args, kernel_kwargs = sgl_convwin.gdn_verify.kernel_arguments(out, q, k, v, g, beta, ssm, slots,
                                                                                 parents, **kwargs)
            triton_kernels().launch_gdn_verify(*kernel_args, **kernel_kwargs, mma=True, q_eff=False,
                                               native_products=native, **tuning)
        return launch

    for shape in (dict(head_k_dim=128, head_v_dim=128, num_nodes=8, parents=[-1, 0, 0, 0, 1, 1, 1, 4]),
                  dict(head_k_dim=128, head_v_dim=128, fused=True, transposed=True),
                  dict(head_k_dim=48, head_v_dim=80, pooled=True, parents=[-1, -1, 0, 2])):
        problem = make_problem(num_rows=4, num_slots=6, slots=[5, -1, 3, 1], qkv_dtype=torch.bfloat16,
                               state_dtype=torch.bfloat16, device="cuda", **shape)
        assert check("cuda", run(True), problem, tol=2e-2) == [0, 2, 3]
        q, k, v, g, beta, ssm, slots, parents = problem
        outs = [torch.zeros(v.shape, device="cuda") for _ in range(2)]
        for out, native in zip(outs, (True, False)):
            run(native)(out, q, k, v, g, beta, ssm, slots, parents)
        assert (outs[0] - outs[1]).abs().max().item() <= 1e-5 * outs[1].abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tuning", [{}, dict(block_v=32, num_warps=4), dict(early_loads=2), dict(persistent=3)],
                         ids=["default", "narrow", "v-first", "persistent"])
def test_cuda_value_runs_bit_for_bit(state_dtype, tuning):
    """v loaded and out stored in 16-byte runs through shared memory (value_runs, the default): bit
    for bit the outputs of an element an access, chains and trees, fused views, odd sizes, a bf16
    and a float32 out whose rows are strided; the skipped row and out's gaps left untouched."""
    for shape, out_dtype in ((dict(head_v_dim=128, num_nodes=8, parents=[-1, 0, 0, 0, 1, 1, 1, 4]), torch.bfloat16),
                             (dict(head_v_dim=128, fused=True, transposed=True), torch.bfloat16),
                             (dict(head_v_dim=40, parents=[-1, -1, 0, 2]), torch.float32)):
        q, k, v, g, beta, ssm, slots, parents = make_problem(
            num_rows=4, num_slots=6, slots=[5, -1, 3, 1], head_k_dim=128 if shape["head_v_dim"] == 128 else 48,
            qkv_dtype=torch.bfloat16, state_dtype=state_dtype, device="cuda", **shape)
        whole = []
        for runs in (True, False):
            base = torch.full((*v.shape[:3], v.shape[3] + 8), FILL, dtype=out_dtype, device="cuda")
            kernel_args, kernel_kwargs = sgl_convwin.gdn_verify.kernel_arguments(base[..., :v.shape[3]], q, k, v, g,
                                                                                 beta, ssm, slots, parents)
            triton_kernels().launch_gdn_verify(*kernel_args, **kernel_kwargs, mma=True, value_runs=runs, **tuning)
            whole.append(base)
        assert torch.equal(whole[0], whole[1])
        assert (whole[0][1] == FILL).all() and (whole[0][..., v.shape[3]:] == FILL).all()
        assert not (whole[0][0, :, :, :v.shape[3]] == FILL).any()  # (a row it verified: written)


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_prefetch_values_changes_no_bit(state_dtype):
    """v's rows prefetched into L2 at a program's start (prefetch_values, a hint): bit for bit the
    outputs without it, chains and trees, fused views, a pool stored transposed, odd sizes (a
    partial last column tile); the skipped row untouched."""
    for shape in (dict(head_v_dim=128, num_nodes=8, parents=[-1, 0, 0, 0, 1, 1, 1, 4]),
                  dict(head_v_dim=128, fused=True, transposed=True), dict(head_v_dim=40, parents=[-1, -1, 0, 2])):
        q, k, v, g, beta, ssm, slots, parents = make_problem(
            num_rows=4, num_slots=6, slots=[5, -1, 3, 1], head_k_dim=128 if shape["head_v_dim"] == 128 else 48,
            qkv_dtype=torch.bfloat16, state_dtype=state_dtype, device="cuda", **shape)
        outs = []
        for prefetch in (False, True):
            outs.append(torch.full(v.shape, FILL, device="cuda"))
            kernel_args, kernel_kwargs = sgl_convwin.gdn_verify.kernel_arguments(outs[-1], q, k, v, g, beta, ssm,
                                                                                 slots, parents)
            triton_kernels().launch_gdn_verify(*kernel_args, **kernel_kwargs, mma=True, prefetch_values=prefetch)
        assert torch.equal(outs[0], outs[1])
        assert (outs[1][1] == FILL).all() and not (outs[1][0] == FILL).any()


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_tree_masks(state_dtype):
    """The mma kernel given each node's path mask instead of its link (tree_masks): the oracle's
    outputs; a row whose masks are not a forest's (a node's own bit missing, a bit above it, a mask
    that is not its parent's plus its own) left untouched, the others written."""
    tree = [-1, 0, 0, 0, 1, 1, 1, 4]
    problem = make_problem(num_rows=4, num_nodes=8, head_k_dim=128, head_v_dim=128, num_slots=6, slots=[5, 0, 3, 1],
                           parents=tree, state_dtype=state_dtype, qkv_dtype=torch.bfloat16, device="cuda")
    tol = 2e-3 if state_dtype == torch.float32 else 2e-2
    masks = path_masks(problem[-1].cpu()).cuda()

    def run(out, q, k, v, g, beta, ssm, slots, parents, **kwargs):
        kernel_args, kernel_kwargs = sgl_convwin.gdn_verify.kernel_arguments(out, q, k, v, g, beta, ssm, slots, parents)
        kernel_args = (*kernel_args[:-1], masks)  # (parents, last, as their path masks)
        triton_kernels().launch_gdn_verify(*kernel_args, **kernel_kwargs, mma=True, tree_masks=True)

    assert check("cuda", run, problem, tol=tol) == [0, 1, 2, 3]
    masks[1, 4] ^= 1 << 4  # node 4 without its own bit
    masks[2, 2] |= 1 << 5  # node 2 with a bit above its own
    masks[3, 7] = 1 << 7 | 1 << 4  # node 7 under node 4 without node 4's ancestors
    q, k, v, g, beta, ssm, slots, parents = problem
    expected, _ = reference.gdn_verify_reference(q, k, v, g, beta, ssm, slots.cpu(), parents)
    out = torch.full(v.shape, FILL, device="cuda")
    run(out, q, k, v, g, beta, ssm, slots, parents)
    got = out.cpu()
    assert torch.equal(got[1:], torch.full_like(got[1:], FILL))
    assert (got[0].double() - expected[0]).abs().max().item() <= tol * expected[0].abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("parents", [None, [-1, 0, 0, 0, 1, 1, 1, 4]], ids=["chain", "tree8"])
def test_cuda_spread_tiles(monkeypatch, state_dtype, parents):
    """MMA_SPREAD_BLOCK_V: a batch too small for the mma kernel's 128-column tiles on 64-column ones
    (16 rows x 4 value heads x 2 tiles = MMA_MIN_PROGRAMS), the launcher's own choice (not an eager
    plan made before the patch), against the oracle."""
    module = triton_kernels().gdn_verify
    monkeypatch.setattr(module, "MMA_SPREAD_BLOCK_V", 64)
    problem = make_problem(num_rows=16, num_nodes=4 if parents is None else 8, head_k_dim=128, head_v_dim=128,
                           num_slots=20, slots=list(range(19, 3, -1)), parents=parents, state_dtype=state_dtype,
                           qkv_dtype=torch.bfloat16, device="cuda")
    q, k, v, g, beta, ssm, slots, links = problem
    call = module._verify_call(torch.empty(v.shape, device="cuda"), q, k, v, g, beta, ssm, slots, links, scale=0.25,
                               use_qk_l2norm=True)
    assert call.kernel.fn.__name__ == "_gdn_verify_mma_kernel" and call.constexprs["BLOCK_V"] == 64

    def run(*args, **kwargs):
        kernel_args, kernel_kwargs = sgl_convwin.gdn_verify.kernel_arguments(*args, **kwargs)
        module.launch_gdn_verify(*kernel_args, **kernel_kwargs)

    assert check("cuda", run, problem, tol=2e-3 if state_dtype == torch.float32 else 2e-2) == list(range(16))


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_state_stages_transposed_pool(state_dtype):
    """The state chunks through shared memory from a pool stored [S, Hv, dv, dk] (engines' layout)
    and passed transposed, 16 bytes a copy down a column: the default plan (chunks of a column's
    128-byte line), three in flight, and chunks of 16 rows (a warp's lanes over fewer rows, more
    columns), with either form."""
    for tuning in (dict(), dict(state_stages=3), dict(chunk_k=16, q_eff=False), dict(chunk_k=16, q_eff=True)):
        def run(*args, **kwargs):
            kernel_args, kernel_kwargs = sgl_convwin.gdn_verify.kernel_arguments(*args, **kwargs)
            triton_kernels().launch_gdn_verify(*kernel_args, **kernel_kwargs, mma=True, **tuning)

        check("cuda", run, make_problem(head_k_dim=128, head_v_dim=128, state_dtype=state_dtype, transposed=True,
                                        device="cuda"), tol=2e-3 if state_dtype == torch.float32 else 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype, offset", [(torch.bfloat16, 4), (torch.float32, 1)], ids=["bf16", "fp32"])
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
def test_cuda_staged_plan_then_a_misaligned_pool(monkeypatch, state_dtype, offset, transposed):
    """An eager plan made with the state chunks through shared memory (a 16-byte aligned pool)
    serves a later pool of the same strides that starts 8 (bf16) or 4 (fp32) bytes off: a bf16 one's
    copies of one value, under cp.async's 4 bytes, take the registers instead of failing to compile;
    a float32 one's copies shrink to 4 bytes; pools stored [.., dv, dk] (copies down a column) too."""
    monkeypatch.setattr(triton_kernels().gdn_verify, "Q_EFF_DTYPES", (torch.float32, torch.bfloat16))
    sgl_convwin.gdn_verify.eager_plans.clear()
    q, k, v, g, beta, ssm, slots, parents = make_problem(num_rows=128, head_k_dim=128, head_v_dim=128,
                                                         state_dtype=state_dtype, device="cuda")
    flat = torch.zeros(ssm.numel() + offset, dtype=ssm.dtype, device="cuda")
    for start in (0, offset):  # the plan at the aligned pool, then the misaligned one
        stored = flat[start:start + ssm.numel()].view(ssm.transpose(-1, -2).shape if transposed else ssm.shape)
        pool = stored.transpose(-1, -2) if transposed else stored
        pool.copy_(ssm)
        check("cuda", sgl_convwin.gdn_verify, [q, k, v, g, beta, pool, slots, parents],
              tol=2e-2 if state_dtype == torch.bfloat16 else 2e-3)
    sgl_convwin.gdn_verify.eager_plans.clear()


@pytest.mark.gpu
@pytest.mark.parametrize("level", [1, 2])
def test_cuda_pdl_reads_what_the_launch_before_wrote(level):
    """Two layers launched as programmatic dependents (pdl 1: every read after the wait; 2: the
    state's first chunks before it), the second's q and k views of the first's out."""
    first = make_problem(num_rows=256, head_k_dim=64, head_v_dim=64, num_slots=256, device="cuda")
    second = make_problem(num_rows=256, head_k_dim=64, head_v_dim=64, num_slots=256, device="cuda", seed=1)
    q0, k0, v0, g0, beta0, ssm0, slots, _ = first
    v1, g1, beta1, ssm1 = second[2], second[3], second[4], second[5]
    out0 = torch.full(v0.shape, FILL, device="cuda")
    out1 = torch.full(v0.shape, FILL, device="cuda")
    q1, k1 = out0[:, :, :2], out0[:, :, 2:]  # (Hk 2, Hv 4, dk = dv)

    def both(pdl=False):
        for out, q, k, v, g, beta, ssm in ((out0, q0, k0, v0, g0, beta0, ssm0), (out1, q1, k1, v1, g1, beta1, ssm1)):
            kernel_args, kernel_kwargs = sgl_convwin.gdn_verify.kernel_arguments(out, q, k, v, g, beta, ssm, slots,
                                                                                 None)
            triton_kernels().launch_gdn_verify(*kernel_args, **kernel_kwargs, mma=True,
                                               pdl=level if pdl else 0)

    check_chained_pdl(both, (out0, out1), FILL)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [dict(), dict(transposed=True), dict(transposed=True, prefetch_rows=32),
                                   dict(block_v=64, prefetch_rows=32)],
                         ids=["rows", "columns", "column-runs", "row-runs"])
def test_cuda_prefetch_reads_what_the_launch_before_wrote(shape):
    """The first state rows prefetched into L2 before a pdl 1 wait (prefetch_rows), right after
    kernels that rewrite the pool and the slots: bit for bit a plain launch's outputs on the new
    ones, eagerly and in a CUDA graph (check_chained_pdl; the one range of whole rows or columns, or
    a run a lane)."""
    shape = dict(shape)
    transposed = shape.pop("transposed", False)
    tuning = dict(dict(mma=True, prefetch_rows=128), **shape)
    q, k, v, g, beta, new_pool, new_slots, _ = make_problem(
        num_rows=256, num_nodes=4, head_k_dim=128, head_v_dim=128, num_slots=300, slots=list(range(299, 43, -1)),
        qkv_dtype=torch.bfloat16, transposed=transposed, device="cuda")
    pool, old_pool = torch.empty_like(new_pool), torch.randn_like(new_pool)  # (the same strides)
    old_slots, slots = torch.arange(256, device="cuda"), torch.empty_like(new_slots)
    out = torch.empty(v.shape, device="cuda")
    kernel_args, kernel_kwargs = sgl_convwin.gdn_verify.kernel_arguments(out, q, k, v, g, beta, pool, slots, None)
    assert kernel_args[6] is pool and kernel_args[7] is slots  # (what the copies rewrite is what it reads)

    def launch(pdl=False):  # (the new pool and slots written right before: a stale read would see the old)
        pool.copy_(old_pool)
        slots.copy_(old_slots)
        pool.copy_(new_pool)
        slots.copy_(new_slots)
        triton_kernels().launch_gdn_verify(*kernel_args, **kernel_kwargs, **dict(
            tuning, **({"pdl": 1} if pdl else {"pdl": 0, "prefetch_rows": 0})))

    check_chained_pdl(launch, (out,), FILL)


@pytest.mark.parametrize("impl", IMPLS[:2])
@given(data=st.data())
def test_fuzz_cpu(impl, data):
    """The CPU paths over random trees, groupings, views and slots."""
    device, run = impl
    num_nodes = data.draw(st.integers(1, 9), label="nodes")
    num_rows = data.draw(st.integers(1, 4), label="rows")
    parents = data.draw(st.one_of(st.none(), trees(num_nodes)), label="parents")
    slots = data.draw(st.lists(st.integers(-2, 5), min_size=num_rows, max_size=num_rows), label="slots")
    problem = make_problem(
        num_rows=num_rows, num_nodes=num_nodes, ratio=data.draw(st.sampled_from([1, 2, 4])), num_slots=4,
        head_k_dim=data.draw(st.sampled_from([8, 16])), head_v_dim=data.draw(st.sampled_from([8, 24])),
        parents=parents, slots=slots, fused=data.draw(st.booleans()), transposed=data.draw(st.booleans()),
        pooled=data.draw(st.booleans()), seed=data.draw(st.integers(0, 2**16)), device=device,
    )
    check(device, run, problem, use_qk_l2norm=data.draw(st.booleans()))


@interpreted
@pytest.mark.slow
@settings(max_examples=20)
@given(data=st.data())
def test_fuzz_triton_interpreted(data):
    """The Triton kernel under the interpreter: random trees, slots and views (few examples: slow)."""
    num_nodes = data.draw(st.integers(1, 8), label="nodes")
    num_rows = data.draw(st.integers(1, 3), label="rows")
    problem = make_problem(
        num_rows=num_rows, num_nodes=num_nodes, ratio=data.draw(st.sampled_from([1, 2])), num_slots=3,
        parents=data.draw(st.one_of(st.none(), trees(num_nodes)), label="parents"),
        slots=data.draw(st.lists(st.integers(-1, 3), min_size=num_rows, max_size=num_rows), label="slots"),
        fused=data.draw(st.booleans()), transposed=data.draw(st.booleans()), seed=data.draw(st.integers(0, 99)),
    )
    check("cpu", run_triton, problem)



@pytest.mark.gpu
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
def test_cuda_model_shape(tree, state_dtype, transposed):
    """Qwen3-Next's per-rank shape (Hk 16, Hv 32, 128 x 128) at 40 rows, as engines call it: q, k, v
    views of one bf16 conv output, a slice of a pool (stored [.., dk, dv] or, as engines store it,
    [.., dv, dk] and passed transposed), slots permuted."""
    parents = [-1, 0, 0, 0, 1, 1, 1, 4] if tree else None
    problem = make_problem(num_rows=40, num_nodes=8 if tree else 4, num_k_heads=16, head_k_dim=128, head_v_dim=128,
                           num_slots=64, slots=torch.randperm(64)[:40], parents=parents, qkv_dtype=torch.bfloat16,
                           state_dtype=state_dtype, fused=True, transposed=transposed, pooled=True, device="cuda")
    tol = 2e-3 if state_dtype == torch.float32 else 2e-2
    check("cuda", run_public, problem, out_dtype=torch.bfloat16, tol=max(tol, 1e-2))
    check("cuda", run_public, problem, out_dtype=torch.float32, tol=tol)


@pytest.mark.gpu
def test_cuda_fp32_tolerance_all_fp32():
    """Everything float32: within 2e-3 x max |o| (tf32x3 products), several batch sizes (tile choices)."""
    for num_rows in (1, 8, 64):
        problem = make_problem(num_rows=num_rows, num_nodes=4, num_k_heads=16, head_k_dim=128, head_v_dim=128,
                               num_slots=num_rows, device="cuda", seed=num_rows)
        check("cuda", run_public, problem, tol=2e-3)


@pytest.mark.gpu
def test_cuda_agrees_with_fla():
    """FLA's fused_recurrent_gated_delta_rule on the same chains (it reads initial_state per row)."""
    fla = pytest.importorskip("fla.ops.gated_delta_rule")
    q, k, v, g, beta, ssm, slots, _ = make_problem(num_rows=6, num_nodes=4, num_k_heads=4, head_k_dim=128,
                                                   head_v_dim=128, num_slots=6, slots=torch.arange(6),
                                                   qkv_dtype=torch.bfloat16, device="cuda")
    out = torch.empty(v.shape, dtype=torch.float32, device="cuda")
    sgl_convwin.gdn_verify(out, q, k, v, g, beta, ssm, slots)
    want, _ = fla.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, scale=128 ** -0.5, initial_state=ssm,
                                                   output_final_state=False, use_qk_l2norm_in_kernel=True)
    error = (out - want.float()).abs().max().item()
    assert error <= 1e-2 * want.float().abs().max().item(), error


def test_checked_mode_names_the_row():
    q, k, v, g, beta, ssm, slots, parents = make_problem(slots=[0, 7, 1], parents=[-1, 0, 0, 1])
    out = torch.full(v.shape, FILL)
    with sgl_convwin.index_checks(), pytest.raises(IndexError, match=r"state_slots\[1\] = 7"):
        sgl_convwin.gdn_verify(out, q, k, v, g, beta, ssm, slots, parents)
    parents[2, 3] = 3
    with sgl_convwin.index_checks(), pytest.raises(IndexError, match=r"parents\[2, 3\] = 3"):
        sgl_convwin.gdn_verify(out, q, k, v, g, beta, ssm, torch.tensor([0, 1, 2]), parents)
    assert torch.equal(out, torch.full_like(out, FILL))


BAD_CALLS = {
    "state 3-D": (lambda p: p.update(ssm=p["ssm"][0]), ValueError, "one layer's pool"),
    "state fp16": (lambda p: p.update(ssm=p["ssm"].half()), TypeError, "float32 or bfloat16"),
    "k shape": (lambda p: p.update(k=p["k"][:, :3]), ValueError, "k must have q's shape"),
    "v heads": (lambda p: p.update(v=p["v"][:, :, :3]), ValueError, r"v must be \[B, N, Hv, dv\]"),
    "dk": (lambda p: p.update(q=p["q"][..., :8], k=p["k"][..., :8]), ValueError, "dk = 16"),
    "dk 0": (lambda p: p.update(q=p["q"][..., :0], k=p["k"][..., :0], ssm=p["ssm"][..., :0, :]), ValueError,
             "Hv, dk, dv >= 1"),
    "g shape": (lambda p: p.update(g=p["g"][:, :, :1]), ValueError, r"g must be \[B, N, Hv\]"),
    "beta int": (lambda p: p.update(beta=p["beta"].long()), TypeError, "beta must be a floating-point"),
    "out shape": (lambda p: p.update(out=p["out"][:2]), ValueError, "out must be"),
    "out expanded": (lambda p: p.update(out=p["out"][:, :1].expand(p["v"].shape)), ValueError, "overlapping"),
    "slots float": (lambda p: p.update(slots=p["slots"].float()), TypeError, "state_slots must be int32 or int64"),
    "slots rows": (lambda p: p.update(slots=p["slots"][:2]), ValueError, "state_slots has 2 rows"),
    "parents shape": (lambda p: p.update(parents=p["parents"][:, :2]), ValueError, r"parents must be \[B, N\]"),
    "out aliases v": (lambda p: p.update(out=p["v"]), ValueError, "share storage"),
    "scale str": (lambda p: p.update(scale="0.1"), TypeError, "scale must be a float"),
    "grouping": (lambda p: p.update(q=p["q"][:, :, :1].expand(-1, -1, 3, -1), k=p["k"][:, :, :1].expand(-1, -1, 3, -1)),
                 ValueError, "multiple of Hk"),
    "too many nodes": (lambda p: p.update(zip(("q", "k", "v", "g", "beta", "ssm", "slots", "parents"),
                                              make_problem(num_nodes=65)), out=torch.full((3, 65, 4, 32), FILL)),
                       ValueError, "must be 1..64"),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_bad_calls_raise_before_writing(case):
    mutate, error, match = BAD_CALLS[case]
    q, k, v, g, beta, ssm, slots, parents = make_problem(parents=[-1, 0, 0, 1])
    p = dict(out=torch.full(v.shape, FILL), q=q, k=k, v=v, g=g, beta=beta, ssm=ssm, slots=slots, parents=parents,
             scale=None)
    mutate(p)
    before = p["out"].clone()
    with pytest.raises(error, match=match):
        sgl_convwin.gdn_verify(p["out"], p["q"], p["k"], p["v"], p["g"], p["beta"], p["ssm"], p["slots"],
                               p["parents"], scale=p["scale"])
    assert torch.equal(p["out"], before)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_opcheck(device):
    for tree in (False, True):
        q, k, v, g, beta, ssm, slots, parents = make_problem(parents=[-1, 0, 0, 1] if tree else None,
                                                             device=device)
        out = torch.zeros(v.shape, device=device)
        torch.library.opcheck(torch.ops.convwin.gdn_verify.default, (out, q, k, v, g, beta, ssm, slots, parents),
                              {"scale": 0.25, "use_qk_l2norm": True})


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph(device, dynamic):
    """Inside torch.compile(fullgraph=True): the op stays in the graph, out is written in place."""
    q, k, v, g, beta, ssm, slots, parents = make_problem(fused=True, parents=[-1, 0, 0, 1], device=device)
    expected, _ = reference.gdn_verify_reference(q, k, v, g, beta, ssm, slots.cpu(), parents)
    backend = CountingBackend() if device == "cpu" else "inductor"

    @torch.compile(fullgraph=True, dynamic=dynamic, backend=backend)
    def step(out, mixed_q, mixed_k, mixed_v, g, beta, ssm, slots, parents):
        sgl_convwin.gdn_verify(out, mixed_q, mixed_k, mixed_v, g, beta, ssm, slots, parents)
        return out.sum()

    out = torch.zeros(v.shape, device=device)
    total = step(out, q, k, v, g, beta, ssm, slots, parents)
    error = (out.cpu().double() - expected).abs().max().item()
    assert error <= 2e-3 * expected.abs().max().item()
    assert torch.allclose(total.cpu().double(), expected.sum(), rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_cuda_graph_replay_with_new_slots():
    """Captured once, replayed with new slots and links written into the static inputs."""
    q, k, v, g, beta, ssm, slots, parents = make_problem(num_rows=4, num_slots=6, parents=[-1, 0, 0, 1],
                                                         device="cuda")
    out = torch.full(v.shape, FILL, device="cuda")
    sgl_convwin.gdn_verify(out, q, k, v, g, beta, ssm, slots, parents)  # warm-up (compiles, plans)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sgl_convwin.gdn_verify(out, q, k, v, g, beta, ssm, slots, parents)
    for new_slots, new_links in (([5, -1, 2, 0], [-1, 0, 1, 1]), ([1, 4, 9, 3], [-1, -1, 0, 2])):
        slots.copy_(torch.tensor(new_slots))
        parents.copy_(torch.tensor(new_links).expand_as(parents))
        out.fill_(FILL)
        graph.replay()
        torch.cuda.synchronize()
        expected, written = reference.gdn_verify_reference(q, k, v, g, beta, ssm, slots.cpu(), parents)
        got = out.cpu().double()
        assert written == [row for row, s in enumerate(new_slots) if 0 <= s < 6]
        assert (got[written] - expected[written]).abs().max() <= 2e-3 * expected[written].abs().max()
        skipped = [r for r in range(4) if r not in written]
        assert torch.equal(out[skipped].cpu(), torch.full_like(out[skipped].cpu(), FILL))
