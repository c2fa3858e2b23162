"""Argument checks shared by every implementation of an op (fake, CPU, Triton launcher).

Everything that can be known without reading device memory (ranks, shapes, dtypes, devices,
index dtypes and lengths, aliasing) is checked here before anything is written, and raises
ValueError or TypeError naming the argument. Index VALUES are not: reading them would be a host
sync. The kernels skip out-of-range rows instead, and the checked mode (see index_checks) reads
them on the host to raise a clear error while debugging.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator, NamedTuple

import torch
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from .layout import (
    CACHE_DTYPES,
    DIM_MAJOR,
    PHYSICAL_SHAPE_TEXT,
    STATE_LAYOUTS,
    WINDOW_MAJOR,
    physical_shape_unchecked,
)

INDEX_DTYPES = (torch.int32, torch.int64)

# ---------------------------------------------------------------------------------------------
# Checked mode
# ---------------------------------------------------------------------------------------------

CHECK_ENV = "SGL_CONVWIN_CHECK_INDICES"
_index_checks = os.environ.get(CHECK_ENV, "0").lower() not in ("", "0", "false", "no", "off")


def index_checks_enabled() -> bool:
    """Whether eager calls read their index values on the host and reject out-of-range ones."""
    return _index_checks


def set_index_checks(enabled: bool) -> None:
    """Turn the checked mode on or off (it starts on when SGL_CONVWIN_CHECK_INDICES=1)."""
    global _index_checks
    _index_checks = bool(enabled)


@contextlib.contextmanager
def index_checks(enabled: bool = True) -> Iterator[None]:
    """``with sgl_convwin.index_checks(): ...`` runs the block in checked mode."""
    previous = index_checks_enabled()
    set_index_checks(enabled)
    try:
        yield
    finally:
        set_index_checks(previous)


def should_check_index_values(*tensors: torch.Tensor) -> bool:
    """Checked mode applies to eager calls on real tensors, never during CUDA-graph capture."""
    if not _index_checks:
        return False
    if any(t.is_cuda for t in tensors) and torch.cuda.is_current_stream_capturing():
        return False  # a host read would break the capture
    return True


# ---------------------------------------------------------------------------------------------
# scatter
# ---------------------------------------------------------------------------------------------


class ScatterSizes(NamedTuple):
    num_layers: int  # L
    num_state_slots: int  # R
    dim: int
    width: int  # K-1
    num_src_slots: int  # M
    num_draft: int  # N
    num_rows: int  # B


def check_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_cache_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in CACHE_DTYPES:
        raise TypeError(
            f"{name} must be float32, float16 or bfloat16, got {t.dtype} "
            f"(shape {tuple(t.shape)}, device {t.device})"
        )


def check_index_tensors(op: str, device: torch.device, names: tuple[str, ...], *indices: torch.Tensor,
                        owner: str = "conv_state") -> int:
    """Index tensors are 1-D, int32/int64, of one length, on ``device`` (``owner``'s); returns that length."""
    length = None
    for name, t in zip(names, indices):
        if not isinstance(t, torch.Tensor):
            check_tensor(f"{op}: {name}", t)
        if t.dtype not in INDEX_DTYPES:
            raise TypeError(f"{op}: {name} must be int32 or int64, got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{op}: {name} must be 1-D [B], got shape {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(
                f"{op}: {name} is on {t.device} but {owner} is on {device}; index tensors "
                f"must live on the cache's device (moving them would be a host sync)"
            )
        if length is None:
            length = t.shape[0]
        elif t.shape[0] != length:
            raise ValueError(
                f"{op}: {name} has {t.shape[0]} rows but {names[0]} has {length}; "
                f"all index tensors must have the same length B"
            )
    assert length is not None
    return length


def _may_overlap(t: torch.Tensor) -> bool:
    """Whether two of t's elements may share a memory location. PyTorch's check answers "too hard"
    for views such as unfold's; then each dimension's stride must pass the span of the dimensions
    with smaller strides (every permuted or sliced dense tensor does; an exotic interleaving that
    fails it is refused too)."""
    answer = torch._debug_has_internal_overlap(t)
    if answer != 2:
        return answer == 1
    span = 0  # the largest offset the dimensions so far reach
    for stride, size in sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size > 1):
        if stride <= span:
            return True
        span += (size - 1) * stride
    return False


def check_writable(op: str, name: str, t: torch.Tensor) -> None:
    """A destination the op may write in place: no overlapping elements (e.g. made by expand, it
    cannot be written row by row), no autograd history to corrupt (the ops have no derivative; a
    cache never requires grad), and not an inference tensor outside inference mode (the Triton
    kernel writes through a raw pointer, so PyTorch's own check would not fire on the GPU)."""
    if not t.is_contiguous() and _may_overlap(t):  # (contiguous: never)
        raise ValueError(
            f"{op}: {name} has overlapping elements (strides {t.stride()}, e.g. from expand); "
            f"it must be a writable tensor with one memory location per element"
        )
    if t.requires_grad:
        raise ValueError(
            f"{op}: {name} requires grad; the ops write it in place and have no derivative, so it "
            f"must not (allocate it with requires_grad=False, or pass {name}.detach())"
        )
    offset = t.storage_offset()
    if type(offset) is not int and not is_concrete_int(offset):
        # Inductor rebuilds a mutated view from its base and a symbolic storage offset that it
        # lowers to 0 (pytorch/pytorch#198068): the op would silently write at the base's start.
        raise ValueError(
            f"{op}: {name} is a view at a symbolic storage offset ({offset}) inside a graph compiled "
            f"with dynamic shapes; Inductor would write it at offset 0 of the tensor it was cut "
            f"from (pytorch/pytorch#198068). Pass the whole tensor instead (the ops take a layer "
            f"index and slot indices for that), or compile with dynamic=False"
        )
    # (declare.py's eager plans send such a tensor here instead of skipping this check)
    if t.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(
            f"{op}: {name} is an inference tensor (made under torch.inference_mode()); it can only "
            f"be written in place inside inference mode"
        )


def check_no_shared_storage(op: str, dst_name: str, dst: torch.Tensor, src_name: str, src: torch.Tensor) -> None:
    """Real tensors only: a destination that shares memory with a source would be read while written."""
    dst_storage = dst.untyped_storage()
    if src.untyped_storage().data_ptr() == dst_storage.data_ptr() and dst_storage.nbytes() > 0:
        raise ValueError(f"{op}: {dst_name} and {src_name} share storage; they must be separate buffers")


def check_no_shared_storages(op: str, dst_name: str, dst: torch.Tensor, **sources: torch.Tensor | None) -> None:
    """check_no_shared_storage against several sources (by keyword; None is skipped), reading the
    destination's storage once (the verify op has five sources, on every eager call)."""
    dst_storage = dst.untyped_storage()
    dst_ptr = dst_storage.data_ptr()
    for src_name, src in sources.items():
        if src is not None and src.untyped_storage().data_ptr() == dst_ptr and dst_storage.nbytes() > 0:
            raise ValueError(f"{op}: {dst_name} and {src_name} share storage; they must be separate buffers")


_SCATTER = "convwin.scatter"
_SCATTER_INDICES = ("dst_slots", "src_slots", "steps")
_STATE_DESC = {DIM_MAJOR: "[L, R, dim, K-1]", WINDOW_MAJOR: "[L, R, K-1, dim]"}  # R: request (state) slots


def check_scatter_args(
    conv_state: torch.Tensor,
    windows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    steps: torch.Tensor,
    state_layout: str,
) -> ScatterSizes:
    """Validate a scatter call (see ops.scatter) and return its sizes.

    Runs on every eager call, so the passing path is kept short; messages are built on failure.
    """
    op = _SCATTER
    if not isinstance(conv_state, torch.Tensor):
        check_tensor(f"{op}: conv_state", conv_state)
    if not isinstance(windows, torch.Tensor):
        check_tensor(f"{op}: windows", windows)
    state_desc = _STATE_DESC.get(state_layout)
    if state_desc is None:
        raise ValueError(f"{op}: state_layout must be one of {STATE_LAYOUTS}, got {state_layout!r}")
    state_shape, window_shape = conv_state.shape, windows.shape
    if len(state_shape) != 4:
        raise ValueError(
            f"{op}: conv_state must be 4-D {state_desc} (state_layout={state_layout!r}), "
            f"got shape {tuple(state_shape)}"
        )
    if len(window_shape) != 5:
        raise ValueError(
            f"{op}: windows must be 5-D [L, M, N, dim, K-1] (a dense buffer or a window_view), "
            f"got shape {tuple(window_shape)}"
        )
    if conv_state.dtype not in CACHE_DTYPES:
        check_cache_dtype(f"{op}: conv_state", conv_state)
    if windows.dtype not in CACHE_DTYPES:
        check_cache_dtype(f"{op}: windows", windows)
    device = conv_state.device
    if windows.device != device:
        raise ValueError(f"{op}: windows is on {windows.device} but conv_state is on {device}")
    if state_layout == DIM_MAJOR:
        num_layers, num_state_slots, dim, width = state_shape
    else:
        num_layers, num_state_slots, width, dim = state_shape
    w_layers, num_src_slots, num_draft, w_dim, w_width = window_shape
    if w_layers != num_layers or w_dim != dim or w_width != width:
        for what, got, expected in (
            ("layers (axis 0)", w_layers, num_layers),
            ("dim (axis 3)", w_dim, dim),
            ("K-1 (axis 4)", w_width, width),
        ):
            if got != expected:
                raise ValueError(
                    f"{op}: windows {what} is {got} but conv_state has {expected} "
                    f"(windows shape {tuple(window_shape)}, conv_state shape "
                    f"{tuple(state_shape)} read as {state_desc})"
                )
    if width < 1:
        raise ValueError(f"{op}: K-1 must be >= 1, got conv_state shape {tuple(state_shape)}")
    check_writable(op, "conv_state", conv_state)
    num_rows = check_index_tensors(op, device, _SCATTER_INDICES, dst_slots, src_slots, steps)
    return ScatterSizes(num_layers, num_state_slots, dim, width, num_src_slots, num_draft, num_rows)


def _check_parents(op: str, parents, device, num_rows: int, num_nodes: int, shape_hint: str,
                   owner: str = "conv_state") -> None:
    """parents: a [B, N] int32/int64 tensor on the cache's device (shape_hint says where B, N come from)."""
    if not isinstance(parents, torch.Tensor):
        check_tensor(f"{op}: parents", parents)
    if parents.dtype not in INDEX_DTYPES:
        raise TypeError(f"{op}: parents must be int32 or int64, got {parents.dtype}")
    if parents.device != device:
        raise ValueError(f"{op}: parents is on {parents.device} but {owner} is on {device}")
    if parents.dim() != 2 or parents.shape[0] != num_rows or parents.shape[1] != num_nodes:
        raise ValueError(
            f"{op}: parents must be [B, N] = [{num_rows}, {num_nodes}] ({shape_hint}), "
            f"got shape {tuple(parents.shape)}"
        )


def _state_sizes(op: str, conv_state: torch.Tensor, state_layout: str) -> tuple[int, int, int, int, str]:
    """Check conv_state's layout name, rank, dtype and window width; return (L, R, dim,
    K-1, how it was read)."""
    state_desc = _STATE_DESC.get(state_layout)
    if state_desc is None:
        raise ValueError(f"{op}: state_layout must be one of {STATE_LAYOUTS}, got {state_layout!r}")
    if conv_state.dim() != 4:
        raise ValueError(
            f"{op}: conv_state must be 4-D {state_desc} (state_layout={state_layout!r}), "
            f"got shape {tuple(conv_state.shape)}"
        )
    if conv_state.dtype not in CACHE_DTYPES:  # (messages are built only on failure)
        check_cache_dtype(f"{op}: conv_state", conv_state)
    if state_layout == DIM_MAJOR:
        num_layers, num_state_slots, dim, width = conv_state.shape
    else:
        num_layers, num_state_slots, width, dim = conv_state.shape
    if width < 1:
        raise ValueError(f"{op}: K-1 must be >= 1, got conv_state shape {tuple(conv_state.shape)}")
    return num_layers, num_state_slots, dim, width, state_desc


class ScatterTreeSizes(NamedTuple):
    num_layers: int  # L
    num_state_slots: int  # R
    dim: int
    width: int  # K-1
    num_src_slots: int  # M
    num_nodes: int  # N
    num_rows: int  # B


_SCATTER_TREE = "convwin.scatter_tree"
_SCATTER_TREE_INDICES = ("dst_slots", "src_slots", "nodes")


def check_scatter_tree_args(
    conv_state: torch.Tensor,
    rows: torch.Tensor,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    nodes: torch.Tensor,
    parents: torch.Tensor,
    state_layout: str,
) -> ScatterTreeSizes:
    """Validate a scatter_tree call (see ops.scatter_tree) and return its sizes."""
    op = _SCATTER_TREE
    for name, value in (("conv_state", conv_state), ("rows", rows), ("parents", parents)):
        if not isinstance(value, torch.Tensor):
            check_tensor(f"{op}: {name}", value)
    num_layers, num_state_slots, dim, width, state_desc = _state_sizes(op, conv_state, state_layout)
    if rows.dim() != 4:
        raise ValueError(
            f"{op}: rows must be 4-D [L, M, N+K-2, dim] (a token_major buffer, or a channel_major "
            f"one seen through .transpose(-1, -2)), got shape {tuple(rows.shape)}"
        )
    check_cache_dtype(f"{op}: rows", rows)
    device = conv_state.device
    if rows.device != device:
        raise ValueError(f"{op}: rows is on {rows.device} but conv_state is on {device}")
    r_layers, num_src_slots, num_positions, r_dim = rows.shape
    for what, got, expected in (("layers (axis 0)", r_layers, num_layers), ("dim (axis 3)", r_dim, dim)):
        if got != expected:
            raise ValueError(
                f"{op}: rows {what} is {got} but conv_state has {expected} (rows shape "
                f"{tuple(rows.shape)}, conv_state shape {tuple(conv_state.shape)} read as {state_desc})"
            )
    num_nodes = num_positions - (width - 1)
    if num_nodes < 1:
        raise ValueError(
            f"{op}: rows axis 2 must hold K-2 = {width - 1} history rows and at least one node, "
            f"got {num_positions} (rows shape {tuple(rows.shape)})"
        )
    check_writable(op, "conv_state", conv_state)
    num_rows = check_index_tensors(op, device, _SCATTER_TREE_INDICES, dst_slots, src_slots, nodes)
    _check_parents(op, parents, device, num_rows, num_nodes, "B rows, N = rows axis 2 minus K-2 history rows")
    return ScatterTreeSizes(num_layers, num_state_slots, dim, width, num_src_slots, num_nodes, num_rows)


def check_parent_links(op: str, row: int, links: list[int]) -> None:
    """Checked mode: every parent link of one row lies in [-1, n-1] (else an IndexError naming it)."""
    for node, parent in enumerate(links):
        if not -1 <= parent < node:
            raise IndexError(
                f"{op}: parents[{row}, {node}] = {parent}; a node's parent must be an earlier node "
                f"(0..{node - 1}) or -1 for the committed history"
            )


def _check_active_rows(
    op: str,
    source: str,
    num_state_slots: int,
    num_src_slots: int,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    accepted_name: str,
    accepted: torch.Tensor,
    num_accepted: int,
    accepted_what: str,
    check_row: Callable[[int], None] | None = None,
) -> None:
    """Checked mode: raise IndexError naming the first bad active row (host sync; for debugging).

    A row is active when its accepted index (step or node) and its destination are >= 0.
    """
    dst, src, taken = dst_slots.tolist(), src_slots.tolist(), accepted.tolist()
    committed_from: dict[int, int] = {}
    for row in range(len(taken)):
        if taken[row] < 0 or dst[row] < 0:
            continue  # a skipped row
        if dst[row] >= num_state_slots:
            raise IndexError(
                f"{op}: dst_slots[{row}] = {dst[row]} is out of range for conv_state with "
                f"{num_state_slots} slots (expected 0..{num_state_slots - 1}, or negative to "
                f"skip the row)"
            )
        if not 0 <= src[row] < num_src_slots:
            raise IndexError(
                f"{op}: src_slots[{row}] = {src[row]} is out of range for {source} with "
                f"{num_src_slots} slots (expected 0..{num_src_slots - 1})"
            )
        if taken[row] >= num_accepted:
            raise IndexError(
                f"{op}: {accepted_name}[{row}] = {taken[row]} is out of range for {num_accepted} "
                f"{accepted_what} (expected 0..{num_accepted - 1}, or negative to skip the row)"
            )
        if check_row is not None:
            check_row(row)
        if dst[row] in committed_from:
            raise IndexError(
                f"{op}: rows {committed_from[dst[row]]} and {row} both commit into conv_state "
                f"slot {dst[row]}; which one lands would be unspecified"
            )
        committed_from[dst[row]] = row


def check_scatter_index_values(
    sizes: ScatterSizes, dst_slots: torch.Tensor, src_slots: torch.Tensor, steps: torch.Tensor
) -> None:
    """Checked mode for scatter (see _check_active_rows)."""
    _check_active_rows(
        _SCATTER, "windows", sizes.num_state_slots, sizes.num_src_slots,
        dst_slots, src_slots, "steps", steps, sizes.num_draft, "draft steps",
    )


def check_scatter_tree_index_values(
    sizes: ScatterTreeSizes,
    dst_slots: torch.Tensor,
    src_slots: torch.Tensor,
    nodes: torch.Tensor,
    parents: torch.Tensor,
) -> None:
    """Checked mode for scatter_tree: also every parent link of an active row."""
    links = parents.tolist()

    def check_links(row: int) -> None:
        check_parent_links(_SCATTER_TREE, row, links[row])

    _check_active_rows(
        _SCATTER_TREE, "rows", sizes.num_state_slots, sizes.num_src_slots,
        dst_slots, src_slots, "nodes", nodes, sizes.num_nodes, "draft nodes", check_links,
    )


# ---------------------------------------------------------------------------------------------
# capture and causal_conv1d_verify
# ---------------------------------------------------------------------------------------------


class CaptureSizes(NamedTuple):
    num_layers: int  # L
    num_state_slots: int  # R
    dim: int
    width: int  # K-1
    num_buffer_slots: int  # M
    num_nodes: int  # N (draft tokens or tree nodes)
    num_rows: int  # B


_CAPTURE_INDICES = ("buffer_slots", "state_slots")


def check_capture_args(
    op: str,
    buffer: torch.Tensor,
    conv_state: torch.Tensor,
    x: torch.Tensor,
    buffer_slots: torch.Tensor,
    state_slots: torch.Tensor,
    layer: int,
    layout: str,
    parents: torch.Tensor | None,
    state_layout: str,
) -> CaptureSizes:
    """Validate the arguments capture and causal_conv1d_verify share, and return their sizes."""
    for name, value in (("buffer", buffer), ("conv_state", conv_state), ("x", x)):
        if not isinstance(value, torch.Tensor):
            check_tensor(f"{op}: {name}", value)
    if layout not in PHYSICAL_SHAPE_TEXT:
        raise ValueError(f"{op}: layout must be one of {tuple(PHYSICAL_SHAPE_TEXT)}, got {layout!r}")
    buffer_desc = PHYSICAL_SHAPE_TEXT[layout].format(n="N")
    num_layers, num_state_slots, dim, width, state_desc = _state_sizes(op, conv_state, state_layout)
    if x.dim() != 3:
        raise ValueError(f"{op}: x must be 3-D [B, N, dim] (the draft tokens' conv inputs), got shape {tuple(x.shape)}")
    device = conv_state.device
    for name, t in (("buffer", buffer), ("x", x)):
        if t.dtype not in CACHE_DTYPES:
            check_cache_dtype(f"{op}: {name}", t)
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but conv_state is on {device}")
    num_rows, num_nodes, x_dim = x.shape
    if x_dim != dim:
        raise ValueError(
            f"{op}: x has dim {x_dim} (axis 2) but conv_state has {dim} (shape "
            f"{tuple(conv_state.shape)} read as {state_desc})"
        )
    if num_nodes < 1:
        raise ValueError(f"{op}: x must hold at least one draft token (axis 1), got shape {tuple(x.shape)}")
    kernel_size = width + 1
    buffer_shape = buffer.shape
    num_buffer_slots = buffer_shape[1] if len(buffer_shape) > 1 else 0
    expected = physical_shape_unchecked(layout, num_layers, num_buffer_slots, dim, num_nodes, kernel_size)
    if buffer_shape != expected:
        wanted = list(expected)
        wanted[1] = "M"
        raise ValueError(
            f"{op}: a {layout} buffer for L={num_layers}, N={num_nodes} draft tokens (x axis 1), "
            f"dim={dim}, K={kernel_size} (conv_state) must be {buffer_desc} = "
            f"[{', '.join(map(str, wanted))}], got shape {tuple(buffer.shape)}"
        )
    if isinstance(layer, bool) or not isinstance(layer, (int, torch.SymInt)):
        raise TypeError(f"{op}: layer must be an int, got {type(layer).__name__}")
    if not 0 <= layer < num_layers:
        raise ValueError(f"{op}: layer {layer} is out of range for {num_layers} layers (expected 0..{num_layers - 1})")
    check_writable(op, "buffer", buffer)
    check_index_tensors(op, device, _CAPTURE_INDICES, buffer_slots, state_slots)
    if buffer_slots.shape[0] != num_rows:
        raise ValueError(
            f"{op}: buffer_slots and state_slots have {buffer_slots.shape[0]} rows but x has "
            f"{num_rows} (axis 0); there is one slot pair per request"
        )
    if parents is not None:
        _check_parents(op, parents, device, num_rows, num_nodes, "x is [B, N, dim]")
    return CaptureSizes(num_layers, num_state_slots, dim, width, num_buffer_slots, num_nodes, num_rows)


ACTIVATIONS = (None, "silu", "swish")


def check_verify_args(
    op: str,
    sizes: CaptureSizes,
    out: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    device: torch.device,
    layer: int,
) -> torch.Tensor:
    """The arguments causal_conv1d_verify adds to capture's; returns the layer's output [B, N, dim]
    (``out`` itself, or ``out[layer]`` when the whole [L, B, N, dim] output is passed)."""
    for name, value in (("out", out), ("weight", weight)):
        if not isinstance(value, torch.Tensor):
            check_tensor(f"{op}: {name}", value)
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be None, 'silu' or 'swish', got {activation!r}")
    kernel_size = sizes.width + 1
    expected_out = (sizes.num_rows, sizes.num_nodes, sizes.dim)
    written = out  # what the op writes (and the checks below see as a destination)
    out = layer_output(sizes, out, layer)
    if out.shape != expected_out:
        raise ValueError(
            f"{op}: out must be [B, N, dim] = {list(expected_out)} like x, or every layer's output "
            f"[L, B, N, dim] = {[sizes.num_layers, *expected_out]} (layer {layer} is written), got shape "
            f"{tuple(written.shape)}"
        )
    if weight.shape != (sizes.dim, kernel_size):
        raise ValueError(
            f"{op}: weight must be [dim, K] = [{sizes.dim}, {kernel_size}] (K-1 = conv_state's "
            f"window width), got shape {tuple(weight.shape)}"
        )
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            check_tensor(f"{op}: bias", bias)
        if bias.shape != (sizes.dim,):
            raise ValueError(f"{op}: bias must be [dim] = [{sizes.dim}] or None, got shape {tuple(bias.shape)}")
    for name, t in (("out", out), ("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if t.dtype not in CACHE_DTYPES:
            check_cache_dtype(f"{op}: {name}", t)
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but conv_state is on {device}")
    check_writable(op, "out", written)
    return out


def layer_output(sizes: CaptureSizes, out: torch.Tensor, layer: int) -> torch.Tensor:
    """The layer's output [B, N, dim] within ``out``: ``out[layer]`` when it holds every layer's."""
    if out.dim() == 4 and out.shape[0] == sizes.num_layers:
        return out[layer]
    return out


def check_capture_index_values(
    op: str,
    sizes: CaptureSizes,
    buffer_slots: torch.Tensor,
    state_slots: torch.Tensor,
    parents: torch.Tensor | None,
) -> None:
    """Checked mode for capture and causal_conv1d_verify: raise IndexError naming the first bad
    row of the batch (host sync; for debugging). A row is active when both slots are >= 0."""
    dst, src = buffer_slots.tolist(), state_slots.tolist()
    links = None if parents is None else parents.tolist()
    written_by: dict[int, int] = {}
    for row in range(len(dst)):
        if dst[row] < 0 or src[row] < 0:
            continue
        if dst[row] >= sizes.num_buffer_slots:
            raise IndexError(
                f"{op}: buffer_slots[{row}] = {dst[row]} is out of range for a buffer with "
                f"{sizes.num_buffer_slots} slots (expected 0..{sizes.num_buffer_slots - 1}, or "
                f"negative to skip the row)"
            )
        if src[row] >= sizes.num_state_slots:
            raise IndexError(
                f"{op}: state_slots[{row}] = {src[row]} is out of range for conv_state with "
                f"{sizes.num_state_slots} slots (expected 0..{sizes.num_state_slots - 1}, or "
                f"negative to skip the row)"
            )
        if links is not None:
            check_parent_links(op, row, links[row])
        if dst[row] in written_by:
            raise IndexError(
                f"{op}: rows {written_by[dst[row]]} and {row} both write buffer slot {dst[row]}; "
                f"which one lands would be unspecified"
            )
        written_by[dst[row]] = row


# ---------------------------------------------------------------------------------------------
# Replay commit: capture_gates and gdn_commit
# ---------------------------------------------------------------------------------------------

_CAPTURE_GATES = "convwin.capture_gates"
_GDN_COMMIT = "convwin.gdn_commit"
_MAMBA2_COMMIT = "convwin.mamba2_commit"
# The replay kernels keep a path token's K-1 previous conv inputs in registers, four at most.
REPLAY_MAX_KERNEL_SIZE = 5
SSM_STATE_DTYPES = (torch.float32, torch.bfloat16)  # what the replay commits and gdn_verify take a state in


def _check_float(op: str, name: str, t: torch.Tensor, device: torch.device) -> None:
    if not t.dtype.is_floating_point:
        raise TypeError(f"{op}: {name} must be a floating-point tensor, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device} but must be on {device} like the state it goes with")


def _check_layer(op: str, layer: int, num_layers: int) -> None:
    if isinstance(layer, bool) or not isinstance(layer, (int, torch.SymInt)):
        raise TypeError(f"{op}: layer must be an int, got {type(layer).__name__}")
    if not 0 <= layer < num_layers:
        raise ValueError(f"{op}: layer {layer} is out of range for {num_layers} layers (expected 0..{num_layers - 1})")


def check_capture_gates_args(gates, g, beta, buffer_slots, layer, a=None, b=None, A_log=None, dt_bias=None) -> int:
    """Validate a capture_gates call (see ops_replay.capture_gates); returns the number of rows."""
    op = _CAPTURE_GATES
    raw = {"a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias}
    if any(value is not None for value in raw.values()):
        if g is not None or beta is not None:
            raise ValueError(f"{op}: give g, beta or the raw a, b with A_log, dt_bias, not both")
        missing = [name for name, value in raw.items() if value is None]
        if missing:
            raise ValueError(f"{op}: the raw gates need a, b, A_log and dt_bias; {', '.join(missing)} missing")
        first, second, names = a, b, ("a", "b")
    else:
        first, second, names = g, beta, ("g", "beta")
    for name, value in (("gates", gates), (names[0], first)):
        if not isinstance(value, torch.Tensor):
            check_tensor(f"{op}: {name}", value)
    if gates.dim() != 5 or gates.shape[3] not in (1, 2):
        raise ValueError(
            f"{op}: gates must be 5-D [L, M, N, G, H] with G = 2 (g, beta) or 1 (dt), as alloc_gates "
            f"makes it, got shape {tuple(gates.shape)}"
        )
    num_layers, num_slots, num_draft, num_gates, num_heads = gates.shape
    device = gates.device
    _check_float(op, "gates", gates, device)
    _check_float(op, names[0], first, device)
    if first.dim() != 3 or first.shape[2] != num_heads or not 1 <= first.shape[1] <= num_draft:
        raise ValueError(
            f"{op}: {names[0]} must be [B, N, H] with H = {num_heads} heads and 1 <= N <= {num_draft} draft "
            f"tokens (gates is {tuple(gates.shape)}), got shape {tuple(first.shape)}"
        )
    if num_gates == 2:
        if second is None:
            raise ValueError(f"{op}: gates holds two gates per head (g, beta): beta must be given")
        if not isinstance(second, torch.Tensor):
            check_tensor(f"{op}: {names[1]}", second)
        _check_float(op, names[1], second, device)
        if second.shape != first.shape:
            raise ValueError(f"{op}: {names[1]} must have {names[0]}'s shape {tuple(first.shape)}, "
                             f"got {tuple(second.shape)}")
    elif names[0] == "a":
        raise ValueError(f"{op}: the raw a, b give Gated DeltaNet's two gates (g, beta); gates holds one "
                         "per head (alloc_gates(..., num_gates=1)): pass Mamba2's dt as g")
    elif second is not None:
        raise ValueError(f"{op}: gates holds one gate per head (alloc_gates(..., num_gates=1)): pass beta=None")
    if names[0] == "a":
        for name, value in (("A_log", A_log), ("dt_bias", dt_bias)):
            if not isinstance(value, torch.Tensor):
                check_tensor(f"{op}: {name}", value)
            _check_float(op, name, value, device)
            if value.dim() != 1 or value.shape[0] != num_heads:
                raise ValueError(f"{op}: {name} must be [H] with H = {num_heads} heads, got shape {tuple(value.shape)}")
    _check_layer(op, layer, num_layers)
    check_writable(op, "gates", gates)
    num_rows = check_index_tensors(op, device, ("buffer_slots",), buffer_slots, owner="gates")
    if num_rows != first.shape[0]:
        raise ValueError(f"{op}: buffer_slots has {num_rows} rows but {names[0]} has {first.shape[0]} (axis 0)")
    return num_rows


def check_capture_gates_index_values(gates, buffer_slots) -> None:
    """Checked mode for capture_gates: in-range slots, no slot written twice."""
    written_by: dict[int, int] = {}
    for row, slot in enumerate(buffer_slots.tolist()):
        if slot < 0:
            continue
        if slot >= gates.shape[1]:
            raise IndexError(
                f"{_CAPTURE_GATES}: buffer_slots[{row}] = {slot} is out of range for gates with "
                f"{gates.shape[1]} slots (expected 0..{gates.shape[1] - 1}, or negative to skip the row)"
            )
        if slot in written_by:
            raise IndexError(f"{_CAPTURE_GATES}: rows {written_by[slot]} and {row} both write slot {slot}")
        written_by[slot] = row


class ReplaySizes(NamedTuple):
    num_layers: int  # L
    num_state_slots: int  # R (ssm_state and conv_state alike)
    dim: int
    width: int  # K-1
    num_src_slots: int  # M
    num_nodes: int  # N draft tokens or tree nodes
    num_rows: int  # B


def _check_positive_ints(op: str, **values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
            raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{op}: {name} must be >= 1, got {value}")


def check_gdn_commit_args(
    ssm_state, conv_state, buffer, gates, conv_weight, dst_slots, src_slots, steps, parents, conv_bias,
    layout, num_k_heads, head_k_dim, num_v_heads, head_v_dim, state_layout,
) -> ReplaySizes:
    """Validate a gdn_commit call (see ops_replay.gdn_commit) and return its sizes."""
    op = _GDN_COMMIT
    _check_positive_ints(op, num_k_heads=num_k_heads, head_k_dim=head_k_dim, num_v_heads=num_v_heads,
                         head_v_dim=head_v_dim)
    if num_v_heads % num_k_heads:
        raise ValueError(f"{op}: num_v_heads ({num_v_heads}) must be a multiple of num_k_heads ({num_k_heads})")
    return _check_replay_args(
        op, ssm_state, conv_state, buffer, gates, conv_weight, dst_slots, src_slots, steps, parents, conv_bias,
        layout, state_layout, mixer_dim=(2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim,
                                         "2*num_k_heads*head_k_dim + num_v_heads*head_v_dim (q, k, v)"),
        state_tail=((num_v_heads, head_k_dim, head_v_dim), "[L, R, Hv, dk, dv]"),
        gates_tail=((2, num_v_heads), "[L, M, N, 2, Hv]"),
    )


def check_mamba2_commit_args(
    ssm_state, conv_state, buffer, gates, conv_weight, A, dst_slots, src_slots, steps, parents, conv_bias,
    layout, num_heads, head_dim, n_groups, d_state, state_layout,
) -> ReplaySizes:
    """Validate a mamba2_commit call (see ops_replay.mamba2_commit) and return its sizes."""
    op = _MAMBA2_COMMIT
    _check_positive_ints(op, num_heads=num_heads, head_dim=head_dim, n_groups=n_groups, d_state=d_state)
    if num_heads % n_groups:
        raise ValueError(f"{op}: num_heads ({num_heads}) must be a multiple of n_groups ({n_groups})")
    sizes = _check_replay_args(
        op, ssm_state, conv_state, buffer, gates, conv_weight, dst_slots, src_slots, steps, parents, conv_bias,
        layout, state_layout, mixer_dim=(num_heads * head_dim + 2 * n_groups * d_state,
                                         "num_heads*head_dim + 2*n_groups*d_state (x, B, C)"),
        state_tail=((num_heads, head_dim, d_state), "[L, R, H, P, Ns]"),
        gates_tail=((1, num_heads), "[L, M, N, 1, H] (alloc_gates(..., num_gates=1))"),
    )
    if not isinstance(A, torch.Tensor):
        check_tensor(f"{op}: A", A)
    if A.shape != (sizes.num_layers, num_heads):
        raise ValueError(f"{op}: A must be [L, H] = [{sizes.num_layers}, {num_heads}] (-exp(A_log)), got shape "
                         f"{tuple(A.shape)}")
    _check_float(op, "A", A, conv_state.device)
    return sizes


def _check_replay_args(
    op, ssm_state, conv_state, buffer, gates, conv_weight, dst_slots, src_slots, steps, parents, conv_bias,
    layout, state_layout, *, mixer_dim, state_tail, gates_tail,
) -> ReplaySizes:
    """What every replay commit checks; ``mixer_dim``, ``state_tail`` and ``gates_tail`` are the
    mixer's (value, how to say it)."""
    for name, value in (("ssm_state", ssm_state), ("conv_state", conv_state), ("buffer", buffer),
                        ("gates", gates), ("conv_weight", conv_weight)):
        if not isinstance(value, torch.Tensor):
            check_tensor(f"{op}: {name}", value)
    if layout not in PHYSICAL_SHAPE_TEXT:
        raise ValueError(f"{op}: layout must be one of {tuple(PHYSICAL_SHAPE_TEXT)}, got {layout!r}")
    buffer_desc = PHYSICAL_SHAPE_TEXT[layout].format(n="N")
    num_layers, num_state_slots, dim, width, state_desc = _state_sizes(op, conv_state, state_layout)
    if width + 1 > REPLAY_MAX_KERNEL_SIZE:
        raise ValueError(
            f"{op}: conv kernels of K <= {REPLAY_MAX_KERNEL_SIZE} are supported; conv_state "
            f"(shape {tuple(conv_state.shape)} read as {state_desc}) holds K-1 = {width} columns, K = {width + 1}"
        )
    if dim != mixer_dim[0]:
        raise ValueError(
            f"{op}: conv_state has dim {dim} (shape {tuple(conv_state.shape)} read as {state_desc}) but "
            f"the mixer needs {mixer_dim[1]} = {mixer_dim[0]} channels"
        )
    device = conv_state.device
    expected_ssm = (num_layers, num_state_slots, *state_tail[0])
    if ssm_state.shape != expected_ssm:
        raise ValueError(
            f"{op}: ssm_state must be {state_tail[1]} = {list(expected_ssm)} (L, R from conv_state), "
            f"got shape {tuple(ssm_state.shape)}"
        )
    if ssm_state.dtype not in SSM_STATE_DTYPES:  # fp16 would overflow or lose a state kept over many steps
        raise TypeError(f"{op}: ssm_state must be float32 or bfloat16, got {ssm_state.dtype} "
                        f"(shape {tuple(ssm_state.shape)}, device {ssm_state.device})")
    for name, t in (("ssm_state", ssm_state), ("buffer", buffer), ("gates", gates), ("conv_weight", conv_weight)):
        if t.dtype not in CACHE_DTYPES:
            check_cache_dtype(f"{op}: {name}", t)
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but conv_state is on {device}")
    if gates.dim() != 5 or gates.shape[0] != num_layers or tuple(gates.shape[3:]) != gates_tail[0]:
        raise ValueError(
            f"{op}: gates must be {gates_tail[1]} with L = {num_layers} and the last two axes "
            f"{list(gates_tail[0])}, got shape {tuple(gates.shape)}"
        )
    num_src_slots, num_nodes = gates.shape[1], gates.shape[2]
    expected_buffer = physical_shape_unchecked(layout, num_layers, num_src_slots, dim, num_nodes, width + 1)
    if buffer.shape != expected_buffer:
        raise ValueError(
            f"{op}: a {layout} buffer {buffer_desc} for L={num_layers}, M={num_src_slots}, N={num_nodes} "
            f"(gates), dim={dim}, K={width + 1} (conv_state) must be {list(expected_buffer)}, got shape "
            f"{tuple(buffer.shape)}"
        )
    if conv_weight.shape != (num_layers, dim, width + 1):
        raise ValueError(
            f"{op}: conv_weight must be [L, dim, K] = [{num_layers}, {dim}, {width + 1}], got shape "
            f"{tuple(conv_weight.shape)}"
        )
    if conv_bias is not None:
        if not isinstance(conv_bias, torch.Tensor):
            check_tensor(f"{op}: conv_bias", conv_bias)
        if conv_bias.shape != (num_layers, dim):
            raise ValueError(f"{op}: conv_bias must be [L, dim] = [{num_layers}, {dim}] or None, got shape "
                             f"{tuple(conv_bias.shape)}")
        if conv_bias.dtype not in CACHE_DTYPES:
            check_cache_dtype(f"{op}: conv_bias", conv_bias)
        if conv_bias.device != device:
            raise ValueError(f"{op}: conv_bias is on {conv_bias.device} but conv_state is on {device}")
    check_writable(op, "ssm_state", ssm_state)
    check_writable(op, "conv_state", conv_state)
    num_rows = check_index_tensors(op, device, _SCATTER_INDICES, dst_slots, src_slots, steps)
    if parents is not None:
        _check_parents(op, parents, device, num_rows, num_nodes, "B rows, N = gates axis 2")
    return ReplaySizes(num_layers, num_state_slots, dim, width, num_src_slots, num_nodes, num_rows)


def check_replay_storages(op: str, ssm_state, conv_state, buffer, gates, conv_weight, conv_bias, A=None) -> None:
    """Real tensors only: neither state may share memory with the other or with a source."""
    check_no_shared_storages(op, "ssm_state", ssm_state, conv_state=conv_state, buffer=buffer, gates=gates,
                             conv_weight=conv_weight, conv_bias=conv_bias, A=A)
    check_no_shared_storages(op, "conv_state", conv_state, buffer=buffer, gates=gates,
                             conv_weight=conv_weight, conv_bias=conv_bias, A=A)


def check_replay_index_values(op: str, sizes: ReplaySizes, dst_slots, src_slots, steps, parents) -> None:
    """Checked mode for the replay commits: the rules of scatter (chains) or scatter_tree (trees)."""
    links = None if parents is None else parents.tolist()

    def check_links(row: int) -> None:
        check_parent_links(op, row, links[row])

    _check_active_rows(
        op, "buffer", sizes.num_state_slots, sizes.num_src_slots, dst_slots, src_slots, "steps", steps,
        sizes.num_nodes, "draft tokens" if parents is None else "draft nodes",
        None if parents is None else check_links,
    )


# ---------------------------------------------------------------------------------------------
# gdn_verify
# ---------------------------------------------------------------------------------------------

_GDN_VERIFY = "convwin.gdn_verify"
# The verify kernel pads the nodes to a power of two >= 16 and keeps [nodes, nodes] matrices in
# registers; drafts of more nodes than this are no speculative step.
VERIFY_MAX_NODES = 64


class VerifySizes(NamedTuple):
    num_rows: int  # B
    num_nodes: int  # N draft tokens or tree nodes
    num_state_slots: int  # S


def check_gdn_verify_args(out, q, k, v, g, beta, ssm_state, state_slots, parents, scale,
                          op: str = _GDN_VERIFY) -> VerifySizes:
    """Validate a gdn_verify call (see ops_verify.gdn_verify) and return its sizes (``op``: the
    name errors give; gdn_ring_verify checks its drafts' arguments here too)."""
    for name, value in (("out", out), ("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta),
                        ("ssm_state", ssm_state)):
        if not isinstance(value, torch.Tensor):
            check_tensor(f"{op}: {name}", value)
    if ssm_state.dim() != 4:
        raise ValueError(f"{op}: ssm_state must be one layer's pool [S, Hv, dk, dv], got shape "
                         f"{tuple(ssm_state.shape)}")
    if ssm_state.dtype not in SSM_STATE_DTYPES:
        raise TypeError(f"{op}: ssm_state must be float32 or bfloat16, got {ssm_state.dtype}")
    num_state_slots, num_v_heads, head_k_dim, head_v_dim = ssm_state.shape
    device = ssm_state.device
    if min(num_v_heads, head_k_dim, head_v_dim) < 1:
        raise ValueError(f"{op}: ssm_state [S, Hv, dk, dv] must have Hv, dk, dv >= 1, got shape "
                         f"{tuple(ssm_state.shape)}")
    if q.dim() != 4:
        raise ValueError(f"{op}: q must be [B, N, Hk, dk], got shape {tuple(q.shape)}")
    num_rows, num_nodes, num_k_heads = q.shape[:3]
    if q.shape[3] != head_k_dim:
        raise ValueError(f"{op}: q must be [B, N, Hk, dk] with dk = {head_k_dim} (ssm_state [S, Hv, dk, dv] = "
                         f"{list(ssm_state.shape)}), got shape {tuple(q.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"{op}: k must have q's shape [B, N, Hk, dk] = {list(q.shape)}, got {tuple(k.shape)}")
    if v.shape != (num_rows, num_nodes, num_v_heads, head_v_dim):
        raise ValueError(f"{op}: v must be [B, N, Hv, dv] = {[num_rows, num_nodes, num_v_heads, head_v_dim]} "
                         f"(B, N from q; Hv, dv from ssm_state), got shape {tuple(v.shape)}")
    if not 1 <= num_nodes <= VERIFY_MAX_NODES:
        raise ValueError(f"{op}: N (draft tokens, q's axis 1) must be 1..{VERIFY_MAX_NODES}, got {num_nodes}")
    if num_k_heads < 1 or num_v_heads % num_k_heads:
        raise ValueError(f"{op}: Hv ({num_v_heads}, ssm_state axis 1) must be a multiple of Hk ({num_k_heads}, "
                         f"q axis 2)")
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (num_rows, num_nodes, num_v_heads):
            raise ValueError(f"{op}: {name} must be [B, N, Hv] = {[num_rows, num_nodes, num_v_heads]}, got shape "
                             f"{tuple(t.shape)}")
    if out.shape != v.shape:
        raise ValueError(f"{op}: out must be [B, N, Hv, dv] = {list(v.shape)} like v, got shape {tuple(out.shape)}")
    for name, t in (("out", out), ("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _check_float(op, name, t, device)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"{op}: scale must be a float or None (dk ** -0.5), got {type(scale).__name__}")
    check_writable(op, "out", out)
    return _verify_sizes(op, device, state_slots, parents, num_rows, num_nodes, num_state_slots, "q")


def _verify_sizes(op, device, state_slots, parents, num_rows, num_nodes, num_state_slots, source):
    """The verify ops' index checks (slots and links for ``source``'s B rows and N nodes), then their sizes."""
    rows = check_index_tensors(op, device, ("state_slots",), state_slots, owner="ssm_state")
    if rows != num_rows:
        raise ValueError(f"{op}: state_slots has {rows} rows but {source} has {num_rows} (axis 0)")
    if parents is not None:
        _check_parents(op, parents, device, num_rows, num_nodes, f"B, N from {source}", owner="ssm_state")
    return VerifySizes(num_rows, num_nodes, num_state_slots)


def check_gdn_verify_index_values(sizes: VerifySizes, state_slots, parents, op: str = _GDN_VERIFY) -> None:
    """Checked mode for gdn_verify (and mamba2_verify, ``op``): slots in range (or negative to
    skip), parent links in [-1, n-1]."""
    links = None if parents is None else parents.tolist()
    for row, slot in enumerate(state_slots.tolist()):
        if slot < 0:
            continue
        if slot >= sizes.num_state_slots:
            raise IndexError(
                f"{op}: state_slots[{row}] = {slot} is out of range for ssm_state with "
                f"{sizes.num_state_slots} slots (expected 0..{sizes.num_state_slots - 1}, or negative to skip the row)"
            )
        if links is not None:
            check_parent_links(op, row, links[row])


# ---------------------------------------------------------------------------------------------
# mamba2_verify
# ---------------------------------------------------------------------------------------------

_MAMBA2_VERIFY = "convwin.mamba2_verify"


def check_mamba2_verify_args(out, x, dt, A, B, C, ssm_state, state_slots, parents, D, z, dt_bias,
                             dt_softplus, op: str = _MAMBA2_VERIFY) -> VerifySizes:
    """Validate a mamba2_verify call (see ops_verify.mamba2_verify) and return its sizes (``op``: the
    name errors give; mamba2_ring_verify checks its drafts' arguments here too)."""
    for name, value in (("out", out), ("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("ssm_state", ssm_state)):
        if not isinstance(value, torch.Tensor):
            check_tensor(f"{op}: {name}", value)
    for name, value in (("D", D), ("z", z), ("dt_bias", dt_bias)):
        if value is not None and not isinstance(value, torch.Tensor):
            check_tensor(f"{op}: {name}", value)
    if ssm_state.dim() != 4:
        raise ValueError(f"{op}: ssm_state must be one layer's pool [S, H, P, Ns], got shape {tuple(ssm_state.shape)}")
    if ssm_state.dtype not in SSM_STATE_DTYPES:
        raise TypeError(f"{op}: ssm_state must be float32 or bfloat16, got {ssm_state.dtype}")
    num_state_slots, num_heads, head_dim, d_state = ssm_state.shape
    device = ssm_state.device
    if x.dim() != 4 or x.shape[2:] != (num_heads, head_dim):
        raise ValueError(f"{op}: x must be [B, N, H, P] with H, P = {num_heads}, {head_dim} (ssm_state [S, H, P, Ns] = "
                         f"{list(ssm_state.shape)}), got shape {tuple(x.shape)}")
    num_rows, num_nodes = x.shape[:2]
    if not 1 <= num_nodes <= VERIFY_MAX_NODES:
        raise ValueError(f"{op}: N (draft tokens, x's axis 1) must be 1..{VERIFY_MAX_NODES}, got {num_nodes}")
    if B.dim() != 4 or B.shape[:2] != (num_rows, num_nodes) or B.shape[3] != d_state:
        raise ValueError(f"{op}: B must be [B, N, G, Ns] with B, N = {num_rows}, {num_nodes} (from x) and Ns = {d_state} "
                         f"(from ssm_state), got shape {tuple(B.shape)}")
    num_groups = B.shape[2]
    if num_groups < 1 or num_heads % num_groups:
        raise ValueError(f"{op}: H ({num_heads}, ssm_state axis 1) must be a multiple of G ({num_groups}, B axis 2)")
    if C.shape != B.shape:
        raise ValueError(f"{op}: C must have B's shape [B, N, G, Ns] = {list(B.shape)}, got {tuple(C.shape)}")
    if dt.shape != (num_rows, num_nodes, num_heads):
        raise ValueError(f"{op}: dt must be [B, N, H] = {[num_rows, num_nodes, num_heads]}, got shape {tuple(dt.shape)}")
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        if t is not None and t.shape != (num_heads,):
            raise ValueError(f"{op}: {name} must be [H] with H = {num_heads}, got shape {tuple(t.shape)}")
    if z is not None and z.shape != x.shape:
        raise ValueError(f"{op}: z must be [B, N, H, P] = {list(x.shape)} like x, got shape {tuple(z.shape)}")
    if out.shape != x.shape:
        raise ValueError(f"{op}: out must be [B, N, H, P] = {list(x.shape)} like x, got shape {tuple(out.shape)}")
    for name, t in (("out", out), ("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z),
                    ("dt_bias", dt_bias)):
        if t is not None:
            _check_float(op, name, t, device)
    if not isinstance(dt_softplus, bool):
        raise TypeError(f"{op}: dt_softplus must be a bool, got {type(dt_softplus).__name__}")
    check_writable(op, "out", out)
    return _verify_sizes(op, device, state_slots, parents, num_rows, num_nodes, num_state_slots, "x")


# ---------------------------------------------------------------------------------------------
# The ring (ops_ring.py, ops_ring_mamba2.py): rows [L, M, C, dim], gates [L, M, C, 2, Hv] (Mamba2:
# [L, M, C, 1, H]), cursor [M, 2], C = capacity + N
# ---------------------------------------------------------------------------------------------

_RING_CONV = "convwin.ring_conv1d_verify"
_GDN_RING_VERIFY = "convwin.gdn_ring_verify"
_RING_ACCEPT = "convwin.ring_accept"
_GDN_RING_FLUSH = "convwin.gdn_ring_flush"


class RingSizes(NamedTuple):
    num_layers: int  # L
    num_ring_slots: int  # M
    ring_rows: int  # C = capacity + N rows per slot
    num_nodes: int  # N draft tokens or tree nodes (a flush: 0, or the num_draft of its due folds)
    num_rows: int  # B
    num_state_slots: int  # S (accept takes no state: 0)

    @property
    def max_pending(self) -> int:
        """The most pending tokens a valid cursor holds: the capacity (C - N); C - 1 for a full flush."""
        return self.ring_rows - max(self.num_nodes, 1)


def _check_ring_buffers(op, rows, gates, cursor, num_layers, dim, num_nodes, device, *, gate_heads=None,
                        num_gates=(1, 2), takes_gates=True) -> tuple[int, int]:
    """rows [L, M, C, dim] (M >= 1, C >= 2N), gates [L, M, C, G, H] (unless not ``takes_gates``), cursor
    [M, 2]; returns (M, C)."""
    for name, value in (("rows", rows), ("cursor", cursor)):
        if not isinstance(value, torch.Tensor):
            check_tensor(f"{op}: {name}", value)
    if rows.dim() != 4 or rows.shape[0] != num_layers or rows.shape[3] != dim:
        raise ValueError(f"{op}: rows must be the ring's conv inputs [L, M, capacity + N, dim] with L = {num_layers} "
                         f"and dim = {dim}, got shape {tuple(rows.shape)}")
    num_ring_slots, ring_rows = rows.shape[1], rows.shape[2]
    if num_ring_slots < 1:
        raise ValueError(f"{op}: rows must hold at least one ring slot (M >= 1), got shape {tuple(rows.shape)}")
    if rows.dtype not in CACHE_DTYPES:
        check_cache_dtype(f"{op}: rows", rows)
    if rows.device != device:
        raise ValueError(f"{op}: rows is on {rows.device} but must be on {device}")
    if ring_rows < 2 * num_nodes:
        raise ValueError(f"{op}: a ring verifying N = {num_nodes} draft tokens holds capacity + N rows per slot with "
                         f"capacity >= N, so at least {2 * num_nodes}; rows has {ring_rows} (shape {tuple(rows.shape)})")
    if takes_gates:
        if not isinstance(gates, torch.Tensor):
            check_tensor(f"{op}: gates", gates)
        if (gates.dim() != 5 or tuple(gates.shape[:3]) != (num_layers, num_ring_slots, ring_rows)
                or gates.shape[3] not in num_gates or (gate_heads is not None and gates.shape[4] != gate_heads)):
            heads = "H" if gate_heads is None else gate_heads
            raise ValueError(f"{op}: gates must be [L, M, capacity + N, G, H] = [{num_layers}, {num_ring_slots}, "
                             f"{ring_rows}, {'|'.join(map(str, num_gates))}, {heads}] like rows, got shape "
                             f"{tuple(gates.shape)}")
        if gates.dtype not in CACHE_DTYPES:
            check_cache_dtype(f"{op}: gates", gates)
        if gates.device != device:
            raise ValueError(f"{op}: gates is on {gates.device} but must be on {device}")
    if cursor.dtype not in INDEX_DTYPES:
        raise TypeError(f"{op}: cursor must be int32 or int64, got {cursor.dtype}")
    if cursor.shape != (num_ring_slots, 2):
        raise ValueError(f"{op}: cursor must be [M, 2] = [{num_ring_slots}, 2] (start, pending per ring slot), "
                         f"got shape {tuple(cursor.shape)}")
    if cursor.device != device:
        raise ValueError(f"{op}: cursor is on {cursor.device} but must be on {device}")
    return num_ring_slots, ring_rows


def _check_row_count(op: str, name: str, count: int, num_rows: int, source: str) -> None:
    if count != num_rows:
        raise ValueError(f"{op}: {name} has {count} rows but {source} has {num_rows} (axis 0)")


def check_ring_conv1d_verify_args(out, rows, conv_state, x, weight, bias, ring_slots, state_slots, cursor, layer,
                                  parents, activation, state_layout) -> tuple[RingSizes, torch.Tensor]:
    """Validate a ring_conv1d_verify call; returns its sizes and the layer's output [B, N, dim]."""
    op = _RING_CONV
    for name, value in (("conv_state", conv_state), ("x", x)):
        if not isinstance(value, torch.Tensor):
            check_tensor(f"{op}: {name}", value)
    num_layers, num_state_slots, dim, width, state_desc = _state_sizes(op, conv_state, state_layout)
    device = conv_state.device
    if x.dim() != 3 or x.shape[2] != dim or x.shape[1] < 1:
        raise ValueError(f"{op}: x must be [B, N, dim] with N >= 1 and dim = {dim} (conv_state {tuple(conv_state.shape)} "
                         f"read as {state_desc}), got shape {tuple(x.shape)}")
    if x.dtype not in CACHE_DTYPES:
        check_cache_dtype(f"{op}: x", x)
    if x.device != device:
        raise ValueError(f"{op}: x is on {x.device} but conv_state is on {device}")
    num_rows, num_nodes = x.shape[0], x.shape[1]
    num_ring_slots, ring_rows = _check_ring_buffers(op, rows, None, cursor, num_layers, dim, num_nodes, device,
                                                    takes_gates=False)
    _check_layer(op, layer, num_layers)
    check_writable(op, "rows", rows)
    count = check_index_tensors(op, device, ("ring_slots", "state_slots"), ring_slots, state_slots)
    _check_row_count(op, "ring_slots", count, num_rows, "x")
    if parents is not None:
        _check_parents(op, parents, device, num_rows, num_nodes, "x is [B, N, dim]")
    capture_sizes = CaptureSizes(num_layers, num_state_slots, dim, width, num_ring_slots, num_nodes, num_rows)
    out = check_verify_args(op, capture_sizes, out, weight, bias, activation, device, layer)
    return RingSizes(num_layers, num_ring_slots, ring_rows, num_nodes, num_rows, num_state_slots), out


def _check_conv_params(op, conv_weight, conv_bias, leading: tuple, dim: int, kernel_size: int, device) -> None:
    """conv_weight [*leading, dim, K] and conv_bias [*leading, dim] or None."""
    shape_text = "".join(f"{n}, " for n in ("L",) * len(leading))
    if not isinstance(conv_weight, torch.Tensor):
        check_tensor(f"{op}: conv_weight", conv_weight)
    if conv_weight.shape != (*leading, dim, kernel_size):
        raise ValueError(f"{op}: conv_weight must be [{shape_text}dim, K] = {[*leading, dim, kernel_size]}, got shape "
                         f"{tuple(conv_weight.shape)}")
    for name, t in (("conv_weight", conv_weight), ("conv_bias", conv_bias)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            check_tensor(f"{op}: {name}", t)
        if t.dtype not in CACHE_DTYPES:
            check_cache_dtype(f"{op}: {name}", t)
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but must be on {device}")
    if conv_bias is not None and conv_bias.shape != (*leading, dim):
        raise ValueError(f"{op}: conv_bias must be [{shape_text}dim] = {[*leading, dim]} or None, got shape "
                         f"{tuple(conv_bias.shape)}")


def _check_ring_states(op, ssm_state, conv_state, state_layout, mixer_dim: int, state_tail: tuple, *,
                       dim_text="2*Hk*dk + Hv*dv = {} channels (q, k, v)", state_text="[L, S, Hv, dk, dv]"):
    """ssm_state [L, S, *state_tail] and conv_state (K <= REPLAY_MAX_KERNEL_SIZE, dim = mixer_dim), both
    written; returns (L, S, dim, K-1). ``dim_text``, ``state_text``: how errors name them (the mixer's)."""
    for name, value in (("ssm_state", ssm_state), ("conv_state", conv_state)):
        if not isinstance(value, torch.Tensor):
            check_tensor(f"{op}: {name}", value)
    num_layers, num_state_slots, dim, width, state_desc = _state_sizes(op, conv_state, state_layout)
    if width + 1 > REPLAY_MAX_KERNEL_SIZE:
        raise ValueError(f"{op}: conv kernels of K <= {REPLAY_MAX_KERNEL_SIZE} are supported; conv_state (shape "
                         f"{tuple(conv_state.shape)} read as {state_desc}) has K = {width + 1}")
    if dim != mixer_dim:
        raise ValueError(f"{op}: conv_state has dim {dim} (shape {tuple(conv_state.shape)} read as {state_desc}) but "
                         f"the layer needs {dim_text.format(mixer_dim)}")
    expected = (num_layers, num_state_slots, *state_tail)
    if ssm_state.shape != expected:
        raise ValueError(f"{op}: ssm_state must be every layer's pool {state_text} = {list(expected)} (L, S from "
                         f"conv_state), got shape {tuple(ssm_state.shape)}")
    if ssm_state.dtype not in SSM_STATE_DTYPES:
        raise TypeError(f"{op}: ssm_state must be float32 or bfloat16, got {ssm_state.dtype}")
    if ssm_state.device != conv_state.device:
        raise ValueError(f"{op}: ssm_state is on {ssm_state.device} but conv_state is on {conv_state.device}")
    check_writable(op, "ssm_state", ssm_state)
    check_writable(op, "conv_state", conv_state)
    return num_layers, num_state_slots, dim, width


def check_gdn_ring_verify_args(out, q, k, v, g, beta, ssm_state, conv_state, rows, gates, cursor, conv_weight,
                               conv_bias, ring_slots, state_slots, layer, parents, scale, state_layout) -> RingSizes:
    """Validate a gdn_ring_verify call and return its sizes."""
    op = _GDN_RING_VERIFY
    if not isinstance(ssm_state, torch.Tensor):
        check_tensor(f"{op}: ssm_state", ssm_state)
    if ssm_state.dim() != 5:
        raise ValueError(f"{op}: ssm_state must be every layer's pool [L, S, Hv, dk, dv] (the fold writes it), got "
                         f"shape {tuple(ssm_state.shape)}")
    _check_layer(op, layer, ssm_state.shape[0])
    verify = check_gdn_verify_args(out, q, k, v, g, beta, ssm_state[layer], state_slots, parents, scale, op=op)
    num_k_heads, head_k_dim = q.shape[2], q.shape[3]
    num_v_heads, head_v_dim = v.shape[2], v.shape[3]
    mixer_dim = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    num_layers, _, dim, width = _check_ring_states(op, ssm_state, conv_state, state_layout, mixer_dim,
                                                   (num_v_heads, head_k_dim, head_v_dim))
    device = ssm_state.device
    num_ring_slots, ring_rows = _check_ring_buffers(op, rows, gates, cursor, num_layers, dim, verify.num_nodes,
                                                    device, gate_heads=num_v_heads, num_gates=(2,))
    _check_conv_params(op, conv_weight, conv_bias, (), dim, width + 1, device)
    check_writable(op, "gates", gates)
    count = check_index_tensors(op, device, ("ring_slots",), ring_slots, owner="ssm_state")
    _check_row_count(op, "ring_slots", count, verify.num_rows, "q")
    return RingSizes(num_layers, num_ring_slots, ring_rows, verify.num_nodes, verify.num_rows,
                     verify.num_state_slots)


def check_ring_accept_args(cursor, rows, gates, ring_slots, steps, parents, num_draft) -> RingSizes:
    """Validate a ring_accept call and return its sizes."""
    op = _RING_ACCEPT
    _check_positive_ints(op, num_draft=num_draft)
    if not isinstance(rows, torch.Tensor):
        check_tensor(f"{op}: rows", rows)
    if rows.dim() != 4:
        raise ValueError(f"{op}: rows must be the ring's conv inputs [L, M, capacity + N, dim], got shape "
                         f"{tuple(rows.shape)}")
    device = rows.device
    num_ring_slots, ring_rows = _check_ring_buffers(op, rows, gates, cursor, rows.shape[0], rows.shape[3], num_draft,
                                                    device)
    for name, t in (("cursor", cursor), ("rows", rows), ("gates", gates)):
        check_writable(op, name, t)
    num_rows = check_index_tensors(op, device, ("ring_slots", "steps"), ring_slots, steps, owner="rows")
    if parents is not None:
        _check_parents(op, parents, device, num_rows, num_draft, "B from ring_slots, N = num_draft", owner="rows")
    return RingSizes(rows.shape[0], num_ring_slots, ring_rows, num_draft, num_rows, 0)


def check_gdn_ring_flush_args(ssm_state, conv_state, cursor, rows, gates, conv_weight, conv_bias, ring_slots,
                              state_slots, num_k_heads, head_k_dim, num_v_heads, head_v_dim,
                              state_layout, num_draft=None) -> RingSizes:
    """Validate a gdn_ring_flush call and return its sizes."""
    op = _GDN_RING_FLUSH
    _check_positive_ints(op, num_k_heads=num_k_heads, head_k_dim=head_k_dim, num_v_heads=num_v_heads,
                         head_v_dim=head_v_dim, **({} if num_draft is None else dict(num_draft=num_draft)))
    if num_v_heads % num_k_heads:
        raise ValueError(f"{op}: num_v_heads ({num_v_heads}) must be a multiple of num_k_heads ({num_k_heads})")
    mixer_dim = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    num_layers, num_state_slots, dim, width = _check_ring_states(op, ssm_state, conv_state, state_layout, mixer_dim,
                                                                 (num_v_heads, head_k_dim, head_v_dim))
    device = conv_state.device
    num_ring_slots, ring_rows = _check_ring_buffers(op, rows, gates, cursor, num_layers, dim, num_draft or 0, device,
                                                    gate_heads=num_v_heads, num_gates=(2,))
    _check_conv_params(op, conv_weight, conv_bias, (num_layers,), dim, width + 1, device)
    check_writable(op, "cursor", cursor)
    num_rows = check_index_tensors(op, device, ("ring_slots", "state_slots"), ring_slots, state_slots)
    return RingSizes(num_layers, num_ring_slots, ring_rows, num_draft or 0, num_rows, num_state_slots)


_MAMBA2_RING_VERIFY = "convwin.mamba2_ring_verify"
_MAMBA2_RING_FLUSH = "convwin.mamba2_ring_flush"
_MAMBA2_DIM_TEXT = "H*P + 2*G*Ns = {} channels (x, B, C)"
_MAMBA2_STATE_TEXT = "[L, S, H, P, Ns]"


def check_alloc_ring_args(op: str, **sizes) -> None:
    """The ring allocators' sizes (ints >= 1) and ``capacity`` >= ``num_draft``."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{op}: {name} must be an int >= 1, got {value!r}")
    if sizes["capacity"] < sizes["num_draft"]:
        raise ValueError(f"{op}: capacity ({sizes['capacity']}) must be >= num_draft ({sizes['num_draft']}): a slot "
                         f"holds its pending tokens plus one step's drafts")


def check_mamba2_ring_verify_args(out, x, dt, A, B, C, ssm_state, conv_state, rows, gates, cursor, conv_weight,
                                  conv_bias, ring_slots, state_slots, layer, parents, D, z, dt_bias, dt_softplus,
                                  state_layout) -> RingSizes:
    """Validate a mamba2_ring_verify call and return its sizes."""
    op = _MAMBA2_RING_VERIFY
    if not isinstance(ssm_state, torch.Tensor):
        check_tensor(f"{op}: ssm_state", ssm_state)
    if ssm_state.dim() != 5:
        raise ValueError(f"{op}: ssm_state must be every layer's pool [L, S, H, P, Ns] (the fold writes it), got "
                         f"shape {tuple(ssm_state.shape)}")
    _check_layer(op, layer, ssm_state.shape[0])
    verify = check_mamba2_verify_args(out, x, dt, A, B, C, ssm_state[layer], state_slots, parents, D, z, dt_bias,
                                      dt_softplus, op=op)
    num_heads, head_dim, n_groups, d_state = x.shape[2], x.shape[3], B.shape[2], B.shape[3]
    num_layers, _, dim, width = _check_ring_states(
        op, ssm_state, conv_state, state_layout, num_heads * head_dim + 2 * n_groups * d_state,
        (num_heads, head_dim, d_state), dim_text=_MAMBA2_DIM_TEXT, state_text=_MAMBA2_STATE_TEXT)
    device = ssm_state.device
    num_ring_slots, ring_rows = _check_ring_buffers(op, rows, gates, cursor, num_layers, dim, verify.num_nodes,
                                                    device, gate_heads=num_heads, num_gates=(1,))
    _check_conv_params(op, conv_weight, conv_bias, (), dim, width + 1, device)
    check_writable(op, "gates", gates)
    count = check_index_tensors(op, device, ("ring_slots",), ring_slots, owner="ssm_state")
    _check_row_count(op, "ring_slots", count, verify.num_rows, "x")
    return RingSizes(num_layers, num_ring_slots, ring_rows, verify.num_nodes, verify.num_rows,
                     verify.num_state_slots)


def check_mamba2_ring_flush_args(ssm_state, conv_state, cursor, rows, gates, conv_weight, conv_bias, A, ring_slots,
                                 state_slots, num_heads, head_dim, n_groups, d_state, state_layout,
                                 num_draft=None) -> RingSizes:
    """Validate a mamba2_ring_flush call and return its sizes."""
    op = _MAMBA2_RING_FLUSH
    _check_positive_ints(op, num_heads=num_heads, head_dim=head_dim, n_groups=n_groups, d_state=d_state,
                         **({} if num_draft is None else dict(num_draft=num_draft)))
    if num_heads % n_groups:
        raise ValueError(f"{op}: num_heads ({num_heads}) must be a multiple of n_groups ({n_groups})")
    num_layers, num_state_slots, dim, width = _check_ring_states(
        op, ssm_state, conv_state, state_layout, num_heads * head_dim + 2 * n_groups * d_state,
        (num_heads, head_dim, d_state), dim_text=_MAMBA2_DIM_TEXT, state_text=_MAMBA2_STATE_TEXT)
    device = conv_state.device
    num_ring_slots, ring_rows = _check_ring_buffers(op, rows, gates, cursor, num_layers, dim, num_draft or 0, device,
                                                    gate_heads=num_heads, num_gates=(1,))
    _check_conv_params(op, conv_weight, conv_bias, (num_layers,), dim, width + 1, device)
    if not isinstance(A, torch.Tensor):
        check_tensor(f"{op}: A", A)
    if A.shape != (num_layers, num_heads):
        raise ValueError(f"{op}: A must be [L, H] = [{num_layers}, {num_heads}] (-exp(A_log)), got shape "
                         f"{tuple(A.shape)}")
    _check_float(op, "A", A, device)
    check_writable(op, "cursor", cursor)
    num_rows = check_index_tensors(op, device, ("ring_slots", "state_slots"), ring_slots, state_slots)
    return RingSizes(num_layers, num_ring_slots, ring_rows, num_draft or 0, num_rows, num_state_slots)


def check_separate_storages(op: str, written: dict, read: dict) -> None:
    """Real tensors only: no written tensor shares memory with any other argument (None skipped).
    Each storage's address is read once and compared as a set (the ring ops pass some fifteen
    tensors on every eager call); the pair is named only when one is found."""
    mine = [t.untyped_storage().data_ptr() for t in written.values() if t is not None]
    others = [t.untyped_storage().data_ptr() for t in read.values() if t is not None]
    distinct = set(mine)
    if len(distinct) == len(mine) and distinct.isdisjoint(others):
        return
    named = [(name, t.untyped_storage()) for name, t in (*written.items(), *read.items()) if t is not None]
    for i, (name, storage) in enumerate(named[:len(mine)]):
        sharing = [other for other, s in named[i + 1:] if s.data_ptr() == storage.data_ptr()]
        if sharing and storage.nbytes() > 0:
            raise ValueError(f"{op}: {name} and {sharing[0]} share storage; they must be separate buffers")


def check_tree_depth(op: str, tree_depth, num_nodes: int, tree: bool | None) -> None:
    """The ring's ``tree_depth`` (its fold rule's T, the most tokens a step accepts): None, or an
    int in 1..N; a chain's (``tree`` False) N alone, since a chain of N drafts accepts up to N
    tokens (``tree`` None: not known here, a flush's)."""
    if tree_depth is None:
        return
    _check_positive_ints(op, tree_depth=tree_depth)
    if tree_depth > num_nodes:
        raise ValueError(f"{op}: tree_depth ({tree_depth}) counts the nodes on the longest root path of a tree of "
                         f"N = {num_nodes} drafts, so at most {num_nodes}")
    if tree is False and tree_depth != num_nodes:
        raise ValueError(f"{op}: tree_depth = {tree_depth} with a chain (parents None): a chain of N = {num_nodes} "
                         f"drafts accepts up to N tokens; pass None")


def check_flush_tree_depth(op: str, tree_depth, num_draft) -> None:
    """A flush's ``tree_depth``: only with ``num_draft`` (the due folds' rule), as check_tree_depth."""
    if tree_depth is not None and num_draft is None:
        raise ValueError(f"{op}: tree_depth (the due folds' rule) needs num_draft; a flush without it folds every "
                         f"pending token")
    if num_draft is not None:
        check_tree_depth(op, tree_depth, num_draft, None)


def longest_root_path(links: list[int]) -> int:
    """The most nodes on a root path of a tree of good links (parents[n] in [-1, n-1]): the ring's
    tree_depth for that tree."""
    depth: list[int] = []
    for link in links:
        depth.append(1 if link < 0 else depth[link] + 1)
    return max(depth, default=0)


def check_ring_index_values(op: str, sizes: RingSizes, ring_slots, cursor, *, state_slots=None, parents=None,
                            steps=None, tree_depth=None) -> None:
    """Checked mode for the ring ops: raise IndexError naming the first bad row of the batch (host
    sync; for debugging). A row is active when its ring slot is >= 0; its state slot (verify,
    flush) must then be in range too -- accept advances every active ring, so a row the verify
    skipped for its state slot alone would corrupt the ring. With ``tree_depth`` no tree may be
    deeper: accept would push pending past the capacity, and every op would skip the slot."""
    ring, cursors = ring_slots.tolist(), cursor.tolist()
    state = None if state_slots is None else state_slots.tolist()
    accepted = None if steps is None else steps.tolist()
    links = None if parents is None else parents.tolist()
    used_by: dict[int, int] = {}
    state_used_by: dict[int, int] = {}
    for row, slot in enumerate(ring):
        if slot < 0:
            continue
        if slot >= sizes.num_ring_slots:
            raise IndexError(f"{op}: ring_slots[{row}] = {slot} is out of range for a ring of {sizes.num_ring_slots} "
                             f"slots (expected 0..{sizes.num_ring_slots - 1}, or negative to skip the row)")
        if state is not None and not 0 <= state[row] < sizes.num_state_slots:
            raise IndexError(f"{op}: state_slots[{row}] = {state[row]} is out of range for {sizes.num_state_slots} "
                             f"state slots while ring_slots[{row}] = {slot} is active (a padded row has both negative)")
        start, pending = cursors[slot]
        if not (0 <= start < sizes.ring_rows and 0 <= pending <= sizes.max_pending):
            raise IndexError(f"{op}: cursor[{slot}] = ({start}, {pending}) (row {row}) is not a ring position: start must "
                             f"be 0..{sizes.ring_rows - 1} and pending 0..{sizes.max_pending}")
        if accepted is not None and accepted[row] >= sizes.num_nodes:
            raise IndexError(f"{op}: steps[{row}] = {accepted[row]} is out of range for {sizes.num_nodes} draft "
                             f"tokens (expected 0..{sizes.num_nodes - 1}, or negative to accept none)")
        if links is not None:
            check_parent_links(op, row, links[row])
            deepest = None if tree_depth is None else longest_root_path(links[row])
            if deepest is not None and deepest > tree_depth:
                raise IndexError(f"{op}: parents[{row}] = {links[row]} has a root path of {deepest} nodes, more than "
                                 f"tree_depth = {tree_depth}")
        if slot in used_by:
            raise IndexError(f"{op}: rows {used_by[slot]} and {row} both use ring slot {slot}; which one lands would "
                             f"be unspecified")
        used_by[slot] = row
        if state is not None:  # (a fold writes the checkpoint and the window at the state slot)
            if state[row] in state_used_by:
                raise IndexError(f"{op}: rows {state_used_by[state[row]]} and {row} both use state slot {state[row]} "
                                 f"(one request's checkpoint); a fold of one would replay the other from it")
            state_used_by[state[row]] = row
