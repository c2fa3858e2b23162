"""The Mamba2 verify recurrence, per step of all layers, side by side in one run:

  mamba2_verify     sgl_convwin's: every draft token's (tree node's) output from one read of the state
  engine stand-in   a selective state update as the engines run it, written here: one token at a time,
                    one program per [BLOCK_P, Ns] state tile held in registers, per token
                    d = softplus(dt + dt_bias), h = exp(d A) h + d x B^T, y = h C + D x (times silu(z)),
                    each token's y stored; reads the state once per row and writes none (SGLang's
                    also writes a state per draft token: left out, which only makes the stand-in faster)
  read floor        the state bytes read once at the read ceiling measured in this run

Nemotron-H-8B TP1 by default (24 Mamba2 layers, H 128, P 64, G 8, Ns 128: 4 MiB of fp32 state per
layer and slot), fp32 state pools (slots a permutation), x, B, C bf16 views of one conv output, dt
bf16, A, D, dt_bias fp32, dt_softplus on, no z (Nemotron-H gates in its norm; --z adds it); D = 4
chains and trees of 8 nodes with topk 3 (bench_commit.TREE_PARENTS). The engines verify chains only:
a tree's stand-in walks its 8 nodes as a chain of 8 (the same bytes, not the tree's outputs). The
stand-in is timed at each of --standin-tiles (BLOCK_P/warps; 4/4 is the tile of mamba_ssm's
selective_state_update for Ns = 128, which the engines carry) and the fastest is kept per B. Times
are CUDA-graph replays of one step (every layer's call; the median of rounds) and do_bench medians.
Both kernels are checked against the float64 oracle (reference.mamba2_verify_reference) at the
timed shape before anything is timed.

    python benchmarks/bench_mamba2_verify.py [--batches 1 8 64 256] [--drafts chain tree]
                                             [--state-dtype fp32|bf16] [--json PATH]
    python benchmarks/bench_mamba2_verify.py --check-only [--shape tiny]   # the checks (CPU: interpreted)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shlex
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402 -- before any kernel: without CUDA it sets TRITON_INTERPRET=1
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import sgl_convwin  # noqa: E402
from bench_commit import MAMBA2_CHECK_SHAPES, NEMOTRON_H_8B_TP1, TREE_PARENTS, time_fn  # noqa: E402
from bench_gdn_verify import layer_reads_fn, read_ceiling_gbps, state_read_bytes  # noqa: E402
from common import environment_line, markdown_header, markdown_row, parse_tunings  # noqa: E402
from sgl_convwin import reference  # noqa: E402

SHAPES = {"nemotron-h-8b": NEMOTRON_H_8B_TP1, "tiny": dataclasses.replace(MAMBA2_CHECK_SHAPES, num_draft=4)}
STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DTYPE_NAMES = {dtype: name for name, dtype in STATE_DTYPES.items()}
DEVICE = "cuda"  # where the timed problems live (a CPU dry run of the tables sets "cpu")
FILL = 7.0  # what out holds before a checked call: skipped rows keep it

# Issue #40's targets (H200, this shape, fp32 state, D = 4, graph replay).
FLOOR_TARGET, FLOOR_FROM = 0.80, 64
MAX_CHAIN_US = {64: 1900.0, 256: 7400.0}
STANDIN_TARGET = {1: 1.0, 8: 1.0, 256: 2.0}  # stand-in time / mamba2_verify time, at least
TREE_TARGET = 1.15  # tree time / chain time, at most
TARGETS_LINE = (f"targets (issue #40; fp32 state, Nemotron-H-8B TP1): chains >= {FLOOR_TARGET:.0%} of the read floor "
                f"from B = {FLOOR_FROM} (<= {MAX_CHAIN_US[64]:.0f} us at B = 64, <= {MAX_CHAIN_US[256]:.0f} us at "
                f"B = 256); >= {STANDIN_TARGET[256]:g}x the stand-in at B = 256, no slower at B = 1, 8; trees "
                f"within {TREE_TARGET}x of chains")


@triton.jit
def _engine_ssu_kernel(
    out_ptr, x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, ssm_ptr, slots_ptr, d_ptr, z_ptr, dt_bias_ptr,
    num_state_slots,
    out_stride_row, out_stride_node, out_stride_head, out_stride_p,
    x_stride_row, x_stride_node, x_stride_head, x_stride_p,
    dt_stride_row, dt_stride_node, dt_stride_head,
    b_stride_row, b_stride_node, b_stride_group, b_stride_n,
    c_stride_row, c_stride_node, c_stride_group, c_stride_n,
    ssm_stride_slot, ssm_stride_head, ssm_stride_p, ssm_stride_n,
    z_stride_row, z_stride_node, z_stride_head, z_stride_p,
    NUM_TOKENS: tl.constexpr, HEADS_PER_GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_STATE: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
):
    """One program per (block of BLOCK_P rows of P, row, head), the engines' grid: the [BLOCK_P, Ns]
    state tile is loaded once and the NUM_TOKENS tokens are decoded onto it in order, each token's
    output stored as soon as it is known. A row whose slot is outside [0, num_state_slots) is skipped."""
    pp = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    row = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2)
    group = head // HEADS_PER_GROUP
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if (slot >= 0) & (slot < num_state_slots):
        nn = tl.arange(0, BLOCK_N)
        p_ok = pp < HEAD_DIM
        n_ok = nn < D_STATE
        tile = (ssm_ptr + slot * ssm_stride_slot + head * ssm_stride_head + (pp * ssm_stride_p)[:, None]
                + (nn * ssm_stride_n)[None, :])
        state = tl.load(tile, mask=p_ok[:, None] & n_ok[None, :], other=0.0).to(tl.float32)
        rate = tl.load(a_ptr + head).to(tl.float32)
        if HAS_DT_BIAS:
            bias = tl.load(dt_bias_ptr + head).to(tl.float32)
        if HAS_D:
            skip = tl.load(d_ptr + head).to(tl.float32)
        for token in range(NUM_TOKENS):
            x = tl.load(x_ptr + row * x_stride_row + token * x_stride_node + head * x_stride_head + pp * x_stride_p,
                        mask=p_ok, other=0.0).to(tl.float32)
            step = tl.load(dt_ptr + row * dt_stride_row + token * dt_stride_node + head * dt_stride_head)
            step = step.to(tl.float32)
            if HAS_DT_BIAS:
                step += bias
            if DT_SOFTPLUS:  # log(1 + exp(d)) is d in float32 above 20
                step = tl.where(step > 20.0, step, tl.log(1.0 + tl.exp(tl.minimum(step, 20.0))))
            b = tl.load(b_ptr + row * b_stride_row + token * b_stride_node + group * b_stride_group + nn * b_stride_n,
                        mask=n_ok, other=0.0).to(tl.float32)
            c = tl.load(c_ptr + row * c_stride_row + token * c_stride_node + group * c_stride_group + nn * c_stride_n,
                        mask=n_ok, other=0.0).to(tl.float32)
            state = state * tl.exp(step * rate) + (step * x)[:, None] * b[None, :]
            y = tl.sum(state * c[None, :], axis=1)
            if HAS_D:
                y += skip * x
            if HAS_Z:
                gate = tl.load(z_ptr + row * z_stride_row + token * z_stride_node + head * z_stride_head
                               + pp * z_stride_p, mask=p_ok, other=0.0).to(tl.float32)
                y *= gate / (1.0 + tl.exp(-gate))
            tl.store(out_ptr + row * out_stride_row + token * out_stride_node + head * out_stride_head
                     + pp * out_stride_p, y.to(out_ptr.dtype.element_ty), mask=p_ok)


def engine_ssu(out, x, dt, A, B, C, ssm_state, state_slots, *, D=None, z=None, dt_bias=None, dt_softplus=False,
               block_p=4, num_warps=4):
    """The stand-in over one layer, every node of a row as one chain (parents are not read). Shapes
    and strides as mamba2_verify's: out, x, z [B, N, H, P]; dt [B, N, H]; A, D, dt_bias [H] (unit
    stride); B, C [B, N, G, Ns]; ssm_state [S, H, P, Ns]; state_slots [B] (unit stride)."""
    num_rows, num_nodes, num_heads, head_dim = x.shape
    num_groups, d_state = B.shape[2], B.shape[3]
    block_p = min(block_p, triton.next_power_of_2(head_dim))
    grid = (triton.cdiv(head_dim, block_p), num_rows, num_heads)
    _engine_ssu_kernel[grid](
        out, x, dt, A, B, C, ssm_state, state_slots, A if D is None else D, x if z is None else z,
        A if dt_bias is None else dt_bias,
        ssm_state.shape[0], *out.stride(), *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *ssm_state.stride(),
        *((0,) * 4 if z is None else z.stride()),
        NUM_TOKENS=num_nodes, HEADS_PER_GROUP=num_heads // num_groups, HEAD_DIM=head_dim, D_STATE=d_state,
        BLOCK_P=block_p, BLOCK_N=triton.next_power_of_2(d_state), HAS_D=D is not None, HAS_Z=z is not None,
        HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=dt_softplus, num_warps=num_warps,
    )


def standin_tile(text: str) -> tuple[int, int]:
    """BLOCK_P/WARPS, e.g. 4/4."""
    try:
        block_p, warps = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BLOCK_P/WARPS, got {text!r}") from None
    if block_p < 1 or block_p & (block_p - 1) or warps < 1:
        raise argparse.ArgumentTypeError(f"BLOCK_P a power of two and WARPS >= 1, got {text!r}")
    return block_p, warps


def verify_problem(shapes, batch, tree, state_dtype, device, seed=0, gated=False, transposed=False):
    """All layers' verify inputs: the state pools ssm [L, B, H, P, Ns] (drawn first: chains and trees
    of one seed read the same states; slots a permutation; transposed: stored [.., Ns, P] and passed
    transposed), x, B, C views of one bf16 conv output
    [L, B, N, H*P + 2*G*Ns], dt [L, B, N, H] bf16 (before dt_bias and softplus), A = -uniform(1, 16),
    D, dt_bias [L, H] fp32, z [L, B, N, H, P] bf16 if ``gated``, out [L, B, N, H, P] bf16."""
    L, H, P, G, Ns = shapes.layers, shapes.heads, shapes.head_dim, shapes.groups, shapes.d_state
    num_nodes = len(TREE_PARENTS) if tree else shapes.num_draft
    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(*shape, dtype=torch.float32, mean=0.0, std=1.0):
        return torch.empty(shape, dtype=dtype, device=device).normal_(mean, std, generator=gen)

    ssm = (normal(L, batch, H, Ns, P, std=0.1).to(state_dtype).transpose(-1, -2) if transposed
           else normal(L, batch, H, P, Ns, std=0.1).to(state_dtype))
    mixed = normal(L, batch, num_nodes, shapes.dim, dtype=torch.bfloat16)
    x_width, bc_width = shapes.x_width, G * Ns
    return dict(
        ssm=ssm, slots=torch.randperm(batch, generator=torch.Generator().manual_seed(seed)).to(device),
        x=mixed[..., :x_width].unflatten(-1, (H, P)),
        B=mixed[..., x_width:x_width + bc_width].unflatten(-1, (G, Ns)),
        C=mixed[..., x_width + bc_width:].unflatten(-1, (G, Ns)),
        dt=normal(L, batch, num_nodes, H, dtype=torch.bfloat16, std=0.5),
        A=-(1.0 + 15.0 * torch.rand(L, H, device=device, generator=gen)),
        D=normal(L, H), dt_bias=normal(L, H, mean=-2.0, std=0.5),  # softplus(-2) ~ 0.13: decays of a few percent
        z=normal(L, batch, num_nodes, H, P, dtype=torch.bfloat16) if gated else None,
        parents=torch.tensor([TREE_PARENTS] * batch, device=device) if tree else None,
        out=torch.zeros(L, batch, num_nodes, H, P, dtype=torch.bfloat16, device=device),
    )


def _layer_args(p, layer):
    """One layer's (positional arguments after out and parents, keywords) of both kernels."""
    args = (p["x"][layer], p["dt"][layer], p["A"][layer], p["B"][layer], p["C"][layer], p["ssm"][layer], p["slots"])
    kwargs = dict(D=p["D"][layer], z=None if p["z"] is None else p["z"][layer], dt_bias=p["dt_bias"][layer],
                  dt_softplus=True)
    return args, kwargs


def mamba2_verify_fn(p, tuning=None):
    """One step: one mamba2_verify per layer (with a tuning: the launcher called with it)."""
    calls = [_layer_args(p, layer) for layer in range(p["ssm"].shape[0])]
    if tuning:
        from sgl_convwin._kernels import triton_kernels

        launch = triton_kernels().launch_mamba2_verify
        calls = [sgl_convwin.mamba2_verify.kernel_arguments(p["out"][layer], *args, p["parents"], **kwargs)
                 for layer, (args, kwargs) in enumerate(calls)]

        def tuned_step():
            for args, kwargs in calls:
                launch(*args, **kwargs, **tuning)
        return tuned_step

    def step():
        for layer, (args, kwargs) in enumerate(calls):
            sgl_convwin.mamba2_verify(p["out"][layer], *args, p["parents"], **kwargs)
    return step


def tuning_spec(text: str) -> dict:
    """NAME=VALUE[,NAME=VALUE...], e.g. chunk_n=16,chunk_stages=4 (integers as ints)."""
    try:
        return parse_tunings(text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE[,NAME=VALUE...], got {text!r}") from None


def standin_fn(p, block_p, num_warps):
    """One step: the stand-in per layer, over every node as a chain."""
    calls = [_layer_args(p, layer) for layer in range(p["ssm"].shape[0])]

    def step():
        for layer, (args, kwargs) in enumerate(calls):
            engine_ssu(p["out"][layer], *args, **kwargs, block_p=block_p, num_warps=num_warps)
    return step


def _oracle(p, parents):
    """The float64 oracle's (out, rows written) for the last layer of ``p``."""
    args, kwargs = _layer_args(p, -1)
    return reference.mamba2_verify_reference(*args[:-1], p["slots"].cpu(), parents, **kwargs)


def _compare(label, p, oracle, tol) -> bool:
    """The last layer's out against the oracle: written rows within tol x max |y|, skipped rows still FILL."""
    want, written = oracle
    got = p["out"][-1].cpu().double()
    skipped = [row for row in range(got.shape[0]) if row not in written]
    error = (got[written] - want[written]).abs().max().item()
    good = error <= tol * want[written].abs().max().item() and bool((got[skipped] == FILL).all())
    print(f"  {label:44} max error {error:.2e} of max |y| {want[written].abs().max().item():.2f} "
          f"({'ok' if good else 'FAILED'})", flush=True)
    return good


def check(shapes, device, state_dtype=torch.float32, gated=False, tiles=((4, 4),), tunings=()) -> bool:
    """The timed calls (every layer run, the last compared) against the float64 oracle on 3 rows,
    row 1 padded (slot -1): mamba2_verify on chains and trees (and at each tuning), the stand-in at
    each tile on the chain and on the tree's 8 nodes as a chain. out float32 here (bf16 when timed)."""
    tol = 2e-3 if state_dtype == torch.float32 else 2e-2
    print(f"check on {device} (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}): {shapes}, state "
          f"{DTYPE_NAMES[state_dtype]}, z {'on' if gated else 'off'}, slots [2, -1, 0]", flush=True)
    ok = True
    for tree in (False, True):
        p = verify_problem(shapes, 3, tree, state_dtype, device, seed=1, gated=gated)
        p["slots"] = torch.tensor([2, -1, 0], device=device)
        p["out"] = torch.full(p["out"].shape, FILL, device=device)
        state_before = p["ssm"][-1].clone()
        mode = f"tree {TREE_PARENTS}" if tree else f"chain D={shapes.num_draft}"
        as_chain = _oracle(p, None)
        for tuning in (None, *tunings):
            p["out"].fill_(FILL)
            mamba2_verify_fn(p, tuning)()
            label = "mamba2_verify" + (f" {tuning_label(tuning)}" if tuning else "")
            ok &= _compare(f"{label}, {mode}", p, _oracle(p, p["parents"]) if tree else as_chain, tol)
        for block_p, warps in tiles:
            p["out"].fill_(FILL)
            standin_fn(p, block_p, warps)()
            ok &= _compare(f"stand-in {block_p}/{warps}, chain of {p['out'].shape[2]}", p, as_chain, tol)
        unchanged = torch.equal(p["ssm"][-1], state_before)
        print(f"  {'state pool untouched':44} {'ok' if unchanged else 'FAILED'}", flush=True)
        ok &= unchanged
    return ok


def targets(batch, chain_us, floor_us, standin_ratio, tree_ratio, read_ratio=None) -> str:
    """Issue #40's targets that apply at ``batch``, each met or missed; a missed stand-in ratio
    also out of reach where even the plain read is not that much faster than the stand-in
    (read_ratio: stand-in / plain read)."""
    verdicts = []

    def judge(name, good):
        verdicts.append(f"{name} {'ok' if good else 'MISSED'}")

    if batch >= FLOOR_FROM:
        judge(f"floor >= {FLOOR_TARGET:.0%}", floor_us / chain_us >= FLOOR_TARGET)
    if batch in MAX_CHAIN_US:
        judge(f"<= {MAX_CHAIN_US[batch]:.0f} us", chain_us <= MAX_CHAIN_US[batch])
    if batch in STANDIN_TARGET and standin_ratio is not None:
        judge(f"stand-in >= {STANDIN_TARGET[batch]:g}x", standin_ratio >= STANDIN_TARGET[batch])
        if verdicts[-1].endswith("MISSED") and read_ratio is not None and read_ratio < STANDIN_TARGET[batch]:
            verdicts[-1] += f" (out of reach: a plain read of the pools is only {read_ratio:.2f}x faster)"
    if tree_ratio is not None:
        judge(f"tree <= {TREE_TARGET}x", tree_ratio <= TREE_TARGET)
    return ", ".join(verdicts) or "-"


def tuning_label(tuning) -> str:
    return ",".join(f"{name}={value}" for name, value in tuning.items())


def bench(shapes, batches, modes, state_dtype, tiles, read_gbps, gated=False, json_path=None, header=None,
          tunings=(), transposed=False):
    """Time every candidate per mode and B, then print the table (mamba2_verify at its defaults;
    each tuning's time on its own line); returns the JSON's rows."""
    rows = []
    for batch in batches:
        for mode in modes:
            p = verify_problem(shapes, batch, mode == "tree", state_dtype, DEVICE, seed=batch, gated=gated,
                               transposed=transposed)
            floor = state_read_bytes(shapes, batch, p["ssm"].element_size()) / (read_gbps * 1e9) * 1e6
            timed = [("mamba2_verify", None, mamba2_verify_fn(p))]
            timed += [("mamba2_verify", tuning_label(tuning), mamba2_verify_fn(p, tuning)) for tuning in tunings]
            timed += [("stand-in", f"{bp}/{w}", standin_fn(p, bp, w)) for bp, w in tiles]
            if mode == modes[0]:  # (the same bytes for every mode)
                timed += [("plain read", None, layer_reads_fn(p["ssm"].transpose(-1, -2) if transposed else p["ssm"]))]
            for name, tile, fn in timed:
                us, graph_us = time_fn(fn)
                rows.append(dict(mode=mode, B=batch, name=name, tile=tile, do_bench_us=us, graph_us=graph_us,
                                 floor_us=floor))
                label = name if tile is None else f"{name} {tile}"
                print(f"  {mode:5} B={batch:<4} {label:20} do_bench {us:9.1f} us  graph {graph_us:9.1f} us  "
                      f"read floor {floor:8.1f} us ({floor / graph_us:6.1%})", flush=True)
            del p, timed, fn  # fn: the last closure, holding p's state pools
            torch.cuda.empty_cache()
        write_json(json_path, header, rows)
    print_table(shapes, batches, state_dtype, rows)
    return rows


def _fastest_standin(rows, mode, batch):
    candidates = [r for r in rows if r["mode"] == mode and r["B"] == batch and r["name"] == "stand-in"]
    return min(candidates, key=lambda r: r["graph_us"]) if candidates else None


def _ratio(num, den):
    return None if num is None or den is None else num["graph_us"] / den["graph_us"]


def _time_cell(row):
    if row is None:
        return "-"
    return f"{row['graph_us']:.1f}" + (f" ({row['tile']})" if row["tile"] else "")


def _ratio_cell(value):
    return "-" if value is None else f"{value:.2f}x"


def print_table(shapes, batches, state_dtype, rows):
    """One line per B: chain, floor, the pools read plainly a launch a layer (how much faster than
    the stand-in any kernel reading each state once can be: stand-in / plain read), stand-in, tree,
    and the targets that apply (fp32 state at the Nemotron-H-8B shape only: the issue sets none for
    others)."""
    ours = {(r["mode"], r["B"]): r for r in rows if r["name"] == "mamba2_verify" and r["tile"] is None}
    scored = state_dtype == torch.float32 and shapes == NEMOTRON_H_8B_TP1
    print(f"\n{shapes.layers} layers per step, graph replay (us); state {DTYPE_NAMES[state_dtype]}; stand-in: "
          "the fastest of its tiles (BLOCK_P/warps); a tree's stand-in walks its 8 nodes as a chain of 8 (same "
          "bytes)")
    print(markdown_header("B", f"chain D={shapes.num_draft}", "read floor", "chain of floor", "plain read",
                          "stand-in chain", "stand-in / chain", "stand-in / plain read", "tree of 8", "tree / chain",
                          "stand-in 8 as chain", "stand-in / tree", "targets"))
    for batch in batches:
        chain, tree = ours.get(("chain", batch)), ours.get(("tree", batch))
        standin_chain, standin_tree = _fastest_standin(rows, "chain", batch), _fastest_standin(rows, "tree", batch)
        floor = (chain or tree)["floor_us"]
        standin_ratio, tree_ratio = _ratio(standin_chain, chain), _ratio(tree, chain)
        read = next((r for r in rows if r["B"] == batch and r["name"] == "plain read"), None)
        read_ratio = _ratio(standin_chain, read)
        verdict = (targets(batch, chain["graph_us"], floor, standin_ratio, tree_ratio, read_ratio) if scored and chain
                   else "-")
        print(markdown_row(batch, _time_cell(chain), f"{floor:.1f}",
                           "-" if chain is None else f"{floor / chain['graph_us']:.1%}", _time_cell(read),
                           _time_cell(standin_chain), _ratio_cell(standin_ratio),
                           _ratio_cell(read_ratio), _time_cell(tree), _ratio_cell(tree_ratio),
                           _time_cell(standin_tree), _ratio_cell(_ratio(standin_tree, tree)), verdict), flush=True)


def write_json(path, header, rows):
    if path:
        with open(path, "w") as f:
            json.dump(dict(header or {}, rows=rows), f, indent=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--drafts", nargs="+", choices=("chain", "tree"), default=["chain", "tree"])
    parser.add_argument("--state-dtype", choices=tuple(STATE_DTYPES), default="fp32")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="nemotron-h-8b",
                        help="tiny: a few heads of 16 channels, for the checks on the CPU")
    parser.add_argument("--standin-tiles", type=standin_tile, nargs="+", default=[(4, 4), (16, 4), (16, 2)],
                        metavar="BLOCK_P/WARPS", help="the stand-in's tiles; the fastest is kept per B")
    parser.add_argument("--z", action="store_true", help="gate the outputs with silu(z) (both kernels)")
    parser.add_argument("--transposed", action="store_true",
                        help="the state pools stored [.., Ns, P] and passed transposed (the timed tables only)")
    parser.add_argument("--check-only", "--quick", dest="check_only", action="store_true",
                        help="run the checks against the float64 oracle and exit (CPU: interpreted)")
    parser.add_argument("--json", default=None, help="write every measured number here")
    parser.add_argument("--tunings", type=tuning_spec, nargs="+", default=[], metavar="NAME=VALUE[,...]",
                        help="also time mamba2_verify's launcher with these choices (e.g. chunk_n=16,chunk_stages=4), "
                             "each checked first")
    args = parser.parse_args(argv)
    shapes, state_dtype = SHAPES[args.shape], STATE_DTYPES[args.state_dtype]
    command = shlex.join(["python3", *(sys.argv if argv is None else ["benchmarks/bench_mamba2_verify.py", *argv])])
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{date}; {environment_line()}; command: {command}", flush=True)
    device = common.DEVICE
    if not check(shapes, device, state_dtype, args.z, args.standin_tiles, args.tunings):
        print("check: FAILED", flush=True)
        return 1
    if args.check_only:
        print("check: all match", flush=True)
        return 0
    if not common.needs_cuda():
        return 1
    read_gbps = read_ceiling_gbps()
    torch.cuda.empty_cache()
    print(f"read ceiling {read_gbps:.0f} GB/s (2 GiB of fp32 summed); shapes {shapes}; state {args.state_dtype}; "
          f"z {'on' if args.z else 'off'}\n{TARGETS_LINE}", flush=True)
    header = dict(date=date, command=command, device=torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=triton.__version__, read_gbps=read_gbps, shapes=dataclasses.asdict(shapes),
                  state_dtype=args.state_dtype, z=args.z, tree_parents=TREE_PARENTS)
    bench(shapes, args.batches, args.drafts, state_dtype, args.standin_tiles, read_gbps, args.z, args.json, header,
          args.tunings, args.transposed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
