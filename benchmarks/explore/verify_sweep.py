"""Channels per program and warps of the fused verify kernels (csrc_triton/verify.py), one layer
at the Qwen3-Next TP1 shape, against the copy ceiling: chain D = 4 and trees of 8 and 32 nodes,
every layout, B = 1 .. 256: the rows tile kernel and the node-loop kernel (node_loop) at several
channels per program and warps. The launcher's kernel choice and block rules come from this sweep.

    python benchmarks/explore/verify_sweep.py [--layouts dense] [--nodes 4 8] [--batches 8 256]   (CUDA)
        [--prefetch 0 1 2 3 4]   (only the node loop, its inputs loaded 0 to 4 nodes ahead)
        [--early]   (only the preloaded rows tile, its slot-free loads after and before the slots)
        [--one-store]   (only the preloaded rows tile, its rows stored row by row and as one tile; at 128
                        channels also one store without the early loads)
        [--blocks-first] (only the default kernels, on their grid and forced to channel blocks first and to
                        requests first)
        [--links-pairs] (only the preloaded rows tile with its early loads, a tree's links walked in registers
                        or reloaded per step, its one store two rows per lane or one)
        [--small-tree]  (only the unrolled small-tree kernel, trees of up to 8 nodes, against the default)
        [--offsets32]   (only the default kernels, the node loops' per-element offsets as the launcher picks
                        them, forced to int32 and forced to int64)
        [--runs]        (only the small-tree kernel, chains too, its channel_major rows or dense windows stored
                        as runs or not, against the default and the rows tile)
        [--capture]     (the capture alone, no conv: launch_capture)
        [--variants lane_runs=True,maxnreg=96 ...]   (only the default kernels, and with each of these sets of
                        tuning keywords: e.g. `lane_runs=True lane_runs=False`, the node loops' committed
                        inputs and weights loaded as runs and column by column; `maxnreg=64 maxnreg=56`,
                        caps on a thread's registers)
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/common.py
import common  # noqa: E402  (before sgl_convwin: without CUDA it sets TRITON_INTERPRET=1)
from common import graph_time_us, layer_bytes, tree_parents, verify_layer_problem  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402


LAYOUTS = ("token_major", "channel_major", "dense")


def tile(block, warps, **more):
    """The rows tile kernel's tuning keywords (launch_causal_conv1d_verify)."""
    return dict(block=block, num_warps=warps, node_loop=False, preload=False) | more


def loop(block, warps, **more):
    """The node-loop kernel's tuning keywords."""
    return dict(block=block, num_warps=warps, node_loop=True) | more


def sweep_configs(args):
    """{"rows": [tuning, ...], "dense": [...]}: the launcher's default ({}) first, then the variants
    the flags ask for."""
    if args.blocks_first:  # the default kernel and configuration, the grid's order forced either way
        orders = [{}, dict(blocks_first=True), dict(blocks_first=False)]
        return {"rows": orders, "dense": orders}
    if args.prefetch is not None:
        # rows: also 2 channels a lane over 2 and 4 warps, fewer programs than one warp's (at most 32 an SM)
        rows = [(64, 1), (128, 1), (256, 1), (128, 2), (256, 2), (256, 4), (512, 4)]
        return {kind: [{}] + [loop(block, warps, prefetch=ahead) for block, warps in blocks for ahead in args.prefetch]
                for kind, blocks in (("rows", rows), ("dense", [(32, 1), (64, 1), (64, 2)]))}
    configs = {
        "rows": [{}] + [tile(block, warps) for block, warps in ((16, 1), (32, 1), (64, 1), (128, 1), (64, 2))]
        + [tile(block, warps, preload=True) for block, warps in ((32, 1), (64, 1), (128, 1), (64, 2))]
        + [loop(block, warps) for block, warps in ((32, 1), (64, 1), (128, 1), (64, 2), (128, 2), (256, 4),
                                                    (256, 1), (256, 2), (512, 2), (512, 4))],
        "dense": [{}] + [loop(block, warps) for block, warps in ((32, 1), (64, 1), (64, 2), (128, 1), (128, 2),
                                                                  (256, 2), (256, 4), (512, 4), (256, 1), (512, 2))],
    }
    if args.early:  # and the node loop at its default prefetch
        configs["rows"] = [{}] + [tile(block, 1, preload=True, early=early) for block in (32, 64, 128)
                                  for early in (False, True)] + [loop(128, 1)]
    if args.one_store:  # at 128 also without the early loads
        configs["rows"] = [{}] + [tile(block, 1, preload=True, early=True, one_store=one) for block in (32, 64, 128)
                                  for one in (False, True)] + [tile(128, 1, preload=True, early=False, one_store=True)]
    if args.small_tree:
        shapes = ((32, 1), (64, 1), (128, 1), (256, 2))
        small = [{}] + [dict(block=block, num_warps=warps, small_tree=True, slots_as_masks=masks)
                        for block, warps in shapes for masks in (False, True)]
        return {"rows": small, "dense": small}
    if args.runs:
        shapes = ((64, 1), (128, 1), (128, 2), (256, 2), (256, 1))
        runs = [{}, dict(small_tree=False)] + [
            dict(block=block, num_warps=warps, small_tree=True, runs=True, slots_as_masks=masks)
            for block, warps in shapes for masks in (False, True)]
        runs += [dict(block=128, num_warps=1, small_tree=True, runs=False, slots_as_masks=True)]
        dense = [{}] + [dict(block=block, num_warps=1, small_tree=True, runs=True, slots_as_masks=masks)
                        for block in (64, 128, 256) for masks in (False, True)]
        dense += [dict(block=block, num_warps=1, small_tree=True, runs=False) for block in (64, 128)]
        return {"rows": runs, "dense": dense}
    if args.offsets32:
        widths = [{}, dict(offsets32=True), dict(offsets32=False)]
        return {"rows": widths, "dense": widths}
    if args.variants:
        variants = [{}] + [parse_tuning(text) for text in args.variants]
        return {"rows": variants, "dense": variants}
    if args.links_pairs:
        configs["rows"] = [{}] + [tile(block, 1, preload=True, early=True, gather_links=links, pairs=pairs)
                                  for block in (32, 64, 128) for links in (False, True) for pairs in (False, True)]
    return configs


def parse_tuning(text):
    """{"lane_runs": True, "maxnreg": 96} from "lane_runs=True,maxnreg=96"."""
    tuning = {}
    for item in text.split(","):
        name, value = item.split("=")
        tuning[name] = {"True": True, "False": False, "None": None}.get(value, value)
        if isinstance(tuning[name], str):
            tuning[name] = int(value)
    return tuning


def registers(kernels, out, dest, state, x, weight, bias, slots_b, slots_s, parents, dense, capture, tuning):
    """'registers / spilled bytes' a thread of the launch holds, from the compiled kernel."""
    verify = sys.modules[kernels.__name__ + ".verify"]
    call = verify._verify_call(None if capture else out, dest, state, x, None if capture else weight,
                               None if capture else bias, slots_b, slots_s, 0, parents, dense=dense,
                               silu=not capture, **tuning)
    compiled = call.kernel[call.grid](*call.tensors, *call.scalars, **call.constexprs)
    return f"{compiled.n_regs} / {compiled.n_spills}"


def config_name(tuning):
    """The table's name of a configuration."""
    if tuning.get("small_tree"):
        masks = ", slots as masks" if tuning.get("slots_as_masks") else ""
        runs = {True: ", runs", False: ", no runs"}.get(tuning.get("runs"), "")
        return f"small tree{masks}{runs} {tuning['block']}/{tuning['num_warps']}w"
    if set(tuning) == {"small_tree"}:
        return "default without the small-tree kernel"
    if set(tuning) == {"offsets32"}:
        return f"default, int{32 if tuning['offsets32'] else 64} offsets"
    if set(tuning) == {"maxnreg"}:
        return f"default, at most {tuning['maxnreg']} registers"
    if set(tuning) == {"lane_runs"}:
        return f"default, committed inputs and weights {'as runs' if tuning['lane_runs'] else 'by column'}"
    if "block" not in tuning and set(tuning) - {"blocks_first"}:
        return "default, " + ",".join(f"{name}={value}" for name, value in tuning.items())
    if "block" not in tuning:
        order = tuning.get("blocks_first")
        return "default" if order is None else f"default, {'blocks' if order else 'requests'} first"
    if tuning["node_loop"]:
        kind, variant = "loop", f"+prefetch {tuning['prefetch']}" if "prefetch" in tuning else ""
    else:
        kind, variant = "tile", ""
        if tuning["preload"]:
            variant = "+preload" + ("+early" if tuning.get("early") else "")
            variant += "+one store" if tuning.get("one_store") else ""
            variant += "+links" if tuning.get("gather_links") else ""
            variant += "+pairs" if tuning.get("pairs") else ""
    return f"{kind}{variant} {tuning['block']}/{tuning['num_warps']}w"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--nodes", nargs="+", type=int, choices=(4, 8, 32), default=[4, 8, 32],
                        help="4: the chain; 8, 32: topk-3 trees")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64, 256])
    parser.add_argument("--channel-contiguous", action="store_true",
                        help="conv_state and weight stored channel-contiguous (a window_major state, a transposed "
                             "weight): what the kernels gain when their per-tap loads coalesce")
    parser.add_argument("--prefetch", nargs="+", type=int, choices=(0, 1, 2, 3, 4), default=None,
                        help="time only the node-loop kernel, at each of these prefetch distances")
    parser.add_argument("--early", action="store_true",
                        help="time only the preloaded rows tile, its slot-free loads after and before the slots")
    parser.add_argument("--one-store", action="store_true",
                        help="time only the preloaded rows tile, its rows stored row by row and as one tile")
    parser.add_argument("--blocks-first", action="store_true",
                        help="time only the launcher's default kernels, on their grid and forced to channel blocks "
                             "first and to requests first")
    parser.add_argument("--links-pairs", action="store_true",
                        help="time only the preloaded rows tile with its early loads, a tree's links walked in "
                             "registers or not, its one store (where it takes one) two rows per lane or not")
    parser.add_argument("--small-tree", action="store_true",
                        help="time only the unrolled small-tree kernel (trees of up to 8 nodes) at several channels "
                             "per program and warps, against the launcher's default")
    parser.add_argument("--offsets32", action="store_true",
                        help="time only the launcher's default kernels, the node loops' per-element offsets as "
                             "the launcher picks them, forced to int32 and forced to int64")
    parser.add_argument("--runs", action="store_true",
                        help="time only the small-tree kernel (chains too) at several channels per program and "
                             "warps, its channel_major rows or dense windows stored as runs or not, against the "
                             "default (and, on rows, the tile)")
    parser.add_argument("--capture", action="store_true", help="time the capture alone (no conv, launch_capture)")
    parser.add_argument("--variants", nargs="+", default=None, metavar="NAME=VALUE,...",
                        help="time the default kernels as they are and with each of these sets of tuning keywords")
    args = parser.parse_args()
    if not common.needs_cuda("this sweep"):
        return 1
    dim, K = common.SHAPES["qwen3next-tp1"][1], common.KERNEL_SIZE
    kernels = triton_kernels()
    ceiling = common.copy_ceiling_gbps()
    common.print_environment(ceiling)
    print(("capture alone" if args.capture else "fused verify (conv + capture)") + ", one layer, dim 8192, K=4, bf16")
    print("| draft | layout | B | block/warps | graph replay (us/launch) | of copy ceiling "
          "| out and buffer equal to default | registers / spilled |")
    print("|---|---|---|---|---|---|---|---|")
    configs = sweep_configs(args)
    for num_nodes in args.nodes:
        tree = num_nodes != 4
        parents_list = tree_parents(num_nodes, 3 if tree else None)
        for layout in args.layouts:
            for B in args.batches:
                if num_nodes == 32 and B == 1:
                    continue
                buffer, dest, state, x, out, weight, bias, slots_b, slots_s, parents = verify_layer_problem(
                    B, num_nodes, parents_list if tree else None, layout, dim, K)
                if args.channel_contiguous:  # same values, strides (1, dim) over (channel, tap)
                    state = state.transpose(-1, -2).contiguous().transpose(-1, -2)
                    weight = weight.t().contiguous().t()
                nbytes = layer_bytes(dim, K, num_nodes, B, layout, conv=not args.capture)
                reference_out = reference_buffer = None
                for tuning in configs["dense" if layout == "dense" else "rows"]:

                    def run():
                        if args.capture:
                            kernels.launch_capture(dest, state, x, slots_b, slots_s, 0, parents,
                                                   dense=layout == "dense", **tuning)
                        else:
                            kernels.launch_causal_conv1d_verify(
                                out, dest, state, x, weight, bias, slots_b, slots_s, 0, parents,
                                dense=layout == "dense", silu=True, **tuning)

                    out.zero_()
                    buffer.zero_()  # (what a configuration does not write shows as a difference)
                    run()
                    if reference_out is None:
                        reference_out, reference_buffer = out.clone(), buffer.clone()
                    same = "yes" if torch.equal(out, reference_out) and torch.equal(buffer, reference_buffer) else "NO"
                    us = graph_time_us(run)
                    name = config_name(tuning)
                    draft = f"tree N={num_nodes} topk 3" if tree else f"chain D={num_nodes}"
                    gbps = nbytes / (us * 1e-6) / 1e9
                    regs = registers(kernels, out, dest, state, x, weight, bias, slots_b, slots_s, parents,
                                     layout == "dense", args.capture, tuning)
                    print(f"| {draft} | {layout} | {B} | {name} | {us:.1f} | {gbps / ceiling:.1%} | {same} | {regs} |",
                          flush=True)
                del buffer
    return 0


if __name__ == "__main__":
    sys.exit(main())
