"""The Gated DeltaNet verify recurrence, per step of all layers, side by side in one run:

  gdn_verify            sgl_convwin's: every draft token's (tree node's) output from one read of the state
  fla fused_recurrent   FLA's fused_recurrent_gated_delta_rule over the drafts (chains; reads the state,
                        writes none), where fla-core imports
  snapshot stand-in     a verify that also writes one state per draft token or tree node (what the
                        snapshot design does: bench_commit's stand-in kernel)
  read floor            the state bytes read once at the read ceiling measured in this run
  plain read            the state pools read whole by a plain read kernel, a launch a layer: what
                        per-layer launches of this size reach of the read ceiling

then the whole recurrent step (verify + commit, chains; trees for gdn_verify): snapshots + copy
commit, FLA verify + gdn_commit, gdn_verify + gdn_commit.

Qwen3-Next-80B TP1 by default (36 layers, Hk 16, Hv 32, dk = dv = 128, fp32 state, bf16 q/k/v
as views of one conv output, D = 4 chains, trees of 8 nodes with topk 3). Times are CUDA-graph
replays (the median of rounds) and do_bench medians.

    python benchmarks/bench_gdn_verify.py [--batches 1 8 64 256] [--state-dtype fp32|bf16]
    python benchmarks/bench_gdn_verify.py --sweep      # the launcher's tile choices per B
    python benchmarks/bench_gdn_verify.py --check      # correctness of the timed calls (CPU too)
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sgl_convwin  # noqa: E402
from bench_commit import (  # noqa: E402
    TREE_PARENTS, Shapes, convwin_commit_fn, make_problem, snapshot_commit_fn, time_fn, verify_layer,
)
from common import environment_line, markdown_header, markdown_row  # noqa: E402
from sgl_convwin import reference  # noqa: E402

GiB = 1 << 30


@triton.jit
def _read_kernel(src_ptr, partial_ptr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(partial_ptr + tl.program_id(0), tl.sum(tl.load(src_ptr + offsets)))


def read_ceiling_gbps() -> float:
    """Read rate of 2 GiB of fp32 (one partial sum written per 16K elements), GB/s."""
    block = 1 << 14
    src = torch.randn(1 << 29, device="cuda")
    partial = torch.empty(src.numel() // block, device="cuda")
    ms = triton.testing.do_bench(lambda: _read_kernel[(partial.numel(),)](src, partial, BLOCK=block, num_warps=8),
                                 warmup=20, rep=200, return_mode="median")
    return src.numel() * 4 / (ms * 1e-3) / 1e9


def verify_problem(shapes: Shapes, batch: int, tree: bool, state_dtype, device, seed=0, transposed=False):
    """All layers' verify inputs: q, k, v views of one bf16 conv output [L, B, N, dim], g, beta [L, B, N, Hv]
    fp32, the state pools [L, B, Hv, dk, dv] (slots a permutation; transposed: stored [.., dv, dk], the
    engines' layout, and passed transposed), out [L, B, N, Hv, dv] bf16."""
    L, Hk, Hv, dk, dv = shapes.layers, shapes.k_heads, shapes.v_heads, shapes.head_k, shapes.head_v
    num_nodes = len(TREE_PARENTS) if tree else shapes.num_draft
    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(*shape, dtype=torch.float32, std=1.0):
        return torch.empty(shape, dtype=dtype, device=device).normal_(0.0, std, generator=gen)

    mixed = normal(L, batch, num_nodes, shapes.dim, dtype=torch.bfloat16)
    kw = shapes.key_width
    return dict(
        q=mixed[..., :kw].unflatten(-1, (Hk, dk)), k=mixed[..., kw:2 * kw].unflatten(-1, (Hk, dk)),
        v=mixed[..., 2 * kw:].unflatten(-1, (Hv, dv)),
        g=-torch.nn.functional.softplus(normal(L, batch, num_nodes, Hv)) * 0.5,
        beta=torch.sigmoid(normal(L, batch, num_nodes, Hv)),
        ssm=(normal(L, batch, Hv, dv, dk, std=0.1).to(state_dtype).transpose(-1, -2) if transposed
             else normal(L, batch, Hv, dk, dv, std=0.1).to(state_dtype)),
        slots=torch.randperm(batch, device="cpu").to(device),
        parents=torch.tensor([TREE_PARENTS] * batch, device=device) if tree else None,
        out=torch.zeros(L, batch, num_nodes, Hv, dv, dtype=torch.bfloat16, device=device),
    )


def gdn_verify_fn(p, launch=None):
    """One step: one gdn_verify per layer (``launch``: a launcher with tuning keywords instead)."""
    layers = p["ssm"].shape[0]
    if launch is None:
        def step():
            for layer in range(layers):
                sgl_convwin.gdn_verify(p["out"][layer], p["q"][layer], p["k"][layer], p["v"][layer], p["g"][layer],
                                       p["beta"][layer], p["ssm"][layer], p["slots"], p["parents"])
        return step
    calls = [sgl_convwin.gdn_verify.kernel_arguments(
        p["out"][layer], p["q"][layer], p["k"][layer], p["v"][layer], p["g"][layer], p["beta"][layer],
        p["ssm"][layer], p["slots"], p["parents"]) for layer in range(layers)]

    def tuned():
        for args, kwargs in calls:
            launch(*args, **kwargs)
    return tuned


def fla_fn(p, fla_recurrent, scale):
    """FLA over each layer's chain (contiguous q, k, v copies made once; initial_state = the pool in slot order)."""
    layers = p["ssm"].shape[0]
    q, k, v = (p[name].contiguous() for name in ("q", "k", "v"))
    state = p["ssm"]

    def step():
        for layer in range(layers):
            fla_recurrent(q[layer], k[layer], v[layer], g=p["g"][layer], beta=p["beta"][layer], scale=scale,
                          initial_state=state[layer], output_final_state=False, use_qk_l2norm_in_kernel=True)
    return step


def snapshot_verify_fn(shapes, p, layers):
    """bench_commit's stand-in verify writing one state per node, over ``layers`` layers."""
    num_nodes = p["q"].shape[2]
    mixed = torch.cat([p["q"].flatten(-2), p["k"].flatten(-2), p["v"].flatten(-2)], dim=-1)
    gates = torch.stack([p["g"], p["beta"]], dim=3)
    snapshots = torch.empty(layers, p["ssm"].shape[1], num_nodes, *p["ssm"].shape[2:], device=p["ssm"].device)
    out = p["out"][0]

    def step():
        for layer in range(layers):
            verify_layer(p["ssm"][layer], mixed[layer], gates[layer], out, snapshots[layer], p["slots"], shapes)
    return step, snapshots


def layer_reads_fn(ssm):
    """Each layer's pool ssm[layer] read whole by _read_kernel (up to 16K elements a program), a
    launch a layer: the read ceiling as a step of per-layer launches of this size reaches it."""
    assert ssm[0].is_contiguous()
    block = math.gcd(ssm[0].numel(), 1 << 14)
    partial = torch.empty(ssm[0].numel() // block, device=ssm.device)

    def step():
        for layer in range(ssm.shape[0]):
            _read_kernel[(partial.numel(),)](ssm[layer], partial, BLOCK=block, num_warps=8)
    return step


def state_read_bytes(shapes, batch, element):
    return shapes.layers * batch * shapes.state_numel * element


def check(device) -> bool:
    """The timed calls against the float64 oracle on a small problem (layer 1 of 2)."""
    shapes = Shapes(layers=2, k_heads=2, v_heads=4, head_k=16, head_v=32)
    ok = True
    for tree in (False, True):
        p = verify_problem(shapes, 3, tree, torch.float32, device)
        p["q"], p["k"], p["v"] = (p[name].float() for name in ("q", "k", "v"))
        p["out"] = p["out"].float()
        gdn_verify_fn(p)()
        want, _ = reference.gdn_verify_reference(p["q"][1], p["k"][1], p["v"][1], p["g"][1], p["beta"][1],
                                                 p["ssm"][1], p["slots"].cpu(), p["parents"])
        error = (p["out"][1].cpu().double() - want).abs().max().item()
        good = error <= 2e-3 * want.abs().max().item()
        print(f"gdn_verify {'tree' if tree else 'chain'} vs float64 oracle: max error {error:.2e} "
              f"({'ok' if good else 'FAILED'})", flush=True)
        ok &= good
    return ok


SWEEP = [dict(mma=False), *(dict(mma=True, block_v=bv, num_warps=w, chunk_k=c) for bv, w, c in (
    (128, 2, 32), (128, 2, 16), (128, 2, 64), (128, 1, 32), (128, 4, 32), (64, 2, 32), (64, 1, 32), (32, 1, 32),
    (32, 2, 32))), *(dict(mma=True, chunk_k=c, state_stages=n)  # the chunks through shared memory
                     for c, n in ((32, 2), (32, 3), (16, 2), (16, 3), (16, 4), (32, 4))),
         # persistent: at most that many programs an SM (1056 = 8 x 132 slots against 2048 tiles at B = 64)
         *(dict(mma=True, ctas_per_sm=c, maxnreg=r) for c, r in ((8, 128), (7, 144), (6, 168), (9, 112))),
         dict(mma=True, ctas_per_sm=8),
         # programmatic dependent launch (the default, 1): a layer's launch under the layer before's end;
         # its first state chunks read there too (2); a plain launch (0)
         dict(mma=True, pdl=0), dict(mma=True, pdl=2), dict(mma=True, pdl=2, state_stages=2),
         # the effective queries: the node matrices before one product with the state
         dict(mma=True, q_eff=True), dict(mma=True, q_eff=True, state_stages=2), dict(mma=True, q_eff=True, pdl=2),
         dict(mma=False, q_eff=False), dict(mma=True, q_eff=False),  # the stacked products, each kernel
         dict(mma=True, tree_masks=True),  # trees only: each node's path mask given (checked, not walked)
         # trees only, the defaults off: the Triton kernel's walk link by link, not by pointer jumping;
         # either kernel's blocked inverse where no root path is over 4 nodes (the benchmarks' tree)
         dict(mma=False, doubling=False), dict(mma=False, shallow=False),
         dict(mma=False, doubling=False, shallow=False),
         dict(mma=True, shallow=False),
         # 64-column tiles at chunks of 16 rows (twice the programs: B = 64's 2048 tiles in about two waves)
         dict(mma=True, block_v=64, chunk_k=16), dict(mma=True, block_v=64, num_warps=1, chunk_k=16),
         # bf16 pools: the effective queries on staged chunks of 32 / 16 rows (their node matrices under the loads)
         dict(mma=True, q_eff=True, chunk_k=32), dict(mma=True, q_eff=True, chunk_k=16),
         # the stacked products (their state product first, the node matrices after it) on chunks of 32 rows in
         # registers, of 16 staged (entry 28: of 16 in registers)
         dict(mma=True, q_eff=False, chunk_k=32), dict(mma=True, q_eff=False, chunk_k=16, state_stages=2),
         # the small inputs loaded where they are used (0), g and beta at the program's start (1), v too (2, its
         # term the products' first addend); the defaults: 1 for chains, 0 for trees
         dict(mma=True, early_loads=0), dict(mma=True, early_loads=1), dict(mma=True, early_loads=2),
         # bf16 pools: the stacked products as bf16 mma (m16n8k16), chunks of 64 / 32 / 16 rows in registers, of 32
         # staged; of 32 staged at 96 registers (10 programs an SM), of 16 at 80 (12; offline: 24 bytes spilled)
         *(dict(mma=True, native_products=True, chunk_k=c) for c in (64, 32, 16)),
         dict(mma=True, native_products=True, chunk_k=32, state_stages=2),
         dict(mma=True, native_products=True, chunk_k=32, state_stages=2, maxnreg=96),
         dict(mma=True, native_products=True, chunk_k=16, maxnreg=80),
         dict(mma=True, native_products=False),  # (the default on bf16 pools stored transposed)
         # the tile's first 32 / 64 / 128 state rows prefetched into L2 before the pdl 1 wait
         *(dict(mma=True, prefetch_rows=r) for r in (32, 64, 128)),
         # none (a float32 pool's default), 16 rows; bf16 pools: with the stacked products as bf16 mma, chunks of
         # 64 / 32 rows in registers
         dict(mma=True, prefetch_rows=0), dict(mma=True, prefetch_rows=16),
         *(dict(mma=True, native_products=True, chunk_k=c, prefetch_rows=32) for c in (64, 32)),
         dict(mma=True, value_runs=False),  # v and out an element a load / store (the default: 16-byte runs)
         dict(mma=True, prefetch_values=True)]  # v's rows prefetched into L2 at the start (read after the products)
TREE_OPTIONS = ("tree_masks", "doubling", "shallow")


def resolved(tuning):
    """A SWEEP entry as the launcher takes it: ctas_per_sm -> persistent programs."""
    tuning = dict(tuning)
    if "ctas_per_sm" in tuning:
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        tuning["persistent"] = tuning.pop("ctas_per_sm") * sms
    return tuning


def registers(p, tuning):
    """(registers, spilled bytes) of the kernel gdn_verify launches with ``tuning`` on layer 0."""
    kernels = sgl_convwin._kernels.triton_kernels()
    args, kwargs = sgl_convwin.gdn_verify.kernel_arguments(
        p["out"][0], p["q"][0], p["k"][0], p["v"][0], p["g"][0], p["beta"][0], p["ssm"][0], p["slots"], p["parents"])
    call = kernels.gdn_verify._verify_call(*args, **kwargs, **tuning)
    compiled = call.kernel[call.grid](*call.tensors, *call.scalars, **call.constexprs)
    return compiled.n_regs, compiled.n_spills


CHECKED_ROWS = 4  # the rows of layer 0 a sweep checks each tuning on, against the float64 oracle


def oracle_rows(p, rows):
    """The float64 oracle's outputs of layer 0's first ``rows`` rows of a verify_problem (their states
    gathered first: the oracle runs on the CPU)."""
    slots = p["slots"][:rows]
    want, _ = reference.gdn_verify_reference(
        p["q"][0][:rows], p["k"][0][:rows], p["v"][0][:rows], p["g"][0][:rows], p["beta"][0][:rows],
        p["ssm"][0][slots].cpu(), torch.arange(rows), None if p["parents"] is None else p["parents"][:rows].cpu())
    return want


def checked(p, launch, tuning, want, tol=2e-2):
    """None if layer 0's first rows launched with ``tuning`` (into a float32 out) are within tol x
    max |o| of the oracle's ``want`` (bf16 q, k, v: the 2e-2 of gdn_verify's contract), else the error."""
    out = torch.full(p["out"][0].shape, float("nan"), device=p["out"].device)
    launch(out, p["q"][0], p["k"][0], p["v"][0], p["g"][0], p["beta"][0], p["ssm"][0], p["slots"], p["parents"],
           scale=p["q"].shape[-1] ** -0.5, use_qk_l2norm=True, **tuning)
    error = (out[:want.shape[0]].cpu().double() - want).abs().max().item()
    return None if error <= tol * want.abs().max().item() else error


def sweep(shapes, batches, state_dtype, tunings, transposed=False, device="cuda"):
    """gdn_verify's launcher at each tile choice, graph replay per step (transposed: verify_problem's),
    each first checked against the float64 oracle (a tuning that fails it is not timed). False if
    one failed."""
    kernels = sgl_convwin._kernels.triton_kernels()
    launch = kernels.launch_gdn_verify
    reads = {}  # B -> the plain read's time (the same bytes for chains and trees)
    failed = False
    print("\n" + markdown_header("mode", "B", "tuning", "graph (us)", "of read floor", "registers / spilled"))
    for tree in (False, True):
        for batch in batches:
            p = verify_problem(shapes, batch, tree, state_dtype, device, seed=batch, transposed=transposed)
            want = oracle_rows(p, min(batch, CHECKED_ROWS))
            floor = state_read_bytes(shapes, batch, p["ssm"].element_size()) / (READ_GBPS * 1e9) * 1e6
            if batch not in reads:  # (a transposed pool's storage: the same bytes)
                reads[batch] = time_fn(layer_reads_fn(p["ssm"].transpose(-1, -2) if transposed else p["ssm"]))[1]
            read_us = reads[batch]
            print(markdown_row("tree" if tree else "chain", batch, "plain read of the pools, a launch a layer",
                               f"{read_us:.1f}", f"{floor / read_us:.1%}", "-"), flush=True)
            for entry in [{}] + tunings:
                if not tree and any(option in entry for option in TREE_OPTIONS):
                    continue  # (a tree's option, on or off: a chain would time the default again)
                tuning = resolved(entry)
                given = p if not entry.get("tree_masks") else dict(
                    p, parents=kernels.gdn_verify.tree_path_masks(p["parents"]))

                def tuned(*args, **kwargs):
                    launch(*args, **kwargs, **tuning)
                name = "/".join(f"{k}={v}" for k, v in entry.items()) or "default"
                try:
                    error = checked(given, launch, tuning, want)
                    if error is not None:
                        print(f"  {name}: FAILED the oracle check (max error {error:.3g})", flush=True)
                        failed = True
                        continue
                    _, graph_us = time_fn(gdn_verify_fn(given, tuned))
                    regs, spills = registers(given, tuning)
                except Exception as error:  # noqa: BLE001 -- a configuration that does not compile
                    print(f"  {name}: {type(error).__name__}: {str(error)[:200]}", flush=True)
                    continue
                print(markdown_row("tree" if tree else "chain", batch, name, f"{graph_us:.1f}", f"{floor / graph_us:.1%}",
                                   f"{regs} / {spills}"), flush=True)
            del p
            if device == "cuda":
                torch.cuda.empty_cache()
    return not failed


READ_GBPS = float("nan")


def profile_layers(shapes, batches, state_dtype):
    """--ncu: each B's first layer, chain then tree, launched once inside the profiler's range."""
    for batch in batches:
        for tree in (False, True):
            p = verify_problem(shapes, batch, tree, state_dtype, "cuda", seed=batch)
            args = [p[name][0] for name in ("out", "q", "k", "v", "g", "beta", "ssm")] + [p["slots"], p["parents"]]
            sgl_convwin.gdn_verify(*args)  # (compiled and warm outside the range)
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            sgl_convwin.gdn_verify(*args)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"profiled {'tree' if tree else 'chain'} B={batch}", flush=True)


def main(argv=None) -> int:
    global READ_GBPS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--state-dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--sweep", action="store_true", help="time the launcher's tile choices instead")
    parser.add_argument("--only", type=int, nargs="+", help="with --sweep: these entries of SWEEP only")
    parser.add_argument("--transposed", action="store_true",
                        help="with --sweep: the pools stored [.., dv, dk] and passed transposed (the engines' layout)")
    parser.add_argument("--check", action="store_true", help="check the timed calls against the oracle and exit")
    parser.add_argument("--no-step", action="store_true", help="skip the whole-step table (commits)")
    parser.add_argument("--ncu", action="store_true",
                        help="instead of timing: one layer's launch per B, chain then tree, warmed up, inside the "
                             "profiler's range (ncu --profile-from-start off)")
    args = parser.parse_args(argv)
    if args.check:
        return 0 if check("cuda" if torch.cuda.is_available() else "cpu") else 1
    if not torch.cuda.is_available():
        parser.error("timing needs a CUDA device (--check runs on the CPU)")
    if args.transposed and not args.sweep:
        parser.error("--transposed is a --sweep option")
    state_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.state_dtype]
    shapes = Shapes()
    if args.ncu:
        profile_layers(shapes, args.batches, state_dtype)
        return 0
    READ_GBPS = read_ceiling_gbps()
    print(environment_line(), flush=True)
    print(f"read ceiling {READ_GBPS:.0f} GB/s; shapes {shapes}; state {args.state_dtype}", flush=True)
    if args.sweep:
        return 0 if sweep(shapes, args.batches, state_dtype,
                          SWEEP if args.only is None else [SWEEP[i] for i in args.only], args.transposed) else 1
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as error:  # noqa: BLE001 -- optional: fla-core
        fused_recurrent_gated_delta_rule = None
        print(f"fla not importable ({type(error).__name__}): its rows are skipped", flush=True)
    rows = {}
    for tree in (False, True):
        mode = "tree" if tree else "chain"
        for batch in args.batches:
            p = verify_problem(shapes, batch, tree, state_dtype, "cuda", seed=batch)
            element = p["ssm"].element_size()
            floor = state_read_bytes(shapes, batch, element) / (READ_GBPS * 1e9) * 1e6
            timed = {"gdn_verify": gdn_verify_fn(p)}
            if not tree:  # (the same bytes for trees)
                timed["plain read"] = layer_reads_fn(p["ssm"])
            if fused_recurrent_gated_delta_rule is not None and not tree:
                timed["fla fused_recurrent"] = fla_fn(p, fused_recurrent_gated_delta_rule, shapes.head_k ** -0.5)
            free = torch.cuda.mem_get_info()[0] - 4 * GiB
            per_layer = batch * p["q"].shape[2] * shapes.state_numel * 4
            layers = max(1, min(shapes.layers, free // per_layer))
            if state_dtype == torch.float32:
                timed["snapshot stand-in"] = snapshot_verify_fn(shapes, p, layers)[0]
            for name, fn in timed.items():
                us, graph_us = time_fn(fn)
                scale = shapes.layers / layers if name == "snapshot stand-in" else 1.0
                rows[(mode, batch, name)] = (us * scale, graph_us * scale)
                note = f" ({layers} layers, scaled)" if scale != 1.0 else ""
                print(f"  {mode} B={batch:<4} {name:22} do_bench {us * scale:9.1f} us  graph {graph_us * scale:9.1f} us"
                      f"  read floor {floor:8.1f} us ({floor / (graph_us * scale):6.1%}){note}", flush=True)
            rows[(mode, batch, "read floor")] = (floor, floor)
            del p, timed
            torch.cuda.empty_cache()
    names = ["gdn_verify", "fla fused_recurrent", "snapshot stand-in"]
    print(f"\n{shapes.layers} layers per step, graph replay (us); state {args.state_dtype}, read ceiling "
          f"{READ_GBPS:.0f} GB/s")
    print(markdown_header("mode", "B", *names, "read floor", "gdn_verify of floor", "plain read, a launch a layer",
                          "gdn_verify of plain read", "fla / gdn_verify"))
    for mode in ("chain", "tree"):
        for batch in args.batches:
            cells = [rows.get((mode, batch, n), (None, None))[1] for n in names]
            floor = rows[(mode, batch, "read floor")][1]
            read = rows[("chain", batch, "plain read")][1]
            ours, fla = cells[0], cells[1]
            print(markdown_row(mode, batch, *("-" if c is None else f"{c:.1f}" for c in cells), f"{floor:.1f}",
                               f"{floor / ours:.1%}", f"{read:.1f}", f"{read / ours:.1%}",
                               "-" if fla is None else f"{fla / ours:.2f}x"))
    if not args.no_step:
        step_table(shapes, args.batches, rows, state_dtype)
    return 0


def step_table(shapes, batches, rows, state_dtype):
    """Whole recurrent step per design: the verify above + the commit timed here (graph replay)."""
    print("\nwhole recurrent step, verify + commit, graph replay (us)")
    print(markdown_header("mode", "B", "snapshots + copy commit", "fla verify + gdn_commit", "gdn_verify + gdn_commit",
                          "vs fla + gdn_commit"))
    for mode in ("chain", "tree"):
        for batch in batches:
            p = make_problem(shapes, batch, mode == "tree", "cuda", seed=batch)
            if state_dtype != torch.float32:
                p.ssm_state = p.ssm_state.to(state_dtype)
            _, commit_us = time_fn(convwin_commit_fn(p))
            snap = None
            if state_dtype == torch.float32:
                snapshots = torch.empty(1, batch, p.num_nodes, *p.ssm_state.shape[2:], device="cuda")
                one = make_problem(Shapes(layers=1), batch, mode == "tree", "cuda", seed=batch)
                _, copy_us = time_fn(snapshot_commit_fn(one, snapshots, one.steps))
                snap = rows.get((mode, batch, "snapshot stand-in"), (0, None))[1]
                snap = None if snap is None else snap + copy_us * shapes.layers
                del snapshots, one
            fla = rows.get((mode, batch, "fla fused_recurrent"), (None, None))[1]
            ours = rows[(mode, batch, "gdn_verify")][1] + commit_us
            fla_total = None if fla is None else fla + commit_us
            print(markdown_row(mode, batch, "-" if snap is None else f"{snap:.1f}",
                               "-" if fla_total is None else f"{fla_total:.1f}", f"{ours:.1f}",
                               "-" if fla_total is None else f"{fla_total / ours:.2f}x faster"), flush=True)
            del p
            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
