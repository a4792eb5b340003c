"""Tuning jobs: job files, recorded misses, sharding, and running a list of tasks with progress.

A job file is TOML; each `[[task]]` names a kernel and one or more shapes and dtypes (every
combination is one task), with an optional trial budget, strategy, seed and static arguments;
`[defaults]` fills in what a task leaves out:

    import = ["mypkg.kernels"]      # modules that register the user's own kernels
    [defaults]
    trials = 32
    [[task]]
    kernel = "matmul"
    shapes = ["256x256,256x256", "512x256,256x128"]
    dtypes = ["float32", "bfloat16"]

Tasks already tuned for this device kind and kernel version are skipped (unless forced), and a
task's search is an Optuna study in a storage, so running an interrupted job again resumes it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.device import DeviceInfo, current_device
from autotune.errors import AutotuneError, SignatureError
from autotune.signature import ArgSpec, format_args, parse_dtype
from autotune.tune_settings import TuneSettings, checked

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

log = logging.getLogger(__name__)
_DEFAULTS = TuneSettings()
# a job file's words for the settings a task sets, where they differ from TuneSettings' fields
_KEYS = {"n_trials": "trials"}
_TASK_FIELDS = {
    "kernel",
    "shape",
    "shapes",
    "dtype",
    "dtypes",
    "static",
    "trials",
    "strategy",
    "seed",
}


class JobError(AutotuneError):
    """A job file, a shard or a task cannot be carried out as written."""


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
        raise SignatureError(
            f"the inputs take {size / 2**30:.1f} GiB, more than this machine can hold beside "
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
    for name, value in static.items():
        default = signature.parameters[name].default if name in signature.parameters else None
        if _wrong_type(value, default):
            raise SignatureError(
                f"--static {name}={value!r}: {kernel.spec.name} takes a "
                f"{type(default).__name__} there, like its default {default!r}"
            )
    try:
        signature.bind_partial(*inputs, **static)  # tunables without defaults come later
    except TypeError as e:
        raise SignatureError(
            f"{kernel.spec.name} cannot be called with --shape {shape} --static {static}: {e}"
        ) from None


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
    """One tuning task: a kernel, the shapes and dtypes of its arguments, and a budget."""

    kernel: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    static: tuple[tuple[str, Any], ...] = ()  # sorted items, so a Task is hashable
    trials: int = _DEFAULTS.n_trials
    strategy: str = _DEFAULTS.strategy
    seed: int | None = _DEFAULTS.seed

    @property
    def static_dict(self) -> dict[str, Any]:
        return dict(self.static)

    @property
    def label(self) -> str:
        args = format_args(tuple(ArgSpec(s, d) for s, d in zip(self.shapes, self.dtypes)))
        static = f" {json.dumps(self.static_dict, sort_keys=True)}" if self.static else ""
        return f"{self.kernel} {args}{static}"

    def inputs(self) -> list[Any]:
        import jax

        return [jax.ShapeDtypeStruct(s, d) for s, d in zip(self.shapes, self.dtypes)]

    def settings(self, run: TuneSettings) -> TuneSettings:
        """The run's settings with this task's budget, strategy and seed."""
        return run.replace(n_trials=self.trials, strategy=self.strategy, seed=self.seed)


def make_task(
    kernel: str,
    shape: str,
    dtype: str = "float32",
    static: dict[str, Any] | None = None,
    trials: int = _DEFAULTS.n_trials,
    strategy: str = _DEFAULTS.strategy,
    seed: int | None = _DEFAULTS.seed,
) -> Task:
    checked(_KEYS, n_trials=trials, strategy=strategy, seed=seed)
    shapes = parse_shapes(shape)
    return Task(
        kernel=kernel,
        shapes=tuple(shapes),
        dtypes=tuple(parse_dtypes(dtype, len(shapes))),
        static=tuple(sorted((static or {}).items())),
        trials=trials,
        strategy=strategy,
        seed=seed,
    )


def load_job(path: str | Path) -> list[Task]:
    """The tasks of a job file, in file order (imports its `import` modules first)."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as e:
        raise JobError(f"cannot read job file {path}: {e.strerror or e}") from e
    except UnicodeDecodeError:
        raise JobError(f"job file {path} is not text: give a TOML job file") from None
    except tomllib.TOMLDecodeError as e:
        raise JobError(f"job file {path} is not valid TOML: {e}") from e
    unknown = sorted(set(doc) - {"import", "defaults", "task"})
    if unknown:
        raise JobError(f"job file {path}: unknown table(s) {', '.join(unknown)} (use [[task]])")
    import_modules(_strings(doc.get("import", []), f"job file {path}: import"))
    defaults = doc.get("defaults", {})
    entries = doc.get("task", [])
    if not isinstance(defaults, dict) or not isinstance(entries, list) or not entries:
        raise JobError(
            f"job file {path} lists no tasks: add [[task]] tables with kernel and shapes"
        )
    bad = sorted(set(defaults) - _TASK_FIELDS)
    if bad:
        raise JobError(f"job file {path}, [defaults]: unknown field(s) {', '.join(bad)}")
    tasks = []
    for n, entry in enumerate(entries, 1):
        where = f"job file {path}, task {n}"
        if not isinstance(entry, dict):
            raise JobError(f"{where}: write it as a [[task]] table")
        spec = {**defaults, **entry}
        bad = sorted(set(spec) - _TASK_FIELDS)
        if bad:
            raise JobError(f"{where}: unknown field(s) {', '.join(bad)}")
        if not isinstance(spec.get("kernel"), str):
            raise JobError(f'{where}: needs kernel = "name" (or "package.module:function")')
        shapes = _strings(spec.get("shapes", spec.get("shape")), f"{where}: shapes")
        dtypes = _strings(spec.get("dtypes", spec.get("dtype", "float32")), f"{where}: dtypes")
        static = spec.get("static", {})
        if not shapes or not isinstance(static, dict):
            raise JobError(f'{where}: needs shapes = ["256x256,256x256", ...] and static a table')
        for shape in shapes:
            for dtype in dtypes:
                try:
                    task = make_task(
                        spec["kernel"],
                        shape,
                        dtype,
                        static,
                        spec.get("trials", _DEFAULTS.n_trials),
                        spec.get("strategy", _DEFAULTS.strategy),
                        spec.get("seed", _DEFAULTS.seed),
                    )
                    check_task(task, shape)  # every task up front, not when its turn comes
                except AutotuneError as e:
                    raise JobError(f"{where}: {e}") from None
                tasks.append(task)
    return tasks


def check_task(task: Task, shape: str) -> None:
    """Refuse a task that cannot run: an unknown kernel, inputs too large for this machine,
    shapes or static arguments the kernel does not take."""
    from autotune import registry

    kernel = registry.resolve(task.kernel)
    check_inputs_fit(task.shapes, task.dtypes)
    check_call(kernel, task.inputs(), task.static_dict, shape)


def _strings(value: Any, what: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise JobError(f"{what} must be a string or a list of strings, got {value!r}")
    return value


def import_modules(names: Iterable[str]) -> None:
    """Import modules that register kernels (found from the current directory too)."""
    find_in_working_directory()
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise JobError(f"cannot import {name!r} (to register its kernels): {e}") from e


def find_in_working_directory() -> None:
    """Let 'module:function' kernels and --import modules be found in the working directory,
    after the installed packages: a jax.py or rich.py there is never imported in their place."""
    import os
    import sys

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def parse_shard(text: str) -> tuple[int, int]:
    """'2/4' -> (2, 4): shard indices run from 0 to N-1 (a Kubernetes JOB_COMPLETION_INDEX)."""
    i, sep, n = text.partition("/")
    if not sep or not i.isdigit() or not n.isdigit() or int(n) < 1 or int(i) >= int(n):
        raise JobError(f"malformed --shard {text!r}: write i/N with 0 <= i < N, e.g. 0/4")
    return int(i), int(n)


def shard(tasks: Sequence[Task], index: int, count: int) -> list[Task]:
    """Every count-th task from `index`: the shards of one task list are disjoint, cover it, and
    are the same on every machine that reads the same job file."""
    return [t for k, t in enumerate(tasks) if k % count == index]


def tuning_device(settings: TuneSettings) -> DeviceInfo:
    """The device that tasks run with `settings` are measured on, which keys them: a device
    worker's where the workers keep to other platforms than this process (the CLI keeps itself
    to the CPU while they own the accelerator), else this process's."""
    from autotune.worker.parent import worker_device

    if settings.isolate and settings.worker_platforms is not None:
        return worker_device(settings.worker_platforms, settings.limits.start_s)
    return current_device()


def pending_tasks(
    db: Any, device: DeviceInfo, *, kernel: str | None = None, trials: int = _DEFAULTS.n_trials
) -> tuple[list[Task], dict[str, int]]:
    """One task per miss recorded on `device`'s kind (most often missed first), and the number
    of misses per kernel that is not registered here (not tuned).

    A miss names its kernel by registered name only: whoever can write the database must not
    choose what this process imports, so the operator imports the user's kernels (`--import`).
    """
    from autotune.registry import registered
    from autotune.signature import parse_args, parse_static

    misses = db.misses(
        kernel=kernel,
        platform=device.platform,
        device_kind=device.device_kind,
        backend=device.backend,
    )
    known = registered()
    tasks: dict[Task, int] = {}
    unknown: dict[str, int] = {}
    for m in misses:
        if m["kernel"] not in known:
            unknown[m["kernel"]] = unknown.get(m["kernel"], 0) + m["count"]
            continue
        try:  # a miss is data anyone who can write the database wrote: one bad one is skipped
            args = parse_args(m["signature"])
            check_inputs_fit([a.shape for a in args], [a.dtype for a in args])
            task = Task(
                kernel=m["kernel"],
                shapes=tuple(a.shape for a in args),
                dtypes=tuple(a.dtype for a in args),
                static=tuple(sorted(parse_static(m["static"]).items())),
                trials=trials,
            )
        except AutotuneError as e:
            log.warning(
                "skipped the miss of %s %s: %s (drop it with `autotune db misses --delete "
                "--kernel %s --signature '%s'`)",
                m["kernel"],
                m["signature"],
                e,
                m["kernel"],
                m["signature"],
            )
            continue
        tasks[task] = tasks.get(task, 0) + m["count"]  # misses of older kernel versions add up
    return sorted(tasks, key=lambda t: -tasks[t]), unknown


@dataclass
class Outcome:
    task: Task
    status: str  # tuned | skipped | failed
    detail: str = ""
    result: Any = None


@dataclass
class JobProgress:
    """What a job reports as it goes; `show` receives it after every trial and task."""

    n_tasks: int
    task_index: int = 0
    task: Task | None = None
    trial: int = 0
    n_trials: int = 0
    best_s: float | None = None
    started: float = field(default_factory=time.monotonic)
    trials_done: int = 0
    budget_left: int = 0  # trials of the tasks after the current one

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def eta_s(self) -> float | None:
        """Remaining time at the mean pace so far (skipped tasks take none)."""
        if not self.trials_done:
            return None
        left = max(self.n_trials - self.trial, 0) + self.budget_left
        return self.elapsed_s / self.trials_done * left


def default_storage(db_url: str) -> str | None:
    """The study storage beside a SQLite tuning database (tuning.db -> tuning-studies.db)."""
    from autotune.db import _sqlite_file, normalize_url, sqlite_url

    file = _sqlite_file(normalize_url(db_url))
    return sqlite_url(file.with_name(file.stem + "-studies.db")) if file else None


def run_tasks(
    tasks: Sequence[Task],
    device: DeviceInfo,
    *,
    db: Any = None,
    settings: TuneSettings = _DEFAULTS,
    force: bool = False,
    show: Callable[[JobProgress, Outcome | None], None] | None = None,
) -> list[Outcome]:
    """Tune each task in order on `device` (see tuning_device); those it already has an entry
    for are skipped unless `force`.

    Each task is tuned with `settings`, its own budget, strategy and seed (Task.settings), and
    the study of its key in `settings.storage`.

    A task that fails (no valid configuration, a kernel error) is reported and the job goes on.
    """
    from autotune import registry
    from autotune.db import TuningDB
    from autotune.tuner import study_name_of, tune

    handle = db if isinstance(db, TuningDB) else TuningDB(db)
    progress = JobProgress(n_tasks=len(tasks), budget_left=sum(t.trials for t in tasks))
    outcomes = []
    try:
        for i, task in enumerate(tasks, 1):
            progress.task_index, progress.task = i, task
            progress.trial, progress.n_trials, progress.best_s = 0, task.trials, None
            progress.budget_left -= task.trials
            try:
                kernel = registry.resolve(task.kernel)
                spec = kernel.spec
                sig = spec.signature(task.inputs(), task.static_dict, device)
                key = spec.key(sig, device)
                entry = handle.best(key)
                if entry is not None and not force:
                    outcome = Outcome(task, "skipped", "already tuned for this device kind")
                    progress.n_trials = 0
                else:
                    study = study_name_of(key)
                    if force and settings.storage:
                        delete_study(settings.storage, study)

                    def on_trial(record: Any, j: int, n: int) -> None:
                        progress.trial, progress.n_trials = j, n
                        progress.trials_done += 1
                        if record.time_s is not None and record.status == "ok":
                            best = progress.best_s
                            progress.best_s = min(best, record.time_s) if best else record.time_s
                        if show:
                            show(progress, None)

                    result = tune(
                        kernel,  # a device worker imports it by its 'module:function' path
                        task.inputs(),
                        kwargs=task.static_dict,
                        settings=task.settings(settings),
                        db=handle,
                        progress=on_trial,
                        study_name=study,
                    )
                    progress.best_s = result.best_time_s
                    outcome = Outcome(task, "tuned", _summary(result), result)
            except TypeError as e:  # the kernel's own signature refused the arguments
                outcome = Outcome(task, "failed", f"the kernel refused these arguments: {e}")
            except AutotuneError as e:
                outcome = Outcome(task, "failed", str(e))
            outcomes.append(outcome)
            if show:
                show(progress, outcome)
    finally:
        if handle is not db:
            handle.close()
    return outcomes


def _summary(result: Any) -> str:
    config = " ".join(f"{k}={v}" for k, v in sorted(result.best_config.items()))
    speedup = f"{result.speedup:.2f}x" if result.speedup else "n/a"
    resumed = f" ({resumed_text(result)})" if result.resumed else ""
    first = ", first-pass figures" if result.first_pass else ""
    return f"{config} {result.best_time_s * 1e3:.4f} ms, speedup {speedup}, {len(result.trials)} trials{resumed}{first}"


def resumed_text(result: Any) -> str:
    """'4 of 10 trials already measured': what a resumed study did not measure again."""
    return f"{result.resumed} of {len(result.trials)} trials already measured"


def delete_study(storage: str, name: str, unless_in_use: bool = False) -> None:
    """Delete a study (a fresh start for its key); nothing happens if there is none, nor,
    `unless_in_use`, while another worker searches it (the last one out deletes it)."""
    import optuna

    from autotune.studies import SharedStudy, optuna_url

    if unless_in_use and SharedStudy(storage, name, None).in_use():
        return
    with contextlib.suppress(KeyError):  # no such study yet, or another worker deleted it
        optuna.delete_study(study_name=name, storage=optuna_url(storage))
