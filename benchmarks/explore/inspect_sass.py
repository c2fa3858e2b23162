"""Offline: what the compiler makes of the production kernels, without a GPU.

Calls the package's own Triton launchers on CPU tensors of the benchmark shapes, but instead of
launching, compiles each kernel for sm_90 (H100/H200) exactly as that launch would specialise it,
then reads the cubin with the cuobjdump / nvdisasm that ship with Triton. Per case: registers per
thread, shared memory, SASS instruction count, the global loads and stores by width, and how many
instructions come before the first load (the index loads) and before the first data load (a 2-byte
or 16-byte load of bf16 data) -- the latency a one-row launch pays before its data moves.

    python benchmarks/explore/inspect_sass.py

Uses Triton internals (the JIT's binder and _pack_args, written against triton 3.9); the GPU runs
triton 3.6, whose compiler and ptxas may allocate differently. Timings stay on the GPU
(docs/benchmarks.md); this explains them.
"""

import os

os.environ["TRITON_INTERPRET"] = "0"  # compile real kernels (common.py would set 1 without a GPU)

import collections  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # noqa: E402  (benchmarks/common.py)
import common  # noqa: E402
import sgl_convwin  # noqa: E402
from sgl_convwin import ops  # noqa: E402
from sgl_convwin._kernels import triton_kernels  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)
TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
L, DIM, K = 36, 8192, 4


def compiled_launches(launch):
    """Run launch() with every @triton.jit kernel's launch replaced by an offline compile; return
    the compiled kernels in launch order."""
    kernels = triton_kernels()
    jitted = {obj for module in (kernels.scatter, kernels.scatter_tree, kernels.verify)
              for obj in vars(module).values() if isinstance(obj, triton.runtime.JITFunction)}
    jitted.add(common._channel_major_strided_kernel)
    compiled = []

    def recorder(fn):
        def run(*args, grid, warmup, **kwargs):
            binder = create_function_from_signature(fn.signature, fn.params, BACKEND)
            bound, specialization, options = binder(*args, **kwargs)
            options, signature, constexprs, attrs = fn._pack_args(BACKEND, kwargs, bound, specialization, options)
            compiled.append(triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET,
                                           options=options.__dict__))

        return run

    for fn in jitted:
        fn.run = recorder(fn)
    try:
        launch()
    finally:
        for fn in jitted:
            del fn.run
    return compiled


def sass_summary(kernel) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "-res-usage", cubin.name],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(TOOLS, "nvdisasm"), "-c", cubin.name],
                              capture_output=True, text=True, check=True).stdout
    ops_ = [m.group(1) for m in re.finditer(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass, re.M)]
    memory = collections.Counter(op for op in ops_ if op.startswith(("LDG", "STG", "LDS", "STS")))
    first = lambda test: next((i for i, op in enumerate(ops_) if test(op)), None)  # noqa: E731
    return dict(
        regs=int(re.search(r"REG:(\d+)", usage).group(1)),
        shared=kernel.metadata.shared,
        instructions=len(ops_),
        memory=", ".join(f"{count} {op}" for op, count in sorted(memory.items())),
        first_load=first(lambda op: op.startswith("LDG")),
        first_data=first(lambda op: op.startswith("LDG") and ("U16" in op or "128" in op)),
    )


def commit_cases():
    """(name, launch) for the chain commit: production choices, the forced alternatives and the
    strided baseline."""
    scatter = triton_kernels().scatter
    cases = []
    for layout, draft in (("token_major", 4), ("channel_major", 4), ("channel_major", 16)):
        problem = common.commit_problem(L, 8, DIM, draft, K, 1, torch.bfloat16, layout, "cpu")
        tag = f"{layout} D={draft}"
        cases += [
            (f"scatter {tag} (production)", lambda p=problem: ops._scatter_triton(*p)),
            (f"scatter {tag}, int64 offsets", lambda p=problem: scatter.launch_scatter(*p, wide_offsets=True)),
            (f"scatter {tag}, flat stores", lambda p=problem: scatter.launch_scatter(*p, flat_stores=True)),
            (f"scatter {tag}, strided stores", lambda p=problem: scatter.launch_scatter(*p, flat_stores=False)),
        ]
        if layout == "channel_major":
            cases.append((f"baseline channel_major strided D={draft}",
                          lambda p=problem: common.channel_major_strided(*p)))
    return cases


def tree_commit_cases():
    """The tree commit's plan (512 channels, links loaded up front) at B = 1 and 64, and its
    window-major-state and channel_major-rows kernels."""
    nodes = 8
    rows = torch.zeros(sgl_convwin.physical_shape("token_major", L, 8, DIM, nodes, K), dtype=torch.bfloat16)
    channel_rows = torch.zeros(sgl_convwin.physical_shape("channel_major", L, 8, DIM, nodes, K),
                               dtype=torch.bfloat16).transpose(-1, -2)
    state = torch.zeros(L, 8, DIM, K - 1, dtype=torch.bfloat16)
    window_major = torch.zeros(L, 8, K - 1, DIM, dtype=torch.bfloat16).transpose(-1, -2)
    cases = []
    for batch in (1, 64):
        slots, accepted = torch.arange(batch) % 8, torch.full((batch,), nodes - 1)
        parents = torch.tensor([common.tree_parents(nodes, 3)] * batch)
        for tag, tensors in (("", (state, rows)), (", window-major state", (window_major, rows)),
                             (", channel_major rows", (state, channel_rows))):
            if batch == 1 and tag:
                continue
            cases.append((f"scatter_tree N=8 topk 3, B={batch}{tag} (production)",
                          lambda t=tensors, s=slots, a=accepted, p=parents: ops._scatter_tree_triton(*t, s, s, a, p)))
    return cases


def verify_cases():
    cases = []
    for name, nodes, topk in (("chain N=4", 4, None), ("tree N=8 topk 3", 8, 3)):
        for layout in ("token_major", "dense"):
            buffer = sgl_convwin.alloc_windows(1, 8, DIM, nodes, K, layout=layout, dtype=torch.bfloat16)
            state = torch.zeros(1, 8, DIM, K - 1, dtype=torch.bfloat16)
            x = torch.zeros(4, nodes, DIM, dtype=torch.bfloat16)
            weight, bias = torch.zeros(DIM, K, dtype=torch.bfloat16), torch.zeros(DIM, dtype=torch.bfloat16)
            slots = torch.arange(4)
            parents = None if topk is None else torch.tensor([common.tree_parents(nodes, topk)] * 4)
            cases.append((f"verify {name} {layout}", lambda a=(torch.empty_like(x), buffer, state, x, weight, bias,
                                                                slots, slots, 0, parents), lay=layout:
                          ops._causal_conv1d_verify_triton(*a, layout=lay, activation="silu")))
    return cases


def main():
    print(f"offline compile for sm_90 with triton {triton.__version__} (no GPU needed); bf16, dim {DIM}, K = {K}")
    print("| case | registers | shared bytes | SASS instructions | global loads / stores | first load at | first data load at |")
    print("|---|---|---|---|---|---|---|")
    for name, launch in commit_cases() + tree_commit_cases() + verify_cases():
        for kernel in compiled_launches(launch):
            s = sass_summary(kernel)
            print(f"| {name} | {s['regs']} | {s['shared']} | {s['instructions']} | {s['memory']} | "
                  f"{s['first_load']} | {s['first_data']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
