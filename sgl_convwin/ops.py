"""The ``torch.ops.convwin`` operators: schemas, fakes, and their CPU and CUDA kernels.

Why ``torch.library.custom_op`` and not ``triton_op``: a triton_op's Python body is traced into
the graph by torch.compile on EVERY device, so a CPU call would be compiled into a Triton launch.
An opaque custom op keeps one validated path per device (vectorised PyTorch on the CPU, a Triton
launch on CUDA); inside compiled graphs Inductor calls it in place on the caller's buffers (no
clone), and inside CUDA graphs the single kernel launch is what gets captured.

Every op is destination-passing where it writes (it returns None) and never allocates, syncs or
produces data-dependent shapes, except ``alloc``, the factory op that creates the buffer.
"""

from __future__ import annotations

from typing import Callable

import torch

from . import cpu
from ._kernels import triton_kernels
from .declare import _PLAIN_TENSORS, eager_device
from .layout import (
    CACHE_DTYPES,
    CHANNEL_MAJOR,
    DEFAULT_LAYOUT,
    DENSE,
    DIM_MAJOR,
    WINDOW_MAJOR,
    physical_shape,
)
from .validation import (
    ScatterSizes,
    check_capture_args,
    check_capture_index_values,
    check_no_shared_storage,
    check_no_shared_storages,
    check_not_inference,
    check_scatter_args,
    check_scatter_index_values,
    check_scatter_tree_args,
    check_scatter_tree_index_values,
    check_verify_args,
    should_check_index_values,
)

# ---------------------------------------------------------------------------------------------
# alloc: the physical buffer
# ---------------------------------------------------------------------------------------------


def _alloc_shape(num_layers, num_slots, dim, num_draft, kernel_size, layout, dtype):
    if dtype not in CACHE_DTYPES:
        raise TypeError(f"convwin.alloc: dtype must be float32, float16 or bfloat16, got {dtype}")
    return physical_shape(layout, num_layers, num_slots, dim, num_draft, kernel_size)


@torch.library.custom_op("convwin::alloc", mutates_args=())
def _alloc(
    num_layers: int,
    num_slots: int,
    dim: int,
    num_draft: int,
    kernel_size: int,
    layout: str,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    shape = _alloc_shape(num_layers, num_slots, dim, num_draft, kernel_size, layout, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


@_alloc.register_fake
def _alloc_fake(num_layers, num_slots, dim, num_draft, kernel_size, layout, dtype, device):
    shape = _alloc_shape(num_layers, num_slots, dim, num_draft, kernel_size, layout, dtype)
    return torch.empty(shape, dtype=dtype, device=device)


def alloc_windows(
    num_layers: int,
    num_slots: int,
    dim: int,
    num_draft: int,
    kernel_size: int,
    *,
    layout: str = DEFAULT_LAYOUT,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Allocate the zero-filled PHYSICAL conv-window buffer of ``layout``.

    Shapes (W = K-1, S = D+K-2): dense [L, M, D, dim, W], channel_major [L, M, dim, S],
    token_major [L, M, S, dim]. Read it through ``window_view(buffer, layout, D, K)``.
    """
    _alloc_shape(num_layers, num_slots, dim, num_draft, kernel_size, layout, dtype)  # clear errors first
    device = torch.get_default_device() if device is None else torch.device(device)
    return torch.ops.convwin.alloc(
        num_layers, num_slots, dim, num_draft, kernel_size, layout, dtype, device
    )


# ---------------------------------------------------------------------------------------------
# scatter: commit the accepted windows
# ---------------------------------------------------------------------------------------------

_ScatterKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None
]


def _run_scatter(
    kernel: _ScatterKernel,
    conv_state: torch.Tensor,
    windows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    steps: torch.Tensor,
    state_layout: str,
    sizes: ScatterSizes | None = None,
) -> None:
    """Check a scatter call, then run ``kernel``. ``sizes``: the call's sizes when its signature
    was checked before (the eager fast path in ``scatter``); then only the checks that depend on
    the tensors themselves run."""
    if sizes is None:
        sizes = check_scatter_args(conv_state, windows, dst_slots, src_slots, steps, state_layout)
    else:  # (requires_grad: the fast path sends such calls through the dispatcher)
        check_not_inference(_SCATTER_OP, "conv_state", conv_state)
    check_no_shared_storage(_SCATTER_OP, "conv_state", conv_state, "windows", windows)
    if should_check_index_values(conv_state):
        check_scatter_index_values(sizes, dst_slots, src_slots, steps)
    kernel(_kernel_state(conv_state, state_layout), windows, dst_slots, src_slots, steps)


def _kernel_state(conv_state: torch.Tensor, state_layout: str) -> torch.Tensor:
    """Kernels see every state as [L, N, dim, K-1]; a window-major one is a transposed view."""
    return conv_state.transpose(2, 3) if state_layout == WINDOW_MAJOR else conv_state


@torch.library.custom_op("convwin::scatter", mutates_args=("conv_state",), device_types="cpu")
def _scatter(
    conv_state: torch.Tensor,
    windows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    steps: torch.Tensor,
    *,
    state_layout: str = DIM_MAJOR,
) -> None:
    _run_scatter(cpu.scatter_cpu, conv_state, windows, dst_slots, src_slots, steps, state_layout)


@_scatter.register_kernel("cuda")
def _scatter_triton(conv_state, windows, dst_slots, src_slots, steps, *, state_layout=DIM_MAJOR):
    launch = triton_kernels().launch_scatter
    _run_scatter(launch, conv_state, windows, dst_slots, src_slots, steps, state_layout)


@_scatter.register_fake
def _scatter_fake(conv_state, windows, dst_slots, src_slots, steps, *, state_layout=DIM_MAJOR):
    check_scatter_args(conv_state, windows, dst_slots, src_slots, steps, state_layout)


def _eager_device(op: str, names: tuple[str, ...], *tensors: torch.Tensor) -> str | None:
    """declare.eager_device, with a TypeError naming a non-tensor argument (the dispatcher's
    schema error would come first otherwise)."""
    device = eager_device(*tensors)
    if device == "invalid":
        for name, t in zip(names, tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    return device


def scatter(
    conv_state: torch.Tensor,
    windows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    steps: torch.Tensor,
    *,
    state_layout: str = DIM_MAJOR,
) -> None:
    """Commit the accepted windows into ``conv_state`` in place, for all layers, in one launch.

    For every row b with ``steps[b] >= 0`` and ``dst_slots[b] >= 0``::

        conv_state[:, dst_slots[b]] = windows[:, src_slots[b], steps[b]]   (cast to its dtype)

    conv_state: [L, N, dim, K-1] (state_layout="dim_major"), or the window-major [L, N, K-1, dim]
        with state_layout="window_major" -- pass that tensor itself, not a transposed view.
    windows: [L, M, D, dim, K-1], any strides: a dense buffer or a ``window_view`` of any layout.
    dst_slots, src_slots, steps: [B], int32 or int64, on conv_state's device. Negative step or
        destination skips the row (pad batches with -1). Out-of-range values skip the row too;
        ``sgl_convwin.index_checks()`` turns them into an IndexError (host sync, for debugging).

    Same as ``torch.ops.convwin.scatter``; eager calls skip the dispatcher (see _eager_device)
    and repeat only the per-tensor checks for a signature already seen (see _EAGER_SCATTER),
    launching the compiled kernel directly.
    """
    device = _eager_device(_SCATTER_OP, ("conv_state", "windows", "dst_slots", "src_slots", "steps"),
                           conv_state, windows, dst_slots, src_slots, steps)
    if device is None:
        torch.ops.convwin.scatter(
            conv_state, windows, dst_slots, src_slots, steps, state_layout=state_layout
        )
        return
    signature = _eager_signature(state_layout, conv_state, windows, dst_slots, src_slots, steps)
    plan = _EAGER_SCATTER.get(signature)
    if plan is None:  # every check (they raise on bad input), then this signature's launch
        sizes = check_scatter_args(conv_state, windows, dst_slots, src_slots, steps, state_layout)
        if device == "cpu":
            launch = cpu.scatter_cpu
        else:
            state = _kernel_state(conv_state, state_layout)
            launch = triton_kernels().planned_scatter(state, windows, dst_slots, src_slots, steps)
        plan = _remember(_EAGER_SCATTER, signature, (sizes, launch))
    sizes, launch = plan
    _run_scatter(launch, conv_state, windows, dst_slots, src_slots, steps, state_layout, sizes)


# The eager fast paths of scatter and scatter_tree keep, per call signature -- every shape,
# stride, dtype and device of the call's tensors, and the state layout: everything the argument
# checks and the launch plan depend on -- the call's sizes and its launch (on CUDA a fixed plan
# that, once compiled, skips Triton's per-call binder; csrc_triton/_common.fixed_launch). A seen
# signature repeats neither the checks nor the planning; the checks that depend on the tensors
# themselves (shared storage, inference tensors, the checked mode) run on every call. Engines
# repeat a few signatures step after step (bounded anyway: cleared when full). On the H200 host
# the public eager scatter costs 0.72-0.76x a raw Triton launch of its kernel, scatter_tree
# 0.77-0.79x (docs/benchmarks.md).
_EAGER_SCATTER: dict[tuple, tuple] = {}
_EAGER_SCATTER_TREE: dict[tuple, tuple] = {}
_EAGER_MAX = 1024
_SCATTER_OP = "convwin.scatter"
_SCATTER_TREE_OP = "convwin.scatter_tree"


def _eager_signature(state_layout: str, *tensors: torch.Tensor) -> tuple:
    signature = [state_layout]
    for t in tensors:
        signature += (t.shape, t.stride(), t.dtype, t.device)
    return tuple(signature)


def _remember(cache: dict, signature: tuple, plan: tuple) -> tuple:
    if len(cache) >= _EAGER_MAX:
        cache.clear()
    cache[signature] = plan
    return plan


# ---------------------------------------------------------------------------------------------
# scatter_tree: commit the accepted node of a tree draft
# ---------------------------------------------------------------------------------------------


def _run_scatter_tree(kernel, conv_state, rows, dst_slots, src_slots, nodes, parents, state_layout, sizes=None):
    """Check a scatter_tree call, then run ``kernel``; ``sizes`` as in _run_scatter."""
    if sizes is None:
        sizes = check_scatter_tree_args(conv_state, rows, dst_slots, src_slots, nodes, parents, state_layout)
    else:
        check_not_inference(_SCATTER_TREE_OP, "conv_state", conv_state)
    check_no_shared_storage(_SCATTER_TREE_OP, "conv_state", conv_state, "rows", rows)
    if should_check_index_values(conv_state):
        check_scatter_tree_index_values(sizes, dst_slots, src_slots, nodes, parents)
    kernel(_kernel_state(conv_state, state_layout), rows, dst_slots, src_slots, nodes, parents)


@torch.library.custom_op("convwin::scatter_tree", mutates_args=("conv_state",), device_types="cpu")
def _scatter_tree(
    conv_state: torch.Tensor,
    rows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    nodes: torch.Tensor,
    parents: torch.Tensor,
    *,
    state_layout: str = DIM_MAJOR,
) -> None:
    _run_scatter_tree(
        cpu.scatter_tree_cpu, conv_state, rows, dst_slots, src_slots, nodes, parents, state_layout
    )


@_scatter_tree.register_kernel("cuda")
def _scatter_tree_triton(conv_state, rows, dst_slots, src_slots, nodes, parents, *, state_layout=DIM_MAJOR):
    launch = triton_kernels().launch_scatter_tree
    _run_scatter_tree(launch, conv_state, rows, dst_slots, src_slots, nodes, parents, state_layout)


@_scatter_tree.register_fake
def _scatter_tree_fake(conv_state, rows, dst_slots, src_slots, nodes, parents, *, state_layout=DIM_MAJOR):
    check_scatter_tree_args(conv_state, rows, dst_slots, src_slots, nodes, parents, state_layout)


def scatter_tree(
    conv_state: torch.Tensor,
    rows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    nodes: torch.Tensor,
    parents: torch.Tensor,
    *,
    state_layout: str = DIM_MAJOR,
) -> None:
    """Commit the accepted node of a tree draft into ``conv_state``, all layers, one launch.

    rows: [L, M, N+K-2, dim], any strides: per slot K-2 history rows (the newest committed inputs,
        oldest first), then row K-2+n = node n's conv input. A token_major buffer allocated with
        num_draft=N is exactly this; a channel_major one is, seen through ``.transpose(-1, -2)``.
    nodes: [B] accepted node per row (negative skips the row; a negative dst_slots entry too).
    parents: [B, N], parents[b, n] in [-1, n-1]; -1 means node n hangs off the committed history.
    dst_slots, src_slots: [B]. Indices int32 or int64, on conv_state's device.

    Row b writes node nodes[b]'s window -- the last K-1 inputs on the path history -> root -> ...
    -> node -- into conv_state[:, dst_slots[b]]. With chain parents (parents[b, n] = n-1) this is
    ``scatter`` with steps = nodes, bit for bit. Out-of-range indices, and parent links outside
    [-1, n-1] met on the walk, skip the row; ``index_checks()`` raises instead. conv_state and
    state_layout as in ``scatter``. Same as ``torch.ops.convwin.scatter_tree``; eager calls take
    the same fast path as ``scatter``'s (see _EAGER_SCATTER_TREE).
    """
    device = _eager_device(_SCATTER_TREE_OP, ("conv_state", "rows", "dst_slots", "src_slots", "nodes", "parents"),
                           conv_state, rows, dst_slots, src_slots, nodes, parents)
    if device is None:
        torch.ops.convwin.scatter_tree(
            conv_state, rows, dst_slots, src_slots, nodes, parents, state_layout=state_layout
        )
        return
    signature = _eager_signature(state_layout, conv_state, rows, dst_slots, src_slots, nodes, parents)
    plan = _EAGER_SCATTER_TREE.get(signature)
    if plan is None:  # as in scatter
        sizes = check_scatter_tree_args(conv_state, rows, dst_slots, src_slots, nodes, parents, state_layout)
        if device == "cpu":
            launch = cpu.scatter_tree_cpu
        else:
            state = _kernel_state(conv_state, state_layout)
            launch = triton_kernels().planned_scatter_tree(state, rows, dst_slots, src_slots, nodes, parents)
        plan = _remember(_EAGER_SCATTER_TREE, signature, (sizes, launch))
    sizes, launch = plan
    _run_scatter_tree(launch, conv_state, rows, dst_slots, src_slots, nodes, parents, state_layout, sizes)


# ---------------------------------------------------------------------------------------------
# capture and causal_conv1d_verify: fill the buffer during the verify pass
# ---------------------------------------------------------------------------------------------

_CAPTURE = "convwin.capture"
_VERIFY = "convwin.causal_conv1d_verify"


def _kernel_views(buffer, conv_state, layout, state_layout):
    """What the kernels see: the buffer as rows [L, M, N+K-2, dim] (dense: windows as they are),
    and the state as [L, N_state, dim, K-1]. Views only, never copies."""
    dest = buffer.transpose(-1, -2) if layout == CHANNEL_MAJOR else buffer
    return dest, _kernel_state(conv_state, state_layout)


def _run_capture(kernel, buffer, conv_state, x, buffer_slots, state_slots, layer, layout, parents, state_layout):
    sizes = check_capture_args(
        _CAPTURE, buffer, conv_state, x, buffer_slots, state_slots, layer, layout, parents, state_layout
    )
    check_no_shared_storages(_CAPTURE, "buffer", buffer, conv_state=conv_state, x=x)
    if should_check_index_values(buffer):
        check_capture_index_values(_CAPTURE, sizes, buffer_slots, state_slots, parents)
    dest, state = _kernel_views(buffer, conv_state, layout, state_layout)
    kernel(dest, state, x, buffer_slots, state_slots, layer, parents, dense=layout == DENSE)


@torch.library.custom_op("convwin::capture", mutates_args=("buffer",), device_types="cpu")
def _capture(
    buffer: torch.Tensor,
    conv_state: torch.Tensor,
    x: torch.Tensor,
    buffer_slots: torch.Tensor,
    state_slots: torch.Tensor,
    layer: int,
    parents: torch.Tensor | None = None,
    *,
    layout: str = DEFAULT_LAYOUT,
    state_layout: str = DIM_MAJOR,
) -> None:
    _run_capture(
        cpu.capture_cpu, buffer, conv_state, x, buffer_slots, state_slots, layer, layout, parents, state_layout
    )


@_capture.register_kernel("cuda")
def _capture_triton(
    buffer, conv_state, x, buffer_slots, state_slots, layer, parents=None, *,
    layout=DEFAULT_LAYOUT, state_layout=DIM_MAJOR,
):
    launch = triton_kernels().launch_capture
    _run_capture(launch, buffer, conv_state, x, buffer_slots, state_slots, layer, layout, parents, state_layout)


@_capture.register_fake
def _capture_fake(
    buffer, conv_state, x, buffer_slots, state_slots, layer, parents=None, *,
    layout=DEFAULT_LAYOUT, state_layout=DIM_MAJOR,
):
    check_capture_args(
        _CAPTURE, buffer, conv_state, x, buffer_slots, state_slots, layer, layout, parents, state_layout
    )


def capture(
    buffer: torch.Tensor,
    conv_state: torch.Tensor,
    x: torch.Tensor,
    buffer_slots: torch.Tensor,
    state_slots: torch.Tensor,
    layer: int,
    parents: torch.Tensor | None = None,
    *,
    layout: str = DEFAULT_LAYOUT,
    state_layout: str = DIM_MAJOR,
) -> None:
    """Write one layer's verify-pass conv inputs into the window buffer (one launch).

    buffer: the WHOLE physical buffer of ``layout`` (from ``alloc_windows(..., num_draft=N)``):
        token_major [L, M, N+K-2, dim], channel_major [L, M, dim, N+K-2], dense [L, M, N, dim, K-1];
        any strides. Pass the whole buffer and ``layer``, not a per-layer view: under torch.compile
        a mutated view costs a clone of its base.
    conv_state: the engine's state, [L, N_state, dim, K-1] (or [L, N_state, K-1, dim] with
        state_layout="window_major"), read only: slot state_slots[b] holds request b's committed
        inputs (K-1, oldest first).
    x: [B, N, dim], any strides: the conv inputs of the N draft tokens (or tree nodes) of each
        request, in the order engines hold them.
    buffer_slots, state_slots: [B], int32 or int64. A negative or out-of-range slot skips the row.
    parents: [B, N] or None (a chain). Only dense buffers depend on it: their window n is the K-1
        inputs of node n's path. A node with a parent link outside [-1, m-1] among the K-1 above
        it is not written. token_major / channel_major rows hold each input once (history K-2
        rows, then x[b, n] at row K-2+n), whatever the tree.

    Commit later with ``scatter(conv_state, window_view(buffer, ...), ...)`` for chains or
    ``scatter_tree(conv_state, rows, ...)`` for trees. Same as ``torch.ops.convwin.capture``.
    """
    device = _eager_device(_CAPTURE, ("buffer", "conv_state", "x", "buffer_slots", "state_slots"),
                           buffer, conv_state, x, buffer_slots, state_slots)
    if device is not None and (parents is None or type(parents) in _PLAIN_TENSORS):
        kernel = cpu.capture_cpu if device == "cpu" else triton_kernels().launch_capture
        _run_capture(kernel, buffer, conv_state, x, buffer_slots, state_slots, layer, layout, parents, state_layout)
    else:
        torch.ops.convwin.capture(
            buffer, conv_state, x, buffer_slots, state_slots, layer, parents,
            layout=layout, state_layout=state_layout,
        )


def _run_verify(
    kernel, out, buffer, conv_state, x, weight, bias, buffer_slots, state_slots, layer,
    layout, parents, activation, state_layout,
):
    sizes = check_capture_args(
        _VERIFY, buffer, conv_state, x, buffer_slots, state_slots, layer, layout, parents, state_layout
    )
    out = check_verify_args(_VERIFY, sizes, out, weight, bias, activation, conv_state.device, layer)
    check_no_shared_storages(_VERIFY, "buffer", buffer, conv_state=conv_state, x=x)
    check_no_shared_storages(_VERIFY, "out", out, buffer=buffer, conv_state=conv_state, x=x, weight=weight, bias=bias)
    if should_check_index_values(buffer):
        check_capture_index_values(_VERIFY, sizes, buffer_slots, state_slots, parents)
    dest, state = _kernel_views(buffer, conv_state, layout, state_layout)
    kernel(
        out, dest, state, x, weight, bias, buffer_slots, state_slots, layer, parents,
        dense=layout == DENSE, silu=activation is not None,
    )


@torch.library.custom_op(
    "convwin::causal_conv1d_verify", mutates_args=("out", "buffer"), device_types="cpu"
)
def _causal_conv1d_verify(
    out: torch.Tensor,
    buffer: torch.Tensor,
    conv_state: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    buffer_slots: torch.Tensor,
    state_slots: torch.Tensor,
    layer: int,
    parents: torch.Tensor | None = None,
    *,
    layout: str = DEFAULT_LAYOUT,
    activation: str | None = None,
    state_layout: str = DIM_MAJOR,
) -> None:
    _run_verify(
        cpu.causal_conv1d_verify_cpu, out, buffer, conv_state, x, weight, bias, buffer_slots,
        state_slots, layer, layout, parents, activation, state_layout,
    )


@_causal_conv1d_verify.register_kernel("cuda")
def _causal_conv1d_verify_triton(
    out, buffer, conv_state, x, weight, bias, buffer_slots, state_slots, layer, parents=None, *,
    layout=DEFAULT_LAYOUT, activation=None, state_layout=DIM_MAJOR,
):
    _run_verify(
        triton_kernels().launch_causal_conv1d_verify, out, buffer, conv_state, x, weight, bias,
        buffer_slots, state_slots, layer, layout, parents, activation, state_layout,
    )


@_causal_conv1d_verify.register_fake
def _causal_conv1d_verify_fake(
    out, buffer, conv_state, x, weight, bias, buffer_slots, state_slots, layer, parents=None, *,
    layout=DEFAULT_LAYOUT, activation=None, state_layout=DIM_MAJOR,
):
    sizes = check_capture_args(
        _VERIFY, buffer, conv_state, x, buffer_slots, state_slots, layer, layout, parents, state_layout
    )
    check_verify_args(_VERIFY, sizes, out, weight, bias, activation, conv_state.device, layer)


def causal_conv1d_verify(
    out: torch.Tensor,
    buffer: torch.Tensor,
    conv_state: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    buffer_slots: torch.Tensor,
    state_slots: torch.Tensor,
    layer: int,
    parents: torch.Tensor | None = None,
    *,
    layout: str = DEFAULT_LAYOUT,
    activation: str | None = None,
    state_layout: str = DIM_MAJOR,
) -> None:
    """The verify pass's depthwise causal conv1d of the draft tokens, fused with ``capture``.

    out[b, n] = act(bias + sum_k weight[:, k] * input k), over the K inputs of node n's path
    ending at n (the committed inputs of conv_state slot state_slots[b], then the drafts on the
    way from the root; weight[:, K-1] multiplies x[b, n] itself). Accumulates in float32.

    out: every layer's output [L, B, N, dim], of which layer ``layer`` is written (pass it whole,
        as the buffer: a slice out[layer] of it is a view at a symbolic storage offset under
        torch.compile(dynamic=True), which Inductor would write at offset 0, so the op refuses it
        there), or one layer's [B, N, dim]; any strides, any float dtype. weight: [dim, K];
    bias: [dim] or None; activation: None or "silu" ("swish"). Everything else as in
    ``capture``, which this writes bit-identically in the same pass. conv_state is not modified:
    commit the accepted window afterwards with ``scatter`` / ``scatter_tree``. Rows skipped by
    capture write no output either (out keeps its values there), and so do nodes with a bad
    parent link. Same as ``torch.ops.convwin.causal_conv1d_verify``.
    """
    device = _eager_device(_VERIFY, ("out", "buffer", "conv_state", "x", "weight", "buffer_slots", "state_slots"),
                           out, buffer, conv_state, x, weight, buffer_slots, state_slots)
    if device is not None and all(t is None or type(t) in _PLAIN_TENSORS for t in (bias, parents)):
        kernel = cpu.causal_conv1d_verify_cpu if device == "cpu" else triton_kernels().launch_causal_conv1d_verify
        _run_verify(
            kernel, out, buffer, conv_state, x, weight, bias, buffer_slots, state_slots, layer,
            layout, parents, activation, state_layout,
        )
    else:
        torch.ops.convwin.causal_conv1d_verify(
            out, buffer, conv_state, x, weight, bias, buffer_slots, state_slots, layer, parents,
            layout=layout, activation=activation, state_layout=state_layout,
        )
