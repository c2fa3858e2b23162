"""Helpers for the tests: implementations under test, strided tensors, whole-storage checks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from hypothesis import strategies as st

import sgl_convwin
from sgl_convwin import reference

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False


@dataclass(frozen=True)
class Impl:
    """One implementation of the public ops, on one device."""

    name: str
    device: str
    scatter: Callable[..., None]
    scatter_tree: Callable[..., None]
    capture: Callable[..., None]
    causal_conv1d_verify: Callable[..., None]
    # Triton's interpreter rounds float downcasts differently from the GPU (it truncates), so
    # under it only exact casts (same dtype, or up to float32) can be compared bit for bit.
    exact_casts_only: bool = False


def _dispatched_scatter(*args, **kwargs):
    torch.ops.convwin.scatter(*args, **kwargs)


def _dispatched_scatter_tree(*args, **kwargs):
    torch.ops.convwin.scatter_tree(*args, **kwargs)


def _dispatched_capture(*args, **kwargs):
    torch.ops.convwin.capture(*args, **kwargs)


def _dispatched_verify(*args, **kwargs):
    torch.ops.convwin.causal_conv1d_verify(*args, **kwargs)


_PUBLIC = (sgl_convwin.scatter, sgl_convwin.scatter_tree, sgl_convwin.capture, sgl_convwin.causal_conv1d_verify)
_DISPATCHED = (_dispatched_scatter, _dispatched_scatter_tree, _dispatched_capture, _dispatched_verify)
# the CUDA kernels' functions, run on CPU tensors under Triton's interpreter
_TRITON = tuple(public.cuda_impl for public in _PUBLIC)

# sgl_convwin.* skip the dispatcher in eager mode; the *_op entries go through it.
IMPLS = {
    "cpu": Impl("cpu", "cpu", *_PUBLIC),
    "cpu_op": Impl("cpu_op", "cpu", *_DISPATCHED),
    "triton_interpret": Impl("triton_interpret", "cpu", *_TRITON, exact_casts_only=True),
    "cuda": Impl("cuda", "cuda", *_PUBLIC),
    "cuda_op": Impl("cuda_op", "cuda", *_DISPATCHED),
}


class CountingBackend:
    """A torch.compile backend that runs the traced graph as it is and counts the compilations."""

    def __init__(self):
        self.compiles = 0

    def __call__(self, graph_module, example_inputs):
        self.compiles += 1
        return graph_module.forward


def impl_params(*names: str, slow: bool = False):
    """pytest params for the implementations this machine can run (others are skipped, with why).
    slow: the interpreter's param is marked ``slow`` (deselected by default; see conftest.py)."""
    params = []
    for name in names or tuple(IMPLS):
        marks = []
        if IMPLS[name].device == "cuda":
            marks.append(pytest.mark.gpu)
        if name == "triton_interpret" and not (INTERPRET and HAS_TRITON):
            marks.append(pytest.mark.skip(reason="Triton's interpreter runs only without a GPU"))
        if name == "triton_interpret" and slow:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(IMPLS[name], id=name, marks=marks))
    return params


# the devices a test runs on: the CPU, and CUDA (marked gpu, so `pytest -m gpu` selects it)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def exact_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    return src == dst or dst == torch.float32


def random_tensor(shape, dtype, device, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator).to(dtype=dtype, device=device)


def strided_tensor(shape, dtype, device, generator: torch.Generator, variant: str) -> torch.Tensor:
    """A random tensor of ``shape`` with the memory layout ``variant`` names.

    contiguous: plain. offset: inside a larger random storage, at a storage offset, with elements
    after it too (sentinels for stray writes). permuted: its last two axes swapped in memory.
    sliced: the middle of a wider last axis, so no inner block is contiguous (sentinels between).
    """
    if variant == "contiguous":
        return random_tensor(shape, dtype, device, generator)
    if variant == "offset":
        numel = 1
        for size in shape:
            numel *= size
        storage = random_tensor((numel + 23,), dtype, device, generator)
        return storage[7 : 7 + numel].view(shape)
    if variant == "permuted":
        swapped = (*shape[:-2], shape[-1], shape[-2])
        return random_tensor(swapped, dtype, device, generator).transpose(-1, -2)
    if variant == "sliced":
        wider = (*shape[:-1], shape[-1] + 3)
        return random_tensor(wider, dtype, device, generator)[..., 1 : 1 + shape[-1]]
    raise ValueError(variant)


def make_state(state_layout, layers, slots, dim, width, dtype, device, generator, variant="contiguous"):
    """A random conv state: [L, N, dim, K-1] (dim_major) or [L, N, K-1, dim] (window_major)."""
    shape = (layers, slots, dim, width) if state_layout == "dim_major" else (layers, slots, width, dim)
    return strided_tensor(shape, dtype, device, generator, variant)


def whole_storage(t: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor over all of t's storage, so a comparison sees stray writes anywhere in it."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())


def expected_storage(t: torch.Tensor, expected_view: torch.Tensor) -> torch.Tensor:
    """t's whole storage as it must be once the region t covers holds ``expected_view``."""
    result = whole_storage(t).clone()
    result.as_strided(t.shape, t.stride(), t.storage_offset()).copy_(expected_view.to(t.device))
    return result


def sprinkled(t: torch.Tensor, values, one_in: int, generator: torch.Generator) -> torch.Tensor:
    """``t`` with about one entry in ``one_in`` replaced by one of ``values`` (drawn on the CPU), on
    t's device."""
    values = torch.tensor(values, dtype=t.dtype)
    pick = torch.randint(0, one_in * len(values), t.shape, generator=generator)
    return torch.where(pick < len(values), values[pick.clamp(max=len(values) - 1)], t.cpu()).to(t.device)


def chain_parents(num_nodes: int) -> list[int]:
    return list(range(-1, num_nodes - 1))


@st.composite
def trees(draw, num_nodes, max_depth=None):
    """parents[n] in [-1, n-1]: chains, stars, k-ary trees (EAGLE-like), or uniform random; with
    ``max_depth``, random trees with at most that many nodes on a root path, one of the deepest
    nodes a likely parent."""
    if max_depth is not None:
        parents, depth = [], []
        for n in range(num_nodes):
            open_nodes = [p for p in range(n) if depth[p] < max_depth]
            deepest = max(open_nodes, key=lambda p: depth[p], default=-1)
            parents.append(draw(st.sampled_from([deepest, -1, *open_nodes])))
            depth.append(1 if parents[-1] < 0 else depth[parents[-1]] + 1)
        return parents
    shape = draw(st.sampled_from(["chain", "star", "kary", "random"]))
    if shape == "chain":
        return chain_parents(num_nodes)
    if shape == "star":
        return [-1] * num_nodes
    if shape == "kary":
        branching = draw(st.integers(2, 4))
        return [(n // branching) - 1 if n >= branching else -1 for n in range(num_nodes)]
    return [draw(st.integers(-1, n - 1)) for n in range(num_nodes)]


# ---------------------------------------------------------------------------------------------
# Replay commit (gdn_commit) problems
# ---------------------------------------------------------------------------------------------


@dataclass
class Replay:
    """One replay commit's tensors and keyword arguments (``mixer`` "gdn" or "mamba2")."""

    ssm_state: torch.Tensor
    conv_state: torch.Tensor
    buffer: torch.Tensor
    gates: torch.Tensor
    conv_weight: torch.Tensor
    dst_slots: torch.Tensor
    src_slots: torch.Tensor
    steps: torch.Tensor
    parents: torch.Tensor | None
    kwargs: dict
    mixer: str = "gdn"
    A: torch.Tensor | None = None  # Mamba2's per-head rate

    def args(self, ssm_state=None, conv_state=None):
        rate = () if self.mixer == "gdn" else (self.A,)
        return (
            self.ssm_state if ssm_state is None else ssm_state,
            self.conv_state if conv_state is None else conv_state,
            self.buffer, self.gates, self.conv_weight, *rate, self.dst_slots, self.src_slots, self.steps,
            self.parents,
        )

    @property
    def commit(self):
        """The public function under test."""
        return sgl_convwin.gdn_commit if self.mixer == "gdn" else sgl_convwin.mamba2_commit

    @property
    def op(self):
        return torch.ops.convwin.gdn_commit if self.mixer == "gdn" else torch.ops.convwin.mamba2_commit

    @property
    def launcher(self) -> str:
        return f"launch_{self.mixer}_commit"

    def reference(self):
        """The oracle's (ssm_state float64, conv_state, destinations written)."""
        oracle = reference.gdn_commit_reference if self.mixer == "gdn" else reference.mamba2_commit_reference
        return oracle(*self.args(), **self.kwargs)


def random_tree(num_nodes: int, generator: torch.Generator, max_depth: int | None = None) -> list[int]:
    """Parent links of a random tree: node 0 is the root, node n hangs off an earlier node (with
    ``max_depth``, one with fewer than that many nodes on its root path)."""
    parents, depth = [-1], [1]
    for n in range(1, num_nodes):
        open_nodes = [p for p in range(n) if max_depth is None or depth[p] < max_depth]
        parents.append(open_nodes[int(torch.randint(0, len(open_nodes), (), generator=generator))])
        depth.append(depth[parents[-1]] + 1)
    return parents


def make_replay(
    *, mixer="gdn", layout="token_major", tree=False, num_layers=2, num_k_heads=2, ratio=2, head_k_dim=4,
    head_v_dim=4, kernel_size=4, num_draft=3, num_rows=3, num_slots=5, buffer_slots=4, ssm_dtype=torch.float32,
    buffer_dtype=torch.float32, conv_dtype=torch.float32, state_layout="dim_major", transposed_ssm=False,
    bias=True, use_qk_l2norm=True, steps=None, device="cpu", seed=0,
) -> Replay:
    """A verify pass through the package's own capture ops, then the commit's arguments.

    Gated DeltaNet: Hk = num_k_heads, Hv = Hk * ratio, dk = head_k_dim, dv = head_v_dim. Mamba2 (the
    same knobs): G = num_k_heads groups, H = G * ratio heads, Ns = head_k_dim, P = head_v_dim."""
    gen = torch.Generator().manual_seed(seed)
    num_slots, buffer_slots = max(num_slots, num_rows), max(buffer_slots, num_rows)
    num_heads = num_k_heads * ratio
    if mixer == "gdn":
        dim = 2 * num_k_heads * head_k_dim + num_heads * head_v_dim
        state_tail = (num_heads, head_k_dim, head_v_dim)
    else:
        dim = num_heads * head_v_dim + 2 * num_k_heads * head_k_dim
        state_tail = (num_heads, head_v_dim, head_k_dim)
    width = kernel_size - 1

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    if transposed_ssm:  # stored with its last two axes swapped, passed transposed, at a storage offset
        numel = num_layers * num_slots * state_tail[0] * state_tail[1] * state_tail[2]
        storage = randn(7 + numel).to(ssm_dtype)
        swapped = (num_layers, num_slots, state_tail[0], state_tail[2], state_tail[1])
        ssm_state = storage[7:].view(swapped).transpose(-1, -2)
    else:
        ssm_state = randn(num_layers, num_slots, *state_tail).to(ssm_dtype)
    conv_shape = (num_layers, num_slots, dim, width) if state_layout == "dim_major" else (num_layers, num_slots, width, dim)
    conv_state = randn(*conv_shape).to(conv_dtype)
    buffer = sgl_convwin.alloc_windows(num_layers, buffer_slots, dim, num_draft, kernel_size, layout=layout,
                                       dtype=buffer_dtype, device=device)
    num_gates = 2 if mixer == "gdn" else 1
    gates = sgl_convwin.alloc_gates(num_layers, buffer_slots, num_draft, num_heads, num_gates=num_gates, device=device)
    # row b: buffer slot perm[b], state slot dst[b]; the last row is padding (-1) when B > 1
    slots_perm = torch.randperm(buffer_slots, generator=gen)[:num_rows]
    dst = torch.randperm(num_slots, generator=gen)[:num_rows]
    if num_rows > 1:
        dst[-1] = -1
    parents = None
    if tree:
        parents = torch.tensor([random_tree(num_draft, gen) for _ in range(num_rows)], device=device)
    conv_weight = randn(num_layers, dim, kernel_size, scale=0.5)
    conv_bias = randn(num_layers, dim, scale=0.1) if bias else None
    for layer in range(num_layers):
        x = randn(num_rows, num_draft, dim).to(buffer_dtype)
        state_slots = dst.clamp(min=0).to(device)
        sgl_convwin.capture(buffer, conv_state, x, slots_perm.to(device), state_slots, layer, parents,
                            layout=layout, state_layout=state_layout)
        if mixer == "gdn":
            g = -torch.nn.functional.softplus(randn(num_rows, num_draft, num_heads))
            beta = torch.sigmoid(randn(num_rows, num_draft, num_heads))
            sgl_convwin.capture_gates(gates, g, beta, slots_perm.to(device), layer)
        else:
            dt = torch.nn.functional.softplus(randn(num_rows, num_draft, num_heads)) * 0.5
            sgl_convwin.capture_gates(gates, dt, None, slots_perm.to(device), layer)
    if steps is None:
        steps = torch.randint(0, num_draft, (num_rows,), generator=gen)
    if mixer == "gdn":
        kwargs = dict(layout=layout, num_k_heads=num_k_heads, head_k_dim=head_k_dim, num_v_heads=num_heads,
                      head_v_dim=head_v_dim, conv_bias=conv_bias, use_qk_l2norm=use_qk_l2norm,
                      state_layout=state_layout)
        rate = None
    else:
        kwargs = dict(layout=layout, num_heads=num_heads, head_dim=head_v_dim, n_groups=num_k_heads,
                      d_state=head_k_dim, conv_bias=conv_bias, state_layout=state_layout)
        rate = -torch.exp(randn(num_layers, num_heads, scale=0.5))
    return Replay(ssm_state, conv_state, buffer, gates, conv_weight, dst.to(device), slots_perm.to(device),
                  torch.as_tensor(steps).to(device), parents, kwargs, mixer, rate)


def check_chained_pdl(launch_both, outs, fill: float) -> None:
    """launch_both(pdl=False): two layers' launches, the second reading the first's out (``outs``);
    with pdl=True (programmatic dependent launches, sm_90) the second starts while the first runs
    and must still read its outputs, not ``fill``: bit for bit the plain launches' outputs, eagerly
    and in a CUDA graph, three times each."""
    launch_both()
    want = [out.clone() for out in outs]
    for graphed in (False, True):
        for _ in range(3):
            for out in outs:
                out.fill_(fill)
            if graphed:
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    launch_both(pdl=True)
                graph.replay()
            else:
                launch_both(pdl=True)
            torch.cuda.synchronize()
            same = all(torch.equal(out, expected) for out, expected in zip(outs, want))
            assert same, "graphed" if graphed else "eager"


def usage_error(capsys, argv: list[str], message: str) -> str:
    """``python -m sgl_convwin *argv`` must stop as argparse does: exit status 2, one line on
    stderr that holds ``message``, nothing on stdout. Returns that line."""
    from sgl_convwin import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == 2, captured
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "error: " in lines[0] and message in lines[0], captured.err
    assert captured.out == ""
    return lines[0]


def ring_pytorch_code(name: str) -> Callable[..., None]:
    """Ring op ``name``'s PyTorch code (cpu_ring.py) on tensors of any device, with the op's checks:
    on CUDA tensors the op itself launches the kernels that code is held against."""
    from sgl_convwin import cpu_ring

    op, code = getattr(sgl_convwin, name), getattr(cpu_ring, f"{name}_cpu")

    def call(*args, **kwargs):
        kernel_args, kernel_kwargs = op.kernel_arguments(*args, **kwargs)
        code(*kernel_args, **kernel_kwargs)

    return call
