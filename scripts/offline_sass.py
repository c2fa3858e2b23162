"""Compile the recurrence kernels' launches for a GPU that is not here, and count what ptxas made of
them: registers, spilled bytes, shared memory, SASS instructions (local loads / stores, cp.async,
mma.sync, wgmma). For a first look at a kernel change between GPU runs; the H200 decides.

The launches are the launchers' own (their call helpers' KernelCalls) at a model's shape, with CPU
tensors standing in for the GPU's: the same strides and dtypes, so the same specialisation
(pointers 16-byte aligned, integers divisible by 16 or equal to 1, as Triton's launcher assumes).
Needs the Triton the GPU has (3.6 on the H200: ``pip install triton==3.6.0`` into a virtual
environment beside torch); its wheel carries ptxas, cuobjdump and nvdisasm.

    python scripts/offline_sass.py mamba2_verify [--batch 64] [--tunings '{}' '{"chunk_n": 0}']
    python scripts/offline_sass.py mamba2_ring --tunings '{"fold_maxnreg": 168}'
    python scripts/offline_sass.py gdn_ring --tunings '{"fold_maxnreg": 168}'   # the mma kernel's launches
    python scripts/offline_sass.py gdn_ring_due                                 # the due flush's fold launch
    python scripts/offline_sass.py gdn_ring_tree --tunings '{"merged": false}'  # trees of 8, each kind apart
    python scripts/offline_sass.py gdn_verify                                   # its mma kernel (gdn_verify_bf16: a bf16 pool)
    python scripts/offline_sass.py gdn_verify_transposed                        # (a pool stored [.., dv, dk])
    python scripts/offline_sass.py gdn_ring --tunings '{"merged": false}' --opcodes 12  # each kind's opcode mix
    python scripts/offline_sass.py gdn_ring_test_shapes --batch 4               # every shape the tests compile
    python scripts/offline_sass.py mamba2_ring_test_shapes --batch 4            # (the Mamba2 ring's)
    python scripts/offline_sass.py ring_tree_depth --batch 4                    # both rings' trees told their depth
"""

from __future__ import annotations

import argparse
import collections
import functools
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import mangle_type

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sgl_convwin  # noqa: E402
from sgl_convwin import csrc_triton  # noqa: E402

TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
         torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}
OPTIONS = ("num_warps", "num_stages", "maxnreg", "num_ctas", "launch_pdl")


def compile_call(call, arch):
    """``call`` (a KernelCall) compiled for sm_<arch>, specialised as Triton's launcher would."""
    values = iter((*call.tensors, *call.scalars))
    signature, constants, attrs = {}, {}, {}
    for index, param in enumerate(call.kernel.params):
        if param.is_constexpr:
            signature[param.name], constants[param.name] = "constexpr", call.constexprs[param.name]
            continue
        value = next(values)
        if hasattr(value, "block_shape"):  # a tensor descriptor: its type, as Triton's launcher mangles it
            signature[param.name] = mangle_type(value)
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + TYPES[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            if value == 1 and not param.do_not_specialize:
                signature[param.name], constants[param.name] = "constexpr", 1
                continue
            signature[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0 and not param.do_not_specialize:
                attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[param.name] = "fp32"
    if type(call.kernel).__name__.startswith("Gluon"):
        from triton.experimental.gluon._runtime import GluonASTSource as source
    else:
        source = ASTSource
    options = {name: value for name, value in call.constexprs.items() if name in OPTIONS}
    return triton.compile(source(call.kernel, signature, constants, attrs), target=GPUTarget("cuda", arch, 32),
                          options=options)


INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")  # nvdisasm's "/*0a30*/  @P0 LDG.E R2, ...;"


def opcode(instruction: str) -> str:
    """An instruction's opcode without its predicate or modifiers ("@P0 LDG.E.64 R2, ..." -> LDG)."""
    words = instruction.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def disassemble(kernel, *flags) -> str:
    """A compiled kernel's cubin through the tool ``flags[0]`` (nvdisasm by default) with the rest."""
    tool, *rest = flags or ("nvdisasm", "-c")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        return subprocess.run([os.path.join(TOOLS, tool), *rest, f.name], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(f.name)


def counts(kernel, opcodes=0) -> dict:
    """ptxas's resource usage and the SASS's instruction counts of a compiled kernel (with opcodes,
    also its most frequent opcodes, that many, and their counts)."""
    usage = disassemble(kernel, "cuobjdump", "--dump-resource-usage")
    regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
    instructions = [m.group(2) for m in map(INSTRUCTION.match, disassemble(kernel).splitlines()) if m]
    ops = {name: sum(1 for text in instructions if re.search(rf"\b{op}\b", text))
           for name, op in (("local loads", "LDL"), ("local stores", "STL"), ("cp.async", "LDGSTS"),
                            ("of 16 bytes", r"LDGSTS\S*\.128"),
                            ("mma.sync", "HMMA"), ("wgmma", "HGMMA"))}
    result = {"registers": int(regs), "spilled bytes": int(stack), "shared bytes": kernel.metadata.shared,
              "instructions": len(instructions), **ops}
    if opcodes:
        result["opcodes"] = collections.Counter(map(opcode, instructions)).most_common(opcodes)
    return result


def conv_views(batch, nodes, widths, names):
    """Views of one bf16 conv output [batch, nodes, sum of widths] split at the widths (engines' layout)."""
    mixed = torch.empty(batch, nodes, sum(width for width, _ in widths), dtype=torch.bfloat16)
    views, start = {}, 0
    for name, (width, heads) in zip(names, widths):
        views[name] = mixed[..., start:start + width].unflatten(-1, heads)
        start += width
    return views


def mamba2_verify_calls(batch, tuning):
    """mamba2_verify's launch at Nemotron-H-8B TP1 (H 128, P 64, G 8, Ns 128), chains of 4."""
    H, P, G, Ns, N = 128, 64, 8, 128, 4
    v = conv_views(batch, N, [(H * P, (H, P)), (G * Ns, (G, Ns)), (G * Ns, (G, Ns))], "xBC")
    out = torch.empty(batch, N, H, P, dtype=torch.bfloat16)
    return [csrc_triton.mamba2_verify._verify_call(
        out, v["x"], torch.empty(batch, N, H, dtype=torch.bfloat16), torch.empty(H), v["B"], v["C"],
        torch.empty(batch, H, P, Ns), torch.arange(batch), None, torch.empty(H), None, torch.empty(H),
        dt_softplus=True, **tuning)]


def mamba2_ring_calls(batch, tuning, H=128, P=64, G=8, Ns=128, N=4, capacity=16, tree=False,
                      state_dtype=torch.float32, tree_depth=None):
    """mamba2_ring_verify's launches, by default at Nemotron-H-8B TP1, capacity 16, chains of 4, a
    float32 checkpoint."""
    K, rows = 4, capacity + N
    dim = H * P + 2 * G * Ns
    v = conv_views(batch, N, [(H * P, (H, P)), (G * Ns, (G, Ns)), (G * Ns, (G, Ns))], "xBC")
    args, kwargs = sgl_convwin.mamba2_ring_verify.kernel_arguments(
        torch.empty(batch, N, H, P, dtype=torch.bfloat16), v["x"], torch.empty(batch, N, H, dtype=torch.bfloat16),
        torch.empty(H), v["B"], v["C"], torch.empty(1, batch, H, P, Ns, dtype=state_dtype),
        torch.empty(1, batch, dim, K - 1, dtype=torch.bfloat16), torch.empty(1, batch, rows, dim, dtype=torch.bfloat16),
        torch.empty(1, batch, rows, 1, H), torch.zeros(batch, 2, dtype=torch.int32),
        torch.empty(dim, K, dtype=torch.bfloat16), torch.empty(dim, dtype=torch.bfloat16), torch.arange(batch),
        torch.arange(batch), 0,
        torch.zeros(batch, N, dtype=torch.int64) if tree else None, D=torch.empty(H), z=None,
        dt_bias=torch.empty(H), dt_softplus=True, tree_depth=tree_depth)
    return list(csrc_triton.mamba2_ring_verify._ring_calls(*args, **dict(kwargs, **tuning)))


def test_shape_calls(shapes, calls, tuning, keep):
    """Every launch ``keep`` takes of ``calls(**shape)`` for each shape, but for a shape the launcher
    refuses for the tuning (said in a line and left out, as the tests skip it)."""
    kept = []
    for shape in shapes:
        try:
            kept += [call for call in calls(**shape) if keep(call)]
        except ValueError as error:
            print(f"{tuning} {shape}: refused ({error})", flush=True)
    return kept


def mamba2_ring_test_shape_calls(batch, tuning):
    """mamba2_ring's launches at the small shapes of its GPU tests (head dim 16, d_state 16 and 40,
    N 3, capacity 4 and 16, chains and trees, float32 and bf16 checkpoints; head dim 24 in two column
    blocks, d_state 64, two heads a program): a compile error at a shape the model never takes shows
    here, before a GPU run."""
    shapes = [dict(P=16, Ns=Ns, capacity=capacity, tree=tree, state_dtype=state_dtype)
              for Ns, capacity, tree, state_dtype
              in itertools.product((16, 40), (4, 16), (False, True), (torch.float32, torch.bfloat16))]
    blocks = dict(block_p=16, heads_per_program=2)
    shapes += [dict(P=24, Ns=64, capacity=8, tree=tree, tiles=blocks) for tree in (False, True)]

    def calls(tiles=None, **shape):
        return mamba2_ring_calls(batch, dict(tuning, **(tiles or {})), H=4, G=2, N=3, **shape)

    return test_shape_calls(shapes, calls, tuning, lambda call: "window" not in call.kernel.__name__)


def gdn_ring_calls(batch, tuning, Hk=16, Hv=32, dk=128, dv=128, N=4, tree=False, state_dtype=torch.float32,
                   capacity=16, tree_depth=None):
    """gdn_ring_verify's launches on the mma kernel; by default at Qwen3-Next TP1 (Hk 16, Hv 32,
    dk = dv = 128), capacity 16, chains of 4, a float32 checkpoint."""
    K, rows = 4, capacity + N
    dim = 2 * Hk * dk + Hv * dv
    v = conv_views(batch, N, [(Hk * dk, (Hk, dk)), (Hk * dk, (Hk, dk)), (Hv * dv, (Hv, dv))], "qkv")
    args, kwargs = sgl_convwin.gdn_ring_verify.kernel_arguments(
        torch.empty(batch, N, Hv, dv, dtype=torch.bfloat16), v["q"], v["k"], v["v"], torch.empty(batch, N, Hv),
        torch.empty(batch, N, Hv), torch.empty(1, batch, Hv, dk, dv, dtype=state_dtype),
        torch.empty(1, batch, dim, K - 1, dtype=torch.bfloat16), torch.empty(1, batch, rows, dim, dtype=torch.bfloat16),
        torch.empty(1, batch, rows, 2, Hv), torch.zeros(batch, 2, dtype=torch.int32),
        torch.empty(dim, K, dtype=torch.bfloat16), None,
        torch.arange(batch), torch.arange(batch), 0, torch.zeros(batch, N, dtype=torch.int64) if tree else None,
        tree_depth=tree_depth)
    return list(csrc_triton.gdn_ring_verify._ring_calls(*args, **dict(kwargs, mma=True, **tuning)))


def tree_depth_calls(batch, tuning):
    """Both rings' launches for trees of 8 told their depth: the benchmarks' (depth 4, capacity 16, the
    models' shapes) and test_trees_fold_by_their_depth's (depth 1 / 3 / 4 at capacity 8 / 9 / 16,
    heads of 32): the GDN verify's stack of C - T keys, Mamba2's of 32 rows."""
    shapes = [dict(capacity=16, tree_depth=4)]
    tests = [dict(capacity=capacity, tree_depth=depth) for capacity, depth in ((8, 1), (9, 3), (16, 4))]
    calls = []
    for shape in shapes:
        calls += gdn_ring_calls(batch, tuning, N=8, tree=True, **shape)
        calls += mamba2_ring_calls(batch, tuning, N=8, tree=True, **shape)
    for shape in tests:
        calls += gdn_ring_calls(batch, tuning, Hk=1, Hv=2, dk=32, dv=32, N=8, tree=True, **shape)
        calls += mamba2_ring_calls(batch, tuning, H=2, P=32, G=1, Ns=32, N=8, tree=True, **shape)
    return [call for call in calls if "window" not in call.kernel.__name__]


def gdn_ring_test_shape_calls(batch, tuning):
    """gdn_ring's launches at the small shapes of its GPU tests (dk / dv 16 / 32, 32 / 32, and the
    model's 128 / 128; N 3 and 4; chains and trees; float32 and bf16 checkpoints; capacity 16, and 4
    (a stack of 16 rows) at the small head dims): a Gluon compile error in a constexpr branch the
    model's shape never takes shows here, before a GPU run."""
    shapes = [dict(dk=dk, dv=dv, capacity=capacity, N=N, tree=tree, state_dtype=state_dtype)
              for (dk, dv, capacity), N, tree, state_dtype
              in itertools.product(((16, 32, 16), (32, 32, 16), (128, 128, 16), (16, 32, 4), (32, 32, 4)), (3, 4),
                                   (False, True), (torch.float32, torch.bfloat16))]
    return test_shape_calls(shapes, lambda **shape: gdn_ring_calls(batch, tuning, Hk=2, Hv=4, **shape), tuning,
                            lambda call: "window" not in call.kernel.__name__)


def gdn_ring_due_calls(batch, tuning, Hk=16, Hv=32, dk=128, dv=128, N=4, capacity=16, layers=36):
    """gdn_ring_flush(..., num_draft=N)'s fold launch on the mma kernel over every layer, by default at
    Qwen3-Next TP1, capacity 16, a float32 checkpoint: the verify's fold kind over a grid of layers."""
    K, rows = 4, capacity + N
    dim = 2 * Hk * dk + Hv * dv
    args, kwargs = sgl_convwin.gdn_ring_flush.kernel_arguments(
        torch.empty(layers, batch, Hv, dk, dv), torch.empty(layers, batch, dim, K - 1, dtype=torch.bfloat16),
        torch.zeros(batch, 2, dtype=torch.int32), torch.empty(layers, batch, rows, dim, dtype=torch.bfloat16),
        torch.empty(layers, batch, rows, 2, Hv), torch.empty(layers, dim, K, dtype=torch.bfloat16),
        torch.arange(batch), torch.arange(batch), num_k_heads=Hk, head_k_dim=dk, num_v_heads=Hv, head_v_dim=dv,
        num_draft=N)
    return list(csrc_triton.gdn_ring_verify._flush_calls(*args, **dict(kwargs, mma=True, **tuning)))[:1]


def gdn_verify_calls(batch, tuning, state_dtype=torch.float32, transposed=False, tree=False):
    """gdn_verify's launch on the mma kernel at Qwen3-Next TP1 (Hk 16, Hv 32, dk = dv = 128), chains of 4
    (transposed: the pool stored [.., dv, dk], passed transposed; tree: the benchmarks' tree of 8 nodes)."""
    Hk, Hv, d = 16, 32, 128
    parents = torch.tensor([[-1, 0, 0, 0, 1, 1, 1, 4]] * batch) if tree else None
    N = 8 if tree else 4
    v = conv_views(batch, N, [(Hk * d, (Hk, d)), (Hk * d, (Hk, d)), (Hv * d, (Hv, d))], "qkv")
    ssm = torch.empty(batch, Hv, d, d, dtype=state_dtype)
    return [csrc_triton.gdn_verify._verify_call(
        torch.empty(batch, N, Hv, d, dtype=torch.bfloat16), v["q"], v["k"], v["v"], torch.empty(batch, N, Hv),
        torch.empty(batch, N, Hv), ssm.transpose(-1, -2) if transposed else ssm, torch.arange(batch), parents,
        scale=d ** -0.5, use_qk_l2norm=True, **dict(dict(mma=True), **tuning))]


KERNELS = {"mamba2_verify": mamba2_verify_calls, "mamba2_ring": mamba2_ring_calls, "gdn_ring": gdn_ring_calls,
           "gdn_ring_due": gdn_ring_due_calls, "gdn_ring_tree": functools.partial(gdn_ring_calls, N=8, tree=True),
           "gdn_ring_test_shapes": gdn_ring_test_shape_calls, "gdn_verify": gdn_verify_calls,
           "gdn_verify_bf16": functools.partial(gdn_verify_calls, state_dtype=torch.bfloat16),
           "gdn_verify_transposed": functools.partial(gdn_verify_calls, transposed=True),
           "gdn_verify_tree": functools.partial(gdn_verify_calls, tree=True),
           "gdn_verify_bf16_tree": functools.partial(gdn_verify_calls, state_dtype=torch.bfloat16, tree=True),
           "gdn_verify_bf16_transposed": functools.partial(gdn_verify_calls, state_dtype=torch.bfloat16, transposed=True),
           "mamba2_ring_test_shapes": mamba2_ring_test_shape_calls, "ring_tree_depth": tree_depth_calls}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel", choices=tuple(KERNELS))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--arch", type=int, default=90, help="the SM version compiled for (90: H100 / H200)")
    parser.add_argument("--tunings", type=json.loads, nargs="+", default=[{}], metavar="JSON",
                        help="the launcher's keyword arguments, one JSON object per compile")
    parser.add_argument("--opcodes", type=int, default=0, metavar="N",
                        help="also each compile's N most frequent SASS opcodes and their counts")
    args = parser.parse_args(argv)
    print(f"triton {triton.__version__}, sm_{args.arch}, {args.kernel} at B = {args.batch}")
    failures = 0
    for tuning in args.tunings:
        for call in KERNELS[args.kernel](args.batch, tuning):
            kind = f" kind {call.constexprs['KIND']}" if "KIND" in call.constexprs else ""
            shape = "" if not kind else " " + str({name: call.constexprs[name] for name in ("NUM_NODES", "BLOCK_K",
                                                                                        "BLOCK_V", "TREE")})
            try:
                result = counts(compile_call(call, args.arch), args.opcodes)
            except Exception as error:  # noqa: BLE001 -- every launch's compile reported, then the exit status
                failures += 1
                result = f"FAILED: {str(error).strip().splitlines()[-1]}"
            print(f"{json.dumps(tuning)} {call.kernel.__name__}{kind}{shape} grid {call.grid}: {result}", flush=True)
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
