"""KernelSpec: what a tunable kernel declares (its function, spaces, defaults, reference,
version, backend, split), and make_spec, which builds one from the decorator's arguments."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune import backends
from autotune.device import DeviceInfo, current_device
from autotune.errors import KernelError, SpaceError
from autotune.registry.split import Split
from autotune.registry.version import kernel_version
from autotune.signature import ArgSpec, Signature, TuningKey, dtype_name, is_array, static_value
from autotune.space import (
    Constraint,
    Param,
    Space,
    load_space_file,
    resolve_space_path,
    space_from_dict,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class KernelSpec:
    """A tunable kernel: its function, search spaces, defaults, reference and version."""

    name: str
    fn: Callable
    spaces: Mapping[str, tuple[Param, ...]]  # per platform
    constraints: tuple[Constraint, ...]
    defaults: Mapping[str, Any]  # the default configuration (every tunable parameter)
    reference: Callable | None
    versioned: str | Callable[[], str]  # the version, or how to work it out on first use
    bind: Callable[[dict[str, Any]], dict[str, Any]] | None  # flat config -> kernel kwargs
    bound_names: frozenset[str]  # the kernel's parameters that the config fills
    takes_interpret: bool
    backend: str | None = None  # "mosaic_gpu", "mosaic_tpu", "triton"; None: recognised
    tuned: Path | None = None  # the tuned table shipped with the kernel (autotune.db.tables)
    split: Split | None = None  # how a call on sharded arrays splits (autotune.runtime.sharded)
    _recognised: dict[str, str | None] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def version(self) -> str:
        """The kernel's version (part of every key): declared, or a hash of its code, worked
        out when first asked (parsing the code costs more than importing it)."""
        return self.versioned if isinstance(self.versioned, str) else self.versioned()

    @property
    def tunables(self) -> frozenset[str]:
        """Every tunable parameter name on any platform (callers may pass these to override)."""
        return frozenset(self.defaults)

    def space(self, platform: str) -> Space:
        return Space(self.spaces[platform], self.constraints)

    def kernel_kwargs(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """What to pass to the kernel function for a config (mapped through `bind` if given)."""
        return self.bind(dict(config)) if self.bind else dict(config)

    def bound_function(self, config: Mapping[str, Any], *, interpret: bool) -> Callable:
        """The kernel function with `config` bound; in interpret mode where the platform needs
        it (`interpret=True` if the kernel takes it, its backend's interpret mode otherwise)."""
        if not (interpret and current_device().interpret):
            return functools.partial(self.fn, **self.kernel_kwargs(config))
        return self.interpreted(config)

    def interpreted(self, config: Mapping[str, Any]) -> Callable:
        """The kernel function with `config` bound, running in Pallas interpret mode:
        `interpret=True` where the kernel takes it, else its backend's interpret mode (GPU
        interpret mode for a Mosaic GPU kernel, TPU interpret mode otherwise), which Pallas
        reads while tracing."""
        kwargs = self.kernel_kwargs(config)
        if self.takes_interpret:
            return functools.partial(self.fn, **kwargs, interpret=True)
        inner = functools.partial(self.fn, **kwargs)

        @functools.wraps(inner)
        def run(*args: Any, **kw: Any) -> Any:
            with backends.interpret_mode(self.compiles_through(args, kw)):
                return inner(*args, **kw)

        return run

    def default_config(self, sig: Signature) -> dict[str, Any]:
        """The defaults, adapted to the call: if they break a constraint for this shape, the
        valid candidate nearest to them (ties: the first in the space's order)."""
        space = self.space(sig.platform)
        defaults = {n: self.defaults[n] for n in space.names}
        if space.is_valid(defaults, sig):
            return defaults
        best, best_d = None, math.inf
        for config in space.all_configs():
            d = config_distance(config, defaults)
            if d < best_d and space.is_valid(config, sig):
                best, best_d = config, d
        return best if best is not None else defaults

    def signature(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], device: DeviceInfo
    ) -> Signature:
        """Bind a call's arguments: arrays form the argument signature, the rest static args."""
        arrays, given = self._split(args, kwargs)
        specs = [ArgSpec(tuple(int(d) for d in a.shape), dtype_name(a.dtype)) for a in arrays]
        static = {name: static_value(name, value) for name, value in given.items()}
        backend = ""
        # which backend matters on a GPU (Triton or Mosaic GPU: the key says which) and on the
        # CPU for a kernel run under its backend's interpret mode
        if backends.backend_matters(device.platform, self.takes_interpret):
            backend = self.compiles_through(args, kwargs) or ""
        return Signature(tuple(specs), static, device.platform, device.device_kind, backend)

    def static_arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """A call's static arguments as its key counts them: those given and the defaults of
        the others (tunable parameters, `interpret` and arrays left out)."""
        return self._split(args, kwargs)[1]

    def _split(
        self, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """A call's arrays, and its static arguments by name (defaults applied)."""
        try:
            bound = inspect.signature(self.fn).bind_partial(*args, **kwargs)
        except TypeError as e:
            raise KernelError(f"{self.name}: bad arguments: {e}") from None
        bound.apply_defaults()
        arrays, static = [], {}
        for name, value in bound.arguments.items():
            if name in self.bound_names or name == "interpret":
                continue
            if is_array(value):
                arrays.append(value)
            elif isinstance(value, dict) and name in _var_keyword(self.fn):
                static.update(value)
            else:
                static[name] = value
        return arrays, static

    def compiles_through(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """The backend this kernel lowers through: the declared one, else the one recognised
        from a trace of this call at the default configuration (once per kernel); None where
        nothing says (a plain `pallas_call`)."""
        if self.backend is not None:
            return self.backend
        if "backend" not in self._recognised:
            fn = functools.partial(self.fn, **self.kernel_kwargs(self.defaults), **kwargs)
            try:
                found = backends.recognise(fn, args)
            except Exception as e:  # a kernel that cannot trace here fails later, with context
                log.debug("%s: backend not recognised: %s", self.name, e)
                found = None
            self._recognised["backend"] = found
        return self._recognised["backend"]

    def key(self, sig: Signature, device: DeviceInfo) -> TuningKey:
        return TuningKey(
            kernel=self.name,
            kernel_version=self.version,
            platform=device.platform,
            device_kind=device.device_kind,
            backend=backends.key_backend(sig.backend or None, device.platform),
            signature=sig.text,
            static=sig.static_text,
        )


def _var_keyword(fn: Callable) -> set[str]:
    return {
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.VAR_KEYWORD
    }


def config_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """Distance between configs: |log2 ratio| per numeric parameter, 1 per differing other."""
    d = 0.0
    for name, va in a.items():
        vb = b.get(name)
        if va == vb and type(va) is type(vb):
            continue
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
        if numeric and va > 0 and vb > 0:
            d += abs(math.log2(va) - math.log2(vb))
        else:
            d += 1.0
    return d


def make_spec(
    fn: Callable,
    *,
    name: str,
    space: Mapping[str, Any] | str | Path,
    constraints: Sequence[Constraint] = (),
    reference: Callable | None = None,
    defaults: Mapping[str, Any] | None = None,
    bind: Callable[[dict[str, Any]], dict[str, Any]] | Mapping[str, Any] | None = None,
    backend: str | None = None,
    tuned: str | Path | None = None,
    version: str | None = None,
    split: Split | None = None,
) -> KernelSpec:
    if not isinstance(name, str) or not name:
        raise KernelError("a kernel needs a non-empty name: autotuned(name='my_kernel', ...)")
    if version is not None and not (isinstance(version, str) and 0 < len(version) <= 64):
        raise KernelError(
            f"{name}: version={version!r} is not a string of 1 to 64 characters: give e.g. "
            "version='2.1', or leave it out for a hash of the kernel's code"
        )
    backends.check_declared(name, backend)
    module_dir = _module_dir(fn)
    if isinstance(space, Mapping):
        where = f"space of kernel {name!r}"
        spaces = space_from_dict(where, space)
    else:
        path = resolve_space_path(space, module_dir)
        spaces = load_space_file(path)
        where = str(path)
    for c in constraints:
        if not callable(c):
            raise SpaceError(
                f"{where}: constraint {c!r} is not callable: pass functions (config, sig) -> bool"
            )

    params = inspect.signature(fn).parameters
    names = {p.name for ps in spaces.values() for p in ps}
    bind_text = ""
    if isinstance(bind, Mapping):
        bind_text = repr(sorted((k, _describe(v)) for k, v in bind.items()))
        bind, derived = structured_bind(fn, name, bind, names)
        defaults = {**derived, **(defaults or {})}
    if bind is None:
        missing = sorted(n for n in names if n not in params)
        if missing:
            raise SpaceError(
                f"{where}: {name} takes no parameter(s) {', '.join(missing)}: "
                "rename them, or pass bind= to map them onto the kernel's arguments"
            )
        given = dict(defaults or {})
        for n in names:
            if n not in given:
                if params[n].default is inspect.Parameter.empty:
                    raise SpaceError(
                        f"{name}: tunable parameter {n!r} has no default: give it one "
                        "(the defaults are the default configuration)"
                    )
                given[n] = params[n].default
        bound_names = frozenset(names)
    else:
        given = dict(defaults or {})
        missing = sorted(names - set(given))
        if missing:
            raise SpaceError(f"{name}: bind= needs defaults= for {', '.join(missing)}")
        bound_names = frozenset(bind(dict(given)))
        unknown = sorted(n for n in bound_names if n not in params)
        if unknown:
            raise SpaceError(
                f"{name}: bind= returns argument(s) {', '.join(unknown)} the kernel does not take"
            )

    bind_code = bind_text or bind
    return KernelSpec(
        name=name,
        fn=fn,
        spaces=spaces,
        constraints=tuple(constraints),
        defaults={n: given[n] for n in sorted(names)},
        reference=reference,
        versioned=version or (lambda: kernel_version(fn, spaces, constraints, bind_code)),
        bind=bind,
        bound_names=bound_names,
        takes_interpret="interpret" in params,
        backend=backend,
        tuned=tuned_path(name, tuned, module_dir),
        split=_checked_split(name, split),
    )


def _checked_split(name: str, split: Any) -> Split | None:
    if split is not None and not isinstance(split, Split):
        raise KernelError(
            f"{name}: split={split!r}: give autotune.Split(axes, along=...), e.g. "
            "Split('mk,kn->mn', along='mn')"
        )
    return split


def tuned_path(name: str, tuned: str | Path | None, module_dir: Path | None) -> Path | None:
    """`tuned=` as a path: relative to the module of the kernel (or variant group), read on the
    first lookup."""
    if tuned is None:
        return None
    path = Path(tuned)
    if not path.is_absolute():
        if module_dir is None:
            raise KernelError(
                f"{name}: tuned={str(tuned)!r} is relative, but the kernel has no module file to "
                "resolve it against: give an absolute path"
            )
        path = module_dir / path
    return path


def structured_bind(
    fn: Callable, name: str, layout: Mapping[str, Any], names: set[str]
) -> tuple[Callable[[dict[str, Any]], dict[str, Any]], dict[str, Any]]:
    """A bind function and defaults from a declarative layout of structured arguments.

    `layout` maps a kernel argument to a tuple of flat parameter names (the argument is a tuple,
    e.g. block_shape=("block_m", "block_n")) or to a dataclass type (its fields of the same
    names as tunable parameters are filled in; the argument's default instance gives the rest).
    Tunable parameters that are plain arguments of the kernel (`names` not in `layout`) pass
    through. The defaults are read from the kernel's own argument defaults.
    """
    params = inspect.signature(fn).parameters
    flat = sorted(n for n in names if n in params and n not in layout)
    makers: dict[str, Callable] = {n: (lambda c, n=n: c[n]) for n in flat}
    defaults = {
        n: params[n].default for n in flat if params[n].default is not inspect.Parameter.empty
    }
    for arg, target in layout.items():
        if arg not in params:
            raise SpaceError(
                f"{name}: bind= names argument {arg!r}, which the kernel does not take"
            )
        default = params[arg].default
        has_default = default is not inspect.Parameter.empty
        if isinstance(target, tuple) and all(isinstance(t, str) for t in target):
            if has_default and isinstance(default, tuple) and len(default) == len(target):
                defaults.update(zip(target, default))
            makers[arg] = lambda c, names=target: tuple(c[n] for n in names)
        elif isinstance(target, type) and dataclasses.is_dataclass(target):
            fields = [f.name for f in dataclasses.fields(target)]
            if has_default and isinstance(default, target):
                defaults.update({f: getattr(default, f) for f in fields})
            base = default if has_default and isinstance(default, target) else None

            def make(c, cls=target, fields=fields, base=base):
                given = {f: c[f] for f in fields if f in c}
                return dataclasses.replace(base, **given) if base is not None else cls(**given)

            makers[arg] = make
        else:
            raise SpaceError(
                f"{name}: bind={{{arg!r}: {target!r}}} is neither a tuple of parameter names "
                "nor a dataclass type: write e.g. bind={'block_shape': ('block_m', 'block_n')}"
            )

    def bind(config: dict[str, Any]) -> dict[str, Any]:
        return {arg: make(config) for arg, make in makers.items()}

    return bind, defaults


def _describe(target: Any) -> str:
    return (
        f"{target.__module__}.{target.__qualname__}" if isinstance(target, type) else repr(target)
    )


def _module_dir(fn: Callable) -> Path | None:
    try:
        return Path(inspect.getfile(fn)).resolve().parent
    except (OSError, TypeError):
        return None
