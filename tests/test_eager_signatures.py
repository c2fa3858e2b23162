"""The eager fast paths of sgl_convwin.scatter and scatter_tree (declare_op's eager plans:
``scatter.eager_plans``, ``scatter_tree.eager_plans``, shared by the public functions and the
registered ops' kernels): a call whose signature (every shape, stride, dtype and device, and the
state layout) was seen before skips the argument checks and the launch planning, and on CUDA
Triton's per-call binder, but never the checks that depend on the tensors themselves, and never
reuses a plan for a call that differs in anything the plan depends on."""

import pytest
import torch

import sgl_convwin
from sgl_convwin import declare, reference
from support import impl_params, whole_storage

L, N, M, D, DIM, K = 2, 3, 2, 4, 8, 4


def problem(device, seed, layout="token_major"):
    generator = torch.Generator().manual_seed(seed)
    conv_state = torch.randn(L, N, DIM, K - 1, generator=generator).to(device)
    buffer = torch.randn(sgl_convwin.physical_shape(layout, L, M, DIM, D, K), generator=generator).to(device)
    windows = sgl_convwin.window_view(buffer, layout, D, K)
    dst, src, steps = (torch.tensor(v, device=device) for v in ([2, 0], [1, 0], [3, 1]))
    return conv_state, windows, dst, src, steps


def tree_problem(device, seed):
    """A topk-2 tree of 4 nodes on token_major rows [L, M, N+K-2, dim], two rows."""
    generator = torch.Generator().manual_seed(seed)
    conv_state = torch.randn(L, N, DIM, K - 1, generator=generator).to(device)
    rows = torch.randn(sgl_convwin.physical_shape("token_major", L, M, DIM, 4, K), generator=generator).to(device)
    dst, src, nodes = (torch.tensor(v, device=device) for v in ([2, 0], [1, 0], [3, 2]))
    parents = torch.tensor([[-1, -1, 0, 1], [-1, -1, 0, 0]], device=device)
    return conv_state, rows, dst, src, nodes, parents


@pytest.fixture(autouse=True)
def empty_cache():
    sgl_convwin.scatter.eager_plans.clear()
    sgl_convwin.scatter_tree.eager_plans.clear()
    yield
    sgl_convwin.scatter.eager_plans.clear()
    sgl_convwin.scatter_tree.eager_plans.clear()


@pytest.mark.parametrize("impl", impl_params("cpu", "cpu_op", "cuda", "cuda_op"))
def test_a_seen_signature_still_checks_each_call(impl):
    """Same signature, other data: right results; an inference state, a state sharing the windows'
    storage, and (checked mode) an out-of-range index are still refused with nothing written."""
    impl.scatter(*problem(impl.device, 0))
    assert len(sgl_convwin.scatter.eager_plans) == 1
    for seed in (1, 2):  # values and indices change, the signature does not
        conv_state, windows, dst, src, steps = problem(impl.device, seed)
        dst.copy_(torch.tensor([seed, (seed + 1) % N]))  # distinct: a shared destination is unspecified
        want = reference.scatter_reference(conv_state, windows, dst, src, steps)
        impl.scatter(conv_state, windows, dst, src, steps)
        assert torch.equal(conv_state.cpu(), want.cpu())
    assert len(sgl_convwin.scatter.eager_plans) == 1

    conv_state, windows, dst, src, steps = problem(impl.device, 3)
    with torch.inference_mode():
        inference = conv_state.clone()
    with pytest.raises(ValueError, match=r"conv_state is an inference tensor"):
        impl.scatter(inference, windows, dst, src, steps)
    assert torch.equal(inference, conv_state)
    leaf = conv_state.clone().requires_grad_()  # the signature of the first call
    with pytest.raises(ValueError, match=r"conv_state requires grad"):
        impl.scatter(leaf, windows, dst, src, steps)
    assert torch.equal(leaf.detach(), conv_state)

    # one storage holding both, with the signature of the first call (same shapes and strides)
    buffer_shape = sgl_convwin.physical_shape("token_major", L, M, DIM, D, K)
    storage = torch.zeros(conv_state.numel() + torch.Size(buffer_shape).numel(), device=impl.device)
    shared_state = storage[: conv_state.numel()].view(conv_state.shape)
    buffer = storage[conv_state.numel():].view(buffer_shape)
    shared_windows = sgl_convwin.window_view(buffer, "token_major", D, K)
    assert shared_windows.stride() == windows.stride()
    before = storage.clone()
    with pytest.raises(ValueError, match=r"conv_state and windows share storage"):
        impl.scatter(shared_state, shared_windows, dst, src, steps)
    assert torch.equal(storage, before)

    before = whole_storage(conv_state).clone()
    with sgl_convwin.index_checks(), pytest.raises(IndexError, match=r"dst_slots\[0\] = 3 is out of range"):
        impl.scatter(conv_state, windows, torch.tensor([3, 0], device=impl.device), src, steps)
    assert torch.equal(whole_storage(conv_state), before)
    assert len(sgl_convwin.scatter.eager_plans) == 1


BAD_AFTER_GOOD = {  # name: (arguments replaced, state_layout, error, message)
    "index dtype": (dict(steps=torch.tensor([3.0, 1.0])), "dim_major", TypeError, r"steps must be int32 or int64"),
    "index length": (dict(src_slots=torch.tensor([1, 0, 0])), "dim_major", ValueError,
                     r"src_slots has 3 rows but dst_slots has 2"),
    "state dtype": (dict(conv_state=torch.zeros(L, N, DIM, K - 1, dtype=torch.float64)), "dim_major", TypeError,
                    r"conv_state must be float32, float16 or bfloat16"),
    "expanded state": (dict(conv_state=torch.zeros(L, 1, DIM, K - 1).expand(L, N, DIM, K - 1)), "dim_major",
                       ValueError, r"conv_state has overlapping elements"),
    "state layout": (dict(), "window_major", ValueError, r"dim \(axis 3\) is 8 but conv_state has 3"),
}


@pytest.mark.parametrize("name", BAD_AFTER_GOOD)
def test_a_bad_call_after_a_good_one_is_checked(name):
    """A call that differs from a seen signature in one field gets every check again."""
    conv_state, windows, dst, src, steps = problem("cpu", 0)
    sgl_convwin.scatter(conv_state, windows, dst, src, steps)
    changes, state_layout, error, message = BAD_AFTER_GOOD[name]
    args = dict(conv_state=conv_state, windows=windows, dst_slots=dst, src_slots=src, steps=steps)
    args.update(changes)
    before = whole_storage(args["conv_state"]).clone()
    with pytest.raises(error, match=message):
        sgl_convwin.scatter(**args, state_layout=state_layout)
    assert torch.equal(whole_storage(args["conv_state"]), before)


@pytest.mark.parametrize("impl", impl_params("cpu", "cpu_op", "cuda", "cuda_op"))
def test_every_signature_gets_its_own_plan(impl):
    """Calls alternating between layouts, strides, dtypes, index widths and batch sizes, each
    compared with the oracle over the whole state: a plan reused across signatures would be wrong
    in at least one (the CUDA plans differ in strides, blocks and store modes)."""
    calls = []
    for layout in sgl_convwin.LAYOUTS:
        calls.append(problem(impl.device, 10, layout))
    conv_state, windows, dst, src, steps = problem(impl.device, 11)
    calls.append((conv_state.half(), windows, dst, src, steps))
    calls.append((conv_state, windows, dst.int(), src.int(), steps))
    calls.append((conv_state, windows, dst[:1], src[:1], steps[:1]))
    window_major = torch.randn(L, N, K - 1, DIM, device=impl.device)
    for round_ in range(2):  # the second round finds every signature in the cache
        for args in calls:
            state = args[0].clone()
            want = reference.scatter_reference(state, *args[1:])
            impl.scatter(state, *args[1:])
            assert torch.equal(state.cpu(), want.cpu()), round_
        state = window_major.clone()
        want = reference.scatter_reference(state, *calls[0][1:], state_layout="window_major")
        impl.scatter(state, *calls[0][1:], state_layout="window_major")
        assert torch.equal(state.cpu(), want.cpu()), round_
    assert len(sgl_convwin.scatter.eager_plans) == len(calls) + 1


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(declare, "EAGER_PLANS_MAX", 2)
    conv_state, windows, dst, src, steps = problem("cpu", 0)
    for rows in (1, 2, 1, 2):
        sgl_convwin.scatter(conv_state, windows, dst[:rows], src[:rows], steps[:rows])
    assert len(sgl_convwin.scatter.eager_plans) == 2
    sgl_convwin.scatter(conv_state, windows, dst[:0], src[:0], steps[:0])  # a third: cleared first
    assert len(sgl_convwin.scatter.eager_plans) == 1


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda"))
def test_planned_scatter_runs_the_plan_on_other_tensors(impl):
    """csrc_triton.planned_scatter fixes launch_scatter's plan for one signature; run on other
    tensors of that signature it is right, and a call with nothing to do launches nothing."""
    from sgl_convwin._kernels import triton_kernels

    planned = triton_kernels().planned_scatter(*problem(impl.device, 20, "channel_major"))
    for seed in (21, 22):
        conv_state, windows, dst, src, steps = problem(impl.device, seed, "channel_major")
        want = reference.scatter_reference(conv_state, windows, dst, src, steps)
        planned(conv_state, windows, dst, src, steps)
        assert torch.equal(conv_state.cpu(), want.cpu())
    conv_state, windows, dst, src, steps = problem(impl.device, 23)
    empty = triton_kernels().planned_scatter(conv_state, windows, dst[:0], src[:0], steps[:0])
    before = conv_state.clone()
    empty(conv_state, windows, dst[:0], src[:0], steps[:0])
    assert torch.equal(conv_state, before)


@pytest.mark.parametrize("impl", impl_params("cpu", "cpu_op", "cuda", "cuda_op"))
def test_scatter_tree_seen_signature_still_checks_each_call(impl):
    """scatter_tree's fast path, as scatter's above: right results for other data of a seen
    signature; inference state, shared storage and (checked mode) a bad parent link refused."""
    impl.scatter_tree(*tree_problem(impl.device, 0))
    assert len(sgl_convwin.scatter_tree.eager_plans) == 1
    for seed in (1, 2):
        conv_state, rows, dst, src, nodes, parents = tree_problem(impl.device, seed)
        dst.copy_(torch.tensor([seed, (seed + 1) % N]))
        nodes.copy_(torch.tensor([seed, 3 - seed]))
        want = reference.scatter_tree_reference(conv_state, rows, dst, src, nodes, parents)
        impl.scatter_tree(conv_state, rows, dst, src, nodes, parents)
        assert torch.equal(conv_state.cpu(), want.cpu())
    assert len(sgl_convwin.scatter_tree.eager_plans) == 1

    conv_state, rows, dst, src, nodes, parents = tree_problem(impl.device, 3)
    with torch.inference_mode():
        inference = conv_state.clone()
    with pytest.raises(ValueError, match=r"conv_state is an inference tensor"):
        impl.scatter_tree(inference, rows, dst, src, nodes, parents)
    assert torch.equal(inference, conv_state)
    leaf = conv_state.clone().requires_grad_()
    with pytest.raises(ValueError, match=r"conv_state requires grad"):
        impl.scatter_tree(leaf, rows, dst, src, nodes, parents)
    assert torch.equal(leaf.detach(), conv_state)

    rows_shape = rows.shape
    storage = torch.zeros(conv_state.numel() + rows.numel(), device=impl.device)
    shared_state = storage[: conv_state.numel()].view(conv_state.shape)
    shared_rows = storage[conv_state.numel():].view(rows_shape)
    before = storage.clone()
    with pytest.raises(ValueError, match=r"conv_state and rows share storage"):
        impl.scatter_tree(shared_state, shared_rows, dst, src, nodes, parents)
    assert torch.equal(storage, before)

    before = whole_storage(conv_state).clone()
    bad_parents = torch.tensor([[-1, -1, 0, 3], [-1, -1, 0, 0]], device=impl.device)  # node 3 -> 3
    with sgl_convwin.index_checks(), pytest.raises(IndexError, match=r"parents\[0, 3\] = 3"):
        impl.scatter_tree(conv_state, rows, dst, src, nodes, bad_parents)
    assert torch.equal(whole_storage(conv_state), before)
    assert len(sgl_convwin.scatter_tree.eager_plans) == 1


@pytest.mark.parametrize("impl", impl_params("cpu", "cpu_op", "cuda", "cuda_op"))
def test_scatter_tree_every_signature_gets_its_own_plan(impl):
    """scatter_tree calls alternating between state layouts, dtypes, index widths, parents strides
    and batch sizes, each compared with the oracle over the whole state, twice."""
    conv_state, rows, dst, src, nodes, parents = tree_problem(impl.device, 10)
    wide_parents = torch.cat([parents, parents[:, :1]], dim=1)[:, :4]  # row stride 5, not 4
    calls = [
        (conv_state, rows, dst, src, nodes, parents, "dim_major"),
        (conv_state.half(), rows, dst, src, nodes, parents, "dim_major"),
        (conv_state, rows, dst.int(), src.int(), nodes.int(), parents.int(), "dim_major"),
        (conv_state, rows, dst, src, nodes, wide_parents, "dim_major"),
        (conv_state, rows, dst[:1], src[:1], nodes[:1], parents[:1], "dim_major"),
        (conv_state.transpose(2, 3).contiguous(), rows, dst, src, nodes, parents, "window_major"),
    ]
    for round_ in range(2):  # the second round finds every signature in the cache
        for *args, state_layout in calls:
            state = args[0].clone()
            want = reference.scatter_tree_reference(state, *args[1:], state_layout=state_layout)
            impl.scatter_tree(state, *args[1:], state_layout=state_layout)
            assert torch.equal(state.cpu(), want.cpu()), (round_, state_layout)
    assert len(sgl_convwin.scatter_tree.eager_plans) == len(calls)


def test_scatter_tree_bad_call_after_a_good_one_is_checked():
    conv_state, rows, dst, src, nodes, parents = tree_problem("cpu", 0)
    sgl_convwin.scatter_tree(conv_state, rows, dst, src, nodes, parents)
    before = conv_state.clone()
    with pytest.raises(ValueError, match=r"parents must be"):
        sgl_convwin.scatter_tree(conv_state, rows, dst, src, nodes, parents[:, :3])
    with pytest.raises(TypeError, match=r"nodes must be int32 or int64"):
        sgl_convwin.scatter_tree(conv_state, rows, dst, src, nodes.float(), parents)
    assert torch.equal(conv_state, before)


def _misaligned(tensor):
    """The same values, shape and strides, 4 bytes past a 16-byte boundary."""
    storage = torch.empty(tensor.numel() + 1, dtype=tensor.dtype, device=tensor.device)
    moved = storage[1:].view(tensor.shape)
    moved.copy_(tensor)
    assert moved.stride() == tensor.stride() and moved.data_ptr() % 16 == 4
    return moved


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("op", ["scatter", "scatter_tree"])
def test_planned_launch_skips_the_binder_only_for_aligned_tensors(monkeypatch, op):
    """After the first call with 16-byte-aligned tensors, a planned launch runs the compiled kernel
    without Triton's binder; a call with a misaligned tensor (the same shapes and strides at an
    odd storage offset: another specialisation) goes through Triton. Each call is compared with
    the oracle over the whole state."""
    from sgl_convwin._kernels import triton_kernels

    kernels = triton_kernels()
    if op == "scatter":
        kernel, planned_for = kernels.scatter._scatter_windows_kernel, kernels.planned_scatter
        make, want_of = problem, reference.scatter_reference
    else:
        kernel, planned_for = kernels.scatter_tree._scatter_tree_kernel, kernels.planned_scatter_tree
        make, want_of = tree_problem, reference.scatter_tree_reference
    binder_runs = []
    triton_run = kernel.run
    monkeypatch.setattr(kernel, "run", lambda *a, **k: binder_runs.append(1) or triton_run(*a, **k))

    planned = planned_for(*make("cuda", 30))
    expected_runs = [1, 1, 2, 2, 3, 3]  # Triton's launch: first aligned call and each misaligned one
    for call, seed in enumerate((31, 32, 33, 34, 35, 36)):
        args = list(make("cuda", seed))
        if seed == 33:  # the source (windows or rows) misaligned
            if op == "scatter":
                buffer = torch.randn(sgl_convwin.physical_shape("token_major", L, M, DIM, D, K), device="cuda")
                args[1] = sgl_convwin.window_view(_misaligned(buffer), "token_major", D, K)
            else:
                args[1] = _misaligned(args[1])
        if seed == 35:
            args[0] = _misaligned(args[0])
        want = want_of(*args)
        planned(*args)
        assert torch.equal(args[0].cpu(), want.cpu()), seed
        assert len(binder_runs) == expected_runs[call], seed


SCHEMAS = {
    "scatter": 'convwin::scatter(Tensor(a0!) conv_state, Tensor windows, Tensor dst_slots, Tensor src_slots, '
               'Tensor steps, *, str state_layout="dim_major") -> ()',
    "scatter_tree": 'convwin::scatter_tree(Tensor(a0!) conv_state, Tensor rows, Tensor dst_slots, '
                    'Tensor src_slots, Tensor nodes, Tensor parents, *, str state_layout="dim_major") -> ()',
    "capture": 'convwin::capture(Tensor(a0!) buffer, Tensor conv_state, Tensor x, Tensor buffer_slots, '
               'Tensor state_slots, SymInt layer, Tensor? parents=None, *, str layout="token_major", '
               'str state_layout="dim_major") -> ()',
    "causal_conv1d_verify": 'convwin::causal_conv1d_verify(Tensor(a0!) out, Tensor(a1!) buffer, '
                            'Tensor conv_state, Tensor x, Tensor weight, Tensor? bias, Tensor buffer_slots, '
                            'Tensor state_slots, SymInt layer, Tensor? parents=None, *, '
                            'str layout="token_major", str? activation=None, str state_layout="dim_major") -> ()',
}


@pytest.mark.parametrize("name", SCHEMAS)
def test_declared_schemas(name):
    """declare_op registers exactly the schemas engines and compiled graphs call (argument order,
    defaults, keyword-only markers, mutated arguments)."""
    assert str(getattr(torch.ops.convwin, name).default._schema) == SCHEMAS[name]
    public = getattr(sgl_convwin, name)
    assert public.op is not None and callable(public.kernel_arguments)
