"""What the benchmark scripts share: model shapes, the problems they time, the timers (do_bench,
CUDA-graph replay, host time per call), the copy ceiling, the baseline kernels that stand for what
engines run today, and the printed formats (environment line, markdown tables, bench_scatter's
rows, which plot_scaling.py reads back).

Import it before any Triton kernel is defined: without CUDA it sets TRITON_INTERPRET=1, so the
scripts' correctness checks run on the CPU with the kernels interpreted.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from typing import Callable

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import sgl_convwin  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_SIZE = 4
SHAPES = {  # name: (layers, dim) per rank, K = 4
    "qwen3next-tp1": (36, 8192),
    "qwen3next-tp4": (36, 2048),
    "nemotronh-tp1": (23, 6144),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def needs_cuda(what: str = "timing") -> bool:
    """True with CUDA; otherwise says so (the caller returns 1)."""
    if DEVICE != "cuda":
        print(f"{what} needs CUDA")
        return False
    return True


# ------------------------------------------------------------------------------------------------
# Problems
# ------------------------------------------------------------------------------------------------


def tree_parents(num_nodes: int, topk: int | None) -> list[int]:
    """Parent links of a draft: a chain for topk None; else topk roots, then each node expands into
    topk children in order (parents[n] = (n - topk) // topk)."""
    if topk is None:
        return list(range(-1, num_nodes - 1))
    return [-1 if n < topk else (n - topk) // topk for n in range(num_nodes)]


def commit_problem(layers, slots, dim, num_draft, kernel_size, batch, dtype, layout, device, seed=0):
    """One commit's arguments ``(conv_state, windows, dst_slots, src_slots, steps)``: a seeded random
    buffer in ``layout`` read through its window view, a dim-major state, B distinct destination
    and source slots and random steps."""
    generator = torch.Generator(device=device).manual_seed(seed)
    buffer = sgl_convwin.alloc_windows(layers, slots, dim, num_draft, kernel_size, layout=layout, dtype=dtype,
                                       device=device)
    buffer.copy_(torch.randn(buffer.shape, generator=generator, device=device, dtype=torch.float32))
    windows = sgl_convwin.window_view(buffer, layout, num_draft, kernel_size)
    conv_state = torch.randn(layers, slots, dim, kernel_size - 1, generator=generator, device=device).to(dtype)
    dst = torch.randperm(slots, generator=generator, device=device)[:batch]
    src = torch.randperm(slots, generator=generator, device=device)[:batch]
    steps = torch.randint(0, num_draft, (batch,), generator=generator, device=device)
    return conv_state, windows, dst, src, steps


def tree_commit_problem(layers, dim, batch, parents_list, kernel_size, device="cuda"):
    """A tree commit's tensors ``(conv_state, rows, dense, dst_slots, src_slots, nodes, parents)``
    (bf16, max(B, 8) slots): seeded token_major rows, the dense fallback's cache holding the windows
    the tree implies (one [dim, K-1] window per node), a zero dim-major state, B distinct
    destination and source slots, a random accepted node per row and ``parents_list`` for every row."""
    from sgl_convwin import reference

    num_nodes, slots = len(parents_list), max(batch, 8)
    generator = torch.Generator(device=device).manual_seed(0)
    dst = torch.randperm(slots, generator=generator, device=device)[:batch]
    src = torch.randperm(slots, generator=generator, device=device)[:batch]
    nodes = torch.randint(0, num_nodes, (batch,), generator=generator, device=device)
    parents = torch.tensor([parents_list] * batch, device=device)
    conv_state = torch.zeros(layers, slots, dim, kernel_size - 1, device=device, dtype=torch.bfloat16)
    rows = sgl_convwin.alloc_windows(layers, slots, dim, num_nodes, kernel_size, layout="token_major", device=device)
    rows.copy_(torch.randn(rows.shape, generator=generator, device=device))
    dense = sgl_convwin.alloc_windows(layers, slots, dim, num_nodes, kernel_size, layout="dense", device=device)
    for node in range(num_nodes):
        positions = reference.tree_window_positions(node, parents_list, kernel_size)
        dense[:, :, node] = rows[:, :, positions].transpose(-1, -2)
    return conv_state, rows, dense, dst, src, nodes, parents


TREE_CONFIG_FLAGS = {  # a tree launch's CHANNELS/WARPS/FLAG...: the launcher arguments each flag sets
    "preload": dict(preload_parents=True),
    "links": dict(preload_parents=False),
    "columns": dict(lane_rows=False),
}


def tree_config(text: str) -> dict:
    """The tree launcher's arguments from CHANNELS/WARPS[/preload|/links][/columns]: channels per
    program, warps, the parent links loaded up front or walked link by link (default: its own rule),
    and an interleaved window stored as each thread's own K-1 vectors instead of lane rows."""
    import argparse

    channels, warps, *flags = text.split("/")
    config = dict(channels=int(channels), num_warps=int(warps))
    for flag in flags:
        arguments = TREE_CONFIG_FLAGS.get(flag)
        if arguments is None or set(arguments) & set(config):
            raise argparse.ArgumentTypeError(f"expected CHANNELS/WARPS[/preload|/links][/columns], got {text!r}")
        config.update(arguments)
    return config


def parse_tunings(pairs) -> dict:
    """NAME=VALUE strings as a launcher's keyword arguments (an integer value as an int)."""
    pairs = list(pairs)
    items = [pair.split("=", 1) for pair in pairs]
    if any(len(item) != 2 for item in items):
        raise ValueError(f"expected NAME=VALUE items, got {pairs}")
    return {name: int(value) if value.lstrip("-").isdigit() else value for name, value in items}


def verify_layer_problem(batch, num_nodes, parents_list, layout, dim, kernel_size, device="cuda"):
    """One verify layer's tensors (bf16, seeded): buffer, dest (what the kernel writes: the buffer,
    a channel_major one transposed), state, x, out, weight, bias, buffer and state slots, parents
    (None for a chain: parents_list None)."""
    slots = max(batch, 8)
    generator = torch.Generator(device=device).manual_seed(0)
    buffer = sgl_convwin.alloc_windows(1, slots, dim, num_nodes, kernel_size, layout=layout, device=device)
    dest = buffer if layout != "channel_major" else buffer.transpose(-1, -2)
    state = torch.randn(1, slots, dim, kernel_size - 1, generator=generator, device=device).to(torch.bfloat16)
    x = torch.randn(batch, num_nodes, dim, generator=generator, device=device).to(torch.bfloat16)
    out = torch.empty_like(x)
    weight = torch.randn(dim, kernel_size, generator=generator, device=device).to(torch.bfloat16)
    bias = torch.randn(dim, generator=generator, device=device).to(torch.bfloat16)
    slots_b = torch.randperm(slots, generator=generator, device=device)[:batch]
    slots_s = torch.randperm(slots, generator=generator, device=device)[:batch]
    parents = None if parents_list is None else torch.tensor([parents_list] * batch, device=device)
    return buffer, dest, state, x, out, weight, bias, slots_b, slots_s, parents


def layer_bytes(dim, kernel_size, num_nodes, batch, layout, element=2, written=True, conv=True) -> int:
    """Bytes one layer's verify must move for ``layout``: read x, the K-1 committed inputs and the
    weights; write the outputs and what it captures (dense: every node's window; else the K-2
    committed inputs and the N node inputs once). ``written`` False: only the bytes read; ``conv``
    False: a capture alone (no weights read, no outputs written)."""
    width = kernel_size - 1
    nbytes = batch * num_nodes * dim  # x read
    nbytes += batch * width * dim  # committed inputs read
    if conv:
        nbytes += dim * (kernel_size + 1)  # weight and bias
    if not written:
        return nbytes * element
    if conv:
        nbytes += batch * num_nodes * dim  # outputs written
    if layout == "dense":
        nbytes += batch * num_nodes * width * dim
    else:
        nbytes += batch * (num_nodes + width - 1) * dim
    return nbytes * element


def commit_bytes(batch, layers, dim, kernel_size, element_size) -> int:
    """Bytes a commit must move: read K-1 columns per window and write them."""
    return 2 * batch * layers * dim * (kernel_size - 1) * element_size


# ------------------------------------------------------------------------------------------------
# Timers
# ------------------------------------------------------------------------------------------------


def do_bench_us(fn, warmup=25, rep=200) -> float:
    """Median of triton.testing.do_bench on eager calls, us (bound by the host at small sizes)."""
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3


def graph_time_us(fn, launches=20, replays=50, *, rounds=5, warmup=1, estimate_us=None, budget_ms=120.0) -> float:
    """GPU time per call of ``fn``, us: ``launches`` calls captured in one CUDA graph (after
    ``warmup`` calls on a side stream), replayed ``replays`` times, median of ``rounds`` such rounds.
    With ``estimate_us`` (a time per call measured before, e.g. do_bench's) the graph's size and the
    replays follow it instead: ``launches`` = 500 us / estimate in 1..20 (a graph of >= ~0.5 ms),
    ``replays`` so that a round takes about ``budget_ms``, in 3..100."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    if estimate_us is not None:
        launches = max(1, min(20, int(500 / max(estimate_us, 1e-3))))
        replays = max(3, min(100, int(budget_ms * 1e3 / (max(estimate_us, 1e-3) * launches))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * launches))
    del graph
    return sorted(times)[len(times) // 2]


def host_time_us(fn, calls=20000, rounds=9, warmup=1000) -> float:
    """Host time per call, us: the best of ``rounds`` rounds of ``calls`` back-to-back calls."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def interleaved_host_times(candidates: dict[str, Callable], calls=1000, rounds=15, warmup=200,
                           sync: Callable = torch.cuda.synchronize) -> dict[str, tuple[float, float]]:
    """Host time per call of each candidate, us, as (best round, median round). Every round times
    every candidate, in an order rotated from round to round, so a slow spell of the host weighs on
    all of them alike; ``sync`` runs after each candidate's calls (outside the timing)."""
    names = list(candidates)
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    sync()
    times = {name: [] for name in names}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            fn = candidates[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
            sync()
    return {name: (min(values), statistics.median(values)) for name, values in times.items()}


def copy_ceiling_gbps() -> float:
    """Device-to-device copy of 1 GiB of bf16, read + write bytes per second, GB/s."""
    numel = 1 << 29
    src = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * numel * 2 / (ms * 1e-3) / 1e9


# ------------------------------------------------------------------------------------------------
# Baselines: stand-ins for the commit engines run today, one program per (row, layer, 1024
# elements): a flat copy out of a dense buffer, and a per-element strided gather out of any window
# view (the channel-major one in the tables).
# ------------------------------------------------------------------------------------------------


@triton.jit
def _dense_flat_copy_kernel(
    state_ptr, windows_ptr, dst_ptr, src_ptr, steps_ptr,
    state_stride_layer, state_stride_slot,
    windows_stride_layer, windows_stride_slot, windows_stride_step,
    numel, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    block = tl.program_id(2)
    step = tl.load(steps_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    src = tl.load(src_ptr + row).to(tl.int64)
    if (step >= 0) & (dst >= 0):
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < numel
        base_in = windows_ptr + layer * windows_stride_layer + src * windows_stride_slot + step * windows_stride_step
        values = tl.load(base_in + offsets, mask=mask)
        base_out = state_ptr + layer * state_stride_layer + dst * state_stride_slot
        tl.store(base_out + offsets, values.to(state_ptr.dtype.element_ty), mask=mask)


def dense_flat_copy(conv_state, windows, dst, src, steps):
    """windows: a contiguous dense buffer [L, M, D, dim, K-1]; conv_state contiguous [L, N, dim, K-1]."""
    L, _, dim, width = conv_state.shape
    numel = dim * width
    grid = (steps.shape[0], L, triton.cdiv(numel, 1024))
    _dense_flat_copy_kernel[grid](
        conv_state, windows, dst, src, steps,
        conv_state.stride(0), conv_state.stride(1),
        windows.stride(0), windows.stride(1), windows.stride(2),
        numel, BLOCK=1024,
    )


@triton.jit
def _channel_major_strided_kernel(
    state_ptr, windows_ptr, dst_ptr, src_ptr, steps_ptr,
    state_stride_layer, state_stride_slot, state_stride_dim, state_stride_win,
    win_stride_layer, win_stride_slot, win_stride_step, win_stride_dim, win_stride_win,
    numel, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    block = tl.program_id(2)
    step = tl.load(steps_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    src = tl.load(src_ptr + row).to(tl.int64)
    if (step >= 0) & (dst >= 0):
        flat = block * BLOCK + tl.arange(0, BLOCK)
        mask = flat < numel
        chan = flat // WIDTH
        col = flat % WIDTH
        in_ptr = (windows_ptr + layer * win_stride_layer + src * win_stride_slot + step * win_stride_step
                  + chan * win_stride_dim + col * win_stride_win)
        out_ptr = (state_ptr + layer * state_stride_layer + dst * state_stride_slot
                   + chan * state_stride_dim + col * state_stride_win)
        tl.store(out_ptr, tl.load(in_ptr, mask=mask).to(state_ptr.dtype.element_ty), mask=mask)


def channel_major_strided(conv_state, windows, dst, src, steps):
    """windows: any [L, M, D, dim, K-1] view (here the channel-major one), element by element."""
    L, _, dim, width = conv_state.shape
    numel = dim * width
    grid = (steps.shape[0], L, triton.cdiv(numel, 1024))
    _channel_major_strided_kernel[grid](
        conv_state, windows, dst, src, steps, *conv_state.stride(), *windows.stride(),
        numel, WIDTH=width, BLOCK=1024,
    )


def torch_indexing(conv_state, windows, dst, src, steps):
    """What a plain-PyTorch engine writes (all rows valid here; it has no skip rows)."""
    conv_state[:, dst] = windows[:, src, steps].to(conv_state.dtype)


# ------------------------------------------------------------------------------------------------
# Printed formats
# ------------------------------------------------------------------------------------------------


def environment_line() -> str:
    """``device: NAME, torch VERSION, triton VERSION`` (read back by read_results)."""
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    return f"device: {name}, torch {torch.__version__}, triton {triton.__version__}"


def print_environment(ceiling: float | None = None) -> None:
    print(environment_line())
    if ceiling is not None:
        print(f"copy ceiling (device-to-device, read+write): {ceiling:.0f} GB/s")


def markdown_header(*columns) -> str:
    return "| " + " | ".join(str(c) for c in columns) + " |\n" + "|---" * len(columns) + "|"


def markdown_row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


# bench_scatter.py prints one line per timed commit row as it goes; a run cut short by a time limit
# still has them, and read_results turns them back into the JSON's rows.
_COMMIT_ROW = re.compile(
    r"^(?P<shape>\S+)\s+(?P<dtype>bf16|fp32)\s+D=(?P<D>\d+)\s+B=(?P<B>\d+)\s+(?P<variant>.+?)\s+"
    r"(?P<us>[\d.]+) us\s+graph\s+(?P<graph_us>[\d.]+) us\s+(?P<gbps>[\d.]+) GB/s\s+(?P<frac>[\d.]+)%$"
)


def format_commit_row(row: dict) -> str:
    return (f"{row['shape']:14} {row['dtype']:5} D={row['D']:<2} B={row['B']:<4} {row['variant']:32} "
            f"{row['us']:9.1f} us  graph {row['graph_us']:8.1f} us  {row['gbps']:7.0f} GB/s  {row['frac']:5.1%}")


def parse_commit_row(line: str) -> dict | None:
    match = _COMMIT_ROW.match(line.rstrip())
    if match is None:
        return None
    row = match.groupdict()
    return dict(row, D=int(row["D"]), B=int(row["B"]), us=float(row["us"]), graph_us=float(row["graph_us"]),
                gbps=float(row["gbps"]), frac=float(row["frac"]) / 100)


def write_results(path: str, ceiling: float, rows: list[dict]) -> None:
    with open(path, "w") as f:
        json.dump(dict(ceiling_gbps=ceiling, device=torch.cuda.get_device_name(), torch=torch.__version__,
                       triton=triton.__version__, rows=rows), f, indent=1)


def read_results(path: str) -> dict:
    """bench_scatter's results: its --json file, or its printed log (``*.log``)."""
    if not path.endswith(".log"):
        with open(path) as f:
            return json.load(f)
    rows, header = [], {}
    with open(path) as f:
        for line in f:
            if line.startswith("device: "):
                device, torch_version, triton_version = (part.strip() for part in line[len("device: "):].split(","))
                header = dict(device=device, torch=torch_version.split()[-1], triton=triton_version.split()[-1])
            row = parse_commit_row(line)
            if row is not None:
                rows.append(row)
    return dict(header, rows=rows)
