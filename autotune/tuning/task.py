"""A tuning task: the kernel, its arguments' shapes and dtypes, static arguments and the search's
budget. Every source of tuning work builds its Task here: the command line's and a job file's
text (`--shape 256x256,256x128`, checked here), a recorded miss, a call in a program. Bound to
the device it is tuned on (`bind`), a task has its kernel, signature, key and search space,
worked out once for the job that checks whether it is tuned and the tuner that tunes it."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin, get_type_hints

from autotune import registry
from autotune.device import DeviceInfo
from autotune.errors import AutotuneError, KernelError, SignatureError
from autotune.measure.inputs import task_inputs, workload_name
from autotune.registry.spec import KernelSpec
from autotune.signature import (
    ArgSpec,
    Signature,
    TuningKey,
    dtype_name,
    format_args,
    is_array,
    parse_args,
    parse_dtype,
    parse_static,
)
from autotune.space import Space
from autotune.tuning.settings import DEFAULTS, TuneSettings, checked

# a job file's words for the settings a task sets, where they differ from TuneSettings' fields
_KEYS = {"n_trials": "trials"}


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """'256x128,128x64' -> [(256, 128), (128, 64)]; '1024' is 1-D; 'scalar' is ()."""
    shapes = []
    for part in text.split(","):
        part = part.strip()
        if part in ("scalar", "()"):
            shapes.append(())
            continue
        dims = part.lower().split("x")
        if not part or not all(d.isascii() and d.isdigit() for d in dims):
            raise SignatureError(
                f"malformed --shape {text!r}: write e.g. 256x256,256x128 (one per argument)"
            )
        shape = tuple(int(d) for d in dims)
        if 0 in shape:
            raise SignatureError(
                f"--shape {text!r}: argument {len(shapes) + 1} ({part}) has a zero dimension: "
                "every dimension must be at least 1"
            )
        shapes.append(shape)
    return shapes


def parse_dtypes(text: str, n: int) -> list[str]:
    """One dtype for every argument, or one per argument: 'float32' or 'bfloat16,float32'."""
    import jax

    names = [parse_dtype(t) for t in text.split(",")]
    wide = [d for d in names if d in ("float64", "int64", "uint64", "complex128")]
    if wide and not jax.config.jax_enable_x64:
        # JAX would make the inputs 32-bit and the entry would be stored under the wrong key
        raise SignatureError(
            f"--dtype {wide[0]} needs JAX's 64-bit mode: set JAX_ENABLE_X64=1 (without it "
            "JAX computes in 32 bits)"
        )
    if len(names) == 1:
        return names * n
    if len(names) != n:
        raise SignatureError(
            f"--dtype gives {len(names)} dtypes for {n} shapes: give one, or one per shape"
        )
    return names


INPUT_MEMORY_SHARE = 0.5  # the inputs' share of host memory; the oracle and outputs need the rest


def check_inputs_fit(shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str]) -> None:
    """Refuse inputs that cannot fit in this machine's memory, before anything is allocated."""
    import os

    import jax.numpy as jnp

    size = sum(math.prod(s) * jnp.dtype(d).itemsize for s, d in zip(shapes, dtypes))
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX host: no check
        return
    if size > INPUT_MEMORY_SHARE * memory:
        # a size of hundreds of digits is past a float's range: said by its magnitude
        taken = (
            f"{size / 2**30:.1f} GiB" if size < 2**100 else f"about 10^{len(str(size)) - 1} bytes"
        )
        raise SignatureError(
            f"the inputs take {taken}, more than this machine can hold beside "
            f"the oracle ({memory / 2**30:.1f} GiB of memory): give smaller shapes"
        )


def check_call(kernel: Any, inputs: Sequence[Any], static: dict[str, Any], shape: str) -> None:
    """Refuse shapes and static arguments the kernel's own signature does not take, saying
    how many arrays it takes."""
    import inspect

    signature = inspect.signature(kernel.spec.fn)
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in static
    ]
    required = [p.name for p in positional if p.default is p.empty]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in signature.parameters.values())
    if len(inputs) < len(required) or (len(inputs) > len(positional) and not varargs):
        count = (
            f"{len(required)}"
            if len(required) == len(positional)
            else (f"{len(required)} to {len(positional)}")
        )
        names = ", ".join(p.name for p in positional)
        raise SignatureError(
            f"{kernel.spec.name} takes {count} array argument(s) ({names}): --shape {shape!r} "
            f"gives {len(inputs)}; give one shape per argument, separated by commas"
        )
    tuned = sorted(set(static) & kernel.spec.tunables)
    if tuned:
        raise SignatureError(
            f"{', '.join(tuned)} of {kernel.spec.name} is tuned, not static: drop --static "
            f"{tuned[0]}=... (the tuner chooses it; see `autotune kernels`)"
        )
    choices = _choices(kernel.spec.fn)
    for name, value in static.items():
        default = signature.parameters[name].default if name in signature.parameters else None
        if _wrong_type(value, default):
            raise SignatureError(
                f"--static {name}={value!r}: {kernel.spec.name} takes a "
                f"{type(default).__name__} there, like its default {default!r}"
            )
        if name in choices and value not in choices[name]:
            raise SignatureError(
                f"--static {name}={value!r}: {kernel.spec.name} takes one of "
                f"{', '.join(map(repr, choices[name]))} there"
            )
    try:
        signature.bind_partial(*inputs, **static)  # tunables without defaults come later
    except TypeError as e:
        raise SignatureError(
            f"{kernel.spec.name} cannot be called with --shape {shape} --static {static}: {e}"
        ) from None


def _choices(fn: Any) -> dict[str, tuple[Any, ...]]:
    """The values of each parameter annotated `Literal[...]` (e.g. matmul's `precision`): a
    declaration read without tracing the kernel, so a job file is checked in microseconds."""
    try:
        hints = get_type_hints(fn)
    except Exception:  # an annotation that cannot be evaluated here (a user's): no choices
        return {}
    return {name: get_args(h) for name, h in hints.items() if get_origin(h) is Literal}


def _wrong_type(value: Any, default: Any) -> bool:
    """Whether a static value cannot stand where the kernel's default does: a flag that is not
    a bool, a number that is text (None and other defaults say nothing)."""
    if isinstance(default, bool):
        return not isinstance(value, bool)
    if isinstance(default, (int, float)):
        return not isinstance(value, (int, float)) or isinstance(value, bool)
    return False


@dataclass(frozen=True)
class Task:
    """One tuning task: a kernel, the shapes and dtypes of its arguments, its static arguments,
    and the search's budget, strategy and seed. Every source of tuning work builds one here
    (make_task: CLI flags and job files; task_of_miss: a recorded miss; task_of_call: a call
    in a program), and the tuner (bound: BoundTask), the protocol and both workers take it."""

    kernel: str  # a registered name, or 'package.module:function'
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]  # canonical names: "float32", "bfloat16"
    static: tuple[tuple[str, Any], ...] = ()  # sorted items, so a Task is hashable
    trials: int = DEFAULTS.n_trials
    strategy: str = DEFAULTS.strategy
    seed: int | None = DEFAULTS.seed
    max_memory: int | None = None  # the bound on a candidate's peak memory; None: the run's
    workload: str | None = None  # what makes its integer data arguments; None: the run's
    transfer: bool | None = None  # use other device kinds' results; None: as the run says

    @property
    def static_dict(self) -> dict[str, Any]:
        return dict(self.static)

    @property
    def label(self) -> str:
        args = format_args(tuple(ArgSpec(s, d) for s, d in zip(self.shapes, self.dtypes)))
        static = f" {json.dumps(self.static_dict, sort_keys=True)}" if self.static else ""
        return f"{self.kernel} {args}{static}"

    def inputs(self) -> list[Any]:
        """The arguments as jax.ShapeDtypeStruct (autotune.measure.inputs.random_inputs fills them)."""
        import jax

        return [jax.ShapeDtypeStruct(s, d) for s, d in zip(self.shapes, self.dtypes)]

    def settings(self, run: TuneSettings) -> TuneSettings:
        """The run's settings with this task's budget, strategy, seed, memory bound, workload
        and transfer."""
        bound = run.max_memory if self.max_memory is None else self.max_memory
        workload = run.workload if self.workload is None else self.workload
        transfer = run.transfer if self.transfer is None else self.transfer
        return run.replace(
            n_trials=self.trials,
            strategy=self.strategy,
            seed=self.seed,
            max_memory=bound,
            workload=workload,
            transfer=transfer,
        )


def make_task(
    kernel: str,
    shape: str,
    dtype: str = "float32",
    static: dict[str, Any] | None = None,
    trials: int = DEFAULTS.n_trials,
    strategy: str = DEFAULTS.strategy,
    seed: int | None = DEFAULTS.seed,
    max_memory: int | None = None,
    workload: str | None = None,
    transfer: bool | None = None,
) -> Task:
    """The task of a command line's or a job file's text: `--shape 256x256,256x128`,
    `--dtype bfloat16`; budget, strategy, seed, memory bound, workload and transfer (None: the
    run's) checked as a job file names them."""
    checked(
        _KEYS,
        n_trials=trials,
        strategy=strategy,
        seed=seed,
        max_memory=max_memory,
        workload=workload,
        transfer=True if transfer is None else transfer,
    )
    shapes = parse_shapes(shape)
    return Task(
        kernel=kernel,
        shapes=tuple(shapes),
        dtypes=tuple(parse_dtypes(dtype, len(shapes))),
        static=_items(static or {}),
        trials=trials,
        strategy=strategy,
        seed=seed,
        max_memory=max_memory,
        workload=workload,
        transfer=transfer,
    )


def task_of_miss(miss: Mapping[str, Any], settings: TuneSettings = DEFAULTS) -> Task:
    """The task of a recorded miss (a row of TuningDB.misses: kernel, signature, static);
    the budget, strategy and seed of `settings`."""
    args = parse_args(miss["signature"])
    return Task(
        kernel=miss["kernel"],
        shapes=tuple(a.shape for a in args),
        dtypes=tuple(a.dtype for a in args),
        static=_items(parse_static(miss["static"])),
        trials=settings.n_trials,
        strategy=settings.strategy,
        seed=settings.seed,
        max_memory=settings.max_memory,
        workload=settings.workload,
    )


def task_of_call(
    kernel: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    settings: TuneSettings = DEFAULTS,
) -> Task:
    """The task of a call `kernel(*args, **kwargs)`: an autotuned kernel (or its registered
    name, or 'package.module:function'), arrays or jax.ShapeDtypeStruct as its arguments,
    static arguments in `kwargs`; the budget, strategy and seed of `settings`."""
    for a in args:
        if not is_array(a):
            raise SignatureError(
                f"tune() takes arrays (or jax.ShapeDtypeStruct) as args, got "
                f"{type(a).__name__}: pass static arguments in kwargs="
            )
    return Task(
        kernel=kernel if isinstance(kernel, str) else kernel.spec.name,
        shapes=tuple(tuple(int(d) for d in a.shape) for a in args),
        dtypes=tuple(dtype_name(a.dtype) for a in args),
        static=_items(kwargs or {}),
        trials=settings.n_trials,
        strategy=settings.strategy,
        seed=settings.seed,
        max_memory=settings.max_memory,
        workload=settings.workload,
    )


def _items(static: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(static.items()))


def kernel_of(target: Any) -> Any:
    """The autotuned kernel (or variant group) `target` names: itself, a registered name, or
    'package.module:function'."""
    kernel = registry.resolve(target) if isinstance(target, str) else target
    if not isinstance(getattr(kernel, "spec", None), KernelSpec):
        raise KernelError(
            f"{target!r} is not an autotuned kernel: decorate it with @autotuned(...)"
        )
    return kernel


@dataclass(frozen=True, eq=False)
class BoundTask:
    """A task bound to the device it is tuned on: its kernel, the arguments it is called with
    (arrays, or the task's jax.ShapeDtypeStructs; the inputs it is tuned on once `measured`,
    and the `workload` that made them), their signature and key there, and the kernel's
    search space for that platform. A job checks the key for an entry; the tuner measures and
    stores under it, each trial naming the workload."""

    task: Task
    kernel: Any  # the AutotunedKernel, or a VariantGroup
    device: DeviceInfo
    args: tuple
    signature: Signature
    key: TuningKey
    space: Space
    workload: str | None = None  # None: not measured yet, or the kernel declares none

    @property
    def spec(self) -> KernelSpec:
        return self.kernel.spec

    def measured(self, settings: TuneSettings) -> BoundTask:
        """This task called with the inputs it is tuned on: its arguments given as arrays, the
        rest random data of their shapes and dtypes, its integer data arguments made by the
        settings' workload, from their seed (autotune.measure.inputs.task_inputs). Made once,
        by the tuner's entry: its workers, its oracle and a variant group's members measure
        on these."""
        seed = 0 if settings.seed is None else settings.seed
        inputs = task_inputs(self.spec, self.args, seed, settings.workload)
        workload = workload_name(self.spec, settings.workload)
        return dataclasses.replace(self, args=tuple(inputs), workload=workload)

    def member(self, kernel: Any, device: DeviceInfo) -> BoundTask:
        """The same call of `kernel` (a variant group's member), bound to `device`."""
        return bind(
            dataclasses.replace(self.task, kernel=kernel.spec.name), device, kernel, self.args
        )


def bind(
    task: Task | BoundTask,
    device: DeviceInfo,
    kernel: Any = None,
    args: Sequence[Any] | None = None,
) -> BoundTask:
    """`task` bound to `device`: `kernel` (default: the one it names) called with `args`
    (default: its shapes and dtypes as jax.ShapeDtypeStructs). A task bound already is
    itself where bound to `device`, else bound anew there with its kernel, arguments and
    workload."""
    workload = None
    if isinstance(task, BoundTask):
        if task.device == device:
            return task
        task, kernel, args, workload = task.task, task.kernel, task.args, task.workload
    kernel = kernel_of(task.kernel) if kernel is None else kernel
    args = tuple(task.inputs() if args is None else args)
    sig = kernel.spec.signature(args, task.static_dict, device)
    return BoundTask(
        task=task,
        kernel=kernel,
        device=device,
        args=args,
        signature=sig,
        key=kernel.spec.key(sig, device),
        space=kernel.spec.space(device.platform),
        workload=workload,
    )


def check_task(task: Task, shape: str, trace: bool = False) -> None:
    """Refuse a task that cannot run: an unknown kernel, inputs too large for this machine,
    shapes or static arguments the kernel does not take (`shape`: the text they came from);
    where `trace`, shapes the kernel's own checks refuse too (_check_traces). The kernel is
    resolved once, for every check."""
    kernel = kernel_of(task.kernel)
    if task.workload is not None and task.workload not in kernel.spec.workloads:
        known = ", ".join(kernel.spec.workloads) or "none: it takes no data arguments"
        raise SignatureError(
            f"--workload {task.workload!r} is not a workload of {kernel.spec.name} (its "
            f"workloads: {known})"
        )
    check_inputs_fit(task.shapes, task.dtypes)
    check_call(kernel, task.inputs(), task.static_dict, shape)
    if trace:
        _check_traces(kernel, task, shape)


def _check_traces(kernel: Any, task: Task, shape: str) -> None:
    """Refuse shapes the kernel cannot take, found by tracing it at its default configuration
    (jax.eval_shape: its own shape checks and JAX's run, nothing compiles), in a second rather
    than when the oracle fails after a worker started; the kernel's message says which
    dimensions disagree. A default that breaks the constraints is left to the tuner, which
    says that no configuration fits."""
    import functools

    import jax

    from autotune.device import current_device

    spec = kernel.spec
    inputs, static = task.inputs(), task.static_dict
    sig = spec.signature(inputs, static, current_device())
    config = spec.default_config(sig)
    if not spec.space(sig.platform).is_valid(config, sig):
        return
    fn = functools.partial(spec.bound_function(config, interpret=True), **static)
    try:
        jax.eval_shape(fn, *inputs)
    except AutotuneError:
        raise
    except Exception as e:  # the kernel's own refusal (a ValueError), or JAX's
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SignatureError(
            f"{spec.name} does not take --shape {shape} ({sig.text}): {reason} (traced at its "
            f"default configuration {config}, before anything compiled)"
        ) from None
