"""The eager fast paths of every op that launches a kernel (declare_op's eager plans:
``<op>.eager_plans``, shared by the public function and the registered op's kernels): a call whose
signature (every shape, stride, dtype and device, and the values of the other arguments) was seen
before skips the argument checks and the launch planning, and on CUDA Triton's per-call binder,
but never the checks that depend on the tensors themselves, and never reuses a plan for a call that
differs in anything the plan depends on. scatter and scatter_tree first, then every op alike."""

import inspect
import sys

import pytest
import torch

import sgl_convwin
from sgl_convwin import declare, reference
import test_ring
import test_ring_mamba2
from support import DEVICES, IMPLS, impl_params, make_replay, make_state, random_tree, strided_tensor, whole_storage

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


OPS = ("scatter", "scatter_tree", "capture", "causal_conv1d_verify", "capture_gates", "gdn_commit", "mamba2_commit",
       "ring_conv1d_verify", "gdn_ring_verify", "ring_accept", "gdn_ring_flush", "mamba2_ring_verify",
       "mamba2_ring_flush")


def clear_plans():
    for name in OPS:
        getattr(sgl_convwin, name).eager_plans.clear()


@pytest.fixture(autouse=True)
def empty_cache():
    clear_plans()
    yield
    clear_plans()


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


def test_every_op_that_launches_a_kernel_has_a_planner():
    """Each op's eager plan comes from its csrc_triton planner; only the factory ops have none."""
    from sgl_convwin._kernels import triton_kernels

    for name in OPS:
        public = getattr(sgl_convwin, name)
        assert isinstance(public.eager_plans, dict) and callable(public.cuda_registered), name
        assert callable(getattr(triton_kernels(), f"planned_{name}")), name


# ---------------------------------------------------------------------------------------------
# Every op alike: one call's arguments by name (a dict), for the public function, the registered
# op and the registered CUDA kernel (on CPU tensors under Triton's interpreter)
# ---------------------------------------------------------------------------------------------

H = 4  # gate heads


def capture_case(device, seed, *, layout="token_major", state_layout="dim_major", tree=False, layer=1,
                 x_dtype=torch.float32, x_variant="contiguous", index_dtype=torch.int64, rows=2):
    generator = torch.Generator().manual_seed(seed)
    buffer = torch.randn(sgl_convwin.physical_shape(layout, L, M, DIM, D, K), generator=generator).to(device)
    conv_state = make_state(state_layout, L, N, DIM, K - 1, torch.float32, device, generator)
    x = strided_tensor((rows, D, DIM), x_dtype, device, generator, x_variant)
    buffer_slots = torch.randperm(M, generator=generator)[:rows].to(device, index_dtype)
    state_slots = torch.randperm(N, generator=generator)[:rows].to(device, index_dtype)
    parents = torch.tensor([random_tree(D, generator) for _ in range(rows)], device=device) if tree else None
    return dict(buffer=buffer, conv_state=conv_state, x=x, buffer_slots=buffer_slots, state_slots=state_slots,
                layer=layer, parents=parents, layout=layout, state_layout=state_layout)


def verify_case(device, seed, *, activation="silu", bias=True, whole_out=False, **capture_variant):
    arguments = capture_case(device, seed, **capture_variant)
    generator = torch.Generator().manual_seed(seed + 1000)
    rows = arguments["x"].shape[0]
    out_shape = (L, rows, D, DIM) if whole_out else (rows, D, DIM)
    return dict(arguments, out=torch.randn(out_shape, generator=generator).to(device),
                weight=torch.randn(DIM, K, generator=generator).to(device),
                bias=torch.randn(DIM, generator=generator).to(device) if bias else None, activation=activation)


def capture_gates_case(device, seed, *, layer=1, one_gate=False, g_dtype=torch.float32, g_variant="contiguous",
                       index_dtype=torch.int64, rows=2, nodes=D):
    generator = torch.Generator().manual_seed(seed)
    gates = torch.randn(L, M, D, 1 if one_gate else 2, H, generator=generator).to(device)
    g = strided_tensor((rows, nodes, H), g_dtype, device, generator, g_variant)
    beta = None if one_gate else strided_tensor((rows, nodes, H), g_dtype, device, generator, g_variant)
    buffer_slots = torch.randperm(M, generator=generator)[:rows].to(device, index_dtype)
    return dict(gates=gates, g=g, beta=beta, buffer_slots=buffer_slots, layer=layer)


def replay_case(mixer):
    def case(device, seed, index_dtype=torch.int64, **variant):
        options = dict(num_layers=L, num_k_heads=1, ratio=2, num_rows=2, num_draft=3)
        replay = make_replay(mixer=mixer, device=device, seed=seed, **dict(options, **variant))
        public = replay.commit
        arguments = inspect.signature(public).bind(*replay.args(), **replay.kwargs).arguments
        for name in ("dst_slots", "src_slots", "steps"):
            arguments[name] = arguments[name].to(index_dtype)
        return dict(arguments)

    return case


def ring_case(name):
    """A call of ring op ``name`` from the ring tests' opcheck samples (a ring with tokens pending,
    folds due), other data per seed; with a tree, or one tensor as both slot indices."""
    mamba2 = name.startswith("mamba2")

    def case(device, seed, tree=False, same_slots=False):
        with torch.random.fork_rng(devices=[]):  # (the samples draw inputs from the global generator)
            torch.manual_seed(seed)
            args, kwargs = (test_ring_mamba2 if mamba2 else test_ring).op_samples(tree)[name]
        schema = getattr(torch.ops.convwin, name).default._schema
        arguments = {a.name: v.to(device) if isinstance(v, torch.Tensor) else v
                     for a, v in zip(schema.arguments, args)}
        arguments.update(kwargs)
        if same_slots:  # (the padded row's state slot -1 as its ring slot's, both now one tensor)
            arguments["state_slots"] = arguments["ring_slots"]
        return arguments

    return case


def scatter_case(device, seed, layout="token_major"):
    conv_state, windows, dst, src, steps = problem(device, seed, layout)
    return dict(conv_state=conv_state, windows=windows, dst_slots=dst, src_slots=src, steps=steps)


def scatter_tree_case(device, seed):
    conv_state, rows, dst, src, nodes, parents = tree_problem(device, seed)
    return dict(conv_state=conv_state, rows=rows, dst_slots=dst, src_slots=src, nodes=nodes, parents=parents)


CASES = {
    "scatter": scatter_case,
    "scatter_tree": scatter_tree_case,
    "capture": capture_case,
    "causal_conv1d_verify": verify_case,
    "capture_gates": capture_gates_case,
    "gdn_commit": replay_case("gdn"),
    "mamba2_commit": replay_case("mamba2"),
    **{name: ring_case(name) for name in OPS[7:]},
}
ALL_IMPLS = impl_params("cpu", "cpu_op", "triton_interpret", "cuda", "cuda_op")


def written(name):
    """The arguments ``name`` writes, from its schema."""
    schema = getattr(torch.ops.convwin, name).default._schema
    return [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def planned(impl, name):
    """What ``impl`` calls: the public function, the registered op, or (Triton's interpreter) the
    registered CUDA kernel itself on CPU tensors -- each through the op's eager plans."""
    public = getattr(sgl_convwin, name)
    if impl.name == "triton_interpret":
        return public.cuda_registered
    return public.op if impl.name.endswith("_op") else public


def storage_copy(t):
    """A copy of t's whole storage seen with t's shape, strides and storage offset: the same signature."""
    copy = whole_storage(t).clone()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(copy.untyped_storage(), t.storage_offset(), t.shape,
                                                               t.stride())


def with_copies(name, arguments):
    """The arguments with fresh copies of the tensors the op writes (an optional one where given)."""
    return dict(arguments, **{n: storage_copy(arguments[n]) for n in written(name)
                              if isinstance(arguments.get(n), torch.Tensor)})


def unplanned(impl, name, arguments):
    """The whole storages of the written tensors after the implementation ``impl`` stands for ran
    WITHOUT a plan (every check, then the CPU kernel or the Triton launcher) on copies of them."""
    public, copies = getattr(sgl_convwin, name), with_copies(name, arguments)
    if impl.device == "cpu" and impl.name != "triton_interpret":
        args, kwargs = public.kernel_arguments(**copies)
        module = sgl_convwin.cpu_ring if hasattr(sgl_convwin.cpu_ring, f"{name}_cpu") else sgl_convwin.cpu
        getattr(module, f"{name}_cpu")(*args, **kwargs)
    else:
        public.cuda_impl(**copies)
    return written_storages(name, copies)


def written_storages(name, arguments):
    return [whole_storage(arguments[n]) for n in written(name) if isinstance(arguments.get(n), torch.Tensor)]


def assert_same(got, want, what):
    for got_storage, want_storage, n in zip(got, want, written(what[0])):
        assert torch.equal(got_storage.cpu(), want_storage.cpu()), (*what, n)


@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize("name", OPS)
def test_a_planned_call_writes_what_an_unplanned_one_does(impl, name):
    """Three calls of one signature with other data: the first makes the op's plan, the other two
    run that same plan (one cache entry, the same object); each writes exactly what the unplanned
    implementation writes, over the whole storage of every written tensor, and writes something."""
    calls = [CASES[name](impl.device, seed) for seed in range(3)]
    plans = getattr(sgl_convwin, name).eager_plans
    plans.clear()
    first_plan = None
    for seed, arguments in enumerate(calls):
        want = unplanned(impl, name, arguments)
        before = [storage.clone() for storage in written_storages(name, arguments)]
        planned(impl, name)(**arguments)
        assert_same(written_storages(name, arguments), want, (name, seed))
        assert any(not torch.equal(b.cpu(), w.cpu()) for b, w in zip(before, want)), "the call writes nothing"
        assert len(plans) == 1, seed
        (plan,) = plans.values()
        first_plan = first_plan or plan
        assert plan is first_plan, seed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_the_public_function_bumps_the_versions_of_what_it_writes(device, name):
    """As the registered op does (test_opcheck.py): each call raises the version of every tensor
    it writes and of none it reads -- the first call, and a seen signature whose launch writes
    through pointers alone (its plan's launch a no-op here, as a Triton kernel's writes are unseen
    by autograd), which is what the public function's own bump is for."""
    public = getattr(sgl_convwin, name)
    arguments = CASES[name](device, 0)
    clear_plans()  # (building a ring case runs the ops)
    tensors = {n: t for n, t in arguments.items() if isinstance(t, torch.Tensor)}
    for launch in ("first call", "seen signature, no-op launch"):
        if launch != "first call":
            public.eager_plans.update({key: (sizes, lambda *args, **kwargs: None)
                                       for key, (sizes, _) in public.eager_plans.items()})
        before = {n: t._version for n, t in tensors.items()}
        public(**arguments)
        assert len(public.eager_plans) == 1, launch
        for n, t in tensors.items():
            assert (t._version > before[n]) == (n in written(name)), (launch, n)


@pytest.mark.parametrize("name", [n for n in OPS if n != "ring_accept"])  # (it reads no floating-point tensor)
def test_read_tensors_that_require_grad_leave_no_history(name):
    """A public function's CPU call whose READ tensors require grad (a conv weight Parameter, a
    model's activations, grad mode on) runs its kernel with autograd off, as the registered op does:
    what it writes gains no grad_fn and does not require grad (a later call would refuse it), and
    holds what the same call without grad writes."""
    arguments = CASES[name]("cpu", 0)
    want = with_copies(name, arguments)
    getattr(sgl_convwin, name)(**want)
    grads = 0
    for key, value in arguments.items():
        if (key not in written(name) and isinstance(value, torch.Tensor) and value.is_floating_point()
                and value.is_leaf):
            arguments[key] = torch.nn.Parameter(value) if grads % 2 else value.requires_grad_()
            grads += 1
    assert grads, "nothing requires grad"
    getattr(sgl_convwin, name)(**arguments)
    for key in (n for n in written(name) if arguments.get(n) is not None):
        got = arguments[key]
        assert got.grad_fn is None and not got.requires_grad, key
        assert torch.equal(whole_storage(got).detach(), whole_storage(want[key])), key


VARIANTS = {  # per op: calls that each differ from all others in their signature
    "capture": [
        dict(), dict(layer=0), dict(layout="channel_major"), dict(layout="dense"), dict(state_layout="window_major"),
        dict(tree=True), dict(x_dtype=torch.bfloat16), dict(x_variant="permuted"), dict(index_dtype=torch.int32),
        dict(rows=1), dict(rows=0),
    ],
    "causal_conv1d_verify": [
        dict(), dict(layer=0), dict(layout="channel_major"), dict(layout="dense"), dict(state_layout="window_major"),
        dict(tree=True), dict(x_variant="sliced"), dict(index_dtype=torch.int32), dict(rows=1), dict(activation=None),
        dict(bias=False), dict(whole_out=True), dict(whole_out=True, layer=0), dict(layout="dense", tree=True),
    ],
    "capture_gates": [
        dict(), dict(layer=0), dict(one_gate=True), dict(g_dtype=torch.bfloat16), dict(g_variant="permuted"),
        dict(index_dtype=torch.int32), dict(rows=1), dict(nodes=2), dict(rows=0),
    ],
    "gdn_commit": [  # (several changes per call: each interpreted call takes a while)
        dict(), dict(tree=True, bias=False), dict(layout="channel_major", use_qk_l2norm=False),
        dict(layout="dense", index_dtype=torch.int32), dict(state_layout="window_major", transposed_ssm=True),
        dict(ssm_dtype=torch.bfloat16, num_rows=1),
    ],
    "mamba2_commit": [
        dict(), dict(tree=True, bias=False), dict(layout="dense", index_dtype=torch.int32),
        dict(state_layout="window_major", ssm_dtype=torch.bfloat16), dict(num_rows=1),
    ],
    "ring_conv1d_verify": [dict(), dict(tree=True), dict(same_slots=True)],
    "gdn_ring_verify": [dict(), dict(tree=True), dict(same_slots=True)],
    "ring_accept": [dict(), dict(tree=True)],
    "gdn_ring_flush": [dict(), dict(same_slots=True), dict(tree=True)],  # (tree: the samples' due flush)
    "mamba2_ring_verify": [dict(), dict(tree=True)],
    "mamba2_ring_flush": [dict(), dict(same_slots=True), dict(tree=True)],
}


@pytest.mark.parametrize("impl", impl_params("cpu", "cpu_op", "triton_interpret", "cuda", "cuda_op", slow=True))
@pytest.mark.parametrize("name", VARIANTS)
def test_every_signature_of_every_op_gets_its_own_plan(impl, name):
    """Calls that differ in a layout, a layer, strides, a dtype, an index width, the batch, a
    missing bias or parents, or a flag, in turn and twice over: every call writes what the
    unplanned implementation writes (a plan reused across signatures would be wrong somewhere),
    and there is one plan per signature."""
    variants = VARIANTS[name]
    calls = [CASES[name](impl.device, 10 + i, **variant) for i, variant in enumerate(variants)]
    wants = [unplanned(impl, name, arguments) for arguments in calls]
    plans = getattr(sgl_convwin, name).eager_plans
    plans.clear()
    for round_ in range(2):  # the second round finds every signature in the cache
        for variant, arguments, want in zip(variants, calls, wants):
            copies = with_copies(name, arguments)
            planned(impl, name)(**copies)
            assert_same(written_storages(name, copies), want, (name, round_, variant))
        assert len(plans) == len(calls), round_


@pytest.mark.parametrize("impl", impl_params("triton_interpret", "cuda"))
@pytest.mark.parametrize("name", ["ring_conv1d_verify", "gdn_ring_verify", "gdn_ring_flush", "mamba2_ring_verify"])
def test_a_plan_takes_each_tensor_from_its_own_argument(impl, name):
    """A ring op's plan (csrc_triton._common.planned_calls) made by a call passing one tensor as both
    ring_slots and state_slots runs a later call of that signature passing two, and the other way
    round, each launch taking every tensor from its own argument: every call writes what the
    unplanned implementation writes."""
    one = CASES[name](impl.device, 0, same_slots=True)
    two = dict(CASES[name](impl.device, 1, same_slots=True),  # (int64, as ring_slots: the same signature)
               state_slots=torch.tensor([1, -1, 2, 0], device=impl.device))
    plans = getattr(sgl_convwin, name).eager_plans
    for order in ((one, two, one), (two, one, two)):
        plans.clear()
        for call, arguments in enumerate(order):
            copies = with_copies(name, arguments)
            want = unplanned(impl, name, arguments)
            planned(impl, name)(**copies)
            assert_same(written_storages(name, copies), want, (name, call))
        assert len(plans) == 1


SHARED = {  # a written tensor and a source of the same dtype, both contiguous
    "capture": ("buffer", "x"),
    "causal_conv1d_verify": ("out", "x"),
    "capture_gates": ("gates", "g"),
    "gdn_commit": ("ssm_state", "gates"),
    "mamba2_commit": ("conv_state", "A"),
    "ring_conv1d_verify": ("out", "x"),
    "gdn_ring_verify": ("out", "v"),
    "mamba2_ring_verify": ("out", "x"),
}
BAD_INDEX = {  # an index whose row 0 is active, the out-of-range value, the checked mode's message
    "capture": ("buffer_slots", 99, r"buffer_slots\[0\] = 99 is out of range"),
    "causal_conv1d_verify": ("state_slots", 99, r"state_slots\[0\] = 99 is out of range"),
    "capture_gates": ("buffer_slots", 99, r"buffer_slots\[0\] = 99 is out of range"),
    "gdn_commit": ("dst_slots", 99, r"dst_slots\[0\] = 99 is out of range"),
    "mamba2_commit": ("src_slots", 99, r"src_slots\[0\] = 99 is out of range"),
    "ring_conv1d_verify": ("ring_slots", 99, r"ring_slots\[0\] = 99 is out of range"),
    "gdn_ring_verify": ("state_slots", 99, r"state_slots\[0\] = 99 is out of range"),
    "mamba2_ring_verify": ("ring_slots", 99, r"ring_slots\[0\] = 99 is out of range"),
}


def one_storage(a, b):
    """Copies of a and b (contiguous, one dtype) at two places of ONE storage: their shapes and strides."""
    storage = torch.zeros(a.numel() + b.numel(), dtype=a.dtype, device=a.device)
    a_view, b_view = storage[: a.numel()].view(a.shape), storage[a.numel():].view(b.shape)
    a_view.copy_(a)
    b_view.copy_(b)
    assert a_view.stride() == a.stride() and b_view.stride() == b.stride()
    return a_view, b_view


@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize("name", SHARED)
def test_a_planned_signature_still_checks_the_tensors(impl, name):
    """After a call has planned a signature, calls of that signature are still refused, with the
    unplanned call's errors and nothing written, for an inference tensor or one that requires grad
    in place of each tensor the op writes, a destination sharing storage with a source, and (checked
    mode) an out-of-range index."""
    first, arguments = CASES[name](impl.device, 1), CASES[name](impl.device, 0)
    plans = getattr(sgl_convwin, name).eager_plans
    plans.clear()  # (a ring case's harness ran the ops)
    planned(impl, name)(**first)
    assert len(plans) == 1

    def refused(error, match, **changes):
        call = dict(arguments, **changes)
        before = [storage.clone() for storage in written_storages(name, call)]
        with pytest.raises(error, match=match):
            planned(impl, name)(**call)
        assert_same(written_storages(name, call), before, (name, match))

    for tensor in (n for n in written(name) if arguments.get(n) is not None):
        with torch.inference_mode():
            inference = storage_copy(arguments[tensor])
        refused(ValueError, rf"{tensor} is an inference tensor", **{tensor: inference})
        refused(ValueError, rf"{tensor} requires grad", **{tensor: storage_copy(arguments[tensor]).requires_grad_()})
    destination, source = SHARED[name]
    shared = one_storage(arguments[destination], arguments[source])
    refused(ValueError, rf"{destination} and {source} share storage", **dict(zip(SHARED[name], shared)))
    index, value, message = BAD_INDEX[name]
    bad = arguments[index].clone()
    bad[0] = value
    with sgl_convwin.index_checks():
        refused(IndexError, message, **{index: bad})
    assert len(plans) == 1
    planned(impl, name)(**arguments)  # and the plan still runs
    assert len(plans) == 1


BAD_AFTER_A_PLAN = [  # (op, arguments replaced, error, message)
    ("capture", dict(layer=True), TypeError, r"layer must be an int"),
    ("causal_conv1d_verify", dict(layer=True), TypeError, r"layer must be an int"),
    ("capture_gates", dict(layer=True), TypeError, r"layer must be an int"),
    ("gdn_commit", dict(num_k_heads=1.0), TypeError, r"num_k_heads must be an int"),
    ("mamba2_commit", dict(n_groups=1.0), TypeError, r"n_groups must be an int"),
    ("scatter", dict(windows=None), TypeError, r"windows must be a torch.Tensor"),
    ("capture", dict(x=None), TypeError, r"x must be a torch.Tensor"),
    ("causal_conv1d_verify", dict(buffer=None), TypeError, r"buffer must be a torch.Tensor"),
    ("gdn_commit", dict(gates=None), TypeError, r"gates must be a torch.Tensor"),
    ("capture", dict(layer=L), ValueError, r"layer 2 is out of range for 2 layers"),
    ("capture_gates", dict(g=torch.zeros(2, D, H, dtype=torch.int32)), TypeError, r"g must be a floating-point"),
    ("mamba2_commit", dict(A=torch.zeros(L, 3)), ValueError, r"A must be \[L, H\]"),
]


@pytest.mark.parametrize(
    "name, changes, error, message", BAD_AFTER_A_PLAN,
    ids=[f"{op}-{next(iter(changes))}-{i}" for i, (op, changes, *_) in enumerate(BAD_AFTER_A_PLAN)],
)
def test_a_bad_call_after_a_planned_one_gets_every_check(name, changes, error, message):
    """A call that differs from a planned signature -- in a value equal to the planned one but of
    another type (True for 1), in a tensor that is not one, or in a shape or dtype -- runs every
    check again and raises the unplanned call's error, writing nothing."""
    public = getattr(sgl_convwin, name)
    public(**CASES[name]("cpu", 0))
    arguments = dict(CASES[name]("cpu", 1), **changes)
    before = [storage.clone() for storage in written_storages(name, arguments)]
    with pytest.raises(error, match=message):
        public(**arguments)
    assert_same(written_storages(name, arguments), before, (name, message))
    assert len(public.eager_plans) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", OPS)
def test_planned_launches_skip_the_binder_for_every_op(monkeypatch, name):
    """Once a signature's plan has launched through Triton (compiling its kernels), the next calls
    of every op launch the compiled kernels directly, without Triton's binder (on the Triton
    versions that direct launch was verified on), and write what an unplanned call writes."""
    from triton.runtime.jit import JITFunction

    from sgl_convwin._kernels import triton_kernels

    kernels = triton_kernels()
    if not kernels._common.direct_launch_supported():
        pytest.skip(f"direct launches are not used on Triton {kernels._common.triton.__version__}")
    calls = [CASES[name]("cuda", seed) for seed in range(3)]
    wants = [unplanned(IMPLS["cuda"], name, arguments) for arguments in calls]
    # every kernel of the package (the unplanned calls imported the modules a launcher loads late)
    jit_kernels = {id(value): value for module_name, module in list(sys.modules.items())
                   if module_name.startswith(kernels.__name__) for value in vars(module).values()
                   if isinstance(value, JITFunction)}.values()
    binder_runs = []
    for kernel in jit_kernels:
        triton_run = kernel.run
        monkeypatch.setattr(kernel, "run", lambda *a, _run=triton_run, **k: binder_runs.append(1) or _run(*a, **k))
    public = getattr(sgl_convwin, name)
    public.eager_plans.clear()
    for seed, (arguments, want) in enumerate(zip(calls, wants)):
        binder_runs.clear()
        public(**arguments)
        assert_same(written_storages(name, arguments), want, (name, seed))
        assert (len(binder_runs) > 0) == (seed == 0), (seed, len(binder_runs))
