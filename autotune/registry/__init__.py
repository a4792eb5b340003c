"""The registry of kernels by name: the shipped ones (imported on first use), those a user
registers, and those named by import path ('package.module:function', imported from the
working directory too). Also the hooks that tell the runtime a tuning run stored an entry."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from autotune.errors import AutotuneError, JobError, KernelError
from autotune.registry.spec import KernelSpec

# The kernels shipped with pallas-autotune register themselves when this package is imported.
from autotune.registry.version import SHIPPED_KERNELS_PACKAGE

# name -> AutotunedKernel (the runtime's wrapper; typed Any to keep this module below runtime)
_REGISTRY: dict[str, Any] = {}


# Called after a tuning run in this process stored a best entry. The runtime subscribes (it
# drops the lookups it memoised, so the entry is served next); the hooks live here, below both,
# so that the tuner never imports the runtime.
_ENTRY_STORED_HOOKS: list[Callable[[], None]] = []


def on_entry_stored(hook: Callable[[], None]) -> None:
    """Call `hook` whenever a tuning run in this process stores a best entry."""
    _ENTRY_STORED_HOOKS.append(hook)


def entry_stored() -> None:
    """A tuning run stored a best entry: tell the subscribers (see on_entry_stored)."""
    for hook in _ENTRY_STORED_HOOKS:
        hook()


# kernel name -> how `autotune db export --format jax` writes its entries: fn(entries) -> the
# text of a Python module in the form the kernel's own project keeps its tuned table
_TABLE_FORMATS: dict[str, Callable[[list[dict[str, Any]]], str]] = {}


def add_table_format(kernel: str, write: Callable[[list[dict[str, Any]]], str]) -> None:
    """Register how a kernel's exported entries (`TuningDB.export`'s) are written as the table
    its own project keeps by hand (JAX's `tuned_block_sizes.py`, say)."""
    _TABLE_FORMATS[kernel] = write


def table_format(kernel: str) -> Callable[[list[dict[str, Any]]], str]:
    """The table format of `kernel` (add_table_format); a KernelError naming those that have
    one where it has none."""
    _import_shipped()
    if kernel not in _TABLE_FORMATS:
        have = ", ".join(sorted(_TABLE_FORMATS)) or "none"
        raise KernelError(
            f"kernel {kernel!r} has no table format to export to (kernels with one: {have}): "
            "export it as JSON (the default --format)"
        )
    return _TABLE_FORMATS[kernel]


def add(kernel: Any) -> None:
    """Register (or replace) an autotuned kernel under its name."""
    _REGISTRY[kernel.spec.name] = kernel


def registered() -> dict[str, Any]:
    """Every registered kernel, the shipped ones included, by name."""
    _import_shipped()
    return dict(sorted(_REGISTRY.items()))


def _import_shipped() -> None:
    try:
        importlib.import_module(SHIPPED_KERNELS_PACKAGE)
    except ImportError as e:  # a broken shipped kernel must not hide the user's own
        raise KernelError(f"cannot import the shipped kernels ({e})") from e


class _NamedModules(importlib.abc.MetaPathFinder):
    """Finds the modules a user named ('module:function', a program, --import), and only them,
    in the working directory they were named in, after every other finder: a jax.py there is
    never imported in place of JAX, and the directory never joins `sys.path`, which every later
    import searches (JAX's backends and plugin discovery import a libtpu.py or jax_plugins/
    from it) and a worker child inherits."""

    def __init__(self) -> None:
        self.directories: dict[str, str] = {}  # top-level module name -> where it was named

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        directory = self.directories.get(fullname)
        if path is not None or directory is None:  # a submodule: its package's __path__
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [directory])


_NAMED = _NamedModules()


def _in_working_directory(module_name: str) -> bool:
    return any(
        os.path.exists(os.path.join(os.getcwd(), module_name + suffix)) for suffix in ("", ".py")
    )


def import_user_module(
    module_name: str, why: str, error: type[AutotuneError] = KernelError
) -> types.ModuleType:
    """Import a module the user named, looked for in the working directory too (it alone).
    Whatever fails (not found, a SyntaxError, the module's own code raising) is one `error`
    naming the module, `why` it was imported, and the cause."""
    _NAMED.directories.setdefault(module_name.partition(".")[0], os.getcwd())
    if _NAMED not in sys.meta_path:
        sys.meta_path.append(_NAMED)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        cause = str(e)
        missing = (e.name or "").partition(".")[0]
        if missing and missing not in _NAMED.directories and _in_working_directory(missing):
            cause += (
                ": of the working directory only the modules named are imported; put it on "
                "PYTHONPATH to import the others"
            )
        raise error(f"cannot import {module_name!r} {why}: {cause}") from e
    except Exception as e:  # the user's code: one line that names it, not a traceback
        cause = str(e) if isinstance(e, ImportError) else f"{type(e).__name__}: {e}"
        raise error(f"cannot import {module_name!r} {why}: {cause.strip().splitlines()[0]}") from e


def import_modules(names: Iterable[str]) -> None:
    """Import the modules the user named to register their kernels (found from the working
    directory too); one that fails is a JobError naming it."""
    for name in names:
        import_user_module(name, "(to register its kernels)", JobError)


def resolve(target: str) -> Any:
    """A registered name, or an import path 'package.module:function', to its autotuned kernel."""
    if ":" in target:
        module_name, _, attr = target.partition(":")
        obj = import_user_module(module_name, f"for kernel {target!r}")
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                raise KernelError(f"{module_name!r} has no attribute {attr!r} (kernel {target!r})")
        if not isinstance(getattr(obj, "spec", None), KernelSpec):
            raise KernelError(
                f"{target!r} is not an autotuned kernel: decorate it with @autotuned(...) "
                "or register it with autotune.register(fn, ...)"
            )
        return obj
    kernels = registered()
    if target not in kernels:
        known = ", ".join(kernels) or "none"
        raise KernelError(
            f"unknown kernel {target!r} (registered: {known}): a kernel of your own is "
            "registered by importing the module that defines it (on the command line: "
            f"--import MODULE), or give it as 'module:{target}'"
        )
    return kernels[target]


def import_path(kernel: Any) -> str:
    """The 'module:function' a worker process imports `kernel` by, checked here."""
    fn = kernel.spec.fn
    path = f"{fn.__module__}:{fn.__qualname__}"
    try:
        found = resolve(path)
    except KernelError:
        found = None
    if getattr(found, "spec", None) is None or found.spec.name != kernel.spec.name:
        raise KernelError(
            f"a device worker cannot import kernel {kernel.spec.name!r} as {path}: pass its "
            "registered name or 'package.module:function' to tune(), or isolate=False"
        )
    return path
