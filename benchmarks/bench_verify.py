"""Verify-pass benchmark: a whole speculative step -- for every layer the causal conv1d of the
draft tokens plus the capture of its inputs, then one commit of the accepted windows for all
layers -- with this package's ops on each layout, against a pure-PyTorch implementation of the
same step (dense windows, and deduplicated token-major rows) and against engine-style update
kernels (one program per request and 256 channels, the committed inputs in registers, the drafts
walked in order) that write dense windows or a channel-major sequence (chains only, no commit).

    python benchmarks/bench_verify.py                  # H200 tables (needs CUDA)
    python benchmarks/bench_verify.py --verify-only    # check every variant on tiny shapes (CPU too)

Drafts: a chain of D=4 tokens, and trees of N=8 nodes with topk 2, 3, 4 (topk roots, then each
node expands into topk children in order: parents[n] = (n - topk) // topk). Two tables
(--tables): "layer", one layer's verify per row (CUDA-graph replay), the engine baselines beside
the package's op on each layout; "step", the whole step per row (CUDA-graph replay and the
do_bench median). Each row has the bytes it must move for its layout (read x, the K-1 committed
inputs and the weights; write the outputs and what it captures; for a step, the commit's read +
write), that as GB/s and as a fraction of a copy ceiling measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, NamedTuple

import torch

import common  # before triton and sgl_convwin: without CUDA it sets TRITON_INTERPRET=1
import sgl_convwin
import triton
import triton.language as tl
from common import graph_time_us, layer_bytes, markdown_header, markdown_row, tree_parents, verify_layer_problem
from sgl_convwin import reference


def path_positions(parents: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """[B, N, K]: every node's K conv inputs as positions in [K-1 committed inputs, N nodes]."""
    num_rows, num_nodes = parents.shape
    width = kernel_size - 1
    pos = width + torch.arange(num_nodes, device=parents.device).expand(num_rows, num_nodes)
    newest_first = [pos]
    for _ in range(width):
        parent = parents.gather(1, (pos - width).clamp(min=0))
        pos = torch.where(pos >= width, width + parent, pos - 1)
        newest_first.append(pos)
    return torch.stack(newest_first[::-1], dim=-1)


# ------------------------------------------------------------------------------------------------
# The step, in plain PyTorch (what an engine writes without this package)
# ------------------------------------------------------------------------------------------------


def torch_step(p, layout):
    """dense: windows [L, M, N, dim, K-1]; token_major: rows [L, M, N+K-2, dim]. Every row valid."""
    B = p["nodes"].shape[0]
    positions = path_positions(p["parents"], p["kernel_size"])  # [B, N, K]
    batch = torch.arange(B, device=positions.device)
    for layer in range(p["x"].shape[0]):
        history = p["conv_state"][layer, p["state_slots"]].transpose(1, 2)  # [B, K-1, dim]
        inputs = torch.cat([history, p["x"][layer]], dim=1)  # [B, K-1+N, dim]
        taps = inputs[batch[:, None, None], positions]  # [B, N, K, dim]
        y = (taps.float() * p["weight"][layer].float().t()).sum(dim=2) + p["bias"][layer].float()
        p["outs"][layer] = torch.nn.functional.silu(y).to(p["outs"].dtype)
        if layout == "dense":
            p["buffer"][layer, p["buffer_slots"]] = taps[:, :, 1:].transpose(-1, -2)
        else:
            p["buffer"][layer, p["buffer_slots"]] = inputs[:, 1:]
    accepted = positions[batch, p["nodes"], 1:]  # [B, K-1] positions of the accepted window
    if layout == "dense":
        windows = p["buffer"][:, p["buffer_slots"], p["nodes"]]
    else:
        windows = p["buffer"][:, p["buffer_slots"][:, None], accepted - 1].transpose(-1, -2)
    p["conv_state"][:, p["state_slots"]] = windows


def convwin_step(p, layout):
    parents = p["parents"] if p["tree"] else None
    for layer in range(p["x"].shape[0]):
        sgl_convwin.causal_conv1d_verify(
            p["outs"][layer], p["buffer"], p["conv_state"], p["x"][layer], p["weight"][layer], p["bias"][layer],
            p["buffer_slots"], p["state_slots"], layer, parents, layout=layout, activation="silu",
        )
    if layout == "dense":
        sgl_convwin.scatter(p["conv_state"], p["buffer"], p["state_slots"], p["buffer_slots"], p["nodes"])
    elif not p["tree"]:
        windows = sgl_convwin.window_view(p["buffer"], layout, p["x"].shape[2], p["kernel_size"])
        sgl_convwin.scatter(p["conv_state"], windows, p["state_slots"], p["buffer_slots"], p["nodes"])
    else:
        rows = p["buffer"] if layout == "token_major" else p["buffer"].transpose(-1, -2)
        sgl_convwin.scatter_tree(p["conv_state"], rows, p["state_slots"], p["buffer_slots"], p["nodes"], p["parents"])


# ------------------------------------------------------------------------------------------------
# Engine baselines: the update kernels engines run in the verify pass today (the shape of SGLang's
# and vLLM's Triton causal-conv1d update with speculative windows), written here from that design:
# one program per (request, 256 channels) holds the K-1 committed inputs in registers and walks the
# draft tokens in order, writing each token's output and either its whole window (dense) or its
# input into a channel-major sequence.
# ------------------------------------------------------------------------------------------------

ENGINE_BLOCK = 256  # channels per program, as in the engines' update kernels
ENGINE_WARPS = 4  # Triton's default: their launches set none


@triton.jit
def _engine_up(pos, parents_row, parents_stride_node):
    """One step up a tree path: a node to its parent, committed input -1 to -2 and so on (a bad
    link leads to -1, keeping every later read in bounds)."""
    parent = tl.load(parents_row + tl.maximum(pos, 0) * parents_stride_node).to(pos.dtype)
    parent = tl.where((parent >= -1) & (parent < pos), parent, -1)
    return tl.where(pos >= 0, parent, pos - 1)


@triton.jit
def _engine_input(pos, xs, x_stride_node, h1, h2, h3, cmask):
    """The input at path position ``pos``: a node's token from x, else committed input h1 (the
    newest, -1), h2 (-2) or h3 (-3) from the registers."""
    # (tl.where, not &: Triton's interpreter mistypes a vector & scalar mask)
    token = tl.load(xs + tl.maximum(pos, 0) * x_stride_node, mask=tl.where(pos >= 0, cmask, False))
    committed = tl.where(pos == -1, h1, tl.where(pos == -2, h2, h3))
    return tl.where(pos >= 0, token.to(tl.float32), committed)


@triton.jit
def _engine_conv_update_kernel(
    out_ptr, dest_ptr, state_ptr, x_ptr, weight_ptr, bias_ptr, buffer_slots_ptr, state_slots_ptr, parents_ptr,
    num_nodes, dim,
    dest_stride_slot, dest_stride_node, dest_stride_dim, dest_stride_win,
    state_stride_slot, state_stride_dim, state_stride_win,
    x_stride_row, x_stride_node, x_stride_dim,
    out_stride_row, out_stride_node, out_stride_dim,
    weight_stride_dim, weight_stride_tap, bias_stride, buffer_slots_stride, state_slots_stride,
    parents_stride_row, parents_stride_node,
    KERNEL_SIZE: tl.constexpr, BLOCK: tl.constexpr, HAS_PARENTS: tl.constexpr, SEQUENCE: tl.constexpr,
):
    WIDTH: tl.constexpr = KERNEL_SIZE - 1
    row = tl.program_id(0).to(tl.int64)
    chan = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    cmask = chan < dim
    dst = tl.load(buffer_slots_ptr + row * buffer_slots_stride).to(tl.int64)
    src = tl.load(state_slots_ptr + row * state_slots_stride).to(tl.int64)
    if (dst >= 0) & (src >= 0):  # a negative slot is padding
        state = state_ptr + src * state_stride_slot + chan * state_stride_dim
        dest = dest_ptr + dst * dest_stride_slot + chan * dest_stride_dim
        xs = x_ptr + row * x_stride_row + chan * x_stride_dim
        outs = out_ptr + row * out_stride_row + chan * out_stride_dim
        parents_row = parents_ptr + row * parents_stride_row
        # the committed inputs, newest first (h2, h3 unused below K = 3, 4)
        h1 = tl.load(state + (WIDTH - 1) * state_stride_win, mask=cmask).to(tl.float32)
        h2 = tl.zeros([BLOCK], dtype=tl.float32)
        h3 = tl.zeros([BLOCK], dtype=tl.float32)
        if WIDTH >= 2:
            h2 = tl.load(state + (WIDTH - 2) * state_stride_win, mask=cmask).to(tl.float32)
        if WIDTH >= 3:
            h3 = tl.load(state + (WIDTH - 3) * state_stride_win, mask=cmask).to(tl.float32)
        # tap K-1 multiplies the token itself, tap K-1-j its j-th previous input
        w0 = tl.load(weight_ptr + chan * weight_stride_dim + WIDTH * weight_stride_tap, mask=cmask).to(tl.float32)
        w1 = tl.load(weight_ptr + chan * weight_stride_dim + (WIDTH - 1) * weight_stride_tap, mask=cmask).to(tl.float32)
        w2 = tl.zeros([BLOCK], dtype=tl.float32)
        w3 = tl.zeros([BLOCK], dtype=tl.float32)
        if WIDTH >= 2:
            w2 = tl.load(weight_ptr + chan * weight_stride_dim + (WIDTH - 2) * weight_stride_tap,
                         mask=cmask).to(tl.float32)
        if WIDTH >= 3:
            w3 = tl.load(weight_ptr + chan * weight_stride_dim + (WIDTH - 3) * weight_stride_tap,
                         mask=cmask).to(tl.float32)
        bias = tl.load(bias_ptr + chan * bias_stride, mask=cmask).to(tl.float32)
        if SEQUENCE:  # positions 0 .. K-3: the K-2 newest committed inputs, oldest first
            if WIDTH >= 2:
                tl.store(dest + (WIDTH - 2) * dest_stride_node, h1.to(dest_ptr.dtype.element_ty), mask=cmask)
            if WIDTH >= 3:
                tl.store(dest + (WIDTH - 3) * dest_stride_node, h2.to(dest_ptr.dtype.element_ty), mask=cmask)
        prev1, prev2, prev3 = h1, h2, h3  # a chain's previous inputs, rolled in registers
        for node in range(num_nodes):
            token = tl.load(xs + node * x_stride_node, mask=cmask).to(tl.float32)
            if HAS_PARENTS:  # a tree node's previous inputs are on its path: follow the parent links
                pos1 = _engine_up(tl.cast(node, tl.int32), parents_row, parents_stride_node)
                prev1 = _engine_input(pos1, xs, x_stride_node, h1, h2, h3, cmask)
                if WIDTH >= 2:
                    pos2 = _engine_up(pos1, parents_row, parents_stride_node)
                    prev2 = _engine_input(pos2, xs, x_stride_node, h1, h2, h3, cmask)
                    if WIDTH >= 3:
                        pos3 = _engine_up(pos2, parents_row, parents_stride_node)
                        prev3 = _engine_input(pos3, xs, x_stride_node, h1, h2, h3, cmask)
            acc = tl.fma(w0, token, bias)
            acc = tl.fma(w1, prev1, acc)
            if WIDTH >= 2:
                acc = tl.fma(w2, prev2, acc)
            if WIDTH >= 3:
                acc = tl.fma(w3, prev3, acc)
            acc = acc * tl.sigmoid(acc)
            tl.store(outs + node * out_stride_node, acc.to(out_ptr.dtype.element_ty), mask=cmask)
            if SEQUENCE:
                tl.store(dest + (WIDTH - 1 + node) * dest_stride_node, token.to(dest_ptr.dtype.element_ty), mask=cmask)
            else:  # the token's window: its K-1 newest inputs, oldest first
                window = dest + node * dest_stride_node
                tl.store(window + (WIDTH - 1) * dest_stride_win, token.to(dest_ptr.dtype.element_ty), mask=cmask)
                if WIDTH >= 2:
                    tl.store(window + (WIDTH - 2) * dest_stride_win, prev1.to(dest_ptr.dtype.element_ty), mask=cmask)
                if WIDTH >= 3:
                    tl.store(window + (WIDTH - 3) * dest_stride_win, prev2.to(dest_ptr.dtype.element_ty), mask=cmask)
            if not HAS_PARENTS:
                prev3 = prev2
                prev2 = prev1
                prev1 = token


def engine_conv_update(out, dest, state, x, weight, bias, buffer_slots, state_slots, parents=None, *,
                       sequence=False):
    """One layer's verify conv, engine style. out, x: [B, N, dim]; state: [slots, dim, K-1];
    weight: [dim, K] (K in 2..4); bias: [dim]; slots: [B]; parents: [B, N] or None (a chain).
    dest: dense windows [slots, N, dim, K-1], or with ``sequence`` (chains only) the channel-major
    sequence [slots, dim, N+K-2]. Any strides."""
    num_rows, num_nodes, dim = x.shape
    kernel_size = weight.shape[1]
    if not 2 <= kernel_size <= 4:
        raise ValueError(f"engine_conv_update: kernel_size {kernel_size}; the registers hold K = 2 .. 4")
    if sequence:
        if parents is not None:
            raise ValueError("engine_conv_update: a channel-major sequence holds a chain's inputs only")
        dest_strides = (dest.stride(0), dest.stride(2), dest.stride(1), 0)  # (slot, position, dim, -)
    else:
        dest_strides = dest.stride()
    if num_rows == 0 or dim == 0:
        return
    grid = (num_rows, triton.cdiv(dim, ENGINE_BLOCK))
    _engine_conv_update_kernel[grid](
        out, dest, state, x, weight, bias, buffer_slots, state_slots,
        parents if parents is not None else buffer_slots,  # never read for a chain
        num_nodes, dim, *dest_strides, *state.stride(), *x.stride(), *out.stride(), *weight.stride(),
        bias.stride(0), buffer_slots.stride(0), state_slots.stride(0),
        *(parents.stride() if parents is not None else (0, 0)),
        KERNEL_SIZE=kernel_size, BLOCK=ENGINE_BLOCK, HAS_PARENTS=parents is not None, SEQUENCE=sequence,
        num_warps=ENGINE_WARPS,
    )


def engine_windows_step(p, layout):
    """Every layer's engine update into a dense buffer, then the package's dense commit (scatter)."""
    parents = p["parents"] if p["tree"] else None
    for layer in range(p["x"].shape[0]):
        engine_conv_update(p["outs"][layer], p["buffer"][layer], p["conv_state"][layer], p["x"][layer],
                           p["weight"][layer], p["bias"][layer], p["buffer_slots"], p["state_slots"], parents)
    sgl_convwin.scatter(p["conv_state"], p["buffer"], p["state_slots"], p["buffer_slots"], p["nodes"])


def engine_sequence_step(p, layout):
    """Every layer's engine update into a channel-major sequence; no commit (none is timed for this
    design: the row is the verify pass alone)."""
    for layer in range(p["x"].shape[0]):
        engine_conv_update(p["outs"][layer], p["buffer"][layer], p["conv_state"][layer], p["x"][layer],
                           p["weight"][layer], p["bias"][layer], p["buffer_slots"], p["state_slots"],
                           sequence=True)


class Variant(NamedTuple):
    name: str
    layout: str
    step: Callable
    commit: bool = True  # False: the step leaves the committed state as it was
    tree: bool = True  # False: chains only


VARIANTS = [
    Variant("pytorch dense", "dense", torch_step),
    Variant("pytorch token_major", "token_major", torch_step),
    Variant("engine conv update, dense windows", "dense", engine_windows_step),
    Variant("engine conv update, channel-major sequence (no commit)", "channel_major", engine_sequence_step,
            commit=False, tree=False),
    Variant("convwin dense", "dense", convwin_step),
    Variant("convwin channel_major", "channel_major", convwin_step),
    Variant("convwin token_major", "token_major", convwin_step),
]


def make_problem(layers, dim, kernel_size, num_nodes, topk, tree, batch, layout, device, seed=0):
    # drawn on the device: the host's randn of a B=256 model-sized problem takes seconds per row
    generator = torch.Generator(device=device).manual_seed(seed)
    slots = max(batch, 8)
    dtype = torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device).to(dtype)

    return dict(
        kernel_size=kernel_size, tree=tree,
        outs=torch.zeros(layers, batch, num_nodes, dim, dtype=dtype, device=device),
        buffer=sgl_convwin.alloc_windows(layers, slots, dim, num_nodes, kernel_size, layout=layout,
                                         dtype=dtype, device=device),
        conv_state=randn(layers, slots, dim, kernel_size - 1),
        x=randn(layers, batch, num_nodes, dim),
        weight=randn(layers, dim, kernel_size),
        bias=randn(layers, dim),
        buffer_slots=torch.randperm(slots, generator=generator, device=device)[:batch],
        state_slots=torch.randperm(slots, generator=generator, device=device)[:batch],
        nodes=torch.randint(0, num_nodes, (batch,), generator=generator, device=device),
        parents=torch.tensor([tree_parents(num_nodes, topk if tree else None)] * batch, device=device),
    )


def step_bytes(layers, dim, kernel_size, num_nodes, batch, layout, element=2, commit=True):
    """Bytes one step must move for ``layout`` (each input read once, each output written once);
    ``commit``: with the commit's read + write of K-1 columns per layer."""
    per_layer = layer_bytes(dim, kernel_size, num_nodes, batch, layout, element)
    if commit:
        per_layer += 2 * batch * (kernel_size - 1) * dim * element
    return layers * per_layer


def check_steps(device) -> bool:
    """Every whole-step variant on tiny shapes: the committed state (exactly; untouched by a step
    without commit), outputs against the float64 oracle, and the captured buffer against the
    capture oracle."""
    ok = True
    layers, dim, K = 2, 24, 4
    for tree, num_nodes, topk in ((False, 4, None), (True, 8, 2), (True, 8, 3), (True, 7, 4)):
        for B in (1, 3):
            for name, layout, step, commit, on_trees in VARIANTS:
                if tree and not on_trees:
                    continue
                p = make_problem(layers, dim, K, num_nodes, topk, tree, B, layout, device, seed=B)
                before = {k: v.cpu().clone() if isinstance(v, torch.Tensor) else v for k, v in p.items()}
                step(p, layout)
                parents = before["parents"] if tree else None
                for layer in range(layers):
                    want_out, written = reference.causal_conv1d_verify_reference(
                        before["outs"][layer], before["conv_state"], before["x"][layer], before["weight"][layer],
                        before["bias"][layer], before["buffer_slots"], before["state_slots"], p["buffer"].shape[1],
                        layer, parents, "silu")
                    good = bool(written.all()) and torch.allclose(p["outs"][layer].cpu().double(), want_out, rtol=1.6e-2, atol=1.6e-2)
                    before["buffer"] = reference.capture_reference(
                        before["buffer"], before["conv_state"], before["x"][layer], before["buffer_slots"],
                        before["state_slots"], layer, layout, parents)
                    if not good:
                        print(f"MISMATCH outputs: {name} tree={tree} N={num_nodes} B={B} layer {layer}")
                    ok &= good
                good = torch.equal(p["buffer"].cpu(), before["buffer"])
                if commit:
                    dense = reference.capture_reference(
                        torch.zeros(layers, p["buffer"].shape[1], num_nodes, dim, K - 1, dtype=torch.bfloat16),
                        before["conv_state"], before["x"][0], before["buffer_slots"], before["state_slots"], 0,
                        "dense", before["parents"])
                    for layer in range(1, layers):
                        dense = reference.capture_reference(dense, before["conv_state"], before["x"][layer],
                                                            before["buffer_slots"], before["state_slots"], layer,
                                                            "dense", before["parents"])
                    want_state = reference.scatter_reference(before["conv_state"], dense, before["state_slots"],
                                                             before["buffer_slots"], before["nodes"])
                else:
                    want_state = before["conv_state"]
                good &= torch.equal(p["conv_state"].cpu(), want_state)
                if not good:
                    print(f"MISMATCH buffer/state: {name} tree={tree} N={num_nodes} B={B}")
                ok &= good
    return ok


# One layer's verify: (name, layout, call) -- call "op" is the package's op on that layout
LAYER_VARIANTS = [
    ("engine conv update, dense windows", "dense", "windows"),
    ("engine conv update, channel-major sequence", "channel_major", "sequence"),
    ("convwin dense", "dense", "op"),
    ("convwin channel_major", "channel_major", "op"),
    ("convwin token_major", "token_major", "op"),
]


def layer_call(call, layout, problem):
    """The timed function of one LAYER_VARIANTS row on a common.verify_layer_problem."""
    buffer, _, state, x, out, weight, bias, buffer_slots, state_slots, parents = problem
    if call == "op":
        return lambda: sgl_convwin.causal_conv1d_verify(out, buffer, state, x, weight, bias, buffer_slots, state_slots,
                                                        0, parents, layout=layout, activation="silu")
    # the engine kernels see one layer: [slots, N, dim, K-1] windows or a [slots, dim, N+K-2] sequence
    return lambda: engine_conv_update(out, buffer[0], state[0], x, weight, bias, buffer_slots, state_slots, parents,
                                      sequence=call == "sequence")


def check_layers(device) -> bool:
    """Every LAYER_VARIANTS call as the per-layer table times it, on small shapes (two channel
    blocks of the engine kernels, the second partial): outputs against the float64 oracle, the
    buffer exactly against the capture oracle."""
    ok = True
    dim, K, B = 300, 4, 3
    for draft, (tree, num_nodes, topk) in DRAFTS.items():
        parents_list = tree_parents(num_nodes, topk) if tree else None
        for name, layout, call in LAYER_VARIANTS:
            if tree and call == "sequence":
                continue
            problem = verify_layer_problem(B, num_nodes, parents_list, layout, dim, K, device)
            before = [t.cpu().clone() if t is not None else None for t in problem]
            layer_call(call, layout, problem)()
            buffer, _, state, x, out, weight, bias, slots_b, slots_s, parents = before
            want_out, written = reference.causal_conv1d_verify_reference(
                out, state, x, weight, bias, slots_b, slots_s, buffer.shape[1], 0, parents, "silu")
            want_buffer = reference.capture_reference(buffer, state, x, slots_b, slots_s, 0, layout, parents)
            good = bool(written.all()) and torch.allclose(problem[4].cpu().double(), want_out, rtol=1.6e-2, atol=1.6e-2)
            good &= torch.equal(problem[0].cpu(), want_buffer)
            if not good:
                print(f"MISMATCH one layer: {name} {draft} B={B}")
            ok &= good
    return ok


def check(device) -> bool:
    ok = check_layers(device) & check_steps(device)
    print("verify:", "all variants match the oracles" if ok else "FAILED")
    return ok


DRAFTS = {"chain": (False, 4, None), "tree2": (True, 8, 2), "tree3": (True, 8, 3), "tree4": (True, 8, 4)}
TABLES = ("layer", "step")
COPY_ROW = "copy of as many bytes"
MIX_ROW = "copy + fill, the rows layouts' read/write mix"
CHAIN_ONLY = ("engine conv update, channel-major sequence: chains only, not run on trees (a tree node's window "
              "is not a slice of the node-order sequence)")


STREAM_ROW = "one kernel streaming the rows layouts' read/write mix"
STREAM_CONFIGS = ((1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8))  # (elements written, warps) per program


@triton.jit
def _mix_stream_kernel(src_ptr, dst_ptr, READ: tl.constexpr, WRITE: tl.constexpr, SIZE: tl.constexpr):
    """Program p reads READ elements of src and writes WRITE of dst (the ones it read, then zeros):
    one streaming kernel moving bytes in the proportion the verify kernels move them."""
    p = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, SIZE)
    values = tl.load(src_ptr + p * READ + offsets, mask=offsets < READ, other=0.0)
    tl.store(dst_ptr + p * WRITE + offsets, values, mask=offsets < WRITE)


def mix_stream_launch(read: int, written: int, block: int, warps: int, device):
    """A launch of _mix_stream_kernel reading ``read`` and writing ``written`` bytes (bf16), ``block``
    elements written per program over ``warps`` warps."""
    per_program = max(8, round(block * read / written / 8) * 8)  # 16-byte vectors
    programs = triton.cdiv(written // 2, block)
    src = torch.zeros(programs * per_program, dtype=torch.bfloat16, device=device)
    dst = torch.empty(programs * block, dtype=torch.bfloat16, device=device)
    size = triton.next_power_of_2(max(block, per_program))
    return lambda: _mix_stream_kernel[(programs,)](src, dst, READ=per_program, WRITE=block, SIZE=size,
                                                   num_warps=warps)


def mix_stream_us(read: int, written: int, device) -> float:
    """Graph-replay time of _mix_stream_kernel at its best of STREAM_CONFIGS: what one kernel moving
    this mix, with nothing else to do, takes."""
    return min(graph_time_us(mix_stream_launch(read, written, block, warps, device), launches=20, replays=20)
               for block, warps in STREAM_CONFIGS)


def draft_name(tree, num_nodes, topk):
    return f"chain D={num_nodes}" if not tree else f"tree N={num_nodes} topk {topk}"


def bench_layers(batches, drafts, ceiling, dim, kernel_size, device):
    """One layer's verify per row: the engine baselines and the package's op on each layout."""
    print(f"\nOne layer's verify (conv + capture), dim={dim}, K={kernel_size}, bf16; CUDA-graph replay of 20 calls")
    rows = []
    for tree, num_nodes, topk in (DRAFTS[name] for name in drafts):
        draft = draft_name(tree, num_nodes, topk)
        parents_list = tree_parents(num_nodes, topk) if tree else None
        for B in batches:
            for name, layout, call in LAYER_VARIANTS:
                if tree and call == "sequence":
                    continue
                problem = verify_layer_problem(B, num_nodes, parents_list, layout, dim, kernel_size, device)
                us = graph_time_us(layer_call(call, layout, problem), launches=20, replays=20)
                nbytes = layer_bytes(dim, kernel_size, num_nodes, B, layout)
                gbps = nbytes / (us * 1e-6) / 1e9
                rows.append((draft, B, name, us, nbytes, gbps, gbps / ceiling))
                print(f"{draft:18} B={B:<4} {name:44} graph {us:8.2f} us  {gbps:6.0f} GB/s {gbps / ceiling:6.1%}",
                      flush=True)
                del problem
            # how near a plain copy of as many bytes (the rows layouts') comes to the ceiling at this size
            nbytes = layer_bytes(dim, kernel_size, num_nodes, B, "token_major")
            src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device=device)
            dst = torch.empty_like(src)
            us = graph_time_us(lambda: dst.copy_(src), launches=20, replays=20)
            gbps = nbytes / (us * 1e-6) / 1e9
            rows.append((draft, B, COPY_ROW, us, nbytes, gbps, gbps / ceiling))
            print(f"{draft:18} B={B:<4} {COPY_ROW:44} graph {us:8.2f} us  {gbps:6.0f} GB/s {gbps / ceiling:6.1%}",
                  flush=True)
            # the same bytes split as the rows layouts' are (they write more than they read): a copy of
            # what they read, and a fill of what they write beyond it, in one graph
            read = layer_bytes(dim, kernel_size, num_nodes, B, "token_major", written=False)
            src = torch.empty(read // 2, dtype=torch.bfloat16, device=device)
            dst = torch.empty_like(src)
            rest = torch.empty(max(nbytes - 2 * read, 0) // 2, dtype=torch.bfloat16, device=device)
            us = graph_time_us(lambda: (dst.copy_(src), rest.zero_()), launches=20, replays=20)
            gbps = nbytes / (us * 1e-6) / 1e9
            rows.append((draft, B, MIX_ROW, us, nbytes, gbps, gbps / ceiling))
            print(f"{draft:18} B={B:<4} {MIX_ROW:44} graph {us:8.2f} us  {gbps:6.0f} GB/s {gbps / ceiling:6.1%}",
                  flush=True)
            src = dst = rest = None  # (not del: the lambdas above read them, which pyflakes takes for undefined)
            us = mix_stream_us(read, nbytes - read, device)
            gbps = nbytes / (us * 1e-6) / 1e9
            rows.append((draft, B, STREAM_ROW, us, nbytes, gbps, gbps / ceiling))
            print(f"{draft:18} B={B:<4} {STREAM_ROW:44} graph {us:8.2f} us  {gbps:6.0f} GB/s {gbps / ceiling:6.1%}",
                  flush=True)
    print()
    print(markdown_header("draft", "B", "variant", "graph replay per layer (us)", "bytes moved", "GB/s",
                          f"of copy ceiling ({ceiling:.0f} GB/s)"))
    for draft, B, name, us, nbytes, gbps, frac in rows:
        print(markdown_row(draft, B, name, f"{us:.2f}", f"{nbytes / 1e6:.2f} MB", f"{gbps:.0f}", f"{frac:.1%}"))
    print(f"\n{CHAIN_ONLY}. {COPY_ROW}: half of the rows layouts' bytes read, half written, by one copy. "
          f"{MIX_ROW}: a copy of the bytes the rows layouts read and a fill of the rest they write. "
          f"{STREAM_ROW}: each program reads a block and writes it and zeros after it, in that proportion "
          f"(the best of {len(STREAM_CONFIGS)} block / warps configurations).")
    return rows


def bench_steps(batches, drafts, ceiling, layers, dim, kernel_size, device):
    """A whole step per row: every layer's verify + the commit of its design."""
    print(f"\nQwen3-Next TP1 shape: L={layers}, dim={dim}, K={kernel_size}, bf16; one step = {layers} x "
          f"(verify conv + capture) + 1 commit")
    rows = []
    for tree, num_nodes, topk in (DRAFTS[name] for name in drafts):
        draft = draft_name(tree, num_nodes, topk)
        for B in batches:
            for name, layout, step, commit, on_trees in VARIANTS:
                if tree and not on_trees:
                    continue
                p = make_problem(layers, dim, kernel_size, num_nodes, topk, tree, B, layout, device)
                us = common.do_bench_us(lambda: step(p, layout), warmup=2, rep=30)
                graph_us = graph_time_us(lambda: step(p, layout), launches=1, replays=10)
                nbytes = step_bytes(layers, dim, kernel_size, num_nodes, B, layout, commit=commit)
                gbps = nbytes / (graph_us * 1e-6) / 1e9
                cache = p["buffer"].numel() * p["buffer"].element_size() // p["buffer"].shape[1]
                rows.append((draft, B, name, us, graph_us, nbytes, gbps, gbps / ceiling, cache))
                print(f"{draft:18} B={B:<4} {name:54} {us:9.1f} us  graph {graph_us:9.1f} us  "
                      f"{gbps:6.0f} GB/s {gbps / ceiling:6.1%}", flush=True)
                p = None  # (not del: the lambdas above read it)
    print()
    print(markdown_header("draft", "B", "variant", "graph replay per step (us)", "do_bench median (us)", "bytes moved",
                          "GB/s", f"of copy ceiling ({ceiling:.0f} GB/s)", "cache bytes per slot"))
    for draft, B, name, us, graph_us, nbytes, gbps, frac, cache in rows:
        print(markdown_row(draft, B, name, f"{graph_us:.1f}", f"{us:.1f}", f"{nbytes / 1e6:.1f} MB", f"{gbps:.0f}",
                           f"{frac:.1%}", cache))
    print(f"\nengine conv update, dense windows: commits with sgl_convwin.scatter on its dense buffer. "
          f"{CHAIN_ONLY}; its row has no commit (neither timed nor in its bytes).")
    return rows


def bench(batches, drafts, tables=TABLES, layers=36, dim=8192, kernel_size=4, device="cuda"):
    ceiling = common.copy_ceiling_gbps()
    common.print_environment(ceiling)
    if "layer" in tables:
        bench_layers(batches, drafts, ceiling, dim, kernel_size, device)
    if "step" in tables:
        bench_steps(batches, drafts, ceiling, layers, dim, kernel_size, device)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify-only", action="store_true")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64, 256])
    parser.add_argument("--drafts", nargs="+", default=list(DRAFTS), choices=list(DRAFTS),
                        help="chain: D=4; treeK: N=8 nodes, topk K")
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=TABLES,
                        help="layer: one layer's verify per row; step: a whole step (36 layers + commit) per row")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if not check(common.DEVICE):
        return 1
    if args.verify_only:
        return 0
    if not common.needs_cuda():
        return 1
    bench(args.batches, args.drafts, args.tables)
    print(f"\nchecks and tables in {time.perf_counter() - start:.0f} s")  # the checklist's step phase allows 170 s
    return 0


if __name__ == "__main__":
    sys.exit(main())
