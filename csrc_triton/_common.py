"""Helpers shared by the launchers and kernels of csrc_triton."""

from __future__ import annotations

import functools
import os
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

try:  # programmatic dependent launch's instructions (Triton 3.4+; without them pdl is not used)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    gdc_launch_dependents = gdc_wait = None

MAX_GRID_Y = 65535  # CUDA's limit on a grid's y and z sizes
INT32_MAX = 2**31 - 1
COPY_BLOCK = 2048  # elements per program when both windows are the same contiguous block
GATHER_BLOCK = 4096  # elements per program when the source is gathered through its strides
# A gather whose grid would have fewer programs than this at GATHER_BLOCK (about eight per SM of an
# H100/H200: B = 1 and 8 at the Qwen3-Next TP4 and Nemotron-H shapes, B = 1 at TP1) is latency,
# not bandwidth: it halves its block (down to SMALL_GATHER_BLOCK) until the grid has that many,
# and stores through the destination's strides when the source channels are not adjacent.
SMALL_GRID_PROGRAMS = 1024
SMALL_GATHER_BLOCK = 1024
DEFAULT_WARPS = 4
# A gather whose source channels lie this many bytes or more apart stores through the
# destination's strides instead of flat. Measured on the H200 (bf16 channel_major, K = 4):
# flat stores win at 12 bytes (D = 4), strided ones at 20 (D = 8) and 36 (D = 16).
STRIDED_GATHER_BYTES = 16
# The chunked recurrences floor each token's log decay here before summing it along a path: after a
# decay of -1e6 the small ones that follow would drown in float32's rounding of the running sum, and
# -inf would make inf - inf. e^-64 (1.6e-28) leaves as little of the state before as zero does.
LOG_DECAY_FLOOR = tl.constexpr(-64.0)


MISSING = object()

# Launching a CompiledKernel directly (``compiled[grid](*args)``) relies on how Triton lays out a
# compiled kernel's launch arguments: used only on the Triton versions it was verified on (the
# GPU tests and the eager table ran on 3.6); any other version launches through Triton every time.
DIRECT_LAUNCH_TRITON_VERSIONS = ("3.6.",)


def direct_launch_supported(version: str = triton.__version__) -> bool:
    return version.startswith(DIRECT_LAUNCH_TRITON_VERSIONS)


class LaunchPlans(dict):
    """Launch plans (grid, scalar arguments, constexprs) keyed by a call's shape/stride signature.

    Engines repeat the same call shapes step after step, and computing a plan costs more host time
    than building its key (docs/benchmarks.md, "Eager overhead"). Use ``plans.get(key, MISSING)``
    (dict's own, the fast path), and ``plans.add(key, plan)`` on a miss. A plan must depend on
    nothing but its key; an error raised while planning is not stored. Bounded: cleared when full."""

    max_size = 4096

    def add(self, key: tuple, plan):
        if len(self) >= self.max_size:
            self.clear()
        self[key] = plan
        return plan


def fixed_launch(kernel, grid: tuple, scalars: tuple, kwargs: dict, num_tensors: int, num_descriptors: int = 0):
    """A function of the kernel's first ``num_tensors`` arguments (tensors) that launches ``kernel``
    on ``grid`` with the arguments after them fixed to ``scalars`` and ``kwargs``.

    Triton's own launch re-derives the kernel's specialisation from every argument on every call
    (its binder: the dtype, 16-byte alignment and value class of each argument), most of a small
    launch's host time. Here the arguments other than the tensors never change, and the tensors'
    dtypes, shapes and strides are fixed by the caller's key, so only their alignment can change:
    the first call whose tensors all start on 16-byte boundaries launches through Triton, which
    compiles (or finds) that specialisation and returns it; later such calls launch that compiled
    kernel directly, on the current stream, with the same arguments. A call with a misaligned
    tensor always launches through Triton. Under TRITON_INTERPRET=1 every call does, and so does
    every call on a Triton version the direct launch was not verified on (DIRECT_LAUNCH_TRITON_VERSIONS).

    For callers that key their cache by at least every dtype, shape and stride of the tensors and
    the device (sgl_convwin.ops' eager signature caches). The first ``num_descriptors`` of those
    arguments may be tensor descriptors, built per call (their bases are 16-byte aligned, or they
    would not exist)."""
    scalars = tuple(scalars)
    # then the constexpr parameters, in order (the compiled kernel takes every parameter)
    tail = scalars + tuple(kwargs[name] for name in kernel.arg_names[num_tensors + len(scalars):])
    launch = kernel[grid]
    direct = None
    direct_ok = direct_launch_supported()

    def run(*tensors):
        nonlocal direct
        misaligned = 0
        for tensor in tensors[num_descriptors:]:
            misaligned |= tensor.data_ptr() & 15
        if direct is not None and not misaligned:
            direct(*tensors, *tail)
            return
        compiled = launch(*tensors, *scalars, **kwargs)
        if direct_ok and not misaligned and hasattr(compiled, "__getitem__"):
            direct = compiled[tuple(grid) + (1,) * (3 - len(grid))]  # a compiled kernel reads 3 grid dims

    return run


def nothing_to_do(*args, **kwargs) -> None:
    """What a planned launch with no work (no rows, no layers, empty windows) runs."""


class KernelCall(NamedTuple):
    """One kernel launch as a launcher's call helper computes it: the launcher runs it, the
    op's planner fixes it (planned_launch) and benchmarks time it as a raw Triton launch."""

    kernel: Any  # a triton.JITFunction
    grid: tuple
    tensors: tuple  # the kernel's leading tensor arguments
    scalars: tuple  # the non-constexpr arguments after them
    constexprs: dict  # the constexpr arguments and launch options (num_warps)

    def launch(self) -> None:
        self.kernel[self.grid](*self.tensors, *self.scalars, **self.constexprs)


def planned_launch(call: KernelCall | None, num_descriptors: int = 0):
    """``call`` fixed for its signature (fixed_launch): a function of the kernel's tensor
    arguments (the first ``num_descriptors`` of them tensor descriptors); nothing_to_do when the
    call helper found nothing to do (None)."""
    if call is None:
        return nothing_to_do
    return fixed_launch(call.kernel, call.grid, call.scalars, call.constexprs, num_tensors=len(call.tensors),
                        num_descriptors=num_descriptors)


def planned_calls(build, *args, **kwargs):
    """The launches that ``build(*args, **kwargs)`` returns (KernelCalls, one or None) fixed for every
    call of this signature, each by planned_launch, with its tensors taken from a later call's
    arguments at the places ``build`` took them from. For launchers whose build takes every tensor
    it launches with from its arguments as it is (no view of one) and decides from their dtypes,
    shapes, strides, devices and 16-byte alignment only: the plan key fixes the rest, and here one
    plan is made per alignment of the tensors. Where a launch has a tensor of its own (a tensor
    descriptor), every call runs ``build``'s launches through Triton."""
    def calls_of(args, kwargs) -> tuple:
        calls = build(*args, **kwargs)
        return () if calls is None else (calls,) if isinstance(calls, KernelCall) else tuple(calls)

    positions = tuple(i for i, value in enumerate(args) if isinstance(value, torch.Tensor))
    names = tuple(name for name, value in kwargs.items() if isinstance(value, torch.Tensor))
    by_alignment: dict[tuple, tuple | None] = {}

    def fix(args, kwargs):
        # each tensor as a distinct alias, so that one passed twice (ring_slots as state_slots)
        # is found at the one place build took it from
        args, kwargs = list(args), dict(kwargs)
        for i in positions:
            args[i] = args[i].view_as(args[i])
        for name in names:
            kwargs[name] = kwargs[name].view_as(kwargs[name])
        flat = [args[i] for i in positions] + [kwargs[name] for name in names]
        fixed = []
        for call in calls_of(args, kwargs):
            where = tuple(next((j for j, t in enumerate(flat) if t is tensor), -1) for tensor in call.tensors)
            if -1 in where:
                return None
            fixed.append((planned_launch(call), where))
        return tuple(fixed)

    def run(*args, **kwargs):
        flat = [args[i] for i in positions] + [kwargs[name] for name in names]
        alignment = tuple(t.data_ptr() & 15 for t in flat)
        fixed = by_alignment.get(alignment, MISSING)
        if fixed is MISSING:
            if len(by_alignment) >= 64:
                by_alignment.clear()
            fixed = by_alignment[alignment] = fix(args, kwargs)
        if fixed is None:
            for call in calls_of(args, kwargs):
                call.launch()
            return
        for launch, where in fixed:
            launch(*[flat[j] for j in where])

    return run


def next_power_of_2(n: int) -> int:
    # triton.next_power_of_2 and triton.cdiv cost microseconds per call (Triton 3.9); these do not.
    return 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def programs_walking(op: str, tiles: int, tiles_a_program: int) -> tuple[int, int]:
    """(tiles a program walks, programs) where a row's ``tiles`` are walked ``tiles_a_program`` a
    program, one after another (0: all of them, one program a row)."""
    tiles_a_program = tiles_a_program or tiles
    if tiles % tiles_a_program:
        raise ValueError(f"{op}: a fold program's tiles must divide a row's {tiles}, got {tiles_a_program}")
    return tiles_a_program, tiles // tiles_a_program


def contiguous_order(dim_stride: int, win_stride: int, dim: int, width: int) -> str | None:
    """Whether a [dim, K-1] window with these strides is one block, and in which order."""
    if win_stride == 1 and (dim_stride == width or dim == 1):
        return "dim_major"
    if dim_stride == 1 and (win_stride == dim or width == 1):
        return "window_major"
    return None


def gather_block(num_rows: int, num_layers: int, window_numel: int) -> int:
    """Elements per program for a commit that gathers its source: GATHER_BLOCK, halved (down to
    SMALL_GATHER_BLOCK) while the grid would have fewer than SMALL_GRID_PROGRAMS programs."""
    block = GATHER_BLOCK
    while block > SMALL_GATHER_BLOCK and num_rows * num_layers * cdiv(window_numel, block) < SMALL_GRID_PROGRAMS:
        block //= 2
    return block


def commit_grid(op: str, num_rows: int, num_layers: int, window_numel: int, block: int) -> tuple[int, int, int]:
    """The commit kernels' grid (block, row, layer): each program reads its coordinates straight
    from program_id, with no division before its first index load (that division cost ~0.05-0.1 us
    at B = 1 on the H200), and programs are dispatched blocks first, then rows, then layers (a
    rows-first order was 4-7% slower from B = 64 up). CUDA allows 65535 rows (y) and layers (z)."""
    num_blocks = cdiv(window_numel, block)
    if num_layers > MAX_GRID_Y:
        raise ValueError(f"{op} supports at most {MAX_GRID_Y} layers, got {num_layers}")
    if num_rows > MAX_GRID_Y:
        raise ValueError(f"{op} commits at most {MAX_GRID_Y} rows per call, got {num_rows}; split the batch")
    if window_numel > INT32_MAX:
        raise ValueError(f"{op}: a window of {window_numel} elements is too large")
    return num_blocks, num_rows, num_layers


@triton.jit
def window_block(block, dim, WIDTH: tl.constexpr, BLOCK: tl.constexpr, WINDOW_MAJOR_ORDER: tl.constexpr):
    """Flat indices of one block of a [dim, K-1] window (walked as [K-1, dim] if
    WINDOW_MAJOR_ORDER), their mask, and their (channel, column) coordinates."""
    flat = block * BLOCK + tl.arange(0, BLOCK)
    mask = flat < dim * WIDTH
    if WINDOW_MAJOR_ORDER:
        col = flat // dim
        chan = flat - col * dim
    else:
        chan = flat // WIDTH
        col = flat - chan * WIDTH
    return flat, mask, chan, col


@triton.jit
def row_indices(
    row, step_ptr, step_stride, num_steps, dst_ptr, dst_stride, num_dst, src_ptr, src_stride, num_src
):
    """A commit row's (step or node, destination slot, source slot) as int64, and whether all three
    are in range. Index values are never trusted: anything out of range skips the row."""
    step = tl.load(step_ptr + row * step_stride).to(tl.int64)
    dst = tl.load(dst_ptr + row * dst_stride).to(tl.int64)
    src = tl.load(src_ptr + row * src_stride).to(tl.int64)
    active = (step >= 0) & (step < num_steps)
    active &= (dst >= 0) & (dst < num_dst)
    active &= (src >= 0) & (src < num_src)
    return step, dst, src, active


@triton.jit
def checked_step(pos, parent, parent_ok, ok):
    """One step of a walk that checks its links, from ``pos`` whose parent link is ``parent``
    (``parent_ok``: it lies in [-1, pos-1]; both unused where pos < 0): the next position -- the
    parent, -1 after a bad link (so every later read stays in bounds), or for a committed input the
    one before it -- and ``ok`` and-ed with this link's check."""
    ok &= parent_ok | (pos < 0)
    return tl.where(pos >= 0, tl.where(parent_ok, parent, -1), pos - 1), ok


@triton.jit
def tile_columns(values, GROUPS: tl.constexpr, COUNT: tl.constexpr):
    """The COUNT columns (a power of two) of a [GROUPS, COUNT] tile, each [GROUPS], in order:
    splits of an axis that lies inside one thread, so register renaming."""
    columns = (values,)
    for level in tl.static_range(COUNT.bit_length() - 1):
        evens = ()
        odds = ()
        for i in tl.static_range(len(columns)):
            even, odd = tl.split(tl.reshape(columns[i], [GROUPS, COUNT // (2 << level), 2]))
            evens = evens + (even,)
            odds = odds + (odd,)
        columns = evens + odds
    flat = ()
    for i in tl.static_range(COUNT):
        flat = flat + (tl.reshape(columns[i], [GROUPS]),)
    return flat


@triton.jit
def join_columns(columns, COUNT: tl.constexpr):
    """[groups, COUNT] whose column i is columns[i] ([groups] each, COUNT a power of two), by joins
    (each round pairs i with i + half, adding the next lower bit as an axis): it stays in registers."""
    leaves = columns
    for level in tl.static_range(COUNT.bit_length() - 1):
        joined = ()
        for i in tl.static_range(COUNT // (2 << level)):
            joined = joined + (tl.join(leaves[i], leaves[i + COUNT // (2 << level)]),)
        leaves = joined
    return tl.reshape(leaves[0], [leaves[0].shape[0], COUNT])


@triton.jit
def softplus(x):
    """torch's softplus in float32 (x itself above 20): max(x, 0) + log1p(exp(-|x|)), log1p(y) as
    2 atanh(y / (2 + y)) by its series -- log(1 + y) would lose log's relative accuracy where y is
    small (x below -3 or so) to the rounding of 1 + y."""
    y = tl.exp(-tl.abs(x))
    s = y / (2.0 + y)  # <= 1/3: ten terms of sum s^(2m+1) / (2m+1) reach float32's rounding
    t = s * s
    series = tl.full(x.shape, 1.0 / 19.0, tl.float32)
    for m in tl.static_range(9):
        series = series * t + 1.0 / (17 - 2 * m)
    return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + 2.0 * s * series)


@triton.jit
def floored_log_decay(x):
    """max(x, LOG_DECAY_FLOOR), NaN kept NaN."""
    return tl.maximum(x, LOG_DECAY_FLOOR, propagate_nan=tl.PropagateNan.ALL)


def prefetch_lines(row_bytes):
    """prefetch_rows_l2's LINES for rows of at most ``row_bytes`` bytes: the most 128-byte lines such
    a row spans, rounded up to a power of two (self-contained: Gluon kernels call it at compile time)."""
    lines = 1
    while lines < (row_bytes + 254) // 128:
        lines *= 2
    return lines


@triton.jit
def prefetch_rows_l2(base, stride_row, num_rows, row_bytes, ROWS: tl.constexpr, LINES: tl.constexpr):
    """A hint: rows r < num_rows (of ROWS, a power of two) of ``row_bytes`` contiguous bytes each, at
    base + r x stride_row elements, into L2, kept there before the lines streamed through after them
    (prefetch.global.L2::evict_last, sm_80+; LINES = prefetch_lines(the most row_bytes)). It reads
    nothing into the program, so it is safe whatever writes those bytes; not for the interpreter."""
    i = tl.arange(0, ROWS * LINES)
    row = i // LINES
    first = (base + row * stride_row).to(tl.int64, bitcast=True)
    line = (first // 128 + i % LINES) * 128
    live = (row < num_rows) & (line < first + row_bytes)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [line, live.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@functools.cache
def _nvidia_capability(device_index: int) -> tuple:
    # (ROCm devices report CUDA-like capabilities too: none of them runs these PTX paths)
    return torch.cuda.get_device_capability(device_index) if torch.version.hip is None else (0, 0)


def nvidia_at_least(device: torch.device, capability: tuple) -> bool:
    """Whether ``device`` is an NVIDIA GPU of compute capability ``capability`` or higher (asked
    once per device: launchers ask on every call)."""
    return _nvidia_capability(device.index if device.index is not None else torch.cuda.current_device()) >= capability


def pdl_device(ssm) -> bool:
    """Whether ssm's device has programmatic dependent launch (sm_90+); a CPU tensor (offline
    compiles, launch tests) counts as one."""
    return not ssm.is_cuda or nvidia_at_least(ssm.device, (9, 0))


def prefetch_device(ssm) -> bool:
    """Whether ssm's device takes prefetch_rows_l2 (an NVIDIA GPU of sm_80+); a CPU tensor (offline
    compiles, launch tests) counts as one."""
    return not ssm.is_cuda or nvidia_at_least(ssm.device, (8, 0))


def interpreted() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
