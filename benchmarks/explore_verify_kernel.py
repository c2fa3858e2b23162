"""Exploration: channels per program and warps of the fused verify kernel (csrc_triton/verify.py),
and a candidate rewrite ("tiles"), one layer at the Qwen3-Next TP1 shape, against the copy ceiling.

    python benchmarks/explore_verify_kernel.py            (CUDA: the timing table)
    python benchmarks/explore_verify_kernel.py --check    (CPU too: the candidate against the op)

The candidate processes all N nodes of a request at once as [nodes, channels] tiles, one tile per
conv tap: the tap positions of every node come from a vectorised walk up the parent links, per-
element offsets are int32 (bases are int64 scalars), and each tap's weights are loaded once per
program. The production kernel instead loops over nodes and re-reads the weights per node with
int64 per-element pointers; docs/benchmarks.md says why that is suspected to be slow.
"""

import argparse
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sgl_convwin  # noqa: E402
from bench_scatter import copy_ceiling_gbps, graph_time_us  # noqa: E402
from bench_verify import tree_parents  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402


@triton.jit
def _verify_tiles_kernel(
    dest_ptr, state_ptr, x_ptr, out_ptr, weight_ptr, bias_ptr, buffer_slots_ptr, state_slots_ptr, parents_ptr,
    dest_layer_offset, state_layer_offset, num_buffer_slots, num_state_slots, dim,
    dest_stride_slot, dest_stride_row, dest_stride_dim, dest_stride_win,
    state_stride_slot, state_stride_dim, state_stride_win,
    x_stride_row, x_stride_node, x_stride_dim,
    out_stride_row, out_stride_node, out_stride_dim,
    weight_stride_dim, weight_stride_tap, bias_stride, parents_stride_row, parents_stride_node,
    NUM_NODES: tl.constexpr, NODES_P2: tl.constexpr, KERNEL_SIZE: tl.constexpr, BLOCK: tl.constexpr,
    DENSE: tl.constexpr, HAS_PARENTS: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    WIDTH: tl.constexpr = KERNEL_SIZE - 1
    row = tl.program_id(0).to(tl.int64)
    chan = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # int32 offsets from here on
    cmask = chan < dim
    dst = tl.load(buffer_slots_ptr + row).to(tl.int64)
    src = tl.load(state_slots_ptr + row).to(tl.int64)
    if (dst >= 0) & (dst < num_buffer_slots) & (src >= 0) & (src < num_state_slots):
        dest = dest_ptr + dest_layer_offset + dst * dest_stride_slot  # scalar bases
        state = state_ptr + state_layer_offset + src * state_stride_slot
        xs = x_ptr + row * x_stride_row
        parents_row = parents_ptr + row * parents_stride_row
        c_x = chan * x_stride_dim
        c_state = chan * state_stride_dim
        c_dest = chan * dest_stride_dim
        node = tl.arange(0, NODES_P2)
        nmask = node < NUM_NODES
        ok = nmask  # per node: the K-1 links above it are valid
        if HAS_PARENTS:
            cur = node
            for _ in tl.static_range(WIDTH):
                is_node = cur >= 0
                parent = tl.load(parents_row + cur * parents_stride_node, mask=is_node & nmask, other=-1).to(tl.int32)
                good = (parent >= -1) & (parent < cur)
                ok = ok & (good | (cur < 0))
                cur = tl.where(is_node, tl.where(good, parent, -1), cur - 1)
        write = ok[:, None] & cmask[None, :]
        if not DENSE:
            for h in tl.static_range(WIDTH - 1):
                committed = tl.load(state + (h + 1) * state_stride_win + c_state, mask=cmask)
                tl.store(dest + h * dest_stride_row + c_dest, committed.to(dest_ptr.dtype.element_ty), mask=cmask)
        acc = tl.zeros([NODES_P2, BLOCK], dtype=tl.float32)
        if HAS_BIAS:  # the production kernel's order: bias, then the taps newest first, by fma
            acc += tl.load(bias_ptr + chan * bias_stride, mask=cmask).to(tl.float32)[None, :]
        cur = node
        for up in tl.static_range(KERNEL_SIZE):
            is_token = cur >= 0
            live = (nmask if up == 0 else ok)[:, None] & cmask[None, :]  # the token itself: always
            from_x = tl.load(xs + (cur * x_stride_node)[:, None] + c_x[None, :],
                             mask=is_token[:, None] & live, other=0.0)
            from_state = tl.load(state + ((WIDTH + cur) * state_stride_win)[:, None] + c_state[None, :],
                                 mask=(cur < 0)[:, None] & live, other=0.0)
            value = tl.where(is_token[:, None], from_x, from_state)
            if up == 0:
                if not DENSE:  # rows K-2+n: every node's input, whatever its links
                    tl.store(dest + ((WIDTH - 1 + node) * dest_stride_row)[:, None] + c_dest[None, :],
                             value.to(dest_ptr.dtype.element_ty), mask=nmask[:, None] & cmask[None, :])
            if DENSE:
                if up < WIDTH:
                    tl.store(dest + (node * dest_stride_row)[:, None] + (WIDTH - 1 - up) * dest_stride_win
                             + c_dest[None, :], value.to(dest_ptr.dtype.element_ty), mask=write)
            tap = tl.load(weight_ptr + chan * weight_stride_dim + (WIDTH - up) * weight_stride_tap,
                          mask=cmask).to(tl.float32)
            acc = tl.fma(tap[None, :], value.to(tl.float32), acc)
            if up < WIDTH:
                if HAS_PARENTS:
                    is_node = cur >= 0
                    parent = tl.load(parents_row + cur * parents_stride_node, mask=is_node & ok, other=-1).to(tl.int32)
                    cur = tl.where(is_node, parent, cur - 1)
                else:
                    cur = cur - 1
        if SILU:
            acc = acc * tl.sigmoid(acc)
        tl.store(out_ptr + row * out_stride_row + (node * out_stride_node)[:, None] + (chan * out_stride_dim)[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=write)


def launch_tiles(out, dest, state, x, weight, bias, buffer_slots, state_slots, layer, parents, *, dense, silu,
                 block=128, num_warps=1):
    """Same contract as csrc_triton.launch_causal_conv1d_verify (int32 per-element offsets: the
    caller keeps one slot and one request within 2**31 elements)."""
    num_rows, num_nodes, dim = x.shape
    if num_rows == 0:
        return
    dest_strides = dest.stride() if dense else (*dest.stride(), 0)
    block = min(block, triton.next_power_of_2(dim))
    _verify_tiles_kernel[(num_rows, triton.cdiv(dim, block))](
        dest, state, x, out, weight, bias if bias is not None else x, buffer_slots, state_slots,
        parents if parents is not None else buffer_slots,
        layer * dest.stride(0), layer * state.stride(0), dest.shape[1], state.shape[1], dim,
        *dest_strides[1:], *state.stride()[1:], *x.stride(), *out.stride(), *weight.stride(),
        bias.stride(0) if bias is not None else 0,
        *(parents.stride() if parents is not None else (0, 0)),
        NUM_NODES=num_nodes, NODES_P2=triton.next_power_of_2(num_nodes), KERNEL_SIZE=state.shape[3] + 1,
        BLOCK=block, DENSE=dense, HAS_PARENTS=parents is not None, HAS_BIAS=bias is not None, SILU=silu,
        num_warps=num_warps,
    )


def check() -> bool:
    """The candidate against the registered op's CPU implementation (interpreter on the CPU)."""
    from sgl_convwin import cpu

    ok = True
    g = torch.Generator().manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for layout in ("token_major", "channel_major", "dense"):
        for parents_list in (None, [-1, 0, 0, 1, 1, 2, 9], [-1, -1, 0, 1, 2, 3, 4]):
            L, M, dim, N, K, B = 2, 3, 40, 7, 4, 3
            buffer = torch.randn(sgl_convwin.physical_shape(layout, L, M, dim, N, K), generator=g)
            state = torch.randn(L, 4, dim, K - 1, generator=g)
            x, weight, bias = torch.randn(B, N, dim, generator=g), torch.randn(dim, K, generator=g), torch.randn(dim, generator=g)
            slots_b, slots_s = torch.tensor([2, -1, 0]), torch.tensor([1, 3, 3])
            parents = None if parents_list is None else torch.tensor([parents_list] * B)
            results = []
            for run in ("cpu", "tiles"):
                buf, out = buffer.clone().to(device), torch.zeros(B, N, dim, device=device)
                dest = buf.transpose(-1, -2) if layout == "channel_major" else buf
                args = [t.to(device) if isinstance(t, torch.Tensor) else t
                        for t in (out, dest, state, x, weight, bias, slots_b, slots_s, 1, parents)]
                if run == "cpu":
                    args = [t.cpu() if isinstance(t, torch.Tensor) else t for t in args]
                    cpu.causal_conv1d_verify_cpu(*args, dense=layout == "dense", silu=True)
                    buf, out = args[1] if layout != "channel_major" else args[1].transpose(-1, -2), args[0]
                else:
                    launch_tiles(*args, dense=layout == "dense", silu=True)
                results.append((buf.cpu(), out.cpu()))
            good = torch.equal(results[0][0], results[1][0]) and torch.allclose(results[0][1], results[1][1], atol=1e-5)
            ok &= good
            print(f"{layout:14} parents={parents_list}: {'ok' if good else 'MISMATCH'}")
    return ok


def layer_bytes(batch, num_nodes, dim, kernel_size, layout, element=2):
    width = kernel_size - 1
    written = batch * num_nodes * width * dim if layout == "dense" else batch * (num_nodes + width - 1) * dim
    return element * (2 * batch * num_nodes * dim + batch * width * dim + dim * (kernel_size + 1) + written)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="only check the candidate (CPU too)")
    if parser.parse_args().check or not torch.cuda.is_available():
        return 0 if check() else 1
    if not check():
        return 1
    dim, K = 8192, 4
    kernels = triton_kernels()
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"triton {triton.__version__}")
    print("fused verify (conv + capture), one layer, dim 8192, K=4, bf16")
    print("| draft | layout | B | block/warps | graph replay (us/launch) | of copy ceiling | out equal to default |")
    print("|---|---|---|---|---|---|---|")
    # production kernel: default and (block, warps); the candidate: ("tiles", block, warps)
    configs = [None, (128, 1), (256, 1), (512, 2), (1024, 4),
               ("tiles", 64, 1), ("tiles", 128, 1), ("tiles", 256, 1), ("tiles", 256, 2), ("tiles", 512, 4)]
    for tree, num_nodes in ((False, 4), (True, 8)):
        parents_list = tree_parents(num_nodes, 3 if tree else None)
        for layout in ("token_major", "dense"):
            for B in (1, 8, 64, 256):
                slots = max(B, 8)
                generator = torch.Generator(device="cuda").manual_seed(0)
                buffer = sgl_convwin.alloc_windows(1, slots, dim, num_nodes, K, layout=layout, device="cuda")
                dest = buffer if layout != "channel_major" else buffer.transpose(-1, -2)
                state = torch.randn(1, slots, dim, K - 1, generator=generator, device="cuda").to(torch.bfloat16)
                x = torch.randn(B, num_nodes, dim, generator=generator, device="cuda").to(torch.bfloat16)
                out = torch.empty_like(x)
                weight = torch.randn(dim, K, generator=generator, device="cuda").to(torch.bfloat16)
                bias = torch.randn(dim, generator=generator, device="cuda").to(torch.bfloat16)
                slots_b = torch.randperm(slots, generator=generator, device="cuda")[:B]
                slots_s = torch.randperm(slots, generator=generator, device="cuda")[:B]
                parents = torch.tensor([parents_list] * B, device="cuda") if tree else None
                nbytes = layer_bytes(B, num_nodes, dim, K, layout)
                reference_out = None
                for config in configs:
                    tiles = config is not None and config[0] == "tiles"
                    launch = launch_tiles if tiles else kernels.launch_causal_conv1d_verify
                    tuning = {} if config is None else dict(block=config[-2], num_warps=config[-1])

                    def run():
                        launch(out, dest, state, x, weight, bias, slots_b, slots_s, 0, parents,
                               dense=layout == "dense", silu=True, **tuning)

                    run()
                    if reference_out is None:
                        reference_out = out.clone()
                    assert torch.allclose(out.float(), reference_out.float(), rtol=1e-2, atol=1e-2), config
                    same = "yes" if torch.equal(out, reference_out) else "no"  # same fma order: expect yes
                    us = graph_time_us(run)
                    name = "default" if config is None else f"{'tiles ' if tiles else ''}{config[-2]}/{config[-1]}w"
                    if config is None:
                        name += f" ({kernels.verify.VERIFY_BLOCK}/{kernels.verify.VERIFY_WARPS}w)"
                    draft = f"tree N={num_nodes} topk 3" if tree else f"chain D={num_nodes}"
                    gbps = nbytes / (us * 1e-6) / 1e9
                    print(f"| {draft} | {layout} | {B} | {name} | {us:.1f} | {gbps / ceiling:.1%} | {same} |", flush=True)
                del buffer
    return 0


if __name__ == "__main__":
    sys.exit(main())
