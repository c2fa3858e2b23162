"""Registration checks (torch.library.opcheck): schemas, fakes, mutation declarations, AOT.

Kept apart from the numeric tests; these say nothing about values beyond what opcheck compares.
"""

import contextlib

import pytest
import torch

import sgl_convwin
from support import DEVICES, strided_tensor

# (source, destination) dtypes, cycled over the samples: every cache dtype on each side
DTYPE_PAIRS = [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16), (torch.float32, torch.float16),
               (torch.bfloat16, torch.bfloat16)]



def scatter_samples(device):
    generator = torch.Generator().manual_seed(0)
    L, M, N, D, K, dim = 2, 3, 4, 4, 4, 24
    dst = torch.tensor([2, -1, 0, 3], device=device)
    src = torch.tensor([0, 1, 2, 1], device=device, dtype=torch.int32)
    steps = torch.tensor([3, 0, 1, -1], device=device)
    for layout in sgl_convwin.LAYOUTS:
        for i, variant in enumerate(("contiguous", "offset", "permuted", "sliced")):
            for state_layout in sgl_convwin.STATE_LAYOUTS:
                source_dtype, state_dtype = DTYPE_PAIRS[i]
                physical = sgl_convwin.physical_shape(layout, L, M, dim, D, K)
                buffer = strided_tensor(physical, source_dtype, device, generator, variant)
                windows = sgl_convwin.window_view(buffer, layout, D, K)
                shape = (L, N, dim, K - 1) if state_layout == "dim_major" else (L, N, K - 1, dim)
                conv_state = strided_tensor(shape, state_dtype, device, generator, variant)
                name = f"{layout}-{variant}-{state_layout}"
                yield name, (conv_state, windows, dst, src, steps), {"state_layout": state_layout}
    empty = torch.empty(0, dtype=torch.int64, device=device)
    yield "B=0", (torch.zeros(L, N, dim, K - 1, device=device), windows, empty, empty, empty), {}


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_scatter(device):
    for name, args, kwargs in scatter_samples(device):
        try:
            torch.library.opcheck(torch.ops.convwin.scatter.default, args, kwargs)
        except Exception as error:  # name the sample that failed
            raise AssertionError(f"opcheck failed for sample {name}") from error


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", sgl_convwin.LAYOUTS)
def test_opcheck_alloc(device, layout):
    for dtype in (torch.float32, torch.bfloat16):
        args = (2, 3, 8, 4, 4, layout, dtype, torch.device(device))
        torch.library.opcheck(torch.ops.convwin.alloc.default, args)


def scatter_tree_samples(device):
    generator = torch.Generator().manual_seed(1)
    L, M, N_state, nodes, K, dim = 2, 3, 4, 5, 4, 24
    dst = torch.tensor([2, -1, 0, 3], device=device)
    src = torch.tensor([0, 1, 2, 1], device=device, dtype=torch.int32)
    accepted = torch.tensor([4, 0, 1, -1], device=device)
    parents = torch.tensor([[-1, 0, 1, 1, 3], [-1, -1, 0, 1, 2], [-1, 0, 0, 1, 1], [-1, 0, 1, 2, 3]], device=device)
    for rows_layout in ("token_major", "channel_major"):
        for i, variant in enumerate(("contiguous", "offset", "permuted", "sliced")):
            for state_layout in sgl_convwin.STATE_LAYOUTS:
                source_dtype, state_dtype = DTYPE_PAIRS[i]
                if rows_layout == "token_major":
                    rows = strided_tensor((L, M, nodes + K - 2, dim), source_dtype, device, generator, variant)
                else:
                    rows = strided_tensor((L, M, dim, nodes + K - 2), source_dtype, device, generator, variant).transpose(-1, -2)
                shape = (L, N_state, dim, K - 1) if state_layout == "dim_major" else (L, N_state, K - 1, dim)
                conv_state = strided_tensor(shape, state_dtype, device, generator, variant)
                name = f"{rows_layout}-{variant}-{state_layout}"
                yield name, (conv_state, rows, dst, src, accepted, parents), {"state_layout": state_layout}
    empty = torch.empty(0, dtype=torch.int64, device=device)
    yield "B=0", (torch.zeros(L, N_state, dim, K - 1, device=device), rows, empty, empty, empty,
                  torch.empty(0, nodes, dtype=torch.int64, device=device)), {}


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_scatter_tree(device):
    for name, args, kwargs in scatter_tree_samples(device):
        try:
            torch.library.opcheck(torch.ops.convwin.scatter_tree.default, args, kwargs)
        except Exception as error:
            raise AssertionError(f"opcheck failed for sample {name}") from error


def verify_samples(device):
    """(name, capture args, verify args, kwargs) over layouts, strides, state layouts, trees, B=0."""
    generator = torch.Generator().manual_seed(2)
    L, M, N_state, nodes, K, dim, B = 2, 3, 4, 5, 4, 24, 4
    buffer_slots = torch.tensor([2, -1, 0, 1], device=device)
    state_slots = torch.tensor([0, 1, 3, 2], device=device, dtype=torch.int32)
    tree = torch.tensor([[-1, 0, 1, 1, 3], [-1, -1, 0, 1, 2], [-1, 0, 0, 1, 1], [-1, 0, 1, 2, 3]], device=device)
    weight = torch.randn(dim, K, generator=generator).to(device)
    bias = torch.randn(dim, generator=generator).to(device)
    # every layout x every stride variant; state layouts and chain/tree alternate (each kernel
    # specialisation opcheck compiles costs seconds on the GPU)
    for layout in sgl_convwin.LAYOUTS:
        for i, variant in enumerate(("contiguous", "offset", "permuted", "sliced")):
            state_layout = sgl_convwin.STATE_LAYOUTS[i % 2]
            parents = (None, tree)[(i // 2) % 2]
            physical = sgl_convwin.physical_shape(layout, L, M, dim, nodes, K)
            x_dtype, buffer_dtype = DTYPE_PAIRS[i]
            buffer = strided_tensor(physical, buffer_dtype, device, generator, variant)
            shape = (L, N_state, dim, K - 1) if state_layout == "dim_major" else (L, N_state, K - 1, dim)
            conv_state = strided_tensor(shape, DTYPE_PAIRS[(i + 2) % 4][0], device, generator, variant)
            x = strided_tensor((B, nodes, dim), x_dtype, device, generator, variant)
            out = strided_tensor((B, nodes, dim), DTYPE_PAIRS[(i + 1) % 4][0], device, generator, variant)
            name = f"{layout}-{variant}-{state_layout}-{'tree' if parents is not None else 'chain'}"
            common = (buffer_slots, state_slots, 1, parents)
            kwargs = {"layout": layout, "state_layout": state_layout}
            yield (name, (buffer, conv_state, x, *common), kwargs,
                   (out, buffer, conv_state, x, weight, bias, *common), {**kwargs, "activation": "silu"})
    empty = torch.empty(0, dtype=torch.int64, device=device)
    x = torch.empty(0, nodes, dim, device=device)
    state = torch.zeros(L, N_state, dim, K - 1, device=device)
    yield ("B=0", (buffer, state, x, empty, empty, 0), {"layout": layout},
           (x.clone(), buffer, state, x, weight, None, empty, empty, 0), {"layout": layout})


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.slow), DEVICES[1]])
def test_opcheck_capture_and_verify(device):
    for name, capture_args, capture_kwargs, verify_args, verify_kwargs in verify_samples(device):
        try:
            torch.library.opcheck(torch.ops.convwin.capture.default, capture_args, capture_kwargs)
            torch.library.opcheck(torch.ops.convwin.causal_conv1d_verify.default, verify_args, verify_kwargs)
        except Exception as error:
            raise AssertionError(f"opcheck failed for sample {name}") from error


def replay_samples(device, mixer):
    from support import make_replay

    for i, (layout, tree) in enumerate([(layout, tree) for layout in sgl_convwin.LAYOUTS for tree in (False, True)]):
        replay = make_replay(mixer=mixer, layout=layout, tree=tree, device=device, seed=i,
                             state_layout=sgl_convwin.STATE_LAYOUTS[i % 2], transposed_ssm=i % 3 == 0)
        kwargs = dict(replay.kwargs)
        conv_bias = kwargs.pop("conv_bias")
        yield f"{layout}-{'tree' if tree else 'chain'}", (*replay.args(), conv_bias), kwargs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mixer", ["gdn", "mamba2"])
def test_opcheck_replay_commit(device, mixer):
    op = torch.ops.convwin.gdn_commit if mixer == "gdn" else torch.ops.convwin.mamba2_commit
    for name, args, kwargs in replay_samples(device, mixer):
        try:
            torch.library.opcheck(op.default, args, kwargs)
        except Exception as error:
            raise AssertionError(f"opcheck failed for sample {name}") from error


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_capture_gates(device):
    generator = torch.Generator().manual_seed(3)
    slots = torch.tensor([1, -1, 0], device=device)
    for num_gates in (2, 1):
        gates = torch.zeros(2, 3, 4, num_gates, 5, device=device)
        g = torch.randn(3, 4, 5, generator=generator).to(device)
        beta = torch.rand(3, 4, 5, generator=generator).to(device).transpose(0, 1).contiguous().transpose(0, 1)
        torch.library.opcheck(torch.ops.convwin.capture_gates.default,
                              (gates, g, beta if num_gates == 2 else None, slots, 1))
    heads = torch.randn(2, 5, generator=generator).to(device)  # raw a, b with A_log, dt_bias
    torch.library.opcheck(torch.ops.convwin.capture_gates.default, (torch.zeros(2, 3, 4, 2, 5, device=device),
                          None, None, slots, 1), {"a": g, "b": beta, "A_log": heads[0], "dt_bias": heads[1]})


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_alloc_gates(device):
    for num_gates, dtype in ((2, torch.float32), (1, torch.bfloat16)):
        torch.library.opcheck(torch.ops.convwin.alloc_gates.default, (2, 3, 4, 5, num_gates, dtype, torch.device(device)))


@pytest.mark.parametrize("inference", [False, True], ids=["grad-mode", "inference-mode"])
@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_ops_bump_the_versions_of_what_they_write(fake, inference):
    """Autograd's saved-tensor check and Dynamo's input-mutation tracking read tensor versions:
    each registered op bumps the version of every tensor it writes and of nothing else, fake
    tensors included (their kernel writes nothing, so the bump is the registration's), and under
    inference_mode too (normal tensors keep counting versions there)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _, capture_args, capture_kwargs, verify_args, verify_kwargs = next(verify_samples("cpu"))
    _, scatter_args, scatter_kwargs = next(scatter_samples("cpu"))
    _, gdn_args, gdn_kwargs = next(replay_samples("cpu", "gdn"))
    cases = [  # op, args, kwargs, the positions it writes
        (torch.ops.convwin.scatter, scatter_args, scatter_kwargs, {0}),
        (torch.ops.convwin.capture, capture_args, capture_kwargs, {0}),
        (torch.ops.convwin.causal_conv1d_verify, verify_args, verify_kwargs, {0, 1}),
        (torch.ops.convwin.gdn_commit, gdn_args, gdn_kwargs, {0, 1}),
    ]
    mode = FakeTensorMode()
    for op, args, kwargs, written in cases:
        if fake:
            args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        versions = [a._version if isinstance(a, torch.Tensor) else None for a in args]
        with mode if fake else contextlib.nullcontext(), torch.inference_mode(inference):
            op(*args, **kwargs)
        for i, (a, before) in enumerate(zip(args, versions)):
            if before is not None:
                assert (a._version > before) == (i in written), (op, i)


def test_ops_record_no_autograd_history():
    """The ops have no derivative: weights that require grad (model parameters) leave no autograd
    history on what a registered op writes, whichever kernel runs."""
    _, _, _, verify_args, verify_kwargs = next(verify_samples("cpu"))
    _, gdn_args, gdn_kwargs = next(replay_samples("cpu", "gdn"))
    for op, args, kwargs, weight, written in ((torch.ops.convwin.causal_conv1d_verify, verify_args, verify_kwargs, 4, (0, 1)),
                                              (torch.ops.convwin.gdn_commit, gdn_args, gdn_kwargs, 4, (0, 1))):
        args = list(args)
        args[weight] = torch.nn.Parameter(args[weight])
        op(*args, **kwargs)
        for i in written:
            assert not args[i].requires_grad and args[i].grad_fn is None, (op, i)


@pytest.mark.parametrize("device", DEVICES)
def test_dispatch_modes_see_every_op_call(device):
    """A registered op's Autograd kernel calls the backend kernel itself only for plain tensors:
    under a dispatch mode the call goes on down the dispatcher, so the mode sees it, and both
    routes write the same."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    _, _, _, verify_args, verify_kwargs = next(verify_samples(device))
    _, scatter_args, scatter_kwargs = next(scatter_samples(device))
    _, gdn_args, gdn_kwargs = next(replay_samples(device, "gdn"))
    cases = ((torch.ops.convwin.scatter, scatter_args, scatter_kwargs, (0,)),
             (torch.ops.convwin.causal_conv1d_verify, verify_args, verify_kwargs, (0, 1)),
             (torch.ops.convwin.gdn_commit, gdn_args, gdn_kwargs, (0, 1)))
    for op, args, kwargs, written in cases:
        plain = [a.clone() if i in written else a for i, a in enumerate(args)]
        moded = [a.clone() if i in written else a for i, a in enumerate(args)]
        op(*plain, **kwargs)
        with Record() as mode:
            op(*moded, **kwargs)
        assert op.default in mode.seen, (op, mode.seen)
        for i in written:
            assert torch.equal(plain[i], moded[i]), (op, i)
            assert not torch.equal(plain[i], args[i]), (op, i)  # the call wrote something
