"""Host time of one eager call of a registered op that does nothing, per registration style: the
Python kernel called directly, ``torch.library.custom_op`` (what declare.py used to build), and
lower-level ``torch.library.Library`` registrations with more or less of custom_op's layers.
CPU only (the dispatcher's work does not depend on the device; the GPU numbers are
``bench_scatter.py --eager-only``).

    python benchmarks/explore/dispatch_overhead.py [--calls 5000] [--rounds 21]

Every op has scatter's schema (one mutated tensor, four read, a keyword-only string) and returns
nothing. Rows:

- direct: the Python kernel itself, no dispatcher.
- custom_op: Autograd and ADInplaceOrView kernels in Python, backend kernel wrapped in a
  dynamo-disable and custom_op's return checks.
- Library, backend only: define + CPU kernel + fake. Autograd: the C++ fallback; ADInplaceOrView:
  fallthrough, so the mutated tensor's version is NOT bumped (not enough on its own).
- Library, bump in the kernel: the backend kernel bumps the version itself (the fast way, but
  a tensor subclass's wrapper or a FunctionalTensor would not see the bump).
- Library, Python ADInplaceOrView: + a minimal Python ADInplaceOrView kernel that bumps the
  mutated tensor's version and redispatches with autograd off (custom_op's Autograd and
  ADInplaceOrView layers in one, without its fill_defaults).
- ... + dynamo-disabled kernels: both Python kernels wrapped in ``torch._disable_dynamo`` as
  custom_op does (so an eager call inside a compiled function's frame never traces them).
- Library, Python Autograd calling the backend: one dynamo-disabled Python Autograd kernel that
  bumps the version and, with autograd off, calls the CPU kernel itself when the keyset below
  holds nothing but it (else redispatches): what declare.py registers.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/common.py
from common import interleaved_host_times  # noqa: E402

SCHEMA = '(Tensor(a0!) conv_state, Tensor windows, Tensor dst_slots, Tensor src_slots, Tensor steps, *, ' \
         'str state_layout="dim_major") -> ()'
NAMESPACE = "convwin_probe"
_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")  # kept alive: registrations die with it


def impl(conv_state: torch.Tensor, windows: torch.Tensor, dst_slots: torch.Tensor, src_slots: torch.Tensor,
         steps: torch.Tensor, *, state_layout: str = "dim_major") -> None:
    return None


def fake(conv_state, windows, dst_slots, src_slots, steps, *, state_layout="dim_major"):
    return None


def bumping_impl(conv_state, windows, dst_slots, src_slots, steps, *, state_layout="dim_major"):
    torch.autograd.graph.increment_version(conv_state)


def ad_inplace_or_view_kernel(overload):
    """Bumps the mutated tensor's version, then the kernels below with autograd off (custom_op's two
    Python layers in one, minus fill_defaults)."""
    after = torch._C._after_ADInplaceOrView_keyset

    def ad_inplace_or_view(keyset, conv_state, *args, **kwargs):
        torch.autograd.graph.increment_version(conv_state)
        with torch._C._AutoDispatchBelowAutograd():  # as custom_op's Autograd kernel
            return overload.redispatch(keyset & after, conv_state, *args, **kwargs)

    return ad_inplace_or_view


def autograd_kernel(overload, backend_kernel):
    """Bumps the mutated tensor's version, then, autograd off, the backend kernel itself when
    nothing else lies below (plain CPU tensors), else the kernels below."""
    below_inplace, below_autograd = torch._C._after_ADInplaceOrView_keyset, torch._C._after_autograd_keyset
    cpu = torch._C.DispatchKey.CPU

    def autograd(keyset, conv_state, *args, **kwargs):
        torch.autograd.graph.increment_version(conv_state)
        with torch._C._AutoDispatchBelowAutograd():
            if (keyset & below_inplace).highestPriorityTypeId() == cpu:
                return backend_kernel(conv_state, *args, **kwargs)
            return overload.redispatch(keyset & below_autograd, conv_state, *args, **kwargs)

    return autograd


def define(name: str):
    _LIB.define(name + SCHEMA, tags=(torch.Tag.pt2_compliant_tag,))
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIB)
    return getattr(getattr(torch.ops, NAMESPACE), name)


def register_all():
    ops = {}
    custom = torch.library.custom_op(f"{NAMESPACE}::custom", impl, mutates_args=("conv_state",), device_types="cpu")
    custom.register_fake(fake)
    ops["custom_op"] = torch.ops.convwin_probe.custom

    op = define("backend_only")
    _LIB.impl("backend_only", impl, "CPU")
    ops["Library, backend only (no version bump)"] = op

    op = define("bump_in_kernel")
    _LIB.impl("bump_in_kernel", bumping_impl, "CPU")
    ops["Library, bump in the kernel"] = op

    for name, off in (("py_inplace", lambda f: f), ("py_inplace_disabled", torch._disable_dynamo)):
        op = define(name)
        _LIB.impl(name, off(impl), "CPU")
        _LIB.impl(name, off(ad_inplace_or_view_kernel(op.default)), "ADInplaceOrView", with_keyset=True)
        ops[f"Library, Python ADInplaceOrView{' + dynamo-disabled kernels' if 'disabled' in name else ''}"] = op

    op = define("py_autograd")
    _LIB.impl("py_autograd", torch._disable_dynamo(impl), "CPU")
    _LIB.impl("py_autograd", torch._disable_dynamo(autograd_kernel(op.default, impl)), "Autograd", with_keyset=True)
    ops["Library, Python Autograd calling the backend (dynamo-disabled)"] = op
    return ops


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args(argv)
    ops = register_all()
    state, windows = torch.zeros(2, 3, 8, 3), torch.zeros(2, 3, 4, 8, 3)
    index = torch.zeros(1, dtype=torch.int64)
    call = (state, windows, index, index, index)
    for name, op in ops.items():  # every variant really runs (and the bumping ones bump)
        before = state._version
        op(*call)
        print(f"# {name}: version {before} -> {state._version}")
    candidates = {"direct (Python kernel, no dispatcher)": lambda: impl(*call)}
    candidates.update({name: (lambda op=op: op(*call)) for name, op in ops.items()})
    candidates["custom_op, keyword-only argument passed"] = lambda: ops["custom_op"](*call, state_layout="dim_major")
    times = interleaved_host_times(candidates, args.calls, args.rounds, warmup=500, sync=lambda: None)
    direct = times["direct (Python kernel, no dispatcher)"][1]
    print(f"host time per call of a no-op op, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"{args.rounds} interleaved rounds x {args.calls} calls")
    print("| registration | best us | median us | median - direct (us) |")
    print("|---|---|---|---|")
    for name, (best, median) in times.items():
        print(f"| {name} | {best:.2f} | {median:.2f} | {median - direct:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
