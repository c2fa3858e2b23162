"""Does moving the GDN replay's state tile through a Hopper TMA tensor descriptor close its gap to
the copy ceiling? A copy of csrc_triton/gdn_commit.py's _gdn_replay_kernel whose [dk, BLOCK_V]
tile of ssm[layer, dst, head] is loaded (TMA_LOAD) and/or stored (TMA_STORE) through a host-side
triton.tools.tensor_descriptor.TensorDescriptor over the 5-D ssm (block [1, 1, 1, BLOCK_K, BLOCK_V])
instead of per-element pointers; everything else is the package kernel's. A commit here is that
kernel, then the package's own window commit (launch_path_window), as launch_gdn_commit does.

    python benchmarks/explore/replay_tma.py --check   # CUDA (+ Qwen3-Next heads), or CPU with TRITON_INTERPRET=1
    python benchmarks/explore/replay_tma.py [--batches 8 64 256] [--configs tma/tma:64/2 ...]

Default mode: Qwen3-Next TP1 (36 layers, Hk 16, Hv 32, dk = dv = 128, K 4, D = 4 chain, fp32 state,
bf16 buffer and conv), each commit timed with triton.testing.do_bench (median) and as CUDA graph
replays, in % of a 1 GiB copy measured the same way, on replay_sweep.py's byte count; registers,
local (spill) bytes, shared bytes and resident programs per SM of each compiled replay kernel.
Needs sm_90+ for the TMA variants. "package" is gdn_commit's kernel as launched (it loads its tile
through a descriptor where it can: tma/ptr's design), "package, pointer load" the same with
tma=False; ptr/ptr is the pointer kernel with its store addresses kept over the path, and
ptr/ptr+reload recomputes them after the path. docs/benchmarks.md ("Rejected designs") has the
descriptor attempts on the kernel before the two-ahead prefetch and after it.
"""

from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor

import sgl_convwin
from sgl_convwin.csrc_triton import gdn_commit as pkg
from sgl_convwin.csrc_triton._common import row_indices
from sgl_convwin.csrc_triton.gdn_commit import gdn_token_inputs
from sgl_convwin.csrc_triton.replay import (
    accepted_path, committed_inputs, conv_silu, conv_taps, launch_path_window, path_node,
)

K = 4
QWEN3_NEXT = dict(layers=36, k_heads=16, head_k=128, v_heads=32, head_v=128)
# variant: (TMA_LOAD, TMA_STORE, RELOAD_DST); a pointer store after a TMA load computes its
# addresses after the path; ptr/ptr+reload does that too (the package's tree trick on a chain)
VARIANTS = {"tma/tma": (True, True, False), "tma/ptr": (True, False, False), "ptr/tma": (False, True, False),
            "ptr/ptr": (False, False, False), "ptr/ptr+reload": (False, False, True)}
DEFAULT_CONFIGS = ["ptr/ptr:64/2", "ptr/ptr+reload:64/2", "tma/tma:64/2", "tma/ptr:64/2", "ptr/tma:64/2",
                   "tma/tma:32/1", "tma/tma:32/2", "tma/tma:64/4", "tma/tma:128/4", "tma/tma:128/8"]


@triton.jit
def _tile_ptrs(ssm_ptr, layer, dst, head, kk, vv, ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_k,
               ssm_stride_v):
    return (ssm_ptr + layer.to(tl.int64) * ssm_stride_layer + dst * ssm_stride_slot + head * ssm_stride_head
            + (kk * ssm_stride_k)[:, None] + (vv * ssm_stride_v)[None, :])


@triton.jit
def _gdn_replay_tma_kernel(
    ssm_desc,
    ssm_ptr, conv_ptr, tokens_ptr, gates_ptr, weight_ptr, bias_ptr,
    dst_slots_ptr, src_slots_ptr, steps_ptr, parents_ptr,
    num_state_slots, num_src_slots, num_nodes,
    ssm_stride_layer, ssm_stride_slot, ssm_stride_head, ssm_stride_k, ssm_stride_v,
    conv_stride_layer, conv_stride_slot, conv_stride_dim, conv_stride_win,
    tokens_stride_layer, tokens_stride_slot, tokens_stride_node, tokens_stride_dim,
    gates_stride_layer, gates_stride_slot, gates_stride_node, gates_stride_gate, gates_stride_head,
    weight_stride_layer, weight_stride_dim, weight_stride_tap,
    bias_stride_layer, bias_stride_dim,
    dst_slots_stride, src_slots_stride, steps_stride, parents_stride_row, parents_stride_node,
    NUM_K_HEADS: tl.constexpr, HEAD_K_DIM: tl.constexpr, NUM_V_HEADS: tl.constexpr, HEAD_V_DIM: tl.constexpr,
    KERNEL_SIZE: tl.constexpr, NODES: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
    TREE: tl.constexpr, HAS_BIAS: tl.constexpr, L2NORM: tl.constexpr,
    TMA_LOAD: tl.constexpr, TMA_STORE: tl.constexpr, RELOAD_DST: tl.constexpr,
):
    """_gdn_replay_kernel with the state tile through ssm_desc where TMA_LOAD / TMA_STORE say."""
    V_BLOCKS: tl.constexpr = (HEAD_V_DIM + BLOCK_V - 1) // BLOCK_V
    head = tl.program_id(0) // V_BLOCKS
    v_block = tl.program_id(0) % V_BLOCKS
    row = tl.program_id(1)
    layer = tl.program_id(2)  # int32: descriptor offsets must be (semantic.py refuses int64 ones)
    layer64 = layer.to(tl.int64)
    node, dst, src, active = row_indices(
        row, steps_ptr, steps_stride, num_nodes, dst_slots_ptr, dst_slots_stride, num_state_slots,
        src_slots_ptr, src_slots_stride, num_src_slots,
    )
    path, length, links_ok = accepted_path(row, node, parents_ptr, parents_stride_row, parents_stride_node,
                                           num_nodes, NODES, TREE)
    if active & links_ok:
        k_head = head // (NUM_V_HEADS // NUM_K_HEADS)
        kk = tl.arange(0, BLOCK_K)
        vv = v_block * BLOCK_V + tl.arange(0, BLOCK_V)
        k_mask = kk < HEAD_K_DIM
        v_mask = vv < HEAD_V_DIM
        k_chan = NUM_K_HEADS * HEAD_K_DIM + k_head * HEAD_K_DIM + kk
        v_chan = 2 * NUM_K_HEADS * HEAD_K_DIM + head * HEAD_V_DIM + vv
        tile_mask = k_mask[:, None] & v_mask[None, :]
        if not TMA_LOAD:
            ssm = _tile_ptrs(ssm_ptr, layer, dst, head, kk, vv, ssm_stride_layer, ssm_stride_slot, ssm_stride_head,
                             ssm_stride_k, ssm_stride_v)
            state = tl.load(ssm, mask=tile_mask, other=0.0).to(tl.float32)

        conv_base = conv_ptr + layer64 * conv_stride_layer + dst * conv_stride_slot
        tokens_base = tokens_ptr + layer64 * tokens_stride_layer + src * tokens_stride_slot
        gates_base = gates_ptr + layer64 * gates_stride_layer + src * gates_stride_slot + head * gates_stride_head
        weight_base = weight_ptr + layer64 * weight_stride_layer
        bias_base = bias_ptr + layer64 * bias_stride_layer
        k1, k2, k3, k4 = committed_inputs(conv_base, k_chan, k_mask, conv_stride_dim, conv_stride_win,
                                          KERNEL_SIZE - 1)
        v1, v2, v3, v4 = committed_inputs(conv_base, v_chan, v_mask, conv_stride_dim, conv_stride_win,
                                          KERNEL_SIZE - 1)
        k_bias, k_wx, k_w1, k_w2, k_w3, k_w4 = conv_taps(weight_base, k_chan, k_mask, weight_stride_dim,
                                                         weight_stride_tap, bias_base, bias_stride_dim,
                                                         KERNEL_SIZE, HAS_BIAS)
        v_bias, v_wx, v_w1, v_w2, v_w3, v_w4 = conv_taps(weight_base, v_chan, v_mask, weight_stride_dim,
                                                         weight_stride_tap, bias_base, bias_stride_dim,
                                                         KERNEL_SIZE, HAS_BIAS)
        xk, xv, g, beta = gdn_token_inputs(
            tokens_base, gates_base, path_node(path, length, 0, NODES, TREE), length > 0, k_chan, k_mask, v_chan,
            v_mask, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)
        xk_next, xv_next, g_next, beta_next = gdn_token_inputs(
            tokens_base, gates_base, path_node(path, length, 1, NODES, TREE), length > 1, k_chan, k_mask, v_chan,
            v_mask, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)
        if TMA_LOAD:
            # After the inputs' loads are issued, so their latency overlaps the bulk copy's wait;
            # the box's parts past dk / dv read as zeros (what the masked load gives).
            tile = ssm_desc.load([layer, dst.to(tl.int32), head, 0, v_block * BLOCK_V])
            state = tile.reshape(BLOCK_K, BLOCK_V).to(tl.float32)
        for j in range(0, length):
            xk_after, xv_after, g_after, beta_after = gdn_token_inputs(
                tokens_base, gates_base, path_node(path, length, j + 2, NODES, TREE), j + 2 < length, k_chan,
                k_mask, v_chan, v_mask, tokens_stride_node, tokens_stride_dim, gates_stride_node, gates_stride_gate)
            k = conv_silu(xk, k1, k2, k3, k4, k_bias, k_wx, k_w1, k_w2, k_w3, k_w4, KERNEL_SIZE)
            v = conv_silu(xv, v1, v2, v3, v4, v_bias, v_wx, v_w1, v_w2, v_w3, v_w4, KERNEL_SIZE)
            k4, k3, k2, k1 = k3, k2, k1, xk
            v4, v3, v2, v1 = v3, v2, v1, xv
            k = tl.where(k_mask, k, 0.0)
            if L2NORM:
                k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
            state = state * tl.exp(g)
            u = beta * (v - tl.sum(state * k[:, None], axis=0))
            state = state + k[:, None] * u[None, :]
            xk, xv, g, beta = xk_next, xv_next, g_next, beta_next
            xk_next, xv_next, g_next, beta_next = xk_after, xv_after, g_after, beta_after
        if TMA_STORE:
            # No addresses live across the path; the parts of the box past dk / dv are dropped.
            ssm_desc.store([layer, dst.to(tl.int32), head, 0, v_block * BLOCK_V],
                           state.reshape(1, 1, 1, BLOCK_K, BLOCK_V))
        else:
            if TREE or RELOAD_DST:
                # volatile: not merged with the first load, so the addresses are not kept over the path
                dst = tl.load(dst_slots_ptr + row * dst_slots_stride, volatile=True).to(tl.int64)
            ssm = _tile_ptrs(ssm_ptr, layer, dst, head, kk, vv, ssm_stride_layer, ssm_stride_slot, ssm_stride_head,
                             ssm_stride_k, ssm_stride_v)
            tl.store(ssm, state.to(ssm_ptr.dtype.element_ty), mask=tile_mask)


def tma_commit(args, kwargs, variant="tma/tma", block_v=64, num_warps=2):
    """A function that runs one commit (the variant's replay, then the package's window commit) on
    launch_gdn_commit's arguments (args, kwargs), its plan and descriptor fixed once; it returns the
    replay's CompiledKernel."""
    ssm, conv, tokens, history, gates, weight, bias, dst_slots, src_slots, steps, parents = args
    tma_load, tma_store, reload_dst = VARIANTS[variant]
    call = pkg._gdn_replay_call(ssm, conv, tokens, gates, weight, bias, dst_slots, src_slots, steps, parents,
                                **kwargs, block_v=block_v, num_warps=num_warps, tma=False)
    tensors = call.tensors[1:]  # (the package kernel's own ssm_desc placeholder dropped)
    constexprs = {name: value for name, value in call.constexprs.items() if name != "TMA_LOAD"}
    block_k = call.constexprs["BLOCK_K"]
    # ssm.shape, not padded sizes: TMA's own bounds give the package kernel's dk / dv masks
    desc = TensorDescriptor(ssm, list(ssm.shape), list(ssm.stride()), [1, 1, 1, block_k, block_v])
    launch = _gdn_replay_tma_kernel[call.grid]

    def run():
        compiled = launch(desc, *tensors, *call.scalars, **constexprs, TMA_LOAD=tma_load,
                          TMA_STORE=tma_store, RELOAD_DST=reload_dst)
        launch_path_window(conv, tokens, history, dst_slots, src_slots, steps, parents)
        return compiled

    return run


def package_commit(args, kwargs, **tuning):
    """launch_gdn_commit as a function of nothing that returns the replay's CompiledKernel."""
    call = pkg._gdn_replay_call(*args[:3], *args[4:], **kwargs, **tuning)
    ssm, conv, tokens, history, gates, weight, bias, dst_slots, src_slots, steps, parents = args

    def run():
        compiled = call.kernel[call.grid](*call.tensors, *call.scalars, **call.constexprs)
        launch_path_window(conv, tokens, history, dst_slots, src_slots, steps, parents)
        return compiled

    return run


def make_problem(device, gen, *, layers, k_heads, head_k, v_heads, head_v, batch, nodes, num_slots, tree,
                 bias=False, skip_row=None):
    """launch_gdn_commit's (args, kwargs) for a random token_major problem and the bytes a commit
    must move (replay_sweep.py's count: state read + write, accepted tokens' inputs and gates, conv
    window read + write)."""
    dim = 2 * k_heads * head_k + v_heads * head_v
    f32, bf16 = dict(device=device, generator=gen), dict(device=device, generator=gen, dtype=torch.bfloat16)
    ssm = torch.randn(layers, num_slots, v_heads, head_k, head_v, **f32)
    conv = torch.randn(layers, num_slots, dim, K - 1, **bf16)
    buffer = torch.randn(layers, num_slots, nodes + K - 2, dim, **bf16)
    gates = torch.rand(layers, num_slots, nodes, 2, v_heads, **f32)
    gates[:, :, :, 0] *= -1
    weight = torch.randn(layers, dim, K, **bf16)
    conv_bias = torch.randn(layers, dim, **bf16) if bias else None
    # distinct, shuffled destination and source slots: a wrong slot shows up in --check
    dst = torch.randperm(num_slots, device=device, generator=gen)[:batch]
    src = torch.randperm(num_slots, device=device, generator=gen)[:batch]
    steps = torch.randint(0, nodes, (batch,), device=device, generator=gen)
    parents = None
    if tree:
        row = [-1, 0, 0, 1, 1, 2, 3, 4][:nodes]
        depth = [1, 2, 2, 3, 3, 3, 4, 4]
        parents = torch.tensor([row] * batch, device=device)
        accepted = sum(depth[s] for s in steps.tolist())
    else:
        accepted = int(steps.sum()) + batch
    if skip_row is not None:
        dst[skip_row] = -1
    args, kwargs = sgl_convwin.gdn_commit.kernel_arguments(
        ssm, conv, buffer, gates, weight, dst, src, steps, parents, layout="token_major", conv_bias=conv_bias,
        num_k_heads=k_heads, head_k_dim=head_k, num_v_heads=v_heads, head_v_dim=head_v)
    state_bytes = 2 * layers * batch * ssm[0, 0].numel() * 4
    input_bytes = layers * accepted * (dim * 2 + 2 * v_heads * 4) + layers * batch * dim * (K - 1) * 2 * 2
    return args, kwargs, state_bytes + input_bytes


def check(device) -> None:
    small = dict(layers=2, k_heads=2, v_heads=4, batch=3, nodes=4, num_slots=5)
    def every_variant(*tiles):
        return [(variant, block_v, warps) for variant in VARIANTS for block_v, warps in tiles]

    cases = [  # (name, shape, tree, bias, skip_row, [(variant, block_v, warps)])
        ("chain", dict(small, head_k=16, head_v=16), False, False, None, every_variant((16, 2), (8, 1))),
        ("tree, bias, dst=-1", dict(small, head_k=16, head_v=16), True, True, 1, every_variant((16, 2), (8, 4))),
        ("chain dk=dv=24 (box past dk, dv)", dict(small, head_k=24, head_v=24), False, False, 2,
         every_variant((16, 2))),
    ]
    if device == "cuda":  # the benchmark's heads and configs too (too slow for the interpreter)
        real = dict(QWEN3_NEXT, layers=2, batch=4, nodes=4, num_slots=6)
        configs = [(c.split(":")[0], *(int(x) for x in c.split(":")[1].split("/"))) for c in DEFAULT_CONFIGS]
        cases += [("Qwen3-Next heads, chain", real, False, False, 3, configs),
                  ("Qwen3-Next heads, tree", real, True, False, None, every_variant((64, 2)))]
    for name, shape, tree, bias, skip, configs in cases:
        gen = torch.Generator(device=device).manual_seed(len(name))
        args, kwargs, _ = make_problem(device, gen, **shape, tree=tree, bias=bias, skip_row=skip)
        ssm0, conv0 = args[0].clone(), args[1].clone()
        pkg.launch_gdn_commit(*args, **kwargs)
        want_ssm, want_conv = args[0].clone(), args[1].clone()
        assert not torch.equal(want_ssm, ssm0), "the reference commit changed nothing"
        written = set(args[7].tolist())
        for slot in range(shape["num_slots"]):  # the skipped row's and unused slots stay as they were
            assert torch.equal(want_ssm[:, slot], ssm0[:, slot]) != (slot in written)
        for variant, block_v, warps in configs:
            args[0].copy_(ssm0)
            args[1].copy_(conv0)
            tma_commit(args, kwargs, variant, block_v, warps)()
            torch.testing.assert_close(args[0], want_ssm, rtol=1e-5, atol=1e-5)
            assert torch.equal(args[1], want_conv)
            exact = "bitwise equal" if torch.equal(args[0], want_ssm) else "within 1e-5"
            print(f"check {name}: {variant} {block_v}/{warps} ok ({exact})", flush=True)
    print("check passed")


def graph_ms(fn, replays=20) -> float:
    """Median ms of one replay of a CUDA graph holding one fn() (compiled and warmed first)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return sorted(start.elapsed_time(end) for start, end in events)[replays // 2]


def programs_per_sm(compiled) -> int:
    """Resident programs per H100/H200 SM by registers (per-warp units of 256) and shared memory."""
    warps = compiled.metadata.num_warps
    by_regs = 65536 // (-(-compiled.n_regs * 32 // 256) * 256) // warps
    by_smem = 233472 // (compiled.metadata.shared + 1024)  # 228 KiB per SM, 1 KiB reserved per program
    return min(by_regs, by_smem, 32, 64 // warps)


def copy_ceilings() -> tuple[float, float]:
    """GB/s of dst.copy_(src) over 1 GiB: do_bench median, CUDA graph replay."""
    src = torch.empty(2**30 // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * 4

    def copy():
        dst.copy_(src)

    ms = triton.testing.do_bench(copy, warmup=50, rep=300, return_mode="median")
    return nbytes / ms / 1e6, nbytes / graph_ms(copy, replays=50) / 1e6


def bench(batches, configs) -> None:
    def pct(nbytes, ms, ceiling):
        return 100 * nbytes / (ms * 1e-3) / 1e9 / ceiling

    ceil_bench, ceil_graph = copy_ceilings()
    print(f"copy ceiling (1 GiB): {ceil_bench:.0f} GB/s do_bench, {ceil_graph:.0f} GB/s graph; "
          f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    for batch in batches:
        gen = torch.Generator(device="cuda").manual_seed(batch)
        args, kwargs, nbytes = make_problem("cuda", gen, **QWEN3_NEXT, batch=batch, nodes=4, num_slots=batch,
                                            tree=False)
        print(f"\nB={batch}: {nbytes / 1e6:.1f} MB to move = {nbytes / ceil_bench / 1e3:.1f} us at the ceiling")
        print(f"{'config':>20} {'us bench':>9} {'%':>5} {'us graph':>9} {'%':>5} {'regs':>5} {'spill B':>7} "
              f"{'smem':>6} {'progs/SM':>8}")
        runs = [("package", package_commit(args, kwargs)),
                ("package, pointer load", package_commit(args, kwargs, tma=False))]
        for spec in configs:
            variant, tuning = spec.split(":")
            block_v, warps = (int(x) for x in tuning.split("/"))
            runs.append((spec, tma_commit(args, kwargs, variant, block_v, warps)))
        for name, run in runs:
            try:
                compiled = run()
                ms = triton.testing.do_bench(run, warmup=25, rep=150, return_mode="median")
                gms = graph_ms(run)
            except Exception as error:  # e.g. a TMA lowering or descriptor the installed Triton refuses
                print(f"{name:>20}  failed: {type(error).__name__}: {str(error)[:200]}", flush=True)
                continue
            print(f"{name:>20} {ms * 1e3:>9.1f} {pct(nbytes, ms, ceil_bench):>4.0f}% {gms * 1e3:>9.1f} "
                  f"{pct(nbytes, gms, ceil_graph):>4.0f}% {compiled.n_regs:>5} {4 * compiled.n_spills:>7} "
                  f"{compiled.metadata.shared:>6} {programs_per_sm(compiled):>8}", flush=True)
        del args, kwargs, runs
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare against launch_gdn_commit on small problems")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS,
                        help="variant:block_v/warps, variant one of " + ", ".join(VARIANTS))
    args = parser.parse_args()
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if args.check:
        check("cpu" if interpret or not torch.cuda.is_available() else "cuda")
    else:
        bench(args.batches, args.configs)


if __name__ == "__main__":
    main()
