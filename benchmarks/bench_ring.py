"""The ring (no commit pass) against the eager step it replaces, per decode step of all layers, in one run:

  eager             gdn_verify + gdn_commit (Mamba2: mamba2_verify + mamba2_commit): the verify reads
                    every state, the commit reads and writes it
  ring step         the due flush (every layer's folds of the step in one launch; --no-due-first: none,
                    each verify folds its own rows), gdn_ring_verify per layer, ring_accept, averaged over
                    a run of steps with random acceptance (uniform over the drafts: 2.5 tokens per step
                    for chains of 4 and trees of 8): the checkpoint read once per step, written by a fold
                    every few steps
  + conv            the same with ring_conv1d_verify before each layer's verify (the eager step's conv,
                    causal_conv1d_verify, is not in the eager column: both designs pay it)
  verify only       gdn_ring_verify with nothing pending (no replay, no fold)
  fold step         a step with 16 pending tokens in every row: all folded (by the due flush), then verified
  R+W copy          a read + write copy of the same states (torch copy_ of the whole pool; the last
                    column divides the fold step by a read + write of them at the copy ceiling instead)

The traffic model beside them: state passes per step = 1 + f at the least (f: folds per row and
step, from the cursor rule run over the same acceptance: every state read once, a folded one
written), 1 + 2f as the kernels run (a folding row's state is read by its fold, then by its
verify; 1 + f for the Mamba2 ring with --no-due-first and FOLD_VERIFY, a folding row's state
read once), and the floor = states read at the read ceiling plus the folds' writes at half the
copy ceiling's rate, both measured in this run.

Qwen3-Next-80B TP1 (36 layers, Hk 16, Hv 32, dk = dv = 128; --mixer mamba2: Nemotron-H-8B TP1,
24 layers, H 128, P 64, G 8, Ns 128), fp32
checkpoints, bf16 ring rows and conv state, capacity R = 16, D = 4 chains and trees of 8 nodes
(topk 3). CUDA-graph replays. Before any timing the verify op (under any --constants) is checked
against the ops' PyTorch code on six rows of every kind (check); a failure times nothing.

    python benchmarks/bench_ring.py [--batches 1 8 64 256] [--capacity 16] [--drafts chain tree] [--mixer mamba2]
    python benchmarks/bench_ring.py --sweep 32/8/tf32x3 128/8/tf32/tf32x3 mma/128/4   # the verify kernels' tiles
    python benchmarks/bench_ring.py --mixer mamba2 --sweep 64/8/1 64/8/16/2           # Mamba2's
    python benchmarks/bench_ring.py --conv-sweep 256/2 512/4 --batches 8 64 256       # ring_conv1d_verify's tiles
    python benchmarks/bench_ring.py --mixer mamba2 --batches 64 --profile             # each kernel's share
    python benchmarks/bench_ring.py --constants RING_MMA_STATE_STAGES=0               # a launcher default set
    python benchmarks/bench_ring.py --no-due-first --profile     # the folds in each layer's verify instead
    python benchmarks/bench_ring.py --batches 64 256 --flush-sweep - fold_tiles=4 fold_tiles=0  # the due flush alone
    ncu --profile-from-start off ... python benchmarks/bench_ring.py --batches 64 --sweep mma/128/4 --ncu mixed
"""

from __future__ import annotations

import argparse
import ast
import collections
import functools
import inspect
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sgl_convwin  # noqa: E402
import bench_mamba2_verify  # noqa: E402
from bench_commit import (  # noqa: E402
    NEMOTRON_H_8B_TP1, TREE_PARENTS, Shapes, convwin_commit_fn, make_mamba2_problem, make_problem, time_fn,
)
from bench_gdn_verify import gdn_verify_fn, read_ceiling_gbps, state_read_bytes, verify_problem  # noqa: E402
from common import (copy_ceiling_gbps, environment_line, graph_time_us, markdown_header, markdown_row,  # noqa: E402
                    parse_tunings)
from sgl_convwin import reference  # noqa: E402
from sgl_convwin.validation import longest_root_path  # noqa: E402

UNROLL = 8  # steps per captured graph, each with its own acceptance
DEVICE = "cuda"  # (tests dry-run the flow on the CPU)
DUE_FIRST = True  # each step's folds first, every layer in one flush(num_draft=N); --no-due-first: in the verifies
TRANSPOSED = False  # --transposed: the GDN checkpoints stored [.., dv, dk] (the engines' layout), passed transposed
TREE_DEPTH = False  # trees fold by their N nodes; --tree-depth: by their depth (tree_depth: TREE_PARENTS' longest path)
SHAPES = {"gdn": Shapes(), "mamba2": NEMOTRON_H_8B_TP1}  # Qwen3-Next-80B TP1, Nemotron-H-8B TP1


def ring_problem(shapes: Shapes, batch: int, tree: bool, capacity: int, seed=0):
    """Every layer's ring inputs on the GPU: the ring (rows random), checkpoints [L, B, Hv, dk, dv] fp32
    (TRANSPOSED: stored [.., dv, dk]), conv_state [L, B, dim, K-1] bf16, x [L, B, N, dim] bf16, g and beta
    [L, B, N, Hv], out [L, B, N, Hv, dv]; ``op`` (the verify op) and ``arguments`` (each layer's
    (args, kwargs) of it)."""
    L, N, dim = shapes.layers, len(TREE_PARENTS) if tree else shapes.num_draft, shapes.dim
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def normal(*shape, dtype=torch.float32, std=1.0):
        return torch.empty(shape, dtype=dtype, device=DEVICE).normal_(0.0, std, generator=gen)

    ring = sgl_convwin.alloc_ring(L, batch, dim, N, shapes.v_heads, capacity=capacity, device=DEVICE)
    ring.rows.normal_(generator=gen)
    ring.gates[:, :, :, 0] = -torch.nn.functional.softplus(normal(*ring.gates[:, :, :, 0].shape)) * 0.5
    ring.gates[:, :, :, 1] = torch.sigmoid(normal(*ring.gates[:, :, :, 1].shape))
    conv_out = normal(batch, N, dim, dtype=torch.bfloat16)  # (values: the verify-only calls run no conv)
    kw = shapes.key_width
    p = dict(
        ring=ring, N=N, conv_out=conv_out,
        q=conv_out[..., :kw].unflatten(-1, (shapes.k_heads, shapes.head_k)),
        k=conv_out[..., kw:2 * kw].unflatten(-1, (shapes.k_heads, shapes.head_k)),
        v=conv_out[..., 2 * kw:].unflatten(-1, (shapes.v_heads, shapes.head_v)),
        x=normal(L, batch, N, dim, dtype=torch.bfloat16),
        g=-torch.nn.functional.softplus(normal(L, batch, N, shapes.v_heads)) * 0.5,
        beta=torch.sigmoid(normal(L, batch, N, shapes.v_heads)),
        ssm=(normal(L, batch, shapes.v_heads, shapes.head_v, shapes.head_k, std=0.1).transpose(-1, -2) if TRANSPOSED
             else normal(L, batch, shapes.v_heads, shapes.head_k, shapes.head_v, std=0.1)),
        conv_state=normal(L, batch, dim, shapes.kernel_size - 1, dtype=torch.bfloat16),
        weight=normal(L, dim, shapes.kernel_size, dtype=torch.bfloat16, std=0.3),
        slots=torch.randperm(batch, device="cpu").to(DEVICE),
        parents=torch.tensor([TREE_PARENTS] * batch, device=DEVICE) if tree else None,
        out=torch.empty(L, batch, N, shapes.v_heads, shapes.head_v, dtype=torch.bfloat16, device=DEVICE),
        tree_depth=tree_depth(tree),
    )
    p["op"] = sgl_convwin.gdn_ring_verify  # (each layer's verify: p["op"](*args, **kwargs) of p["arguments"])
    p["arguments"] = [((p["out"][layer], p["q"], p["k"], p["v"], p["g"][layer], p["beta"][layer], p["ssm"],
                        p["conv_state"], ring.rows, ring.gates, ring.cursor, p["weight"][layer], None, p["slots"],
                        p["slots"], layer, p["parents"]), dict(tree_depth=p["tree_depth"])) for layer in range(L)]
    p["due"] = functools.partial(  # the step's folds, every layer (--due-first)
        sgl_convwin.gdn_ring_flush, p["ssm"], p["conv_state"], ring.cursor, ring.rows, ring.gates, p["weight"],
        p["slots"], p["slots"], num_k_heads=shapes.k_heads, head_k_dim=shapes.head_k, num_v_heads=shapes.v_heads,
        head_v_dim=shapes.head_v, num_draft=N, tree_depth=p["tree_depth"])
    return p


def mamba2_ring_problem(shapes, batch: int, tree: bool, capacity: int, seed=0):
    """ring_problem for Mamba2 layers: the ring of alloc_mamba2_ring (dt ~ 0.13 per head), checkpoints
    [L, B, H, P, Ns] fp32, x, B, C views of the conv output, dt [L, B, N, H] bf16 with dt_bias and
    softplus, A = -uniform(1, 16), D (as the eager step's mamba2_verify), a conv bias; ``op`` and
    ``arguments`` as ring_problem's; ``calls``: each layer's kernel arguments (for a tile sweep)."""
    L, N, dim, H = shapes.layers, len(TREE_PARENTS) if tree else shapes.num_draft, shapes.dim, shapes.heads
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def normal(*shape, dtype=torch.float32, mean=0.0, std=1.0):
        return torch.empty(shape, dtype=dtype, device=DEVICE).normal_(mean, std, generator=gen)

    ring = sgl_convwin.alloc_mamba2_ring(L, batch, dim, N, H, capacity=capacity, device=DEVICE)
    ring.rows.normal_(generator=gen)
    ring.gates.copy_(torch.nn.functional.softplus(normal(*ring.gates.shape, mean=-2.0, std=0.5)))
    conv_out = normal(batch, N, dim, dtype=torch.bfloat16)  # (values: the verify-only calls run no conv)
    x_width, bc_width = shapes.x_width, shapes.groups * shapes.d_state
    p = dict(
        ring=ring, N=N, conv_out=conv_out, x=normal(L, batch, N, dim, dtype=torch.bfloat16),
        dt=normal(L, batch, N, H, dtype=torch.bfloat16, std=0.5), A=-(1.0 + 15.0 * torch.rand(L, H, device=DEVICE)),
        dt_bias=normal(L, H, mean=-2.0, std=0.5), D=normal(L, H),
        ssm=normal(L, batch, H, shapes.head_dim, shapes.d_state, std=0.1),
        conv_state=normal(L, batch, dim, shapes.kernel_size - 1, dtype=torch.bfloat16),
        weight=normal(L, dim, shapes.kernel_size, dtype=torch.bfloat16, std=0.3),
        bias=normal(L, dim, dtype=torch.bfloat16, std=0.1), slots=torch.randperm(batch, device="cpu").to(DEVICE),
        parents=torch.tensor([TREE_PARENTS] * batch, device=DEVICE) if tree else None,
        out=torch.empty(L, batch, N, H, shapes.head_dim, dtype=torch.bfloat16, device=DEVICE),
        tree_depth=tree_depth(tree),
    )
    x = conv_out[..., :x_width].unflatten(-1, (H, shapes.head_dim))
    B, C = (conv_out[..., start:start + bc_width].unflatten(-1, (shapes.groups, shapes.d_state))
            for start in (x_width, x_width + bc_width))
    arguments = [((p["out"][layer], x, p["dt"][layer], p["A"][layer], B, C, p["ssm"], p["conv_state"], ring.rows,
                   ring.gates, ring.cursor, p["weight"][layer], p["bias"][layer], p["slots"], p["slots"], layer,
                   p["parents"]), dict(D=p["D"][layer], dt_bias=p["dt_bias"][layer], dt_softplus=True,
                                       tree_depth=p["tree_depth"]))
                 for layer in range(L)]
    p["op"], p["arguments"] = sgl_convwin.mamba2_ring_verify, arguments
    p["due"] = functools.partial(  # the step's folds, every layer (--due-first)
        sgl_convwin.mamba2_ring_flush, p["ssm"], p["conv_state"], ring.cursor, ring.rows, ring.gates, p["weight"],
        p["A"], p["slots"], p["slots"], conv_bias=p["bias"], num_heads=H, head_dim=shapes.head_dim,
        n_groups=shapes.groups, d_state=shapes.d_state, num_draft=N, tree_depth=p["tree_depth"])
    p["calls"] = [sgl_convwin.mamba2_ring_verify.kernel_arguments(*args, **kwargs) for args, kwargs in arguments]
    return p


def check(mixer, shapes, capacity) -> bool:
    """The verify op being timed (with any --constants) on layer 0 of six rows -- one that folds, one
    that replays R - N pending tokens from the ring's end, one a few, one none, one padded, one
    past the ring's end by a wrap -- against the ops' PyTorch code (cpu_ring) on the same inputs,
    chains and trees: outputs within 2e-2 x max |out| (the ops' bound for bf16 inputs: their tf32
    products), folded checkpoints within 1e-4 x max |S| (3xTF32), the conv windows, ring rows, gates
    and cursors bit for bit -- but Mamba2's stored step sizes, softplus(dt + dt_bias), within float32
    rounding (the GPU's softplus is not the CPU's bits). Prints a line each; False if one fails."""
    from sgl_convwin import cpu_ring

    code = getattr(cpu_ring, f"{mixer}_ring_verify_cpu")
    problem = ring_problem if mixer == "gdn" else mamba2_ring_problem
    ok = True
    for tree in (False, True):
        p = problem(shapes, 6, tree, capacity, seed=1)
        ring, num_draft, op = p["ring"], p["N"], p["op"]
        ring_rows = ring.rows.shape[2]
        ring.cursor.copy_(torch.tensor([[ring_rows - 3, capacity], [ring_rows - 5, capacity - num_draft], [2, 2],
                                        [0, 0], [1, 1], [ring_rows - 1, capacity - num_draft]], device=DEVICE))
        p["slots"].copy_(torch.tensor([0, 1, 2, 3, -1, 5]))  # (row i on cursor i; row 4 padded)
        args, kwargs = p["arguments"][0]
        args = (torch.full(args[0].shape, float("nan"), device=DEVICE), *args[1:])  # (float32 outputs)
        state = [args[0], p["ssm"], p["conv_state"], ring.rows, ring.gates, ring.cursor]
        before = [t.clone() for t in state]
        op(*args, **kwargs, after_due_flush=DUE_FIRST)
        got = [t.clone() for t in state]
        for t, saved in zip(state, before):
            t.copy_(saved)
        kernel_args, kernel_kwargs = op.kernel_arguments(*args, **kwargs)
        code(*kernel_args, **kernel_kwargs)
        (out, ssm), (want_out, want_ssm) = got[:2], state[:2]
        written = ~torch.isnan(want_out)  # (the padded row's outputs stay as they were)
        errors = [((out - want_out)[written].abs().max() / want_out[written].abs().max()).item(),
                  ((ssm - want_ssm).abs().max() / want_ssm.abs().max()).item()]
        same = {name: torch.equal(a, b) for name, a, b in zip(("conv_state", "rows", "gates", "cursor"), got[2:],
                                                                state[2:])}
        if mixer == "mamba2":
            same["gates"] = torch.allclose(got[4], state[4], rtol=1e-6, atol=1e-7)
        exact = torch.equal(torch.isnan(out), ~written) and all(same.values())
        good = errors[0] <= 2e-2 and errors[1] <= 1e-4 and exact
        rest = "exact" if exact else "DIFFERS: " + (", ".join(n for n, ok in same.items() if not ok) or "out's NaNs")
        print(f"check: {mixer} ring verify, {'tree' if tree else 'chain'}, against the PyTorch code: outputs "
              f"{errors[0]:.2e}, checkpoints {errors[1]:.2e} x max, the rest {rest} ({'ok' if good else 'FAILED'})",
              flush=True)
        ok &= good
        del p
    return ok


def ring_steps_fn(p, steps_table, *, conv: bool, accept: bool = True, cursor=None):
    """One call: a step per row of ``steps_table`` ([U, B] on the GPU, the accepted draft of each row),
    each (the cursors first set to ``cursor``'s where given; with DUE_FIRST its folds first, every
    layer's) every layer's (conv and) verify, then the acceptance."""
    ring, slots, parents = p["ring"], p["slots"], p["parents"]
    bias = p.get("bias")

    def run():
        for steps in steps_table:
            if cursor is not None:  # (a due flush moves the folded rows' cursors: each replay folds again)
                ring.cursor.copy_(cursor)
            if DUE_FIRST:
                p["due"]()
            for layer in range(p["ssm"].shape[0]):
                if conv:
                    sgl_convwin.ring_conv1d_verify(p["conv_out"], ring.rows, p["conv_state"], p["x"][layer],
                                                   p["weight"][layer], None if bias is None else bias[layer], slots,
                                                   slots, ring.cursor, layer, parents, activation="silu")
                args, kwargs = p["arguments"][layer]
                p["op"](*args, **kwargs, after_due_flush=DUE_FIRST)
            if accept:
                sgl_convwin.ring_accept(ring.cursor, ring.rows, ring.gates, slots, steps, parents, num_draft=p["N"],
                                        tree_depth=p["tree_depth"])
    return run


def eager_us(mixer, shapes, batch, tree):
    """(verify, commit) graph-replay times of the eager step: gdn_verify / mamba2_verify, then
    gdn_commit / mamba2_commit."""
    if mixer == "gdn":
        verify = gdn_verify_fn(verify_problem(shapes, batch, tree, torch.float32, DEVICE, seed=batch))
        commit = convwin_commit_fn(make_problem(shapes, batch, tree, DEVICE, seed=batch))
    else:
        verify = bench_mamba2_verify.mamba2_verify_fn(
            bench_mamba2_verify.verify_problem(shapes, batch, tree, torch.float32, DEVICE, seed=batch))
        commit = convwin_commit_fn(make_mamba2_problem(shapes, batch, tree, DEVICE, seed=batch))
    return time_fn(verify)[1], time_fn(commit)[1]


def path_length(step: int, parents: list[int] | None) -> int:
    return step + 1 if parents is None else len(reference.accepted_path(step, parents))


def tree_depth(tree: bool) -> int | None:
    """The ops' tree_depth for a step of TREE_PARENTS trees (its longest path) or chains (None)."""
    return longest_root_path(TREE_PARENTS) if tree and TREE_DEPTH else None


def folds_per_step(steps_table: list[list[int]], most_accepted: int, capacity: int, parents, steps=2000) -> float:
    """Folds per row and step of the cursor rule (fold when pending > 0 and pending + T > capacity, T
    = most_accepted: N or the tree_depth; then the accepted path becomes pending), the acceptance
    table repeated for ``steps`` steps."""
    pending = [0] * len(steps_table[0])
    folds = 0
    for i in range(steps):
        for row, step in enumerate(steps_table[i % len(steps_table)]):
            if pending[row] > 0 and pending[row] + most_accepted > capacity:
                folds += 1
                pending[row] = 0
            pending[row] += path_length(step, parents)
    return folds / (steps * len(pending))


def graph_us(fn, calls_per_fn: int) -> float:
    """Graph replay time per step: ``fn`` runs ``calls_per_fn`` steps."""
    return graph_time_us(fn, launches=1, replays=8, rounds=3, warmup=1) / calls_per_fn


FOLD_EVERY = 6  # the sweep's mixed column: one row in FOLD_EVERY folds (a ring step's 0.17-0.18 folds a row)


def sweep_pendings(shapes, capacity):
    """The pending counts a tile sweep times, its table's header printed: 8, then R - N (both replayed,
    no fold: at R = 16 and N = 4 the mma kernels' small rows, then their others), then R (folded),
    then a step's mix: every FOLD_EVERY-th row at R (folding), the others at 8 -- a fold launch
    with few rows to fold, as in a ring step."""
    pendings = (8, capacity - shapes.num_draft, capacity, (8, capacity))
    print(markdown_header("B", "tile", *(f"pending {n}, us per layer" for n in pendings[:2]),
                          f"pending {capacity} (fold), us per layer",
                          f"1 row in {FOLD_EVERY} folding, the others 8, us per layer"))
    return pendings


def conv_sweep(shapes, batches, capacity, specs, copy_gbps):
    """ring_conv1d_verify's launch per tile choice (BLOCK/WARPS: channels per program, warps), every
    layer's, chains, every row's history 8 pending rows: us per step (graph replay) and its bytes
    (the drafts' inputs read and stored in the ring, the outputs, K-1 history rows a row) against the
    copy ceiling."""
    from sgl_convwin._kernels import triton_kernels

    launch = triton_kernels().launch_ring_conv1d_verify
    print(markdown_header("B", "tile", "us per step", "of the copy ceiling"))
    for batch in batches:
        p = ring_problem(shapes, batch, False, capacity, seed=batch)
        ring, slots = p["ring"], p["slots"]
        ring.cursor[:, 0], ring.cursor[:, 1] = 0, 8
        calls = [sgl_convwin.ring_conv1d_verify.kernel_arguments(
            p["conv_out"], ring.rows, p["conv_state"], p["x"][layer], p["weight"][layer], None, slots, slots,
            ring.cursor, layer, None, activation="silu") for layer in range(shapes.layers)]
        step_bytes = shapes.layers * batch * shapes.dim * 2 * (3 * p["N"] + shapes.kernel_size - 1)
        for spec in ("default", *specs):
            tuning = {} if spec == "default" else dict(zip(("block", "num_warps"), map(int, spec.split("/"))))

            def fn():
                for args, kwargs in calls:
                    launch(*args, **kwargs, **tuning)
            try:
                us = graph_time_us(fn, launches=1, replays=8, rounds=3, warmup=1)
            except Exception as error:  # noqa: BLE001 -- a tile the compiler refuses: reported, the sweep goes on
                print(markdown_row(batch, spec, f"failed: {type(error).__name__}", "-"), flush=True)
                continue
            print(markdown_row(batch, spec, f"{us:.1f}", f"{step_bytes / (copy_gbps * 1e3) / us:.1%}"), flush=True)
        del p
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


NCU_COLUMNS = ("few", "more", "fold", "mixed")  # --ncu's names of the sweep's columns


def sweep_times(fn, cursor, pendings, ncu=None):
    """One sweep row's cells: ``fn``'s graph-replay time (us) with every row's cursor at each pending
    count (a pair: every FOLD_EVERY-th row at the second), or why it did not run (a tile the
    compiler refuses ends that row, not the sweep). With ncu (a column's name), that column's launches
    instead, once, warmed up, inside the profiler's range (ncu --profile-from-start off)."""
    cells = []
    for column, pending in zip(NCU_COLUMNS, pendings):
        others, folding = pending if isinstance(pending, tuple) else (pending, pending)
        cursor[:, 1] = others
        cursor[::FOLD_EVERY, 1] = folding
        if ncu is not None:
            if column == ncu:
                fn()
                fn()  # (compiled and warm)
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.profiler.start()
                fn()
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.profiler.stop()
            cells.append("profiled" if column == ncu else "-")
            continue
        try:
            cells.append(f"{graph_time_us(fn, launches=5, replays=10, rounds=3):.1f}")
        except Exception as error:  # noqa: BLE001 -- reported in the table
            return cells + [f"failed: {type(error).__name__}"] * (len(pendings) - len(cells))
    return cells


def spec_fields(spec):
    """A sweep spec's positional fields and its NAME=VALUE keywords (any launch tuning by name; an
    integer value as an int)."""
    fields = spec.split("/")
    return [field for field in fields if "=" not in field], parse_tunings(field for field in fields if "=" in field)


def sweep(shapes, batches, capacity, specs, ncu=None):
    """One layer's gdn_ring_verify launch per tile choice (columns/warps/precision, then a folding
    row's precision), chains, every row holding sweep_pendings' pending tokens."""
    from sgl_convwin._kernels import triton_kernels

    launch = triton_kernels().launch_gdn_ring_verify
    pendings = sweep_pendings(shapes, capacity)
    for batch in batches:
        p = ring_problem(shapes, batch, False, capacity, seed=batch)
        ring, slots = p["ring"], p["slots"]
        args, kwargs = sgl_convwin.gdn_ring_verify.kernel_arguments(
            p["out"][0], p["q"], p["k"], p["v"], p["g"][0], p["beta"][0], p["ssm"], p["conv_state"], ring.rows,
            ring.gates, ring.cursor, p["weight"][0], None, slots, slots, 0, None)
        for spec in specs:
            fields, keywords = spec_fields(spec)
            # the mma kernel: mma/COLUMNS/WARPS[/MAXNREG[/SMALL[/FOLD_WARPS[/FOLD_COLUMNS]]]]
            if spec.startswith("mma/"):
                block_v, warps, *cap = fields[1:]  # MAXNREG: N, or SMALL_ROWS,OTHERS (0: no cap)
                caps = tuple(int(n) for n in cap[0].split(",")) if cap else ()
                tuning = dict(mma=True, block_v=int(block_v), num_warps=int(warps),
                              **(dict(maxnreg=caps if len(caps) > 1 else caps[0]) if caps else {}),
                              **(dict(small=cap[1] == "1") if len(cap) > 1 else {}),  # (0: no stack of 16 rows)
                              **(dict(fold_warps=int(cap[2])) if len(cap) > 2 else {}),
                              **(dict(fold_block_v=int(cap[3])) if len(cap) > 3 else {}))
            else:
                block_v, warps, precision, *fold = fields
                tuning = dict(block_v=int(block_v), num_warps=int(warps), precision=precision,
                              fold_precision=fold[0] if fold else precision)
            tuning.update(keywords)
            print(markdown_row(batch, spec, *sweep_times(lambda: launch(*args, **dict(kwargs, **tuning)), ring.cursor,
                                                         pendings, ncu)), flush=True)
        del p
        torch.cuda.empty_cache()


def mamba2_sweep(shapes, batches, capacity, specs, ncu=None):
    """One layer's mamba2_ring_verify launches per tile choice (BLOCK_P/WARPS/HEADS_PER_PROGRAM[/STAGES
    [/PRECISION[/STATE_PRECISION[/FOLD_WARPS[/MAXNREG]]]]]: the verify's products, its C S0^T's, the
    fold launch's warps, the verify launch's register cap (0: none); the fold's products staying
    3xTF32), chains, every row holding sweep_pendings' pending tokens."""
    from sgl_convwin._kernels import triton_kernels

    launch = triton_kernels().launch_mamba2_ring_verify
    pendings = sweep_pendings(shapes, capacity)
    for batch in batches:
        p = mamba2_ring_problem(shapes, batch, False, capacity, seed=batch)
        args, kwargs = p["calls"][0]
        for spec in specs:
            (block_p, warps, share, *rest), keywords = spec_fields(spec)
            tuning = dict(block_p=int(block_p), num_warps=int(warps), heads_per_program=int(share),
                          **(dict(num_stages=int(rest[0])) if rest else {}),
                          **(dict(precision=rest[1], fold_precision="tf32x3") if len(rest) > 1 else {}),
                          **(dict(state_precision=rest[2]) if len(rest) > 2 else {}),
                          **(dict(fold_warps=int(rest[3])) if len(rest) > 3 else {}),
                          **(dict(maxnreg=int(rest[4])) if len(rest) > 4 else {}), **keywords)
            print(markdown_row(batch, spec, *sweep_times(lambda: launch(*args, **dict(kwargs, **tuning)),
                                                         p["ring"].cursor, pendings, ncu)), flush=True)
        del p
        torch.cuda.empty_cache()


def profile(args, shapes):
    """Where a ring step's time goes: each kernel's launches and device time per step (torch.profiler
    over an eager run of UNROLL steps; a CPU dry run lists none), against the step's graph replay
    time -- the difference is the gaps between kernels."""
    cuda = DEVICE == "cuda"
    rng = random.Random(0)
    problem = ring_problem if args.mixer == "gdn" else mamba2_ring_problem
    for mode in args.drafts:
        for batch in args.batches:
            p = problem(shapes, batch, mode == "tree", args.capacity, seed=batch)
            table = [[rng.randrange(p["N"]) for _ in range(batch)] for _ in range(UNROLL)]
            run = ring_steps_fn(p, torch.tensor(table, device=DEVICE), conv=False)
            step_us = graph_us(run, UNROLL)
            run()  # (the ring a few steps in, as the graph left it)
            activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
            with torch.profiler.profile(activities=[activity]) as prof:
                run()
                if cuda:
                    torch.cuda.synchronize()
            events = sorted((event for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA),
                            key=lambda event: event.time_range.start)
            launches = collections.Counter(event.name for event in events)
            seen, totals = collections.Counter(), {}
            for event in events:  # a kernel launched m times a layer (and r times before the first layer): its
                # i-th launch of each layer as "name #i", the first r of each step as "name (step)"
                per_step = launches[event.name] // UNROLL
                per_layer, once = divmod(per_step, shapes.layers)
                index, name = seen[event.name] % per_step, event.name
                if once and per_layer and launches[event.name] % UNROLL == 0:
                    name = f"{name[:56]} (step)" if index < once else f"{name[:56]} #{(index - once) % per_layer}"
                elif per_layer > 1 and not once and launches[event.name] % UNROLL == 0:
                    name = f"{name[:56]} #{index % per_layer}"
                seen[event.name] += 1
                count, us = totals.get(name, (0, 0.0))
                totals[name] = (count + 1, us + event.time_range.elapsed_us())
            kernels_us = sum(us for _, us in totals.values()) / UNROLL
            print(f"\n{mode} B={batch}: graph step {step_us:.1f} us, its kernels {kernels_us:.1f} us (eager)")
            print(markdown_header("kernel", "launches per step", "us per step", "share"))
            for name, (count, us) in sorted(totals.items(), key=lambda item: -item[1][1]):
                split = " #" in name or " (step)" in name
                print(markdown_row(name if split else name[:60], f"{count / UNROLL:g}", f"{us / UNROLL:.1f}",
                                   f"{us / UNROLL / kernels_us:.1%}"), flush=True)
            del p, run
            if cuda:
                torch.cuda.empty_cache()


def flush_sweep(shapes, batches, capacity, specs):
    """The GDN due flush's launches alone per tuning (NAME=VALUE items joined by '/', e.g.
    fold_tiles=4; "-" its defaults): every FOLD_EVERY-th row due (R - 2 pending, more if N < 3), the others at 8,
    each replay from the same cursors; the graph time less a replay of the cursor copy alone."""
    from sgl_convwin._kernels import triton_kernels

    launch = triton_kernels().launch_gdn_ring_flush
    print(markdown_header("B", "tuning", f"due flush, 1 row in {FOLD_EVERY} due, us"))
    for batch in batches:
        p = ring_problem(shapes, batch, False, capacity, seed=batch)
        ring = p["ring"]
        cursors = torch.zeros_like(ring.cursor)
        cursors[:, 1] = 8
        cursors[::FOLD_EVERY, 1] = max(capacity - 2, capacity - shapes.num_draft + 1)  # (due: > R - N)
        args, kwargs = sgl_convwin.gdn_ring_flush.kernel_arguments(
            p["ssm"], p["conv_state"], ring.cursor, ring.rows, ring.gates, p["weight"], p["slots"], p["slots"],
            num_k_heads=shapes.k_heads, head_k_dim=shapes.head_k, num_v_heads=shapes.v_heads, head_v_dim=shapes.head_v,
            num_draft=shapes.num_draft)
        copy_us = graph_time_us(lambda: ring.cursor.copy_(cursors), launches=1, replays=8, rounds=3, warmup=1)
        for spec in specs:
            tuning = {} if spec == "-" else parse_tunings(spec.split("/"))

            def run(tuning=tuning):
                ring.cursor.copy_(cursors)
                launch(*args, **dict(kwargs, **tuning))

            cell = f"{graph_time_us(run, launches=1, replays=8, rounds=3, warmup=1) - copy_us:.1f}"
            print(markdown_row(batch, spec, cell), flush=True)
        del p
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


def folded_rows_read_twice(mixer) -> bool:
    """Whether a folding row's state is read by its fold and again by its verify (the run passes
    1 + 2f), not once (the Mamba2 ring's folds in each verify with FOLD_VERIFY: 1 + f)."""
    from sgl_convwin._kernels import triton_kernels

    launcher = triton_kernels().mamba2_ring_verify
    return DUE_FIRST or mixer == "gdn" or not launcher.FOLD_VERIFY


def captured_constants(module) -> set:
    """The module constants that a function of ``module`` takes as a parameter's default: read
    when the module was imported, so that setting them later changes nothing."""
    tree = ast.parse(inspect.getsource(module))
    return {default.id for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
            for default in (*node.args.defaults, *node.args.kw_defaults) if isinstance(default, ast.Name)}


def set_constants(mixer, constants, error):
    """The ring verify launcher's module defaults set (each name must exist there, and be read
    when a launch is built: else the defaults would be timed under another name)."""
    from sgl_convwin._kernels import triton_kernels

    module = getattr(triton_kernels(), "gdn_ring_verify" if mixer == "gdn" else "mamba2_ring_verify")
    captured = captured_constants(module)
    for name, value in constants.items():
        if not name.isupper() or not hasattr(module, name):
            error(f"--constants: {module.__name__} has no constant {name}")
        if name in captured:
            error(f"--constants: {module.__name__}.{name} is a parameter's default, read at import: setting it "
                  "would change nothing")
        print(f"{module.__name__}.{name} = {value} (was {getattr(module, name)})", flush=True)
        setattr(module, name, value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--capacity", type=int, default=sgl_convwin.DEFAULT_CAPACITY)
    parser.add_argument("--drafts", nargs="+", choices=("chain", "tree"), default=["chain", "tree"])
    parser.add_argument("--mixer", choices=tuple(SHAPES), default="gdn")
    parser.add_argument("--sweep", nargs="+", metavar="SPEC",
                        help="time the verify kernel's tile choices instead (one layer, chains): "
                             "COLUMNS/WARPS/PRECISION[/FOLD_PRECISION] or mma/COLUMNS/WARPS[/MAXNREG[,MAXNREG]"
                             "[/SMALL[/FOLD_WARPS[/FOLD_COLUMNS]]]]; --mixer mamba2: BLOCK_P/WARPS/HEADS_PER_PROGRAM"
                             "[/STAGES[/PRECISION[/STATE_PRECISION[/FOLD_WARPS[/MAXNREG]]]]]; either followed by "
                             "any /NAME=VALUE tunings (e.g. /fold_heads_per_program=4)")
    parser.add_argument("--profile", action="store_true",
                        help="each kernel's time per ring step instead (torch.profiler), beside the step's graph time")
    parser.add_argument("--ncu", choices=NCU_COLUMNS,
                        help="with --sweep: run that column's launches once inside cudaProfilerStart / Stop instead "
                             "of timing them (under ncu --profile-from-start off): few / more pending, every row "
                             "folding, 1 row in 6 folding")
    parser.add_argument("--constants", nargs="+", default=[], metavar="NAME=VALUE",
                        help="module defaults of the ring verify's launcher (csrc_triton/gdn_ring_verify.py, "
                             "--mixer mamba2: mamba2_ring_verify.py) set for this run, e.g. RING_MMA_MERGED=0")
    parser.add_argument("--flush-sweep", nargs="+", metavar="SPEC",
                        help="the GDN due flush's launches alone per tuning (NAME=VALUE items joined by '/', e.g. "
                             "fold_tiles=4; '-' the defaults), 1 row in 6 due")
    parser.add_argument("--due-first", action=argparse.BooleanOptionalAction, default=True,
                        help="each ring step begins with the flush of what its verifies would fold (every layer in "
                             "one launch: gdn_ring_flush / mamba2_ring_flush(..., num_draft=N)); the verifies then "
                             "fold nothing (the default); --no-due-first: each layer's verify folds its own rows")
    parser.add_argument("--conv-sweep", nargs="+", metavar="BLOCK/WARPS",
                        help="ring_conv1d_verify's launches alone per tile (channels per program / warps; the default "
                             "first), every layer, chains")
    parser.add_argument("--tree-depth", action=argparse.BooleanOptionalAction, default=False,
                        help="trees fold by their depth (the ops' tree_depth: 4 for the trees of 8 here); the default "
                             "(--no-tree-depth): by their N nodes, as a ring that is not told")
    parser.add_argument("--transposed", action="store_true",
                        help="the GDN checkpoints stored [.., dv, dk] (the engines' layout) and passed transposed")
    args = parser.parse_args(argv)
    global DUE_FIRST, TRANSPOSED, TREE_DEPTH
    DUE_FIRST, TRANSPOSED, TREE_DEPTH = args.due_first, args.transposed, args.tree_depth
    if args.transposed and args.mixer != "gdn":
        parser.error("--transposed is the GDN checkpoints' layout")
    if args.constants:
        set_constants(args.mixer, parse_tunings(args.constants), parser.error)
    if args.ncu and not args.sweep:
        parser.error("--ncu profiles a --sweep's launches")
    if args.conv_sweep and args.mixer != "gdn":
        parser.error("--conv-sweep times the GDN ring's conv")
    if args.flush_sweep and args.mixer != "gdn":
        parser.error("--flush-sweep times the GDN due flush")
    if DEVICE == "cuda" and not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    shapes = SHAPES[args.mixer]
    read_gbps, copy_gbps = read_ceiling_gbps(), copy_ceiling_gbps()
    print(environment_line(), flush=True)
    print(f"read ceiling {read_gbps:.0f} GB/s, copy ceiling {copy_gbps:.0f} GB/s; shapes {shapes}; capacity "
          f"{args.capacity}; fp32 checkpoints, bf16 rows; {UNROLL} steps per graph", flush=True)
    if not check(args.mixer, shapes, args.capacity):
        return 1
    if args.sweep:
        (sweep if args.mixer == "gdn" else mamba2_sweep)(shapes, args.batches, args.capacity, args.sweep, args.ncu)
        return 0
    if args.profile:
        profile(args, shapes)
        return 0
    if args.flush_sweep:
        flush_sweep(shapes, args.batches, args.capacity, args.flush_sweep)
        return 0
    if args.conv_sweep:
        conv_sweep(shapes, args.batches, args.capacity, args.conv_sweep, copy_gbps)
        return 0
    rng = random.Random(0)
    results = []
    for mode in args.drafts:
        tree = mode == "tree"
        parents_list = TREE_PARENTS if tree else None
        for batch in args.batches:
            state_bytes = state_read_bytes(shapes, batch, 4)
            verify_us, commit_us = eager_us(args.mixer, shapes, batch, tree)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()

            problem = ring_problem if args.mixer == "gdn" else mamba2_ring_problem
            p = problem(shapes, batch, tree, args.capacity, seed=batch)
            num_draft = p["N"]
            table = [[rng.randrange(num_draft) for _ in range(batch)] for _ in range(UNROLL)]
            steps_table = torch.tensor(table, device=DEVICE)
            fold_rate = folds_per_step(table, p["tree_depth"] or num_draft, args.capacity, parents_list)
            accepted = sum(path_length(s, parents_list) for row in table for s in row) / (UNROLL * batch)
            ring_us = graph_us(ring_steps_fn(p, steps_table, conv=False), UNROLL)
            conv_us = graph_us(ring_steps_fn(p, steps_table, conv=True), UNROLL)
            cursor = p["ring"].cursor
            cursor.zero_()
            verify_only_us = graph_us(ring_steps_fn(p, steps_table[:1], conv=False, accept=False), 1)
            cursor[:, 1] = args.capacity
            fold_us = graph_us(ring_steps_fn(p, steps_table[:1], conv=False, accept=False, cursor=cursor.clone()), 1)
            _, copy_us = time_fn(functools.partial(torch.empty_like(p["ssm"]).copy_, p["ssm"]))
            del p
            if DEVICE == "cuda":
                torch.cuda.empty_cache()

            floor = (state_bytes / read_gbps + fold_rate * state_bytes / copy_gbps) / 1e3
            row = dict(mode=mode, batch=batch, eager=verify_us + commit_us, verify=verify_us, ring=ring_us,
                       ring_conv=conv_us, verify_only=verify_only_us, fold=fold_us, copy=copy_us, folds=fold_rate,
                       accepted=accepted, floor=floor, read_write=2 * state_bytes / copy_gbps / 1e3)
            results.append(row)
            print(f"  {mode} B={batch:<4} eager {row['eager']:9.1f} us (verify {verify_us:.1f})  ring {ring_us:9.1f} us"
                  f"  +conv {conv_us:9.1f}  verify only {verify_only_us:9.1f}  fold step {fold_us:9.1f}"
                  f"  R+W copy {copy_us:9.1f}  folds/row-step {fold_rate:.3f}  accepted {accepted:.2f}"
                  f"  floor {floor:9.1f}", flush=True)

    print(f"\n{shapes.layers} layers per step, graph replay (us); fp32 checkpoints, capacity {args.capacity}; read "
          f"ceiling {read_gbps:.0f} GB/s, copy ceiling {copy_gbps:.0f} GB/s")
    print(markdown_header("mode", "B", "eager verify + commit", "ring step", "eager / ring",
                          "state passes: least / run", "ring floor", "of floor", "+ conv", "verify only",
                          "step / verify only", "fold step", "R+W copy", "fold / copy", "fold / R+W at ceiling"))
    reads = 2 if folded_rows_read_twice(args.mixer) else 1
    for r in results:
        print(markdown_row(r["mode"], r["batch"], f"{r['eager']:.1f}", f"{r['ring']:.1f}",
                           f"{r['eager'] / r['ring']:.2f}x", f"{1 + r['folds']:.2f} / {1 + reads * r['folds']:.2f}",
                           f"{r['floor']:.1f}",
                           f"{r['floor'] / r['ring']:.1%}", f"{r['ring_conv']:.1f}", f"{r['verify_only']:.1f}",
                           f"{r['ring'] / r['verify_only']:.2f}x", f"{r['fold']:.1f}", f"{r['copy']:.1f}",
                           f"{r['fold'] / r['copy']:.2f}x", f"{r['fold'] / r['read_write']:.2f}x"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
