"""Job files: the tasks of a TOML file, each checked before any is run.

A job file is TOML; each `[[task]]` names a kernel and one or more shapes and dtypes (every
combination is one task), with an optional trial budget, strategy, seed, memory bound
(`max_memory`, bytes), workload (`workload`: which of the kernel's workloads makes its
integer data arguments), whether other device kinds' results guide the search (`transfer`, true
by default) and static arguments;
`[defaults]` fills in what a task leaves out:

    import = ["mypkg.kernels"]      # modules that register the user's own kernels
    [defaults]
    trials = 32
    [[task]]
    kernel = "matmul"
    shapes = ["256x256,256x256", "512x256,256x128"]
    dtypes = ["float32", "bfloat16"]
    [[task]]
    program = "mymodel:train_step"  # every @autotuned call of a program (autotune.calls_in)

Tasks already tuned for this device kind and kernel version are skipped (unless forced), and a
task's search is an Optuna study in a storage, so running an interrupted job again resumes it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, JobError
from autotune.registry import import_modules
from autotune.tuning.settings import DEFAULTS
from autotune.tuning.task import Task, check_task, make_task

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

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
    "max_memory",
    "workload",
    "transfer",
    "program",
}


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
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise JobError(f"job file {path} is not valid TOML: nested too deeply") from None
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
        if "program" in entry:
            tasks += _program_tasks(entry, spec, where)
            continue
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
                        spec.get("trials", DEFAULTS.n_trials),
                        spec.get("strategy", DEFAULTS.strategy),
                        spec.get("seed", DEFAULTS.seed),
                        spec.get("max_memory"),
                        spec.get("workload"),
                        spec.get("transfer"),
                    )
                    check_task(task, shape)  # every task up front, not when its turn comes
                except AutotuneError as e:
                    raise JobError(f"{where}: {e}") from None
                tasks.append(task)
    return tasks


def _program_tasks(entry: dict[str, Any], spec: dict[str, Any], where: str) -> list[Task]:
    """A task that names a program (`program = "module:factory"`): one task per @autotuned
    call of it (autotune.calls_in), with the task's budget, strategy and seed."""
    from autotune.service.program import program_tasks_of
    from autotune.tuning.settings import checked

    own = {"program", "trials", "strategy", "seed", "max_memory", "workload", "transfer"}
    clash = sorted(set(entry) & (_TASK_FIELDS - own))
    if clash or not isinstance(entry["program"], str):
        raise JobError(
            f'{where}: a program task names program = "module:factory" and no '
            f"{', '.join(clash) or 'kernel, shapes or static'}"
        )
    try:
        settings = checked(
            {"n_trials": "trials"},
            n_trials=spec.get("trials", DEFAULTS.n_trials),
            strategy=spec.get("strategy", DEFAULTS.strategy),
            seed=spec.get("seed", DEFAULTS.seed),
            max_memory=spec.get("max_memory"),
            workload=spec.get("workload"),
            transfer=spec.get("transfer", DEFAULTS.transfer),
        )
        transfer = spec.get("transfer")  # None: the run's
        return [replace(t, transfer=transfer) for t in program_tasks_of(entry["program"], settings)]
    except AutotuneError as e:
        raise JobError(f"{where}: {e}") from None


def _strings(value: Any, what: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise JobError(f"{what} must be a string or a list of strings, got {value!r}")
    return value
