"""Host time of the ops' Python path on every eager call: argument checks, aliasing checks and the
commit's launch planning, and the public eager commit with a signature it has seen (its
signature cache), with the kernel itself replaced by a no-op. Runs on any machine (CPU
tensors; the checks read only metadata), so host overhead can be worked on without a GPU; the
GPU machine's end-to-end numbers are `bench_scatter.py --eager-only`.

    python benchmarks/bench_host.py

Shape: Qwen3-Next TP1 (36 layers, dim 8192, K = 4), token_major buffer of 8 slots, D = N = 4,
B = 1, bf16. Prints the best of 9 rounds of 20,000 calls, us per call.
"""

import os
import sys

import torch

import common  # before sgl_convwin: without CUDA it sets TRITON_INTERPRET=1
import sgl_convwin
from common import host_time_us, markdown_header, markdown_row
from sgl_convwin.declare import eager_device

(L, DIM), K = common.SHAPES["qwen3next-tp1"], common.KERNEL_SIZE
M, N, B = 8, 4, 1


def main():
    buffer = sgl_convwin.alloc_windows(L, M, DIM, N, K, layout="token_major", dtype=torch.bfloat16)
    windows = sgl_convwin.window_view(buffer, "token_major", N, K)
    state = torch.zeros(L, M, DIM, K - 1, dtype=torch.bfloat16)
    x = torch.zeros(B, N, DIM, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    weight, bias = torch.zeros(DIM, K, dtype=torch.bfloat16), torch.zeros(DIM, dtype=torch.bfloat16)
    index = torch.zeros(B, dtype=torch.int64)
    noop = lambda *args, **kwargs: None  # noqa: E731
    rows = [
        ("eager-call test (eager_device, 5 tensors)", lambda: eager_device(state, windows, index, index, index)),
        ("scatter: checks, no kernel",
         lambda: sgl_convwin.scatter.kernel_arguments(state, windows, index, index, index)),
        ("capture: checks, no kernel", lambda: sgl_convwin.capture.kernel_arguments(buffer, state, x, index, index, 3)),
        ("causal_conv1d_verify: checks, no kernel",
         lambda: sgl_convwin.causal_conv1d_verify.kernel_arguments(out, buffer, state, x, weight, bias, index, index, 3,
                                                                   activation="silu")),
    ]
    rows.append(("scatter: public eager call, signature seen (kernel no-op)",
                 lambda: sgl_convwin.scatter(state, windows, index, index, index)))
    parents = torch.full((B, N), -1, dtype=torch.int64)
    rows.append(("scatter_tree: public eager call, signature seen (kernel no-op)",
                 lambda: sgl_convwin.scatter_tree(state, buffer, index, index, index, parents)))
    try:
        from sgl_convwin._kernels import triton_kernels

        plan = triton_kernels().scatter.scatter_launch_args
        rows.append(("scatter: launch plan lookup", lambda: plan(state, windows, index, index, index)))
    except ImportError:
        pass
    # one layer's gdn_ring_verify (a capacity-16 ring of the model's 36 layers; states of 8 slots)
    hk, dk, hv, dv = 16, 128, 32, 128
    ring = sgl_convwin.alloc_ring(L, M, DIM, N, hv, capacity=16, dtype=torch.bfloat16)
    ssm = torch.empty(L, M, hv, dk, dv)
    conv_out = torch.zeros(B, N, DIM, dtype=torch.bfloat16)
    q, k, v = (conv_out[..., :hk * dk].unflatten(-1, (hk, dk)), conv_out[..., hk * dk:2 * hk * dk].unflatten(-1, (hk, dk)),
               conv_out[..., 2 * hk * dk:].unflatten(-1, (hv, dv)))
    g, beta, verify_out = torch.zeros(B, N, hv), torch.zeros(B, N, hv), torch.zeros(B, N, hv, dv, dtype=torch.bfloat16)
    ring_args = (verify_out, q, k, v, g, beta, ssm, state, *ring, weight, None, index, index, 3)
    rows.append(("gdn_ring_verify: checks, no kernel", lambda: sgl_convwin.gdn_ring_verify.kernel_arguments(*ring_args)))
    rows.append(("gdn_ring_verify: public eager call, signature seen (kernel no-op)",
                 lambda: sgl_convwin.gdn_ring_verify(*ring_args)))
    planned = (sgl_convwin.scatter, sgl_convwin.scatter_tree, sgl_convwin.gdn_ring_verify)
    for public in planned:
        public.eager_plans.clear()
    sgl_convwin.scatter(state, windows, index, index, index)
    sgl_convwin.scatter_tree(state, buffer, index, index, index, parents)
    sgl_convwin.gdn_ring_verify(*ring_args)
    for public in planned:  # the eager plans take the no-op
        plans = public.eager_plans
        plans.update({key: (sizes, noop) for key, (sizes, _) in plans.items()})
    print(f"host time per call, torch {torch.__version__}, {os.cpu_count()} CPUs")
    print(markdown_header("path", "us per call"))
    for name, fn in rows:
        print(markdown_row(name, f"{host_time_us(fn):.2f}"), flush=True)
    for public in planned:
        public.eager_plans.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
