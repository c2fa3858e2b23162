"""Exploration (kept as a record): block size and warps of the commit kernel per layout, and a
row-per-column alternative for channel_major. Prints tables; docs/benchmarks.md has the reading.

    python benchmarks/explore_commit_kernels.py      (CUDA)
"""

import sys

import torch
import triton
import triton.language as tl

import sgl_convwin
from sgl_convwin._kernels import triton_kernels


@triton.jit
def _rows_kernel(state_ptr, win_ptr, dst_ptr, src_ptr, steps_ptr, num_blocks, dim,
                 ssl, sss, wsl, wss, wst, wsd, wsw,
                 WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """One contiguous row of the source per window column, stored with stride K-1."""
    pid = tl.program_id(0)
    row = pid // num_blocks
    block = pid % num_blocks
    layer = tl.program_id(1).to(tl.int64)
    step = tl.load(steps_ptr + row).to(tl.int64)
    dst = tl.load(dst_ptr + row).to(tl.int64)
    src = tl.load(src_ptr + row).to(tl.int64)
    if (step >= 0) & (dst >= 0):
        chan = block * BLOCK + tl.arange(0, BLOCK)
        mask = chan < dim
        base_in = win_ptr + layer * wsl + src * wss + step * wst + chan * wsd
        base_out = state_ptr + layer * ssl + dst * sss + chan * WIDTH
        for col in tl.static_range(WIDTH):
            values = tl.load(base_in + col * wsw, mask=mask)
            tl.store(base_out + col, values.to(state_ptr.dtype.element_ty), mask=mask)


def launch_rows(state, windows, dst, src, steps, block, warps):
    L, N, dim, W = state.shape
    nb = triton.cdiv(dim, block)
    _rows_kernel[(steps.shape[0] * nb, L)](state, windows, dst, src, steps, nb, dim,
        state.stride(0), state.stride(1), windows.stride(0), windows.stride(1), windows.stride(2),
        windows.stride(3), windows.stride(4), WIDTH=W, BLOCK=block, num_warps=warps)


def launch_op_kernel(state, windows, dst, src, steps, block, warps):
    triton_kernels().launch_scatter(state, windows, dst, src, steps, block=block, num_warps=warps)


def main():
    L, dim, D, K = 36, 8192, 4, 4
    ceiling_src = torch.randn(1 << 29, device="cuda", dtype=torch.bfloat16)
    ceiling_dst = torch.empty_like(ceiling_src)
    ms = triton.testing.do_bench(lambda: ceiling_dst.copy_(ceiling_src), return_mode="median")
    ceiling = 4 * (1 << 29) / (ms * 1e-3) / 1e9
    del ceiling_src, ceiling_dst
    print(f"copy ceiling {ceiling:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    results = []
    batches = (1, 8, 64, 256, 512)
    layouts = ("dense", "token_major", "channel_major", "token_major->window_major")
    for B in batches:
        slots = max(B, 8)
        g = torch.Generator(device="cuda").manual_seed(0)
        dst = torch.randperm(slots, device="cuda", generator=g)[:B]
        src = torch.randperm(slots, device="cuda", generator=g)[:B]
        steps = torch.randint(0, D, (B,), device="cuda", generator=g)
        nbytes = 2 * B * L * dim * (K - 1) * 2
        for case in layouts:
            layout = case.split("->")[0]
            window_major = case.endswith("window_major")
            state_phys = torch.zeros(L, slots, K - 1, dim, device="cuda", dtype=torch.bfloat16) if window_major else \
                torch.zeros(L, slots, dim, K - 1, device="cuda", dtype=torch.bfloat16)
            state = state_phys.transpose(2, 3) if window_major else state_phys
            buf = sgl_convwin.alloc_windows(L, slots, dim, D, K, layout=layout, device="cuda")
            buf.copy_(torch.randn(buf.shape, device="cuda", generator=g))
            win = sgl_convwin.window_view(buf, layout, D, K)
            want = state.clone()
            want[:, dst] = win[:, src, steps]
            variants = []
            for block in (1024, 2048, 4096, 8192, 16384):
                for warps in (4, 8, 16):
                    if block // (32 * warps) < 4:
                        continue
                    variants.append((f"op {block} w{warps}", lambda b=block, w=warps: launch_op_kernel(state, win, dst, src, steps, b, w)))
            if case == "channel_major":
                for block in (1024, 4096):
                    variants.append((f"rows {block} w4", lambda b=block: launch_rows(state, win, dst, src, steps, b, 4)))
            for name, fn in variants:
                state.zero_()
                fn()
                ok = torch.equal(state, want)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(10):
                        fn()
                us = triton.testing.do_bench(graph.replay, return_mode="median") * 1e3 / 10
                results.append((B, case, name, us, nbytes / (us * 1e-6) / 1e9 / ceiling, ok))
                print(f"B={B:<4} {case:26} {name:18} {us:8.1f} us/launch (graph)  {results[-1][4]:6.1%}  {'ok' if ok else 'WRONG'}", flush=True)
            del buf, win, state, state_phys
    print("\nbest four per (B, case), graph replay us/launch and fraction of the copy ceiling:")
    for B in batches:
        for case in layouts:
            rows = sorted((r for r in results if r[0] == B and r[1] == case and r[5]), key=lambda r: r[3])
            print(f"B={B:<4} {case:26} " + " | ".join(f"{r[2]} {r[3]:.1f} us {r[4]:.0%}" for r in rows[:4]))
    print("\nper block/warps, sum over B of us (lower is better) per case:")
    for case in layouts:
        names = sorted({r[2] for r in results if r[1] == case})
        totals = sorted((sum(r[3] for r in results if r[1] == case and r[2] == n), n) for n in names)
        print(f"{case:26} " + " | ".join(f"{n} {t:.0f}" for t, n in totals[:5]))


if __name__ == "__main__":
    sys.exit(main())
