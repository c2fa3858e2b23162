"""Offline: does a Gluon kernel store channel_major rows as whole lines? (docs/benchmarks.md,
"Verify kernel" > "channel_major rows").

channel_major rows put a channel's R = N+K-2 rows together (12 bytes at D = 4, K = 4), so a warp
whose lanes each hold a few channels covers only a third of every line it stores. This probe
compiles, for sm_90 and without a GPU, a one-warp kernel that turns token-major rows [R, dim] into
channel_major rows [dim, R] for 128 channels: each thread gathers its 4 channels' 24-element run
(in the verify kernels the run would come from registers), stores elements 0-15 and 16-23 of it
into shared memory through two padded views so that element f of thread g lands at 24g + f, then
the warp reads the 768 elements back flat, 16 bytes per lane, and stores them to global memory.
It prints the kernel's shared and global memory instructions. Not run on a GPU yet.

    python benchmarks/explore/channel_major_store_probe.py

Written against Triton 3.6's Gluon (the H200's; 3.9 renamed the descriptor's _reinterpret).
"""

import os
import re
import subprocess
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

ROWS, VEC, BLOCK = 6, 4, 128  # D = 4, K = 4; channels per thread; channels per program (one warp)


@gluon.jit
def _channel_major_rows_kernel(src_ptr, dst_ptr, dim, R: gl.constexpr, VEC: gl.constexpr, BLOCK: gl.constexpr):
    GROUPS: gl.constexpr = BLOCK // VEC  # one thread per group of VEC channels
    RUN: gl.constexpr = VEC * R  # a group's rows, contiguous in the destination
    RUN_A: gl.constexpr = 16  # a run in two power-of-two pieces: 16 + 8 at R = 6
    RUN_B: gl.constexpr = RUN - RUN_A
    first = gl.program_id(0) * BLOCK
    layout_a: gl.constexpr = gl.BlockedLayout([1, RUN_A], [32, 1], [1, 1], [1, 0])
    layout_b: gl.constexpr = gl.BlockedLayout([1, RUN_B], [32, 1], [1, 1], [1, 0])
    group_a = gl.arange(0, GROUPS, layout=gl.SliceLayout(1, layout_a))[:, None]
    f_a = gl.arange(0, RUN_A, layout=gl.SliceLayout(0, layout_a))[None, :]
    group_b = gl.arange(0, GROUPS, layout=gl.SliceLayout(1, layout_b))[:, None]
    f_b = RUN_A + gl.arange(0, RUN_B, layout=gl.SliceLayout(0, layout_b))[None, :]
    # element f of group g: row f % R of channel first + g * VEC + f // R
    piece_a = gl.load(src_ptr + (f_a % R) * dim + first + group_a * VEC + f_a // R)
    piece_b = gl.load(src_ptr + (f_b % R) * dim + first + group_b * VEC + f_b // R)
    runs = gl.allocate_shared_memory(gl.bfloat16, [1024], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    # padding RUN - piece after every piece: element (g, f) of a piece lands at g * RUN + f
    view_a: gl.constexpr = gl.PaddedSharedLayout(
        [[RUN_A, RUN - RUN_A]], [[0, 1], [0, 2], [0, 4], [0, 8], [1, 0], [2, 0], [4, 0], [8, 0], [16, 0]], [],
        [GROUPS, RUN_A])
    view_b: gl.constexpr = gl.PaddedSharedLayout(
        [[RUN_B, RUN - RUN_B]], [[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0], [8, 0], [16, 0]], [],
        [GROUPS, RUN_B])
    runs._reinterpret(gl.bfloat16, [GROUPS, RUN_A], view_a).store(piece_a)
    # (a slice's offset must be a multiple of its length: 16 elements at 16, then viewed wider)
    runs.slice(RUN_A, RUN_A)._reinterpret(gl.bfloat16, [GROUPS, RUN_B], view_b).store(piece_b)
    gl.thread_barrier()
    CHUNK: gl.constexpr = 256
    flat: gl.constexpr = gl.BlockedLayout([8], [32], [1], [0])
    for i in gl.static_range(RUN * GROUPS // CHUNK):
        values = runs.slice(i * CHUNK, CHUNK).load(flat)
        gl.store(dst_ptr + first * R + i * CHUNK + gl.arange(0, CHUNK, layout=flat), values)


def main():
    signature = {"src_ptr": "*bf16", "dst_ptr": "*bf16", "dim": "i32", "R": "constexpr", "VEC": "constexpr",
                 "BLOCK": "constexpr"}
    aligned = [["tt.divisibility", 16]]
    source = GluonASTSource(fn=_channel_major_rows_kernel, signature=signature,
                            constexprs={(3,): ROWS, (4,): VEC, (5,): BLOCK},
                            attrs={(0,): aligned, (1,): aligned, (2,): aligned})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", cubin.name], capture_output=True,
                              text=True, check=True).stdout
    lines = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*", "", line).split(";")[0].strip()
             for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
    print(f"triton {triton.__version__}, sm_90: {len(lines)} instructions; shared and global stores, shared loads:")
    for line in lines:
        if re.search(r"\b(STS|LDS|STG|BAR)\b", line):
            print("  " + line)


if __name__ == "__main__":
    main()
