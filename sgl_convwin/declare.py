"""One declaration per op: the public function, the registered ``torch.ops.convwin`` op, its fake
and its CPU and CUDA implementations all come from one ``declare_op`` call::

    @declare_op(mutates=("gates",), prepare=_prepare_capture_gates,
                cpu=cpu.capture_gates_cpu, cuda="launch_capture_gates")
    def capture_gates(gates: Tensor, g: Tensor, beta: Tensor | None, buffer_slots: Tensor,
                      layer: int) -> None:
        '''The public contract (this docstring is the public function's).'''

``prepare(real, **arguments)`` is the op's one validation: it raises on bad input before anything
is written and returns ``(args, kwargs)`` for the kernels, which take those and nothing else (the
CPU kernel as ``cpu``, the Triton launcher named ``cuda`` in csrc_triton). The fake runs it with
``real=False``: no storage, no index values are read then.

Why an opaque op and not a ``triton_op``: a triton_op's Python body is traced into the graph by
torch.compile on EVERY device, so a CPU call would be compiled into a Triton launch. An opaque op
keeps one validated path per device; inside compiled graphs Inductor calls it in place on the
caller's buffers (no clone), inside CUDA graphs its launches are what is captured. It is
registered through ``torch.library.Library`` with the schema ``torch.library.custom_op`` would
infer and the same tag, fake, CPU and CUDA kernels, but with one lean Python kernel (at Autograd
and ADInplaceOrView) in place of custom_op's Autograd and ADInplaceOrView layers, which cost
several times a small kernel per eager call (``_register``). As with custom_op, the op's schema
takes the public function's keyword-only tensor arguments positionally, after its positional
ones.

Every CUDA path (the public function's and the registered kernel) makes the written tensor's GPU
current for a call whose tensors live on another one, and runs the call there (``on_its_device``):
Triton launches on the current device.

An op may opt into the eager plan cache with ``eager_plan="planned_..."``, the name of a
csrc_triton planner: ``planner(*args, **kwargs)`` (the kernel arguments of one call) returns a
launch taking the same arguments that is valid for every call of that signature -- every shape,
stride, dtype and device of its tensors and the values of its other arguments. Such an op's
``prepare`` returns ``(args, kwargs, sizes)`` and takes ``sizes=`` (what it returned for a call
of the same signature): then it skips the checks that depend on the signature only and runs
those that depend on the tensors' storage (shared storage, the checked mode). On the CPU the plan
is ``cpu`` itself. The public function and the registered op's CPU and CUDA kernels share the
cache, so ``torch.ops.convwin.<name>`` calls use it too. A call whose written tensors require grad
or are inference tensors outside inference mode, or that passes something other than a tensor
where one goes, never takes a plan (the full checks then name what is wrong). Every op that
launches a Triton kernel has a planner (``csrc_triton.planned_<name>``); those of the ops with
several launches (the ring's) fix each of their launcher's KernelCalls (``_common.planned_calls``).

``cuda`` may also be a function instead of a launcher's name: an op whose kernels are still to
come runs its PyTorch code on CUDA tensors.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
import typing
from typing import Callable

import torch

from ._kernels import triton_kernels

NAMESPACE = "convwin"
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)  # Parameter disables __torch_function__
# Per op, (sizes, launch) per eager call signature. Engines repeat a few signatures step after
# step; bounded anyway (cleared when full).
EAGER_PLANS_MAX = 1024
# The current CUDA device's index: torch.cuda.current_device without its lazy-init check (a call
# that asks has a CUDA tensor in hand, so CUDA is initialised), where this torch has the raw call.
_CURRENT_CUDA_DEVICE = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
# Every declared op's registrations; they are undone when this object is deleted.
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


def eager_device(*tensors: torch.Tensor | None) -> str | None:
    """"cpu" or "cuda" when a public function may call the implementation directly, else None.

    The dispatcher costs more than the whole kernel at small batches, so plain eager calls on
    CPU or CUDA tensors (or Parameters: conv weights) skip it (quack does the same). The first
    tensor is the one the op writes; if it requires grad, the call goes through the op too.
    Everything else -- tracing by torch.compile, fake or functional tensors, an active dispatch
    mode (make_fx, FakeTensorMode), autograd -- goes through the registered op, so graphs still
    see ``convwin::*``. None entries (optional tensors not given) are ignored.
    """
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0:
        return None
    for t in tensors:
        if t is not None and type(t) not in _PLAIN_TENSORS:
            # a non-tensor goes to the checks, which name it; a tensor subclass to the dispatcher
            return None if isinstance(t, torch.Tensor) else "invalid"
    first = tensors[0]
    if first is None:  # the written tensor is never optional
        return "invalid"
    if first.requires_grad:
        return None
    # (is_cuda / is_cpu: reading .device builds an object, 4x slower on the hot path)
    return "cuda" if first.is_cuda else "cpu" if first.is_cpu else None


def _compile(name: str, signature: inspect.Signature, body: str, namespace: dict) -> Callable:
    """A function with exactly ``signature`` (its arguments as local variables) and ``body``:
    Python's own argument parsing, several times faster than ``Signature.bind``."""
    params, star = [], False
    for i, p in enumerate(signature.parameters.values()):
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not star:
            params.append("*")
            star = True
        text = p.name
        if p.default is not inspect.Parameter.empty:
            namespace[f"_default{i}"] = p.default
            text += f"=_default{i}"
        params.append(text)
    exec(f"def {name}({', '.join(params)}):\n{body}", namespace)  # noqa: S102
    return namespace[name]  # (named after the op: argument errors read "gdn_commit() missing ...")


def _binder(name: str, signature: inspect.Signature) -> Callable[..., dict]:
    """A function with exactly ``signature`` that returns its arguments as a dict, defaults applied."""
    names = ", ".join(f"{p!r}: {p}" for p in signature.parameters)
    return _compile(name, signature, f"    return {{{names}}}\n", {})


def _is_tensor_type(annotation) -> bool:
    return annotation is torch.Tensor or torch.Tensor in typing.get_args(annotation)


def _register(name: str, positional_names: tuple[str, ...], mutates: tuple[str, ...],
              cpu_kernel: Callable, cuda_kernel: Callable, fake_kernel: Callable) -> None:
    """Define ``convwin::<name>`` with the schema custom_op would infer from ``cpu_kernel`` and
    register its CPU, CUDA and fake kernels, and one lean Python kernel at Autograd and at
    ADInplaceOrView in place of custom_op's two layers there.

    That kernel runs the call with autograd off (a CPU kernel's writes must not record history from
    a weight that requires grad; the ops return nothing, so nothing gets a grad_fn, and a written
    tensor that requires grad is refused by the checks), then bumps the written tensors' versions
    (as custom_op's ADInplaceOrView kernel does; a Library op without one bumps nothing; a refused
    call bumps nothing).
    When nothing but a CPU or CUDA backend lies below it -- a plain eager call -- it calls that
    backend's kernel itself: a second trip through the dispatcher into Python costs more than a
    small kernel. Anything else below (fake or functional tensors, a dispatch mode, subclasses)
    gets a redispatch. Autograd runs it for calls with grad mode's keys; ADInplaceOrView for the
    rest that still track versions (normal tensors under inference_mode; a call redispatched from
    Autograd bumps twice, which is harmless). Written tensors are never defaulted, so the
    dispatcher always passes them positionally. Every Python kernel runs with Dynamo off, as
    custom_op's do: an eager call from a frame Dynamo is compiling must not trace it.
    """
    schema = torch.library.infer_schema(cpu_kernel, mutates_args=mutates)  # (its __signature__ is the op's)
    _LIBRARY.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    overload = getattr(getattr(torch.ops, NAMESPACE), name).default
    bumps = _bump_line(f"args[{positional_names.index(n)}]" for n in mutates)
    below_inplace = torch._C._after_ADInplaceOrView_keyset
    for key, below in (("Autograd", torch._C._after_autograd_keyset), ("ADInplaceOrView", below_inplace)):
        namespace = dict(_increment_version=torch.autograd.graph.increment_version, _redispatch=overload.redispatch,
                         _below=below, _below_inplace=below_inplace, _no_autograd=torch._C._AutoDispatchBelowAutograd,
                         _cpu_key=torch._C.DispatchKey.CPU, _cuda_key=torch._C.DispatchKey.CUDA, _cpu=cpu_kernel,
                         _cuda=cuda_kernel)
        exec(f"def {name}(keyset, *args, **kwargs):\n"  # noqa: S102
             f"    backend = (keyset & _below_inplace).highestPriorityTypeId()\n"
             f"    with _no_autograd():\n"
             f"        if backend == _cuda_key:\n"
             f"            _cuda(*args, **kwargs)\n"
             f"        elif backend == _cpu_key:\n"
             f"            _cpu(*args, **kwargs)\n"
             f"        else:\n"
             f"            _redispatch(keyset & _below, *args, **kwargs)\n{bumps}", namespace)
        _LIBRARY.impl(name, torch._disable_dynamo(namespace[name]), key, with_keyset=True)
    _LIBRARY.impl(name, torch._disable_dynamo(cpu_kernel), "CPU")
    _LIBRARY.impl(name, torch._disable_dynamo(cuda_kernel), "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake_kernel, lib=_LIBRARY)


def _without_autograd(kernel: Callable[..., None]) -> Callable[..., None]:
    """``kernel`` (PyTorch code) run with autograd off, as the registered op's Python kernel runs it:
    a public function's eager call reaches it directly, and a read tensor that requires grad (a conv
    weight Parameter, a model's activations) must not leave history in what it writes."""
    below_autograd = torch._C._AutoDispatchBelowAutograd

    @functools.wraps(kernel)
    def run(*args, **kwargs):
        with below_autograd():
            return kernel(*args, **kwargs)

    return run


def _bump_line(tensors) -> str:
    """A generated function body's line bumping the versions of ``tensors`` (expressions), all in one
    call (a sequence: torch >= 2.5)."""
    return f"    _increment_version(({''.join(f'{t}, ' for t in tensors)}))\n"


def _after_launch(body: str, lines: str) -> str:
    """A generated function body with ``lines`` (at the body's indent) where it says {after}, and
    one level deeper where it says {after_first} (str.replace, not format: the body is code)."""
    return body.replace("{after_first}", textwrap.indent(lines, "    ")).replace("{after}", lines)


def declare_op(
    *,
    mutates: tuple[str, ...],
    prepare: Callable[..., tuple[tuple, dict]],
    cpu: Callable[..., None],
    cuda: str | Callable[..., None],
    eager_plan: str | None = None,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorate the public signature (annotations, defaults, docstring; its body is never run)
    of a destination-passing op ``convwin::<name>``; returns the public function, with the
    registered op as its ``.op`` attribute, ``.kernel_arguments``, ``.cuda_impl`` (the CUDA
    implementation without the eager plans, callable with the op's arguments on any device:
    Triton's interpreter), ``.cuda_registered`` (the registered CUDA kernel, eager plans included
    with ``eager_plan``; any device too) and, with ``eager_plan``, ``.eager_plans`` (its cache)."""
    cpu = _without_autograd(cpu)
    if callable(cuda):
        cuda = _without_autograd(cuda)

    def decorate(signature_function: Callable[..., None]) -> Callable[..., None]:
        name = signature_function.__name__
        public_signature = inspect.signature(signature_function)
        hints = typing.get_type_hints(signature_function)
        params = [p.replace(annotation=hints[p.name]) for p in public_signature.parameters.values()]
        keyword_only = inspect.Parameter.KEYWORD_ONLY
        moved = [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
                 for p in params if p.kind is keyword_only and _is_tensor_type(p.annotation)]
        positional = [p for p in params if p.kind is not keyword_only] + moved
        keywords = [p for p in params if p.kind is keyword_only and not _is_tensor_type(p.annotation)]
        op_signature = inspect.Signature(positional + keywords, return_annotation=None)
        positional_names = tuple(p.name for p in positional)
        keyword_names = tuple(p.name for p in keywords)
        tensor_names = tuple(mutates) + tuple(
            p.name for p in params if _is_tensor_type(p.annotation) and p.name not in mutates
        )

        bind_public = _binder(name, public_signature)
        other_names = tuple(p.name for p in params if not _is_tensor_type(p.annotation))
        plans: dict[tuple, tuple] = {}

        def first_call(device: str, key: tuple | None, *prepare_args) -> None:
            """An eager call of a signature without a plan: every check, then its plan."""
            kernel_args, kernel_kwargs, sizes = prepare(True, *prepare_args)
            if device == "cpu":
                launch = cpu
            else:
                launch = getattr(triton_kernels(), eager_plan)(*kernel_args, **kernel_kwargs)
            if key is not None:
                if len(plans) >= EAGER_PLANS_MAX:
                    plans.clear()
                plans[key] = (sizes, launch)
            launch(*kernel_args, **kernel_kwargs)

        # The public function and the kernels, generated so that their arguments are local
        # variables: eager calls are as cheap as hand-written wrappers (they cost more than a
        # small kernel).
        prepare_names = list(inspect.signature(prepare).parameters)[1:]
        if eager_plan is not None:
            if "sizes" not in prepare_names:
                raise TypeError(f"declare_op {name}: with eager_plan, prepare takes sizes= (see declare.py)")
            prepare_names.remove("sizes")
        if sorted(prepare_names) != sorted(public_signature.parameters):
            raise TypeError(f"declare_op {name}: prepare takes real, then the op's arguments")
        prepare_args = ", ".join(prepare_names)
        tensors = ", ".join(tensor_names)
        op_call = ", ".join(list(positional_names) + [f"{n}={n}" for n in keyword_names])
        planned = ""  # (a function body's lines) a call of a seen signature runs its plan; {after} and
        # {after_first}: the public function's lines after a launch (the registered kernels': none)
        if eager_plan is not None:
            # each other argument with its type: 1, 1.0 and True are one dict key, not one signature
            key = [f"{n}, type({n})" for n in other_names] + [
                f"{n}.shape, {n}.stride(), {n}.dtype, {n}.device" if p.annotation is torch.Tensor
                else f"None if {n} is None else ({n}.shape, {n}.stride(), {n}.dtype, {n}.device)"
                for n, p in ((p.name, p) for p in params) if n in tensor_names
            ]
            # a written tensor that requires grad, or an inference tensor outside inference mode,
            # never takes a plan: the checks a plan skips refuse it
            unwritable = " or ".join(f"{n}.requires_grad or ({n}.is_inference() and not _inference_mode())"
                                     for n in mutates)
            planned = f"""    try:
        _key = ({", ".join(key)},)
        _plan = _plans.get(_key)
    except (TypeError, AttributeError):  # unhashable, or no tensor where one goes: the checks name it
        _plan = _key = None
    if _plan is None or {unwritable}:
        _first_call(_device, _key, {prepare_args})
{{after_first}}        return
    _args, _kwargs, _ = _prepare(True, {prepare_args}, sizes=_plan[0])
    _plan[1](*_args, **_kwargs)
{{after}}    return
"""
        checked = f"""    _args, _kwargs = _prepare(True, {prepare_args})[:2]
    (_cuda_kernel() if _device == "cuda" else _cpu)(*_args, **_kwargs)
{{after}}"""
        # a kernel writes through pointers, unseen by autograd: the public function bumps the versions
        # of what it writes, as the dispatcher does for the registered op (a no-op in inference mode)
        bump = _bump_line(mutates)
        cuda_kernel = (lambda: cuda) if callable(cuda) else lambda: getattr(triton_kernels(), cuda)
        namespace = dict(_eager_device=eager_device, _plans=plans, _prepare=prepare, _cpu=cpu,
                         _inference_mode=torch.is_inference_mode_enabled,
                         _first_call=first_call, _cuda_kernel=cuda_kernel,
                         _Tensor=torch.Tensor, _current_device=_CURRENT_CUDA_DEVICE, _device_guard=torch.cuda.device,
                         _increment_version=torch.autograd.graph.increment_version)
        written = tensor_names[0]

        def on_its_device(signature: inspect.Signature, head: str, rest: str, condition: str,
                          namespace: dict) -> Callable:
            """``head + rest`` compiled with ``signature``, with a device guard between them for the
            calls where ``condition`` holds: Triton launches on the current device, so such a call
            whose written tensor lives on another GPU runs ``head + rest`` again with that GPU
            current (as PyTorch's own CUDA ops guard their device), on its current stream."""
            unguarded = _compile(name, signature, head + rest, dict(namespace))
            arguments = ", ".join(f"{n}={n}" for n in signature.parameters)
            guard = (f"    if {condition} and {written}.get_device() != _current_device():\n"
                     f"        with _device_guard({written}.get_device()):\n"
                     f"            return _unguarded({arguments})\n")
            return _compile(name, signature, head + guard + rest, dict(namespace, _unguarded=unguarded))

        def kernel(device: str, plan: bool) -> Callable[..., None]:
            """The registered kernel of ``device`` (the dispatcher's call: the op's signature)."""
            head = f"    _device = {device!r}\n"
            rest = _after_launch((planned if plan else "") + checked, "")
            if device == "cuda":
                is_cuda = f"isinstance({written}, _Tensor) and {written}.is_cuda"
                function = on_its_device(op_signature, head, rest, is_cuda, namespace)
            else:
                function = _compile(name, op_signature, head + rest, dict(namespace))
            function.__signature__ = op_signature
            return function

        cpu_impl, cuda_impl, cuda_planned = kernel("cpu", True), kernel("cuda", False), kernel("cuda", True)
        fake_impl = _compile(name, op_signature, f"    _prepare(False, {prepare_args})\n", dict(namespace))
        fake_impl.__signature__ = op_signature
        _register(name, positional_names, mutates, cpu_impl, cuda_planned, fake_impl)
        packet = getattr(getattr(torch.ops, NAMESPACE), name)

        head = f"""    _device = _eager_device({tensors})
    if _device is None:
        _packet({op_call})
        return
"""
        public_planned = _after_launch(planned, bump)
        rest = ((f"    if _device != \"invalid\":\n{textwrap.indent(public_planned, '    ')}" if planned else "")
                + _after_launch(checked, bump))
        public = on_its_device(public_signature, head, rest, '_device == "cuda"', dict(namespace, _packet=packet))
        public = functools.wraps(signature_function)(public)

        def kernel_arguments(*args, **kwargs) -> tuple[tuple, dict]:
            """What the kernels get for this call (checked): ``(args, kwargs)``. For tests that run
            one implementation on any device (the Triton launcher under the interpreter)."""
            result = prepare(True, **bind_public(*args, **kwargs))  # (args, kwargs[, sizes])
            return result[0], result[1]

        public.op = packet
        public.kernel_arguments = kernel_arguments
        public.cuda_impl = cuda_impl
        public.cuda_registered = cuda_planned
        if eager_plan is not None:
            public.eager_plans = plans
        public.__signature__ = public_signature
        return public

    return decorate
