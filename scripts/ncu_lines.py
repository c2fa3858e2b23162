"""Where a kernel's time goes, by source line: Nsight Compute's per-instruction counts and stall
samples (its SASS page as CSV) matched to the same launch compiled here (scripts/offline_sass.py,
under the Triton the GPU has) instruction by instruction, and nvdisasm's line table of that compile.
Triton's own line info names the Python lines; inlined helpers keep theirs.

On the device:  ncu ... -o R python3 benchmarks/bench_ring.py ...   (scripts/gpu_checklist.sh ringncu)
                ncu -i R.ncu-rep --page source --csv --print-source sass > R_sass.csv
Here:           python scripts/ncu_lines.py R_sass.csv gdn_ring --kind 3 [--batch 64] [--top 40]
                python scripts/ncu_lines.py R_sass.csv mamba2_ring --launch verify

The compile must be the profiled one (same shape, tunings and Triton); every opcode is compared
and a mismatch stops it.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import offline_sass  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r'//## File "([^"]+)", line (\d+)')


def compiled_lines(call, arch: int) -> list[tuple[str, tuple[str, int] | None]]:
    """(opcode, (file, line)) of each SASS instruction of ``call`` compiled for sm_<arch>."""
    sass = offline_sass.disassemble(offline_sass.compile_call(call, arch), "nvdisasm", "-c", "-g")
    where, result = None, []
    for text in sass.splitlines():
        if match := LINE.search(text):
            where = (os.path.basename(match.group(1)), int(match.group(2)))
        elif match := offline_sass.INSTRUCTION.match(text):
            result.append((offline_sass.opcode(match.group(2)), where))
    return result


def ncu_reports(path: str) -> list[tuple[str, list[dict]]]:
    """Each profiled kernel's name and per-instruction rows in an ``ncu --page source --csv`` file."""
    reports, name, rows, header = [], None, [], None
    for row in csv.reader(open(path, newline="")):
        if row and row[0] == "Kernel Name":
            if name is not None:
                reports.append((name, rows))
            name, rows, header = row[1], [], None
        elif header is None:
            header = row
        elif len(row) >= len(header):
            rows.append(dict(zip(header, row)))
    if name is not None:
        reports.append((name, rows))
    return reports


def number(value: str) -> float:
    return float(value.replace(",", "")) if value else 0.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu -i REPORT --page source --csv --print-source sass > CSV")
    parser.add_argument("kernel", choices=tuple(offline_sass.KERNELS), help="the launches, as offline_sass.py's")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tunings", type=json.loads, default={}, metavar="JSON")
    parser.add_argument("--kind", type=int, help="the launch whose KIND constexpr is this (GDN ring)")
    parser.add_argument("--launch", default="", metavar="NAME", help="the launch whose kernel's name holds NAME")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--top", type=int, default=40, help="lines shown, most instructions executed first")
    args = parser.parse_args(argv)

    calls = offline_sass.KERNELS[args.kernel](args.batch, args.tunings)
    if args.kind is not None:
        calls = [call for call in calls if call.constexprs.get("KIND") == args.kind]
    calls = [call for call in calls if args.launch in call.kernel.__name__]
    if not calls:
        parser.error("no such launch")
    compiled = compiled_lines(calls[0], args.arch)
    name = calls[0].kernel.__name__
    # the report of that kernel with as many instructions (a launcher's kinds are separate compiles)
    reports = [rows for kernel, rows in ncu_reports(args.csv) if kernel == name and len(rows) == len(compiled)]
    if not reports:
        print(f"no {name} report of {len(compiled)} instructions in {args.csv}: another compile was profiled")
        return 1
    rows = reports[0]
    mismatches = sum(offline_sass.opcode(row["Source"]) != op for row, (op, _) in zip(rows, compiled))
    if mismatches:
        print(f"{mismatches} of {len(rows)} opcodes differ from the compile here: another compile was profiled")
        return 1

    executed, samples = collections.Counter(), collections.Counter()
    reasons = collections.defaultdict(collections.Counter)
    stalls = [key for key in rows[0] if key.startswith("stall_") and "Not Issued" not in key]
    for row, (_, where) in zip(rows, compiled):
        executed[where] += number(row["Instructions Executed"])
        samples[where] += number(row["Warp Stall Sampling (All Samples)"])
        for key in stalls:
            reasons[where][key[len("stall_"):]] += number(row[key])
    total_executed, total_samples = sum(executed.values()) or 1, sum(samples.values()) or 1
    sources = {}
    print(f"{name} ({len(rows)} instructions): share of instructions executed and of stall samples by line")
    print(f"{'line':34s} {'executed':>8s} {'stalled':>8s}  top stalls  source")
    for where, count in executed.most_common(args.top):
        text = ""
        if where is not None:
            if where[0] not in sources:
                path = os.path.join(ROOT, "csrc_triton", where[0])
                sources[where[0]] = open(path).read().splitlines() if os.path.exists(path) else []
            lines = sources[where[0]]
            text = lines[where[1] - 1].strip()[:60] if where[1] <= len(lines) else ""
        top = ", ".join(f"{reason} {100 * n / total_samples:.1f}" for reason, n in reasons[where].most_common(2) if n)
        label = f"{where[0]}:{where[1]}" if where else "?"
        print(f"{label:34s} {100 * count / total_executed:7.1f}% {100 * samples[where] / total_samples:7.1f}%  "
              f"{top:28s}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
