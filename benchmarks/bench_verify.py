"""Verify-pass benchmark: a whole speculative step -- for every layer the causal conv1d of the
draft tokens plus the capture of its inputs, then one commit of the accepted windows for all
layers -- with this package's ops on each layout, against a pure-PyTorch implementation of the
same step (dense windows, and deduplicated token-major rows).

    python benchmarks/bench_verify.py                  # H200 tables (needs CUDA)
    python benchmarks/bench_verify.py --verify-only    # check every variant on tiny shapes (CPU too)

Drafts: a chain of D=4 tokens, and trees of N=8 nodes with topk 2, 3, 4 (topk roots, then each
node expands into topk children in order: parents[n] = (n - topk) // topk). Per row: the time of
one step from CUDA-graph replays, the do_bench median, the bytes the step must move for its
layout (read x, the K-1 committed inputs and the weights; write the outputs and the buffer; the
commit's read + write), that as GB/s and as a fraction of a copy ceiling measured in the same run.
"""

from __future__ import annotations

import argparse
import sys

import torch

import common  # before sgl_convwin: without CUDA it sets TRITON_INTERPRET=1
import sgl_convwin
from common import graph_time_us, markdown_header, markdown_row, tree_parents
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


# (name, layout, step)
VARIANTS = [
    ("pytorch dense", "dense", torch_step),
    ("pytorch token_major", "token_major", torch_step),
    ("convwin dense", "dense", convwin_step),
    ("convwin channel_major", "channel_major", convwin_step),
    ("convwin token_major", "token_major", convwin_step),
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


def step_bytes(layers, dim, kernel_size, num_nodes, batch, layout, element=2):
    """Bytes one step must move for ``layout`` (each input read once, each output written once)."""
    width = kernel_size - 1
    per_layer = batch * num_nodes * dim  # x read
    per_layer += batch * width * dim  # committed inputs read
    per_layer += dim * (kernel_size + 1)  # weight and bias
    per_layer += batch * num_nodes * dim  # outputs written
    if layout == "dense":
        per_layer += batch * num_nodes * width * dim
    else:
        per_layer += batch * (num_nodes + width - 1) * dim
    commit = 2 * batch * width * dim
    return (layers * (per_layer + commit)) * element


def check(device) -> bool:
    """Every variant on tiny shapes: the same committed state (exactly), outputs against the float64
    oracle, and the captured buffer against the capture oracle."""
    ok = True
    layers, dim, K = 2, 24, 4
    for tree, num_nodes, topk in ((False, 4, None), (True, 8, 2), (True, 8, 3), (True, 7, 4)):
        for B in (1, 3):
            for name, layout, step in VARIANTS:
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
                dense = reference.capture_reference(
                    torch.zeros(layers, p["buffer"].shape[1], num_nodes, dim, K - 1, dtype=torch.bfloat16),
                    before["conv_state"], before["x"][0], before["buffer_slots"], before["state_slots"], 0, "dense",
                    before["parents"])
                for layer in range(1, layers):
                    dense = reference.capture_reference(dense, before["conv_state"], before["x"][layer],
                                                        before["buffer_slots"], before["state_slots"], layer, "dense",
                                                        before["parents"])
                want_state = reference.scatter_reference(before["conv_state"], dense, before["state_slots"],
                                                         before["buffer_slots"], before["nodes"])
                good &= torch.equal(p["conv_state"].cpu(), want_state)
                if not good:
                    print(f"MISMATCH buffer/state: {name} tree={tree} N={num_nodes} B={B}")
                ok &= good
    print("verify:", "all variants match the oracles" if ok else "FAILED")
    return ok


DRAFTS = {"chain": (False, 4, None), "tree2": (True, 8, 2), "tree3": (True, 8, 3), "tree4": (True, 8, 4)}


def bench(batches, drafts, layers=36, dim=8192, kernel_size=4):
    ceiling = common.copy_ceiling_gbps()
    common.print_environment(ceiling)
    print(f"Qwen3-Next TP1 shape: L={layers}, dim={dim}, K={kernel_size}, bf16; one step = {layers} x "
          f"(verify conv + capture) + 1 commit")
    rows = []
    for tree, num_nodes, topk in (DRAFTS[name] for name in drafts):
        draft = f"chain D={num_nodes}" if not tree else f"tree N={num_nodes} topk {topk}"
        for B in batches:
            for name, layout, step in VARIANTS:
                p = make_problem(layers, dim, kernel_size, num_nodes, topk, tree, B, layout, "cuda")
                us = common.do_bench_us(lambda: step(p, layout), warmup=2, rep=30)
                graph_us = graph_time_us(lambda: step(p, layout), launches=1, replays=10)
                nbytes = step_bytes(layers, dim, kernel_size, num_nodes, B, layout)
                gbps = nbytes / (graph_us * 1e-6) / 1e9
                cache = p["buffer"].numel() * p["buffer"].element_size() // p["buffer"].shape[1]
                rows.append((draft, B, name, us, graph_us, nbytes, gbps, gbps / ceiling, cache))
                print(f"{draft:18} B={B:<4} {name:24} {us:9.1f} us  graph {graph_us:9.1f} us  "
                      f"{gbps:6.0f} GB/s {gbps / ceiling:6.1%}", flush=True)
                del p
    print()
    print(markdown_header("draft", "B", "variant", "graph replay per step (us)", "do_bench median (us)", "bytes moved",
                          "GB/s", f"of copy ceiling ({ceiling:.0f} GB/s)", "cache bytes per slot"))
    for draft, B, name, us, graph_us, nbytes, gbps, frac, cache in rows:
        print(markdown_row(draft, B, name, f"{graph_us:.1f}", f"{us:.1f}", f"{nbytes / 1e6:.1f} MB", f"{gbps:.0f}",
                           f"{frac:.1%}", cache))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify-only", action="store_true")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64, 256])
    parser.add_argument("--drafts", nargs="+", default=list(DRAFTS), choices=list(DRAFTS),
                        help="chain: D=4; treeK: N=8 nodes, topk K")
    args = parser.parse_args(argv)
    if not check(common.DEVICE):
        return 1
    if args.verify_only:
        return 0
    if not common.needs_cuda():
        return 1
    bench(args.batches, args.drafts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
