"""The ``torch.ops.convwin`` operators of the window cache: ``alloc``, and the commit and verify
ops, each declared once with ``declare_op`` (declare.py: the registered op, its fake, its CPU and
CUDA implementations and the public function) from its public signature and its ``prepare``,
the op's one validation.

Every op is destination-passing where it writes (it returns None) and never allocates, syncs or
produces data-dependent shapes, except ``alloc``, the factory op that creates the buffer.
"""

from __future__ import annotations

import torch

from . import cpu
from .declare import declare_op
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
    check_capture_args,
    check_capture_index_values,
    check_no_shared_storage,
    check_no_shared_storages,
    check_scatter_args,
    check_scatter_index_values,
    check_scatter_tree_args,
    check_scatter_tree_index_values,
    check_verify_args,
    layer_output,
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

    Shapes (W = K-1, S = N+K-2): dense [L, M, N, dim, W], channel_major [L, M, dim, S],
    token_major [L, M, S, dim]. Read it through ``window_view(buffer, layout, N, K)``.
    """
    _alloc_shape(num_layers, num_slots, dim, num_draft, kernel_size, layout, dtype)  # clear errors first
    device = torch.get_default_device() if device is None else torch.device(device)
    return torch.ops.convwin.alloc(
        num_layers, num_slots, dim, num_draft, kernel_size, layout, dtype, device
    )


# ---------------------------------------------------------------------------------------------
# scatter: commit the accepted windows
# ---------------------------------------------------------------------------------------------

_SCATTER = "convwin.scatter"
_SCATTER_TREE = "convwin.scatter_tree"
_CAPTURE = "convwin.capture"
_VERIFY = "convwin.causal_conv1d_verify"


def _kernel_state(conv_state: torch.Tensor, state_layout: str) -> torch.Tensor:
    """Kernels see every state as [L, N, dim, K-1]; a window-major one is a transposed view."""
    return conv_state.transpose(2, 3) if state_layout == WINDOW_MAJOR else conv_state


def _prepare_scatter(real, conv_state, windows, dst_slots, src_slots, steps, state_layout, sizes=None):
    """``sizes``: this call signature's, checked before (the eager plan); then only the checks
    that depend on the tensors' storage run (see declare.py)."""
    if sizes is None:
        sizes = check_scatter_args(conv_state, windows, dst_slots, src_slots, steps, state_layout)
    if real:
        check_no_shared_storage(_SCATTER, "conv_state", conv_state, "windows", windows)
        if should_check_index_values(conv_state):
            check_scatter_index_values(sizes, dst_slots, src_slots, steps)
    return (_kernel_state(conv_state, state_layout), windows, dst_slots, src_slots, steps), {}, sizes


@declare_op(mutates=("conv_state",), prepare=_prepare_scatter, cpu=cpu.scatter_cpu,
            cuda="launch_scatter", eager_plan="planned_scatter")
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
    windows: [L, M, N, dim, K-1], any strides: a dense buffer or a ``window_view`` of any layout.
    dst_slots, src_slots, steps: [B], int32 or int64, on conv_state's device. Negative step or
        destination skips the row (pad batches with -1). Out-of-range values skip the row too;
        ``sgl_convwin.index_checks()`` turns them into an IndexError (host sync, for debugging).

    Same as ``torch.ops.convwin.scatter``; eager calls skip the dispatcher (see declare.eager_device)
    and repeat only the per-tensor checks for a signature already seen (see declare_op's
    eager_plan), launching the compiled kernel directly.
    """


# ---------------------------------------------------------------------------------------------
# scatter_tree: commit the accepted node of a tree draft
# ---------------------------------------------------------------------------------------------


def _prepare_scatter_tree(real, conv_state, rows, dst_slots, src_slots, nodes, parents, state_layout, sizes=None):
    """As _prepare_scatter."""
    if sizes is None:
        sizes = check_scatter_tree_args(conv_state, rows, dst_slots, src_slots, nodes, parents, state_layout)
    if real:
        check_no_shared_storage(_SCATTER_TREE, "conv_state", conv_state, "rows", rows)
        if should_check_index_values(conv_state):
            check_scatter_tree_index_values(sizes, dst_slots, src_slots, nodes, parents)
    args = (_kernel_state(conv_state, state_layout), rows, dst_slots, src_slots, nodes, parents)
    return args, {}, sizes


@declare_op(mutates=("conv_state",), prepare=_prepare_scatter_tree, cpu=cpu.scatter_tree_cpu,
            cuda="launch_scatter_tree", eager_plan="planned_scatter_tree")
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
    the same fast path as ``scatter``'s (see declare_op's eager_plan).
    """


# ---------------------------------------------------------------------------------------------
# capture and causal_conv1d_verify: fill the buffer during the verify pass
# ---------------------------------------------------------------------------------------------


def _kernel_views(buffer, conv_state, layout, state_layout):
    """What the kernels see: the buffer as rows [L, M, N+K-2, dim] (dense: windows as they are),
    and the state as [L, R, dim, K-1]. Views only, never copies."""
    dest = buffer.transpose(-1, -2) if layout == CHANNEL_MAJOR else buffer
    return dest, _kernel_state(conv_state, state_layout)


def _prepare_capture(
    real, buffer, conv_state, x, buffer_slots, state_slots, layer, parents, layout, state_layout, sizes=None,
):
    """As _prepare_scatter."""
    if sizes is None:
        sizes = check_capture_args(
            _CAPTURE, buffer, conv_state, x, buffer_slots, state_slots, layer, layout, parents, state_layout
        )
    if real:
        check_no_shared_storages(_CAPTURE, "buffer", buffer, conv_state=conv_state, x=x)
        if should_check_index_values(buffer):
            check_capture_index_values(_CAPTURE, sizes, buffer_slots, state_slots, parents)
    dest, state = _kernel_views(buffer, conv_state, layout, state_layout)
    return (dest, state, x, buffer_slots, state_slots, layer, parents), dict(dense=layout == DENSE), sizes


@declare_op(mutates=("buffer",), prepare=_prepare_capture, cpu=cpu.capture_cpu, cuda="launch_capture",
            eager_plan="planned_capture")
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
    conv_state: the engine's state, [L, R, dim, K-1] (or [L, R, K-1, dim] with
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


def _prepare_verify(
    real, out, buffer, conv_state, x, weight, bias, buffer_slots, state_slots, layer, parents,
    layout, activation, state_layout, sizes=None,
):
    """As _prepare_scatter."""
    if sizes is None:
        sizes = check_capture_args(
            _VERIFY, buffer, conv_state, x, buffer_slots, state_slots, layer, layout, parents, state_layout
        )
        out = check_verify_args(_VERIFY, sizes, out, weight, bias, activation, conv_state.device, layer)
    else:
        out = layer_output(sizes, out, layer)
    if real:
        check_no_shared_storages(_VERIFY, "buffer", buffer, conv_state=conv_state, x=x)
        check_no_shared_storages(
            _VERIFY, "out", out, buffer=buffer, conv_state=conv_state, x=x, weight=weight, bias=bias
        )
        if should_check_index_values(buffer):
            check_capture_index_values(_VERIFY, sizes, buffer_slots, state_slots, parents)
    dest, state = _kernel_views(buffer, conv_state, layout, state_layout)
    args = (out, dest, state, x, weight, bias, buffer_slots, state_slots, layer, parents)
    return args, dict(dense=layout == DENSE, silu=activation is not None), sizes


@declare_op(mutates=("out", "buffer"), prepare=_prepare_verify, cpu=cpu.causal_conv1d_verify_cpu,
            cuda="launch_causal_conv1d_verify", eager_plan="planned_causal_conv1d_verify")
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
        there), or one layer's [B, N, dim]; any strides, float32, float16 or bfloat16. weight: [dim, K];
    bias: [dim] or None; activation: None or "silu" ("swish"). Everything else as in
    ``capture``, which this writes bit-identically in the same pass. conv_state is not modified:
    commit the accepted window afterwards with ``scatter`` / ``scatter_tree``. Rows skipped by
    capture write no output either (out keeps its values there), and so do nodes with a bad
    parent link. Same as ``torch.ops.convwin.causal_conv1d_verify``.
    """


# Checks, then ``kernel`` on what the kernels get, in the argument order tests call them with.
def _run_scatter(kernel, conv_state, windows, dst_slots, src_slots, steps, state_layout):
    args, kwargs = scatter.kernel_arguments(conv_state, windows, dst_slots, src_slots, steps, state_layout=state_layout)
    kernel(*args, **kwargs)


def _run_capture(kernel, buffer, conv_state, x, buffer_slots, state_slots, layer, layout, parents, state_layout):
    args, kwargs = capture.kernel_arguments(
        buffer, conv_state, x, buffer_slots, state_slots, layer, parents, layout=layout, state_layout=state_layout
    )
    kernel(*args, **kwargs)


def _run_verify(
    kernel, out, buffer, conv_state, x, weight, bias, buffer_slots, state_slots, layer, layout, parents,
    activation, state_layout,
):
    args, kwargs = causal_conv1d_verify.kernel_arguments(
        out, buffer, conv_state, x, weight, bias, buffer_slots, state_slots, layer, parents,
        layout=layout, activation=activation, state_layout=state_layout,
    )
    kernel(*args, **kwargs)


# the CUDA implementations, callable on CPU tensors under Triton's interpreter
_scatter_triton, _scatter_tree_triton = scatter.cuda_impl, scatter_tree.cuda_impl
_capture_triton, _causal_conv1d_verify_triton = capture.cuda_impl, causal_conv1d_verify.cuda_impl
