"""Helpers for the tests: implementations under test, strided tensors, whole-storage checks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from hypothesis import strategies as st

import sgl_convwin
from sgl_convwin import ops

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
_TRITON = (ops._scatter_triton, ops._scatter_tree_triton, ops._capture_triton, ops._causal_conv1d_verify_triton)

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


def impl_params(*names: str):
    """pytest params for the implementations this machine can run (others are skipped, with why)."""
    params = []
    for name in names or tuple(IMPLS):
        marks = []
        if IMPLS[name].device == "cuda":
            marks.append(pytest.mark.gpu)
        if name == "triton_interpret" and not (INTERPRET and HAS_TRITON):
            marks.append(pytest.mark.skip(reason="Triton's interpreter runs only without a GPU"))
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


def chain_parents(num_nodes: int) -> list[int]:
    return list(range(-1, num_nodes - 1))


@st.composite
def trees(draw, num_nodes):
    """parents[n] in [-1, n-1]: chains, stars, k-ary trees (EAGLE-like), or uniform random."""
    shape = draw(st.sampled_from(["chain", "star", "kary", "random"]))
    if shape == "chain":
        return chain_parents(num_nodes)
    if shape == "star":
        return [-1] * num_nodes
    if shape == "kary":
        branching = draw(st.integers(2, 4))
        return [(n // branching) - 1 if n >= branching else -1 for n in range(num_nodes)]
    return [draw(st.integers(-1, n - 1)) for n in range(num_nodes)]
