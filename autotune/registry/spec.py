"""KernelSpec: what a tunable kernel declares (its function, spaces, defaults, reference,
version, backend, split, example, backward), KernelOptions, the one list of what the decorator
takes, and make_spec, which builds a KernelSpec from a function and its options.

A kernel takes its tunables as keyword arguments of their own (`block_m=128`), or as one: a
keyword-only `block_sizes` whose default is an instance of a frozen dataclass (JAX's own
Pallas ops' `BlockSizes`), declared once: its fields are the tunables, their defaults the
default configuration. Such a kernel is checked when it registers: every field has candidates
in the search space, every parameter of the space is a field, every default is one of its
candidates on each platform that tunes it, and (given an example call) its constraints read
no parameter that is not a field. A mismatch is an error naming the kernel, the parameter and
the fix, not a default silently used.
"""

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
from autotune.registry.example import Example
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

# The keyword-only argument a kernel takes its tunables in, when it takes them as one frozen
# dataclass (the name JAX's own Pallas ops give it)
BLOCK_SIZES = "block_sizes"


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
    example: Example | None = None  # a small call, for code that covers every kernel
    # the kernels its custom VJP calls (() where it calls none); None: it does not differentiate
    backward: tuple[str, ...] | None = None
    block_sizes: type | None = None  # the frozen dataclass it takes its tunables in, if any
    # named input makers for its integer arguments that are data (group sizes, lengths, page
    # tables): name -> fn(args, rng) -> {argument index: array}; the first is the default
    workloads: Mapping[str, Callable] = field(default_factory=dict)
    # why Pallas interpret mode cannot run it here (None: it can): no interpret oracle judges
    # it, so it is tuned only where its reference can, on its own platform
    not_interpretable: str | None = None
    # a call's own defaults where they differ from `defaults` (a platform's, sized to the
    # call and the chip): {name: value} for some tunables, or None
    defaults_for: Callable[[Signature], Mapping[str, Any] | None] | None = None
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

    @property
    def differentiates(self) -> bool:
        """Whether jax.grad through the kernel works (it declares a backward)."""
        return self.backward is not None

    def space(self, platform: str) -> Space:
        """The platform's candidates and the constraints. A kernel with block sizes gives its
        constraints every field: those the platform does not tune at their defaults."""
        params = self.spaces[platform]
        fixed: tuple[tuple[str, Any], ...] = ()
        if self.block_sizes is not None:
            tuned = {p.name for p in params}
            fixed = tuple((n, v) for n, v in self.defaults.items() if n not in tuned)
        return Space(params, self.constraints, fixed)

    def take_overrides(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The tunables a call gives itself, taken out of `kwargs`: by name (`block_m=64`), or
        as the whole `block_sizes=` object of a kernel that takes one."""
        overrides = {k: kwargs.pop(k) for k in self.tunables & kwargs.keys()}
        if self.block_sizes is not None and BLOCK_SIZES in kwargs:
            given = kwargs.pop(BLOCK_SIZES)
            if not isinstance(given, self.block_sizes):
                raise KernelError(
                    f"{self.name}: block_sizes={given!r} is no {self.block_sizes.__name__}: "
                    f"pass {self.block_sizes.__name__}(...), or the block sizes by name"
                )
            overrides = {**_fields(given), **overrides}
        return overrides

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

    def call_defaults(self, sig: Signature) -> dict[str, Any]:
        """The defaults of the call's platform's tunables: the call's own where `defaults_for`
        gives them, else the declared ones (not adapted to the call)."""
        own = self.defaults_for(sig) if self.defaults_for is not None else None
        base = {**self.defaults, **(own or {})}
        return {n: base[n] for n in self.space(sig.platform).names}

    def default_config(self, sig: Signature) -> dict[str, Any]:
        """The defaults (`call_defaults`), adapted to the call: if they break a constraint for
        this shape, the valid candidate nearest to them (ties: the first in the space's
        order)."""
        space = self.space(sig.platform)
        defaults = self.call_defaults(sig)
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


@dataclass(frozen=True)
class KernelOptions:
    """What a kernel declares beside its function: the keywords of `autotuned` and `register`.

    `space`: a dict of candidate lists, or the name of a file in search_spaces/ (or beside the
    kernel's module). `constraints`: functions (config, sig) -> bool. `reference`: what its
    output must agree with (plain JAX, run under jax.jit). `defaults`, `bind`: for tunables the function does not take as
    plain keyword arguments (a dict such as {"block_shape": ("block_m", "block_n"),
    "block_sizes": BlockSizes} maps them declaratively). `backend`: "mosaic_gpu", ... where it
    is not recognised from what the kernel traces to. `tuned`: a tuned table shipped with the
    kernel, relative to its module. `version`: instead of a hash of its code. `split`: its
    batch-like axes. `example`: a small call (`Example`), with which the suites that cover
    every kernel call it. `backward`: the kernels its custom VJP calls (() where none): it
    differentiates. `workloads`: named makers of its integer arguments that are data
    (autotune.measure.inputs.task_inputs), the first the default. `not_interpretable`: why
    Pallas interpret mode cannot run it (the oracle is then its reference, on its platform).
    `defaults_for(sig)`: a call's own defaults where they differ from the
    declared ones (a platform's: a GPU's that spill no registers, a TPU's sized to the chip's
    VMEM and the call), {name: value} or None.
    """

    name: str
    space: Mapping[str, Any] | str | Path
    constraints: Sequence[Constraint] = ()
    reference: Callable | None = None
    defaults: Mapping[str, Any] | None = None
    bind: Callable[[dict[str, Any]], dict[str, Any]] | Mapping[str, Any] | None = None
    backend: str | None = None
    tuned: str | Path | None = None
    version: str | None = None
    split: Split | None = None
    example: Example | None = None
    backward: Sequence[str] | None = None
    workloads: Mapping[str, Callable] | None = None
    not_interpretable: str | None = None
    defaults_for: Callable[[Any], Mapping[str, Any] | None] | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> KernelOptions:
        """The options from a decorator's keywords; an unknown one is a KernelError naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        missing = sorted({"name", "space"} - set(options))
        if unknown or missing:
            what = f"unknown option(s) {', '.join(unknown)}" if unknown else ""
            what += ("; " if what else "") + (f"no {' or '.join(missing)}" if missing else "")
            raise KernelError(
                f"autotuned({', '.join(f'{k}=...' for k in options)}): {what}: it takes "
                f"{', '.join(f.name for f in dataclasses.fields(cls))}"
            )
        return cls(**options)


def make_spec(fn: Callable, options: KernelOptions) -> KernelSpec:
    name = options.name
    if not isinstance(name, str) or not name:
        raise KernelError("a kernel needs a non-empty name: autotuned(name='my_kernel', ...)")
    version = options.version
    if version is not None and not (isinstance(version, str) and 0 < len(version) <= 64):
        raise KernelError(
            f"{name}: version={version!r} is not a string of 1 to 64 characters: give e.g. "
            "version='2.1', or leave it out for a hash of the kernel's code"
        )
    backends.check_declared(name, options.backend)
    module_dir = _module_dir(fn)
    space = options.space
    if isinstance(space, Mapping):
        where = f"space of kernel {name!r}"
        spaces = space_from_dict(where, space)
    else:
        path = resolve_space_path(space, module_dir)
        spaces = load_space_file(path)
        where = str(path)
    constraints = tuple(options.constraints)
    for c in constraints:
        if not callable(c):
            raise SpaceError(
                f"{where}: constraint {c!r} is not callable: pass functions (config, sig) -> bool"
            )
    example = _checked_example(name, options.example)

    params = inspect.signature(fn).parameters
    names = {p.name for ps in spaces.values() for p in ps}
    bind, defaults = options.bind, options.defaults
    block_sizes = _block_sizes_type(params) if bind is None else None
    bind_text = ""
    if block_sizes is not None:
        if defaults is not None:
            raise KernelError(
                f"{name}: defaults= beside block_sizes: the defaults are "
                f"{block_sizes.__name__}'s own: drop defaults="
            )
        default = params[BLOCK_SIZES].default
        _check_block_sizes(name, fn, block_sizes, default, spaces, where)
        given = _fields(default)
        names = set(given)
        bind_text = f"{BLOCK_SIZES}: {_describe(block_sizes)}"
        bind = functools.partial(_fill, default)
        bound_names = frozenset({BLOCK_SIZES})
    elif bind is None:
        missing = sorted(n for n in names if n not in params)
        if missing:
            hint = (
                f"give {BLOCK_SIZES} a frozen dataclass default ({BLOCK_SIZES}: BlockSizes = "
                "BlockSizes()) whose fields they are"
                if BLOCK_SIZES in params
                else "rename them, or pass bind= to map them onto the kernel's arguments"
            )
            raise SpaceError(f"{where}: {name} takes no parameter(s) {', '.join(missing)}: {hint}")
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
        if isinstance(bind, Mapping):
            bind_text = repr(sorted((k, _describe(v)) for k, v in bind.items()))
            bind, derived = structured_bind(fn, name, bind, names)
            defaults = {**derived, **(defaults or {})}
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

    defaults_config = {n: given[n] for n in sorted(names)}
    if block_sizes is not None and example is not None:
        _check_constraint_reads(name, block_sizes, constraints, defaults_config, example)
    bind_code = bind_text or bind
    return KernelSpec(
        name=name,
        fn=fn,
        spaces=spaces,
        constraints=constraints,
        defaults=defaults_config,
        reference=options.reference,
        versioned=version or (lambda: kernel_version(fn, spaces, constraints, bind_code)),
        bind=bind,
        bound_names=bound_names,
        takes_interpret="interpret" in params,
        backend=options.backend,
        tuned=tuned_path(name, options.tuned, module_dir),
        split=_checked_split(name, options.split),
        example=example,
        backward=_checked_backward(name, options.backward),
        block_sizes=block_sizes,
        workloads=_checked_workloads(name, options.workloads),
        not_interpretable=options.not_interpretable,
        defaults_for=options.defaults_for,
    )


def _checked_workloads(name: str, workloads: Mapping[str, Callable] | None) -> dict:
    made = dict(workloads or {})
    for label, maker in made.items():
        if not (isinstance(label, str) and label and callable(maker)):
            raise KernelError(
                f"{name}: workloads={{{label!r}: {maker!r}}}: give names and functions "
                "(args, rng) -> {argument index: array}"
            )
    return made


def _fields(blocks: Any) -> dict[str, Any]:
    """A block sizes object's fields by name (shallow: dataclasses.asdict would copy)."""
    return {f.name: getattr(blocks, f.name) for f in dataclasses.fields(blocks)}


def _fill(default: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The kernel's arguments for a flat config: its block sizes, the default's fields where
    the config (a platform's space) does not tune them."""
    return {BLOCK_SIZES: dataclasses.replace(default, **config)}


def _block_sizes_type(params: Mapping[str, inspect.Parameter]) -> type | None:
    """The frozen dataclass a kernel takes its tunables in (`block_sizes`), or None."""
    p = params.get(BLOCK_SIZES)
    if p is None or p.kind is not p.KEYWORD_ONLY:
        return None
    default = p.default
    if not dataclasses.is_dataclass(default) or isinstance(default, type):
        return None
    return type(default)


def _check_block_sizes(
    name: str,
    fn: Callable,
    cls: type,
    default: Any,
    spaces: Mapping[str, tuple[Param, ...]],
    where: str,
) -> None:
    """A kernel's block sizes against its space: the same names, each default a candidate."""
    title = cls.__qualname__
    module = getattr(fn, "__module__", "") or "its module"
    if not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise KernelError(
            f"{name}: {title} is not frozen: declare it @dataclasses.dataclass(frozen=True) (block "
            "sizes are static arguments: jit hashes them)"
        )
    try:
        own = cls()
    except TypeError as e:
        raise KernelError(
            f"{name}: {title}() fails ({e}): give every field a default, the default configuration"
        ) from None
    if own != default:
        raise KernelError(
            f"{name}: {BLOCK_SIZES} defaults to {default!r}, not {title}(): declare the defaults "
            f"once, in {title}'s fields, and write {BLOCK_SIZES}: {title} = {title}()"
        )
    fields = list(_fields(default))
    tuned_on: dict[str, list[str]] = {}
    for platform, params in spaces.items():
        for p in params:
            tuned_on.setdefault(p.name, []).append(platform)
    for param, platforms in sorted(tuned_on.items()):
        if param not in fields:
            raise SpaceError(
                f"{where}: {name} tunes {param!r} (on {', '.join(platforms)}), which {title} has "
                f"no field for: add `{param}: int = ...` to {title} ({module}), or remove it "
                "from the space"
            )
    for f in fields:
        if f not in tuned_on:
            raise SpaceError(
                f"{name}: {title}.{f} has no candidates in {where}: give it a list there (under "
                "[common] or a platform's section), or remove the field"
            )
    for platform, params in spaces.items():
        for p in params:
            value = getattr(default, p.name)
            if not p.admits(value):
                raise SpaceError(
                    f"{name}: {title}.{p.name} defaults to {value!r}, which is not one of its "
                    f"{platform} candidates in {where} {list(p.values)}: add it there, or change "
                    "the default (a tuning run measures the default, and stores it where it wins)"
                )


class _UnknownParameter(Exception):
    pass


class _ReadChecked(dict):
    """A config that refuses to be read at a name that is no tunable."""

    def __getitem__(self, key: Any) -> Any:
        if key not in self:
            raise _UnknownParameter(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            raise _UnknownParameter(key)
        return super().get(key)


def _check_constraint_reads(
    name: str,
    cls: type,
    constraints: Sequence[Constraint],
    defaults: Mapping[str, Any],
    example: Example,
) -> None:
    """Each constraint, asked about the default configuration at the example's shapes on every
    platform, reads only tunables: a name that is no field of `cls` is a KernelError."""
    for platform in backends.PLATFORM_BACKENDS:
        sig = example.signature(platform, backends.of_platform(platform).default_kind or platform)
        for c in constraints:
            try:
                c(_ReadChecked(defaults), sig)
            except _UnknownParameter as e:
                raise KernelError(
                    f"{name}: constraint {getattr(c, '__qualname__', c)} reads parameter "
                    f"{e.args[0]!r}, which {cls.__qualname__} has no field for: read one of "
                    f"{', '.join(defaults)}, or add the field (and its candidates)"
                ) from None
            except Exception as e:  # asked again, and reported, when a space uses it
                log.debug("%s: constraint %s raised on the example: %s", name, c, e)


def _checked_example(name: str, example: Any) -> Example | None:
    if example is not None and not isinstance(example, Example):
        raise KernelError(
            f"{name}: example={example!r}: give autotune.Example('f32[37,45],f32[45,29]'), "
            "static arguments as its keywords"
        )
    return example


def _checked_backward(name: str, backward: Any) -> tuple[str, ...] | None:
    if backward is None:
        return None
    if isinstance(backward, str) or not all(isinstance(b, str) for b in backward):
        raise KernelError(
            f"{name}: backward={backward!r}: give the names of the kernels its VJP calls, "
            "e.g. backward=('softmax_bwd',), or () for none"
        )
    return tuple(backward)


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
        path = (module_dir / path).resolve()  # '../tuned': a folder beside the package's
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
    """The folder of the module the kernel is written in (under any functools.wraps wrapper)."""
    try:
        return Path(inspect.getfile(inspect.unwrap(fn))).resolve().parent
    except (OSError, TypeError):
        return None
