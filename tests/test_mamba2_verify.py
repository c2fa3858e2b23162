"""mamba2_verify against its float64 oracle (reference.mamba2_verify_reference).

Every implementation -- the public function on the CPU (the chunked PyTorch path), the registered
op, the Triton kernel under the interpreter, the CUDA kernel -- computes chains and trees of every
group count, with every optional term (D, z, dt_bias, dt_softplus), from strided views of one conv
output and transposed or sliced state pools. Outputs are compared with a tolerance relative to the
largest output (arithmetic); rows that must be skipped, and the state (read only), bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sgl_convwin
from sgl_convwin import reference
from sgl_convwin._kernels import triton_kernels
from support import HAS_TRITON, INTERPRET, CountingBackend, check_chained_pdl, trees

FILL = 7.0  # what out holds before the call: rows left untouched keep it


def run_public(*args, **kwargs):
    sgl_convwin.mamba2_verify(*args, **kwargs)


def run_op(*args, **kwargs):
    torch.ops.convwin.mamba2_verify(*args, **kwargs)


def run_triton(*args, **kwargs):
    kernel_args, kernel_kwargs = sgl_convwin.mamba2_verify.kernel_arguments(*args, **kwargs)
    triton_kernels().launch_mamba2_verify(*kernel_args, **kernel_kwargs)


def tuned(**tuning):
    def run(*args, **kwargs):
        kernel_args, kernel_kwargs = sgl_convwin.mamba2_verify.kernel_arguments(*args, **kwargs)
        triton_kernels().launch_mamba2_verify(*kernel_args, **kernel_kwargs, **tuning)
    return run


interpreted = pytest.mark.skipif(not (INTERPRET and HAS_TRITON), reason="Triton's interpreter runs on the CPU only")
IMPLS = [
    pytest.param(("cpu", run_public), id="cpu-public"),
    pytest.param(("cpu", run_op), id="cpu-op"),
    pytest.param(("cpu", run_triton), id="triton-interpret", marks=interpreted),
    pytest.param(("cuda", run_public), id="cuda", marks=pytest.mark.gpu),
    pytest.param(("cuda", run_op), id="cuda-op", marks=pytest.mark.gpu),
]
TERMS = ("D", "z", "dt_bias")


def make_problem(*, num_rows=3, num_nodes=4, num_heads=4, num_groups=2, head_dim=16, d_state=16, num_slots=5,
                 parents=None, slots=None, terms=TERMS, dt_softplus=True, x_dtype=torch.float32,
                 dt_dtype=torch.float32, state_dtype=torch.float32, fused=False, transposed=False, pooled=False,
                 device="cpu", seed=0):
    """One layer's verify inputs (a list of positional arguments after ``out``, and the keywords).
    fused: x, B, C as views of one [B, N, H*P + 2*G*Ns] conv output; transposed: the pool stored
    [S, H, Ns, P] and passed transposed; pooled: a slice of [2, S, ...]. terms: the optional ones given."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(shape, generator=gen) * std

    x_width, bc_width = num_heads * head_dim, num_groups * d_state
    if fused:
        # views made on the device: moving a view there would copy it into a contiguous tensor
        mixed = randn(num_rows, num_nodes, x_width + 2 * bc_width).to(device, x_dtype)
        x = mixed[..., :x_width].unflatten(-1, (num_heads, head_dim))
        B = mixed[..., x_width:x_width + bc_width].unflatten(-1, (num_groups, d_state))
        C = mixed[..., x_width + bc_width:].unflatten(-1, (num_groups, d_state))
    else:
        x = randn(num_rows, num_nodes, num_heads, head_dim).to(x_dtype)
        B = randn(num_rows, num_nodes, num_groups, d_state).to(x_dtype)
        C = randn(num_rows, num_nodes, num_groups, d_state).to(x_dtype)
    # dt before softplus (around -1: steps of 0.3) or as the model uses it (positive)
    dt = (randn(num_rows, num_nodes, num_heads, std=0.5) - 1.0 if dt_softplus
          else torch.rand((num_rows, num_nodes, num_heads), generator=gen) * 0.4).to(dt_dtype)
    A = -torch.rand((num_heads,), generator=gen) * 2 - 0.1
    state_shape = (num_slots, num_heads, d_state, head_dim) if transposed else (num_slots, num_heads, head_dim, d_state)
    ssm = randn(2 if pooled else 1, *state_shape, std=0.3).to(device, state_dtype)[-1]
    if transposed:
        ssm = ssm.transpose(-1, -2)
    slots = torch.arange(num_rows) % num_slots if slots is None else torch.as_tensor(slots)
    if parents is not None:
        parents = torch.as_tensor(parents)
        if parents.dim() == 1:
            parents = parents.expand(num_rows, num_nodes).clone()
    optional = dict(D=randn(num_heads), z=randn(num_rows, num_nodes, num_heads, head_dim).to(x_dtype),
                    dt_bias=randn(num_heads, std=0.3))
    kwargs = {name: value.to(device) for name, value in optional.items() if name in terms}
    tensors = [x, dt, A, B, C, ssm, slots, parents]
    return [None if t is None else t.to(device) for t in tensors], dict(kwargs, dt_softplus=dt_softplus)


def check(device, run, problem, *, out_dtype=torch.float32, tol=2e-3):
    """Run mamba2_verify into a filled ``out`` and compare it with the oracle: written rows within
    ``tol`` x max |y|, every other row untouched, the state unchanged."""
    (x, dt, A, B, C, ssm, slots, parents), kwargs = problem
    expected, written = reference.mamba2_verify_reference(x, dt, A, B, C, ssm, slots.cpu(), parents, **kwargs)
    state_before = ssm.clone()
    out = torch.full(x.shape, FILL, dtype=out_dtype, device=device)
    run(out, x, dt, A, B, C, ssm, slots, parents, **kwargs)
    assert torch.equal(ssm, state_before), "the state was written"
    got = out.cpu()
    skipped = [row for row in range(x.shape[0]) if row not in written]
    assert torch.equal(got[skipped], torch.full_like(got[skipped], FILL)), "a skipped row was written"
    if written:
        error = (got[written].double() - expected[written]).abs().max().item()
        assert error <= tol * expected[written].abs().max().item(), f"max error {error:.3g}"
    return written


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("num_groups", [1, 2, 8])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_matches_oracle(impl, num_groups, tree):
    device, run = impl
    parents = [-1, 0, 0, 1, 1, 2] if tree else None
    problem = make_problem(num_nodes=6, num_heads=8, num_groups=num_groups, parents=parents, num_slots=4,
                           slots=[3, 0, 1], device=device)
    assert check(device, run, problem) == [0, 1, 2]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("terms", [(), ("D",), ("z",), ("dt_bias",), TERMS], ids=lambda t: "+".join(t) or "none")
@pytest.mark.parametrize("dt_softplus", [False, True], ids=["dt", "softplus"])
def test_optional_terms(impl, terms, dt_softplus):
    device, run = impl
    problem = make_problem(terms=terms, dt_softplus=dt_softplus, parents=[-1, 0, 0, 2], device=device, seed=3)
    check(device, run, problem)


@pytest.mark.parametrize("impl", IMPLS)
def test_views_of_one_conv_output_and_pools(impl):
    """x, B, C split from one conv output (no copies), the pool transposed and sliced."""
    device, run = impl
    problem = make_problem(fused=True, transposed=True, pooled=True, parents=[-1, -1, 0, 2], device=device)
    assert not problem[0][0].is_contiguous() and not problem[0][5].is_contiguous()
    check(device, run, problem)
    check(device, run, make_problem(fused=True, device=device, seed=1))


@pytest.mark.parametrize("impl", IMPLS)
def test_low_precision_inputs_and_state(impl):
    device, run = impl
    problem = make_problem(x_dtype=torch.bfloat16, dt_dtype=torch.bfloat16, state_dtype=torch.bfloat16,
                           fused=True, device=device)
    check(device, run, problem, out_dtype=torch.bfloat16, tol=2e-2)
    problem = make_problem(x_dtype=torch.float16, parents=[-1, 0, 0, 1], device=device, seed=1)
    check(device, run, problem, out_dtype=torch.float16, tol=2e-2)


@pytest.mark.parametrize("impl", IMPLS)
def test_skipped_rows(impl):
    """Slots < 0 or >= S and bad links (self, forward, below -1) skip their row; rows sharing a slot
    both read it."""
    device, run = impl
    slots = [4, -1, 5, 2, 2, 0, 1, 3]
    links = [[-1, 0, 1, 2]] * 3 + [[-1, 0, 0, 1], [-1, 0, 0, 1], [-1, 1, 0, 1], [-1, 0, 2, 1], [-1, 0, -2, 1]]
    problem = make_problem(num_rows=8, num_slots=5, slots=slots, parents=links, device=device)
    assert check(device, run, problem) == [0, 3, 4]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_strong_decays(impl, tree):
    """Steps d A of -1e3 down to -1e7 before small ones: the outputs after them stay within the
    tolerance, not lost to the rounding of a path's sum."""
    device, run = impl
    (x, dt, *rest), kwargs = make_problem(num_rows=4, num_nodes=6, terms=(), dt_softplus=False,
                                          parents=[-1, 0, 1, 1, 3, -1] if tree else None, device=device)
    dt = dt.clone()
    for row, value in enumerate((1e3, 1e5, 1e6, 1e7)):
        dt[row, row % 2, 0] = value  # (A <= -0.1)
        dt[row, 3, 1] = value
    check(device, run, ([x, dt, *rest], kwargs))


@pytest.mark.parametrize("impl", IMPLS)
def test_one_node_odd_sizes_and_deep_paths(impl):
    """N = 1, P and Ns that are not powers of two (the kernel pads and masks), paths of 12 and 17."""
    device, run = impl
    check(device, run, make_problem(num_nodes=1, head_dim=12, d_state=20, device=device))
    check(device, run, make_problem(num_nodes=5, head_dim=24, d_state=40, parents=[-1, 0, -1, 2, 0], device=device))
    check(device, run, make_problem(num_rows=2, num_nodes=12, parents=[-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 10],
                                    device=device))
    check(device, run, make_problem(num_rows=2, num_nodes=17, num_groups=1, device=device))


TUNINGS = [dict(block_p=16), dict(block_p=16, num_warps=2), dict(block_p=32, precision="tf32x3"),
           dict(block_p=64, precision="ieee"), dict(block_p=16, chunk_n=16), dict(chunk_n=32, chunk_stages=2),
           dict(pdl=True),  # (a programmatic dependent launch on sm_90; a plain one elsewhere)
           dict(prefetch_inputs=True),  # (the L2 prefetch on a GPU; none interpreted)
           dict(heads_per_program=2), dict(heads_per_program=2, flatten=True, maxnreg=96)]


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=[interpreted, pytest.mark.slow]),
                                    pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("tuning", TUNINGS, ids=lambda t: "-".join(f"{k}={v}" for k, v in t.items()))
def test_launch_choices(device, tuning):
    """The launcher's choices: narrow tiles (a partial last one too), warps, precisions, C S0^T over
    chunks of state rows (d_state 48: a partial last chunk)."""
    run = tuned(**tuning)
    check(device, run, make_problem(head_dim=40, d_state=48, parents=[-1, 0, 0, 2], device=device))
    check(device, run, make_problem(head_dim=64, slots=[1, -1, 2], device=device))


@pytest.mark.gpu
def test_cuda_pdl_reads_what_the_launch_before_wrote():
    """Two layers launched as programmatic dependents, the second's x the first's out."""
    (x0, *rest0), kwargs = make_problem(num_rows=256, num_heads=16, head_dim=64, d_state=128, num_slots=256,
                                        device="cuda")
    (_, *rest1), _ = make_problem(num_rows=256, num_heads=16, head_dim=64, d_state=128, num_slots=256,
                                  device="cuda", seed=1)
    out0 = torch.full(x0.shape, FILL, device="cuda")
    out1 = torch.full(x0.shape, FILL, device="cuda")

    def both(pdl=False):
        for out, x, rest in ((out0, x0, rest0), (out1, out0, rest1)):
            tuned(pdl=pdl)(out, x, *rest, **kwargs)

    check_chained_pdl(both, (out0, out1), FILL)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["apart", "fused"])
@pytest.mark.parametrize("tuning", [dict(prefetch_inputs=True), dict(heads_per_program=2),
                                    dict(heads_per_program=2, flatten=True, maxnreg=96, prefetch_inputs=True)],
                         ids=["prefetch", "heads", "flattened"])
def test_cuda_launch_orders_change_no_bit(fused, tuning):
    """The nodes' inputs prefetched into L2 (a hint), a program's heads one after another, their
    loops flattened: every output bit as it was (the same arithmetic a tile) -- the model's head and
    state sizes, trees, a partial last tile of head-dim rows, x, B and C as views of one conv output
    or tensors of their own, z given, bf16 inputs, a skipped row."""
    for problem in (make_problem(num_rows=8, num_heads=16, num_groups=2, head_dim=64, d_state=128, num_slots=8,
                                 x_dtype=torch.bfloat16, fused=fused, device="cuda"),
                    make_problem(num_rows=5, num_heads=4, head_dim=40, d_state=48, parents=[-1, 0, 0, 2],
                                 slots=[1, -1, 2, 0, 3], fused=fused, device="cuda")):
        (x, *rest), kwargs = problem
        outs = []
        for run in (tuned(), tuned(**tuning)):
            outs.append(torch.full(x.shape, FILL, device="cuda"))
            run(outs[-1], x, *rest, **kwargs)
        assert torch.equal(outs[0], outs[1])


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_heads_per_program_divides_a_group():
    """heads_per_program must divide a group's heads: a clear error before any launch."""
    (x, dt, A, B, C, ssm, slots, parents), kwargs = make_problem(num_heads=8, num_groups=2)
    for heads in (3, 8, 0):
        with pytest.raises(ValueError, match=f"heads_per_program must divide a group's 4 heads, got {heads}"):
            triton_kernels().mamba2_verify._verify_call(torch.empty(x.shape), x, dt, A, B, C, ssm, slots, parents,
                                                        kwargs.get("D"), kwargs.get("z"), kwargs.get("dt_bias"),
                                                        dt_softplus=kwargs["dt_softplus"], heads_per_program=heads)


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_prefetch_inputs_where_rows_are_contiguous(monkeypatch):
    """prefetch_inputs reaches the kernel only where x, z, B and C rows are contiguous and the kernel
    is compiled (never interpreted); its lines a row cover the widest of them."""
    kernels = triton_kernels()
    monkeypatch.setattr(kernels.mamba2_verify, "interpreted", lambda: False)

    def constexprs(problem, **tuning):
        (x, dt, A, B, C, ssm, slots, parents), kwargs = problem
        out = torch.empty(x.shape)
        call = kernels.mamba2_verify._verify_call(out, x, dt, A, B, C, ssm, slots, parents, kwargs.get("D"),
                                                  kwargs.get("z"), kwargs.get("dt_bias"),
                                                  dt_softplus=kwargs["dt_softplus"], **tuning)
        return call.constexprs["PREFETCH"], call.constexprs["LINES"]

    problem = make_problem(head_dim=64, d_state=128, x_dtype=torch.bfloat16, fused=True)
    assert constexprs(problem) == (kernels.mamba2_verify.PREFETCH_INPUTS, 4)
    assert constexprs(problem, prefetch_inputs=True) == (True, 4)  # (B's, C's rows of 256 bytes: up to 3 lines)
    (x, *rest), kwargs = problem
    strided = x.transpose(-1, -2).contiguous().transpose(-1, -2)  # (head-dim elements apart)
    assert constexprs(([strided, *rest], kwargs), prefetch_inputs=True)[0] is False
    monkeypatch.setattr(kernels.mamba2_verify, "interpreted", lambda: True)
    assert constexprs(problem, prefetch_inputs=True)[0] is False


def draw_problem(data, device, *, max_nodes, max_rows, max_slot, fused_pool=True):
    num_nodes = data.draw(st.integers(1, max_nodes), label="nodes")
    num_rows = data.draw(st.integers(1, max_rows), label="rows")
    num_groups = data.draw(st.sampled_from([1, 2, 4]), label="groups")
    return make_problem(
        num_rows=num_rows, num_nodes=num_nodes, num_heads=4, num_groups=num_groups, num_slots=4,
        head_dim=data.draw(st.sampled_from([8, 16, 24])), d_state=data.draw(st.sampled_from([8, 16])),
        parents=data.draw(st.one_of(st.none(), trees(num_nodes)), label="parents"),
        slots=data.draw(st.lists(st.integers(-2, max_slot), min_size=num_rows, max_size=num_rows), label="slots"),
        terms=tuple(t for t in TERMS if data.draw(st.booleans(), label=t)), dt_softplus=data.draw(st.booleans()),
        state_dtype=data.draw(st.sampled_from([torch.float32, torch.bfloat16])), fused=data.draw(st.booleans()),
        transposed=fused_pool and data.draw(st.booleans()), pooled=fused_pool and data.draw(st.booleans()),
        seed=data.draw(st.integers(0, 2**16)), device=device,
    )


@pytest.mark.parametrize("impl", IMPLS[:2])
@given(data=st.data())
def test_fuzz_cpu(impl, data):
    """The CPU paths over random trees, groupings, optional terms, views and slots."""
    device, run = impl
    problem = draw_problem(data, device, max_nodes=9, max_rows=4, max_slot=5)
    check(device, run, problem, tol=2e-3 if problem[0][5].dtype == torch.float32 else 2e-2)


@interpreted
@pytest.mark.slow
@settings(max_examples=20)
@given(data=st.data())
def test_fuzz_triton_interpreted(data):
    """The Triton kernel under the interpreter: random trees, slots, terms and views (few examples: slow)."""
    problem = draw_problem(data, "cpu", max_nodes=8, max_rows=3, max_slot=4)
    check("cpu", run_triton, problem, tol=2e-3 if problem[0][5].dtype == torch.float32 else 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_model_shape(tree, state_dtype):
    """Nemotron-H-8B's TP1 shape (H 128, P 64, G 8, Ns 128) at 40 rows, as engines call it: x, B, C
    views of one bf16 conv output, a slice of a pool, slots permuted, D, z, dt_bias, softplus."""
    parents = [-1, 0, 0, 0, 1, 1, 1, 4] if tree else None
    problem = make_problem(num_rows=40, num_nodes=8 if tree else 4, num_heads=128, num_groups=8, head_dim=64,
                           d_state=128, num_slots=64, slots=torch.randperm(64)[:40], parents=parents,
                           x_dtype=torch.bfloat16, state_dtype=state_dtype, fused=True, pooled=True, device="cuda")
    tol = 2e-3 if state_dtype == torch.float32 else 2e-2
    check("cuda", run_public, problem, out_dtype=torch.bfloat16, tol=max(tol, 1e-2))
    check("cuda", run_public, problem, out_dtype=torch.float32, tol=tol)


@pytest.mark.gpu
def test_cuda_fp32_tolerance_all_fp32():
    """Everything float32: within 2e-3 x max |y|, several batch sizes (tile choices), C S0^T whole or
    over chunks of state rows."""
    for num_rows in (1, 8, 64):
        problem = make_problem(num_rows=num_rows, num_nodes=4, num_heads=32, num_groups=8, head_dim=64, d_state=128,
                               num_slots=num_rows, device="cuda", seed=num_rows)
        check("cuda", run_public, problem, tol=2e-3)
        check("cuda", tuned(chunk_n=16, chunk_stages=4), problem, tol=2e-3)


def test_checked_mode_names_the_row():
    (x, dt, A, B, C, ssm, slots, parents), kwargs = make_problem(slots=[0, 7, 1], parents=[-1, 0, 0, 1])
    out = torch.full(x.shape, FILL)
    with sgl_convwin.index_checks(), pytest.raises(IndexError, match=r"mamba2_verify: state_slots\[1\] = 7"):
        sgl_convwin.mamba2_verify(out, x, dt, A, B, C, ssm, slots, parents, **kwargs)
    parents[2, 3] = 3
    with sgl_convwin.index_checks(), pytest.raises(IndexError, match=r"parents\[2, 3\] = 3"):
        sgl_convwin.mamba2_verify(out, x, dt, A, B, C, ssm, torch.tensor([0, 1, 2]), parents, **kwargs)
    assert torch.equal(out, torch.full_like(out, FILL))


BAD_CALLS = {
    "state 3-D": (lambda p: p.update(ssm=p["ssm"][0]), ValueError, "one layer's pool"),
    "state fp16": (lambda p: p.update(ssm=p["ssm"].half()), TypeError, "float32 or bfloat16"),
    "x heads": (lambda p: p.update(x=p["x"][:, :, :3]), ValueError, r"x must be \[B, N, H, P\]"),
    "B state": (lambda p: p.update(B=p["B"][..., :8]), ValueError, "Ns = 16"),
    "C shape": (lambda p: p.update(C=p["C"][:, :3]), ValueError, "C must have B's shape"),
    "grouping": (lambda p: p.update(B=p["B"][:, :, :1].expand(-1, -1, 3, -1), C=p["C"][:, :, :1].expand(-1, -1, 3, -1)),
                 ValueError, "multiple of G"),
    "dt shape": (lambda p: p.update(dt=p["dt"][:, :, :1]), ValueError, r"dt must be \[B, N, H\]"),
    "A shape": (lambda p: p.update(A=p["A"][:2]), ValueError, r"A must be \[H\]"),
    "D shape": (lambda p: p.update(D=p["D"][None]), ValueError, r"D must be \[H\]"),
    "dt_bias int": (lambda p: p.update(dt_bias=p["dt_bias"].long()), TypeError, "dt_bias must be a floating-point"),
    "z shape": (lambda p: p.update(z=p["z"][..., :8]), ValueError, "z must be"),
    "D list": (lambda p: p.update(D=[1.0] * 4), TypeError, "D must be a torch.Tensor"),
    "softplus int": (lambda p: p.update(dt_softplus=1), TypeError, "dt_softplus must be a bool"),
    "out shape": (lambda p: p.update(out=p["out"][:2]), ValueError, "out must be"),
    "out expanded": (lambda p: p.update(out=p["out"][:, :1].expand(p["x"].shape)), ValueError, "overlapping"),
    "slots float": (lambda p: p.update(slots=p["slots"].float()), TypeError, "state_slots must be int32 or int64"),
    "slots rows": (lambda p: p.update(slots=p["slots"][:2]), ValueError, "state_slots has 2 rows"),
    "parents shape": (lambda p: p.update(parents=p["parents"][:, :2]), ValueError, r"parents must be \[B, N\]"),
    "out aliases x": (lambda p: p.update(out=p["x"]), ValueError, "share storage"),
    "out aliases z": (lambda p: p.update(out=p["z"]), ValueError, "share storage"),
    "too many nodes": (lambda p: p.update(x=torch.zeros(3, 65, 4, 16)), ValueError, "must be 1..64"),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_bad_calls_raise_before_writing(case):
    mutate, error, match = BAD_CALLS[case]
    (x, dt, A, B, C, ssm, slots, parents), kwargs = make_problem(parents=[-1, 0, 0, 1])
    p = dict(out=torch.full(x.shape, FILL), x=x, dt=dt, A=A, B=B, C=C, ssm=ssm, slots=slots, parents=parents, **kwargs)
    mutate(p)
    before = p["out"].clone()
    with pytest.raises(error, match=match):
        sgl_convwin.mamba2_verify(p["out"], p["x"], p["dt"], p["A"], p["B"], p["C"], p["ssm"], p["slots"],
                                  p["parents"], D=p["D"], z=p["z"], dt_bias=p["dt_bias"], dt_softplus=p["dt_softplus"])
    assert torch.equal(p["out"], before)


def test_schema():
    """Keyword-only tensors go positional after parents, as declare_op does for every op."""
    assert str(torch.ops.convwin.mamba2_verify.default._schema) == (
        "convwin::mamba2_verify(Tensor(a0!) out, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
        "Tensor ssm_state, Tensor state_slots, Tensor? parents=None, Tensor? D=None, Tensor? z=None, "
        "Tensor? dt_bias=None, *, bool dt_softplus=False) -> ()")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_opcheck(device):
    for tree, terms in ((False, ()), (True, TERMS)):
        (x, dt, A, B, C, ssm, slots, parents), kwargs = make_problem(parents=[-1, 0, 0, 1] if tree else None,
                                                                     terms=terms, device=device)
        out = torch.zeros(x.shape, device=device)
        args = (out, x, dt, A, B, C, ssm, slots, parents, *(kwargs.get(name) for name in TERMS))
        torch.library.opcheck(torch.ops.convwin.mamba2_verify.default, args, {"dt_softplus": kwargs["dt_softplus"]})


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph(device, dynamic):
    """Inside torch.compile(fullgraph=True): the op stays in the graph, out is written in place."""
    (x, dt, A, B, C, ssm, slots, parents), kwargs = make_problem(fused=True, parents=[-1, 0, 0, 1], device=device)
    expected, _ = reference.mamba2_verify_reference(x, dt, A, B, C, ssm, slots.cpu(), parents, **kwargs)
    backend = CountingBackend() if device == "cpu" else "inductor"

    @torch.compile(fullgraph=True, dynamic=dynamic, backend=backend)
    def step(out, x, dt, A, B, C, ssm, slots, parents, D, z, dt_bias):
        sgl_convwin.mamba2_verify(out, x, dt, A, B, C, ssm, slots, parents, D=D, z=z, dt_bias=dt_bias,
                                  dt_softplus=True)
        return out.sum()

    out = torch.zeros(x.shape, device=device)
    total = step(out, x, dt, A, B, C, ssm, slots, parents, kwargs["D"], kwargs["z"], kwargs["dt_bias"])
    error = (out.cpu().double() - expected).abs().max().item()
    assert error <= 2e-3 * expected.abs().max().item()
    assert torch.allclose(total.cpu().double(), expected.sum(), rtol=1e-3, atol=1e-3)
    if device == "cpu":
        assert backend.compiles == 1  # one graph: no break around the op


@pytest.mark.gpu
def test_cuda_graph_replay_with_new_slots():
    """Captured once, replayed with new slots and links written into the static inputs."""
    (x, dt, A, B, C, ssm, slots, parents), kwargs = make_problem(num_rows=4, num_slots=6, parents=[-1, 0, 0, 1],
                                                                 device="cuda")
    out = torch.full(x.shape, FILL, device="cuda")
    sgl_convwin.mamba2_verify(out, x, dt, A, B, C, ssm, slots, parents, **kwargs)  # warm-up (compiles, plans)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sgl_convwin.mamba2_verify(out, x, dt, A, B, C, ssm, slots, parents, **kwargs)
    for new_slots, new_links in (([5, -1, 2, 0], [-1, 0, 1, 1]), ([1, 4, 9, 3], [-1, -1, 0, 2])):
        slots.copy_(torch.tensor(new_slots))
        parents.copy_(torch.tensor(new_links).expand_as(parents))
        out.fill_(FILL)
        graph.replay()
        torch.cuda.synchronize()
        expected, written = reference.mamba2_verify_reference(x, dt, A, B, C, ssm, slots.cpu(), parents, **kwargs)
        got = out.cpu().double()
        assert written == [row for row, s in enumerate(new_slots) if 0 <= s < 6]
        assert (got[written] - expected[written]).abs().max() <= 2e-3 * expected[written].abs().max()
        skipped = [r for r in range(4) if r not in written]
        assert torch.equal(out[skipped].cpu(), torch.full_like(out[skipped].cpu(), FILL))
