"""Tensors on a GPU other than the current one: every op runs its kernels on its tensors' GPU.

Triton launches on the current device; the ops make their tensors' device current for the call,
as PyTorch's own CUDA ops do. Without that a kernel runs on the wrong GPU: an error, or, with
peer access, another device's stream and a silently unordered write. With two GPUs: every op
through torch.ops (the registered kernels, their eager plans) and through its public function
(the eager fast path), the demo's model on the second GPU, and the checks that refuse tensors
spread over two GPUs. With one: the same calls with another device reported current, which must
enter the tensors' device and leave the same results.
"""

import io

import pytest
import torch

import sgl_convwin
from sgl_convwin import demo
import test_gdn_verify
import test_mamba2_verify
import test_ring
import test_ring_mamba2
from test_opcheck import replay_samples, scatter_samples, scatter_tree_samples, verify_samples

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs two CUDA devices")

OPS = ("scatter", "scatter_tree", "capture", "causal_conv1d_verify", "capture_gates", "gdn_commit", "mamba2_commit",
       "gdn_verify", "mamba2_verify", "ring_conv1d_verify", "gdn_ring_verify", "ring_accept", "gdn_ring_flush",
       "mamba2_ring_verify", "mamba2_ring_flush")

OTHER = "cuda:1"


def op_calls(device):
    """(name, op, args, kwargs) for every op with data, from the opcheck samples (seeded: two
    calls give equal tensors with equal strides)."""
    ops = torch.ops.convwin
    for name, args, kwargs in scatter_samples(device):
        yield f"scatter-{name}", ops.scatter.default, args, kwargs
    for name, args, kwargs in scatter_tree_samples(device):
        yield f"scatter_tree-{name}", ops.scatter_tree.default, args, kwargs
    for name, capture_args, capture_kwargs, verify_args, verify_kwargs in verify_samples(device):
        yield f"capture-{name}", ops.capture.default, capture_args, capture_kwargs
        yield f"causal_conv1d_verify-{name}", ops.causal_conv1d_verify.default, verify_args, verify_kwargs
    for mixer, op in (("gdn", ops.gdn_commit.default), ("mamba2", ops.mamba2_commit.default)):
        for name, args, kwargs in replay_samples(device, mixer):
            yield f"{mixer}_commit-{name}", op, args, kwargs
    generator = torch.Generator().manual_seed(4)
    gates = torch.zeros(2, 3, 4, 2, 5).to(device)
    g, beta = torch.randn(3, 4, 5, generator=generator).to(device), torch.rand(3, 4, 5, generator=generator).to(device)
    yield "capture_gates", ops.capture_gates.default, (gates, g, beta, torch.tensor([1, -1, 0], device=device), 1), {}
    for tree in (None, [-1, 0, 0, 1]):
        q, k, v, g, beta, ssm, slots, parents = test_gdn_verify.make_problem(parents=tree, device=device)
        yield "gdn_verify", ops.gdn_verify.default, (torch.zeros(v.shape, device=device), q, k, v, g, beta, ssm,
                                                     slots, parents), {"scale": 0.25, "use_qk_l2norm": True}
        (x, dt, A, B, C, ssm, slots, parents), kwargs = test_mamba2_verify.make_problem(parents=tree, device=device)
        yield "mamba2_verify", ops.mamba2_verify.default, (
            torch.zeros(x.shape, device=device), x, dt, A, B, C, ssm, slots, parents,
            *(kwargs.get(name) for name in test_mamba2_verify.TERMS)), {"dt_softplus": kwargs["dt_softplus"]}
    with torch.random.fork_rng(devices=[]):  # (the ring samples draw some inputs from the global generator)
        torch.manual_seed(5)
        ring_samples = [(name, tree, sample) for module in (test_ring, test_ring_mamba2) for tree in (False, True)
                        for name, sample in module.op_samples(tree).items()]
    for name, tree, (args, kwargs) in ring_samples:
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
        yield f"{name}-{'tree' if tree else 'chain'}", getattr(ops, name).default, args, kwargs


def tensors_of(args):
    return [a for a in args if isinstance(a, torch.Tensor)]


def call(via, op, args, kwargs):
    """One op call through torch.ops or through its public function (every argument by name)."""
    if via == "torch.ops":
        op(*args, **kwargs)
    else:
        public = getattr(sgl_convwin, op._schema.name.split("::")[1])
        public(**{argument.name: value for argument, value in zip(op._schema.arguments, args)}, **kwargs)


@two_gpus
@pytest.mark.parametrize("via", ["torch.ops", "public"])
def test_every_op_runs_on_its_tensors_gpu(via):
    """Each op on cuda:1 with cuda:0 current, called twice (the second call through its eager
    plan), leaves exactly what the same calls leave with cuda:1 current."""
    torch.cuda.set_device(0)
    with torch.cuda.device(1):
        expected = []
        for name, op, args, kwargs in op_calls(OTHER):
            call(via, op, args, kwargs)
            call(via, op, args, kwargs)
            expected.append((name, tensors_of(args)))
    torch.cuda.synchronize(1)
    for (name, op, args, kwargs), (expected_name, want) in zip(op_calls(OTHER), expected, strict=True):
        assert name == expected_name
        call(via, op, args, kwargs)
        call(via, op, args, kwargs)
        assert torch.cuda.current_device() == 0, name
        for got, wanted in zip(tensors_of(args), want, strict=True):
            assert got.device == torch.device(OTHER)
            assert torch.equal(got, wanted), f"{name}: a tensor differs from the run with {OTHER} current"


@two_gpus
@pytest.mark.parametrize("mixer", demo.MIXERS)
def test_the_demo_on_the_second_gpu_matches_greedy(mixer):
    """The model's op calls (chain and tree, every layout) on cuda:1 with cuda:0 current."""
    torch.cuda.set_device(0)
    out = io.StringIO()
    assert demo.run_demo(device=OTHER, out=out, mixer=mixer, new_tokens=8, batch=3, prompt_len=5, draft=4,
                         tree_nodes=7, topk=3, layers=2, show_progress=False), out.getvalue()
    assert torch.cuda.current_device() == 0


@two_gpus
def test_tensors_on_two_gpus_are_refused():
    conv_state = torch.zeros(2, 4, 24, 3, device=OTHER)
    windows = sgl_convwin.alloc_windows(2, 3, 24, 4, 4, layout="dense", device="cuda:0")
    index = torch.zeros(1, dtype=torch.int64, device=OTHER)
    with pytest.raises(ValueError, match="windows is on cuda:0 but conv_state is on cuda:1"):
        sgl_convwin.scatter(conv_state, windows, index, index, index)


def pretend_another_device_is_current(monkeypatch, functions):
    """Report device 1 as current to ``functions`` (generated: their globals hold the guard's
    names) and record each device they make current; the list of those indices."""
    entered = []

    def device_guard(index):
        entered.append(index)
        return torch.cuda.device(index)

    for function in functions:
        monkeypatch.setitem(function.__globals__, "_current_device", lambda: 1)
        monkeypatch.setitem(function.__globals__, "_device_guard", device_guard)
    return entered


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("via", ["torch.ops", "public"])
def test_a_call_enters_its_tensors_device(monkeypatch, via):
    """Every op on cuda:0 with device 1 reported current to its registered CUDA kernel
    (torch.ops) or to its public function (the eager fast path; the registered kernels, not
    patched then, would not record an entry): each call enters device 0, and leaves exactly what
    the same call leaves without the pretence."""
    expected = []
    for name, op, args, kwargs in op_calls("cuda:0"):
        call(via, op, args, kwargs)
        expected.append(tensors_of(args))
    samples = list(op_calls("cuda:0"))  # (made first: making the replay samples calls capture ops)
    functions = [getattr(sgl_convwin, name) for name in OPS]
    if via == "torch.ops":
        functions = [public.cuda_registered for public in functions]
    entered = pretend_another_device_is_current(monkeypatch, functions)
    for calls, ((name, op, args, kwargs), want) in enumerate(zip(samples, expected, strict=True), 1):
        call(via, op, args, kwargs)
        assert entered == [0] * calls, name
        for got, wanted in zip(tensors_of(args), want, strict=True):
            assert torch.equal(got, wanted), name
