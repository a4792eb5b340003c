"""@autotuned: call -> key -> lookup -> compiled kernel call.

Each kernel has one jitted entry whose body does the lookup (autotune.runtime.lookup), so the lookup
runs only while jit traces it (once per new shapes, dtypes and static arguments) and a repeated
eager call costs what a hand-configured jitted call costs: jit's own C++ dispatch. Arrays are
traced, other arguments are static; where the kernel's signature cannot say which is which,
each call is checked first (see AutotunedKernel.__init__). The lookup is memoised per call shape
in the process state (autotune.runtime.state), so the database is read once per distinct call
in a process; dropping the memo (a tune stored an entry: `registry.on_entry_stored`; `configure`;
an overlay) drops every kernel's jitted entry too. Each traced call is noted under a named scope
(autotune.runtime.traced_calls) for `calls_in`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune import backends, registry
from autotune.device import current_device
from autotune.errors import AutotuneError
from autotune.registry.spec import KernelOptions, KernelSpec, make_spec
from autotune.runtime import lookup, partitioned, sharded
from autotune.runtime import state as runtime_state
from autotune.runtime.lookup import Resolution
from autotune.runtime.overlays import active_overlays
from autotune.runtime.traced_calls import traced_call_scope
from autotune.signature import Signature, call_shape, is_array

# a tuning run in this process stored a best entry: serve it from the next call on
registry.on_entry_stored(runtime_state.clear_memo)


def _is_option(p: inspect.Parameter) -> bool:
    """A keyword-only parameter with a default that is no array: a default other than None, or
    None under an annotation that names no array (`sm_scale: float | None = None`); an
    unannotated None default may stand for an optional array (`bias=None`)."""
    if p.kind is not p.KEYWORD_ONLY or p.default is p.empty:
        return False
    if p.default is not None:
        return True
    return p.annotation is not p.empty and "array" not in str(p.annotation).lower()


class AutotunedKernel:
    """A kernel wrapper that calls its function with the tuned configuration."""

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self._executables: dict[tuple, Callable] = {}
        params = [
            p
            for p in inspect.signature(spec.fn).parameters.values()
            if p.name not in spec.bound_names and p.name != "interpret"
        ]
        # The jitted entry's static arguments: options, and overrides of tunable parameters.
        options = {p.name for p in params if p.kind is p.KEYWORD_ONLY or p.default is not p.empty}
        # (a kernel's block sizes object, given whole, is static too: a frozen dataclass)
        given_whole = set(spec.bound_names) if spec.block_sizes is not None else set()
        self._static_names = frozenset(options | spec.tunables | given_whole | {"interpret"})
        self._array_names = [p.name for p in params if p.kind is not p.KEYWORD_ONLY]
        # A signature whose every argument is an array (positional, no default) or an option
        # (keyword-only with a default: see _is_option) says how calls split: they go straight
        # to the entry, which splits them as jax.jit(fn, static_argnames=<options>) would (so
        # a Python scalar in an array's place is traced, an array in an option's is refused).
        # Any other (e.g. `bias=None`, `causal=False` positional) has each call checked first,
        # so that every non-array value is static and every array traced.
        self._direct = all(
            (p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)
            or _is_option(p)
            for p in params
        )
        self._drop_entry()
        runtime_state.add_kernel(self)
        functools.update_wrapper(self, spec.fn)

    def __repr__(self) -> str:
        return f"<autotuned kernel {self.spec.name!r} version {self.spec.version}>"

    # ------------------------------------------------------------------ calling

    # Calling the kernel calls `_entry`, with no Python frame in between (a property whose
    # getter is C): for a direct kernel that is the jitted entry itself, so a repeated call
    # costs what jit's C++ dispatch costs; it keys calls by shapes, dtypes and static values.
    __call__ = property(operator.attrgetter("_entry"))

    def _drop_entry(self) -> None:
        """Forget the jitted entry (its traces hold configurations looked up before)."""
        self._jit: Callable | None = None
        self._entry: Callable = self._first_call

    def _first_call(self, *args: Any, **kwargs: Any) -> Any:
        import jax

        def entry(*args: Any, **kwargs: Any) -> Any:  # runs while jit traces a new call
            return self._run(args, kwargs, self._traced_kernel)

        # named as the kernel, as a hand-jitted kernel is named in jaxprs and profiles
        entry.__name__ = entry.__qualname__ = self.spec.fn.__name__
        self._jit = jax.jit(entry, static_argnames=sorted(self._static_names))
        self._entry = self._jit if self._direct else self._checked
        return self._entry(*args, **kwargs)

    def _checked(self, *args: Any, **kwargs: Any) -> Any:
        if self._fits(args, kwargs):
            # (_jit is None only if another thread dropped the entries meanwhile)
            return (self._jit or self._first_call)(*args, **kwargs)
        return self._call(args, kwargs)

    def _fits(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
        """Whether the jitted entry splits a call as the decorator does: arrays (or None)
        positionally, non-array values of static names by keyword."""
        return _all_arrays(args) and (
            not kwargs
            or (kwargs.keys() <= self._static_names and not any(map(is_array, kwargs.values())))
        )

    def _call(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """The general path: non-array arguments become static ones of a jitted executable."""
        return self._run(args, kwargs, self.executable)

    def _traced_kernel(
        self,
        config: Mapping[str, Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        given: frozenset[str] = frozenset(),
    ) -> Callable:
        # inside the entry's trace: the kernel itself, so the entry holds its pallas_call; the
        # caller's block sizes (`given`) checked here, once per trace, never per call
        if given:
            lookup.check_given(self.spec, config, given, args, kwargs)
        return self.spec.bound_function(config, interpret="interpret" not in kwargs)

    def _run(self, args: Sequence[Any], kwargs: dict[str, Any], kernel_for: Callable) -> Any:
        """A call, in the jitted entry's trace or on the general path: looked up, then run in
        a scope that names the call in jaxprs (`autotune.calls_in` reads it). A call on
        sharded arrays runs this for each device's part (on a mesh's Explicit axes
        autotune.runtime.sharded, on Auto axes autotune.runtime.partitioned), so that each is
        looked up, named and recorded at its local shape."""
        if partitioned.in_body():
            return self._run_whole(args, kwargs, kernel_for)
        split = sharded.plan(self.spec.split, args, self._array_names)
        if split is not None:
            return sharded.run(
                self.spec.name, split, lambda *part: self._run(part, dict(kwargs), kernel_for), args
            )
        interpreter = self._interpreter(kwargs)
        mesh = partitioned.auto_mesh(args, kwargs)
        if mesh is not None and interpreter != "mode":
            return partitioned.run(
                self,
                self._array_names,
                mesh,
                args,
                kwargs,
                lambda part, kw: self._run(part, kw, kernel_for),
                lambda part, kw: self._run_whole(part, kw, kernel_for),
                kernel_for,
            )
        if mesh is not None:
            partitioned.warn_interpret_mode(self.spec.name, mesh)
        if interpreter == "plain":
            sharded.warn_plain_interpreter(self.spec.name, args)
        given = dict(kwargs)
        overrides = self.spec.take_overrides(kwargs)
        resolution = self._resolution(args, kwargs)
        if resolution.refused and not overrides:  # block sizes passed: the caller's choice
            raise AutotuneError(resolution.detail)
        config = {**resolution.config, **overrides}
        source = "caller" if overrides else resolution.source
        with traced_call_scope(self, args, given, config, source):
            out = kernel_for(config, args, kwargs, frozenset(overrides))(*args, **kwargs)
        if resolution.miss:
            runtime_state.record_miss(resolution.key)
        return out

    def _run_whole(self, args: Sequence[Any], kwargs: dict[str, Any], kernel_for: Callable) -> Any:
        """The call at its global shape where XLA's partitioner runs each device's part
        (autotune.runtime.partitioned), traced for its type only: at the default
        configuration (or the caller's block sizes), nothing looked up, named or recorded."""
        kwargs = dict(kwargs)
        overrides = {k: kwargs.pop(k) for k in self.spec.tunables & kwargs.keys()}
        sig = self.spec.signature(args, kwargs, current_device())
        config = {**self._default_config(sig, args, kwargs), **overrides}
        return kernel_for(config, args, kwargs)(*args, **kwargs)

    def _interpreter(self, kwargs: Mapping[str, Any]) -> str | None:
        """Which of Pallas's interpreters runs the call: "plain" (`interpret=True`), "mode"
        (an interpret mode, TPU's or GPU's: forced, passed, or the backend's for a kernel
        without an `interpret` argument on a CPU), None (compiled for the device)."""
        if backends.interpret_mode_forced():
            return "mode"
        if "interpret" in kwargs:
            given = kwargs["interpret"]
            return "plain" if given is True else "mode" if given else None
        if not current_device().interpret:
            return None
        return "plain" if self.spec.takes_interpret else "mode"

    def _memo_key(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple:
        # an active overlay changes the answer: calls inside and outside one differ
        return (self, call_shape(args, kwargs), active_overlays())

    def _resolution(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Resolution:
        """resolve(), memoised per call shape: the database is read once per key per process."""
        if runtime_state.listed(self):  # kept by no memo: a call's own trace counts its miss
            return self.resolve(args, kwargs)
        memo_key = self._memo_key(args, kwargs)
        state = runtime_state.current()
        try:
            hit = state.memo.get(memo_key)
        except TypeError:  # an unhashable static argument: resolve without the memo
            return self.resolve(args, kwargs)
        if hit is None:
            hit = state.memo[memo_key] = self.resolve(args, kwargs)
            if state.db is False:
                state.unopened.add(memo_key)
                if state.db:  # a retry opened it meanwhile: this call's trace is stale too
                    state.memo.pop(memo_key, None)
                    self._drop_entry()
        return hit

    def explain(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """What a call with these arguments would use: config, source (one of LOOKUP_ORDER,
        or "caller" for a configuration passed in the call), key (a dict) and signature; for
        arrays sharded over a mesh, each device's call (at its local shape). Where this process
        remembers another configuration for the call than a lookup gives now (another process
        stored an entry since), the remembered one, which calls run, with `detail` saying so."""
        overrides = self.spec.take_overrides(kwargs)
        split = sharded.plan(self.spec.split, args, self._array_names)
        if split is not None:
            args = sharded.local_parts(split, args)
        else:
            args = partitioned.local_parts(self.spec.split, args, kwargs)
        with runtime_state.listing():  # a question, not a call to count
            r = self.resolve(args, kwargs, record_miss=False)
        try:
            remembered = runtime_state.current().memo.get(self._memo_key(args, kwargs))
        except TypeError:  # an unhashable static argument: never remembered
            remembered = None
        if remembered is not None and remembered.config != r.config:  # what calls still run
            note = (
                f"remembered from an earlier lookup, and run by calls since; a lookup now gives "
                f"{r.config} ({r.source}): a new process, or autotune.configure(), uses that"
            )
            r = dataclasses.replace(remembered, detail="; ".join(filter(None, (r.detail, note))))
        config = {**r.config, **overrides}
        refused = lookup.given_problem(self.spec, config, frozenset(overrides), r.signature)
        return {
            "config": config,
            "source": "caller" if overrides else r.source,
            "key": r.key.as_dict(),
            "signature": r.key.signature,
            "detail": refused or r.detail,
        }

    def config(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The configuration a call with these arguments (arrays or jax.ShapeDtypeStruct) is
        served, looked up as a call looks it up (overlay, database, shipped table, nearest
        shape, default) and remembered as a call's is: what a look-up hook hands a kernel that
        takes its block sizes from the caller (megablox's `tiling=`, splash's `block_sizes=`).
        A miss is recorded as a call's is."""
        return dict(self._resolution(args, kwargs).config)

    def executable(
        self,
        config: Mapping[str, Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        given: frozenset[str] = frozenset(),
    ) -> Callable:
        """The jitted kernel for a config; static (non-array) arguments are jit-static. The
        parameters of the config the caller passed (`given`) are checked against the
        constraints while jit traces a call (once per shape, not per call)."""
        static_nums = tuple(i for i, a in enumerate(args) if not is_array(a))
        static_names = tuple(sorted(k for k, v in kwargs.items() if not is_array(v)))
        cache_key = (tuple(sorted(config.items())), static_nums, static_names, given)
        exe = self._executables.get(cache_key)
        if exe is None:
            import jax

            fn = self.spec.bound_function(config, interpret="interpret" not in kwargs)
            if given:
                fn = _checking(fn, self.spec, config, given)
            exe = jax.jit(fn, static_argnums=static_nums, static_argnames=static_names)
            self._executables[cache_key] = exe
        return exe

    # ------------------------------------------------------------------ lookup

    def resolve(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], record_miss: bool = True
    ) -> Resolution:
        """Look the configuration for a call up (autotune.runtime.lookup's chain); a miss is
        recorded for `autotune tune --pending` unless `record_miss` is False."""
        default = functools.partial(self._default_config, args=args, kwargs=kwargs)
        return lookup.resolve(self.spec, args, kwargs, default, record_miss)

    def _default_config(
        self, sig: Signature, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The configuration a call without a tuned entry uses (a variant group overrides it)."""
        return self.spec.default_config(sig)


def _checking(
    fn: Callable, spec: KernelSpec, config: Mapping[str, Any], given: frozenset[str]
) -> Callable:
    """`fn`, checking the caller's block sizes (`given`) for each call it is traced for."""

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        lookup.check_given(spec, config, given, args, kwargs)
        return fn(*args, **kwargs)

    return traced


# Types whose every value is an array (is_array), or None; learned as calls bring them.
_ARRAY_TYPES: set[type] = {type(None)}


def _all_arrays(values: Sequence[Any]) -> bool:
    """Whether every value is an array or None, judged by its type: one set lookup per value
    once the type is known (an array's `dtype` is a property that costs microseconds). A type
    whose instances alone carry a shape and a dtype is judged not to be one: such calls take
    the general path, which judges each value."""
    if _ARRAY_TYPES.issuperset(map(type, values)):
        return True
    for cls in set(map(type, values)) - _ARRAY_TYPES:
        if not (hasattr(cls, "shape") and hasattr(cls, "dtype")):
            return False
        _ARRAY_TYPES.add(cls)
    return True


def autotuned(**options: Any) -> Callable[[Callable], AutotunedKernel]:
    """Declare a kernel's tunable parameters and register it under `name` (the options:
    `KernelOptions`, checked here, before the function is decorated).

    `space` is a dict of candidate lists or the name of a file in search_spaces/. The kernel
    takes its tunables as keyword arguments with defaults (the default configuration), or as
    one keyword-only `block_sizes` whose default is a frozen dataclass, declared once (see
    autotune.registry.spec); `bind=` with `defaults=` maps the flat config onto other
    structured arguments (a dict such as {"block_shape": ("block_m", "block_n"),
    "block_sizes": BlockSizes} does so declaratively and reads the defaults from the kernel's
    own). `tuned` is a tuned table shipped with the kernel: an exported JSON file, or a folder
    of them, relative to the kernel's module; it serves calls the user's own database has no
    entry for. `split` says which axes of its arrays are batch-like, so that a call on arrays
    sharded along them under `jax.jit` runs on each device's part (autotune.runtime.sharded).
    `version` names the kernel's version (part of every key) instead of a hash of its code:
    for a library whose kernels run code from outside their own package. `example` is a small
    call (autotune.Example) and `backward` the kernels its custom VJP calls: what code that
    covers every registered kernel reads. `workloads` names makers of its integer arguments
    that are data (group sizes, lengths, page tables: fn(args, rng) -> {index: array}, the
    first the default; autotune.measure.inputs.task_inputs), and `not_interpretable` says why
    Pallas interpret mode cannot run it (its reference then judges it on its own platform, and
    a host that could only interpret it refuses to tune it).
    """
    checked = KernelOptions.of(options)

    def decorate(fn: Callable) -> AutotunedKernel:
        return _register(fn, checked)

    return decorate


def register(fn: Callable, **options: Any) -> AutotunedKernel:
    """Register an existing function (e.g. from another library) as an autotuned kernel (the
    options: `autotuned`'s)."""
    return _register(fn, KernelOptions.of(options))


def _register(fn: Callable, options: KernelOptions) -> AutotunedKernel:
    kernel = AutotunedKernel(make_spec(fn, options))
    registry.add(kernel)
    return kernel


# what help() and editors show: the one list of options
autotuned.__signature__ = register.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in inspect.signature(KernelOptions).parameters.values()
    ]
)
