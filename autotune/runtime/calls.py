"""What a program calls: `calls_in`, and loading a program named 'package.module:factory'.

`calls_in` traces a function to a jaxpr (arrays or jax.ShapeDtypeStructs in: nothing runs)
and reads the `@autotuned` calls off it: each kernel's jitted entry traces its call inside a
named scope that the runtime remembers (autotune.runtime.traced_calls), and the scope's name stays
on the entry's operations in every jaxpr that holds them, also where jit served the entry
from its cache. Calls that `fn` differentiates include the backward's: the shipped kernels'
VJPs call backward kernels that are `@autotuned` themselves.

On a mesh each call is listed as each device runs it, at its local shape. Inside a shard_map and
on a mesh's Explicit axes the trace says it; on Auto axes (`jax.sharding.Mesh(devices, names)`)
only XLA's partitioner does, when it compiles the program (autotune.runtime.partitioned): so a
program that makes such calls is compiled too (nothing runs), where its arguments' shardings are
a mesh of this process's devices; elsewhere its calls are listed at their global shapes, saying
so.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import reprlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import AutotuneError
from autotune.signature import is_array

log = logging.getLogger(__name__)


class ProgramError(AutotuneError):
    """A program named on the command line or in a job file that cannot be loaded."""


def load_program(target: str) -> tuple[Callable, tuple, dict[str, Any]]:
    """'package.module:factory' to (fn, args, kwargs): `factory()` returns (fn, args) or
    (fn, args, kwargs), the arguments arrays or jax.ShapeDtypeStructs."""

    from autotune.registry import import_user_module

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ProgramError(f"program {target!r}: write package.module:factory")
    factory: Any = import_user_module(module_name, f"for program {target!r}", ProgramError)
    for part in attr.split("."):
        factory = getattr(factory, part, None)
    if factory is None:
        raise ProgramError(f"program {target!r}: {module_name} has no function {attr!r}")
    if not callable(factory):
        raise ProgramError(
            f"program {target!r}: {module_name}.{attr} is not a function (it is "
            f"{reprlib.repr(factory)}): name a function that returns (fn, args)"
        )
    try:
        made = factory()
    except Exception as e:  # the user's code: one line that names it, not a traceback
        raise ProgramError(f"program {target!r}: {attr}() raised {type(e).__name__}: {e}") from e
    if not (isinstance(made, tuple) and len(made) in (2, 3) and callable(made[0])):
        raise ProgramError(
            f"program {target!r}: {attr}() must return (fn, args) or (fn, args, kwargs), "
            f"got {type(made).__name__}"
        )
    fn, args, kwargs = made if len(made) == 3 else (*made, {})
    if not isinstance(args, (tuple, list)) or not isinstance(kwargs, Mapping):
        raise ProgramError(
            f"program {target!r}: {attr}() must return args as a tuple and kwargs as a dict"
        )
    return fn, tuple(args), dict(kwargs)


@dataclass(frozen=True)
class ProgramCall:
    """One `@autotuned` call of a program, as `autotune db` names it, and where it is served from."""

    kernel: str  # the registered name
    signature: str  # shapes and dtypes, e.g. "f32[64,128],f32[128,64]"
    static: str  # static arguments as JSON, e.g. '{"causal":true}'
    source: str  # "db", "nearest", "default" or "caller" (the call passes its block sizes)
    config: dict[str, Any]  # what the call runs with now (the trace's, where it is older)
    args: tuple  # jax.ShapeDtypeStruct per array argument
    kwargs: dict[str, Any]  # static arguments, tunable ones and `interpret` left out
    # the mesh axes the call is mapped over, with their sizes (inside `jax.shard_map`, or a
    # kernel's call on sharded arrays): its shapes are each device's, {} where it is not mapped
    mesh_axes: dict[str, int] = field(default_factory=dict)
    detail: str = ""  # where the trace found runs another config than a new trace would
    count: int = 1  # how many times the program makes the call (as traced: a loop's body once)
    # what the call gathers to every device first, on a mesh ("x's axis 1 (over mesh axis
    # 'd')"): it runs at those axes' global size, not each device's part
    gathered: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "signature": self.signature,
            "static": self.static,
            "count": self.count,
            "source": self.source,
            "config": self.config,
            "mesh_axes": self.mesh_axes,
            "gathered": list(self.gathered),
            "detail": self.detail,
        }


def calls_in(
    fn: Callable, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None
) -> list[ProgramCall]:
    """Every `@autotuned` call that `fn(*args, **kwargs)` makes, each once (with `count`, how
    many times the program makes it), in the order the program makes them; arguments may be
    arrays or jax.ShapeDtypeStructs (nothing runs). On a mesh the calls are each device's, at
    its local shape, from the arguments' shardings (give a ShapeDtypeStruct its `sharding=`): a
    call's `mesh_axes` says the mesh it runs on each device of, `gathered` what it gathers
    first. A call's configuration is the one a trace made now runs: the program is traced
    apart from its real calls' traces (no miss hidden from them), so a function jitted
    earlier, inside an overlay that has ended, still runs what its own trace chose then."""
    import jax

    from autotune.runtime.partitioned import (
        BACKWARD_SCOPE_PREFIX,
        PARTITIONED_CALLS,
        PARTITIONED_SCOPE_PREFIX,
    )
    from autotune.runtime.state import listing
    from autotune.runtime.traced_calls import TRACED_CALLS, TRACED_SCOPE_PREFIX

    if not isinstance(args, (tuple, list)):
        what = "an array" if is_array(args) else f"a {type(args).__name__}"
        raise AutotuneError(
            f"calls_in: args is {what}: give the arguments as a tuple, e.g. calls_in(fn, (x,)) "
            "for fn(x)"
        )
    kwargs = dict(kwargs or {})
    positions = [i for i, a in enumerate(args) if is_array(a)]
    names = [k for k, v in kwargs.items() if is_array(v)]

    def program(arrays: list[Any], named: dict[str, Any]) -> Any:
        call_args = list(args)
        for i, a in zip(positions, arrays):
            call_args[i] = a
        return fn(*call_args, **{**kwargs, **named})

    arrays = [_abstract(args[i]) for i in positions]
    named = {k: _abstract(kwargs[k]) for k in names}
    pattern = _scopes(TRACED_SCOPE_PREFIX, PARTITIONED_SCOPE_PREFIX, BACKWARD_SCOPE_PREFIX)
    with listing() as current:  # reads only: no miss counted, no database created
        closed = _traced(fn, lambda: jax.make_jaxpr(program)(arrays, named))
        scopes = list(
            dict.fromkeys(s for n in _name_stacks(closed.jaxpr) for s in pattern.findall(n))
        )
        split_by_xla = any(not s.startswith(TRACED_SCOPE_PREFIX) for s in scopes)
        compiled = split_by_xla and _on_devices([*arrays, *named.values()])
        if compiled:  # XLA's partitioner traces each device's call as it compiles (runs none)
            _traced(fn, lambda: jax.jit(program).lower(arrays, named).compile())
    in_program = _scope_counts(closed.jaxpr, pattern)
    local = _scopes(TRACED_SCOPE_PREFIX)
    found: dict[tuple, ProgramCall] = {}
    counts: dict[tuple, int] = {}
    for scope in scopes:
        n = in_program.get(scope, 0)
        if scope.startswith(TRACED_SCOPE_PREFIX):
            calls = [(_program_call(TRACED_CALLS[scope]), n)]
        elif compiled:  # each device's calls, as the partitioner traced them
            per_device = current.partitioned.get(scope)
            each = _scope_counts(per_device, local) if per_device is not None else {}
            calls = [(_program_call(TRACED_CALLS[s]), n * m) for s, m in each.items()]
        elif scope.startswith(BACKWARD_SCOPE_PREFIX):  # its calls are known once compiled
            calls = []
        else:
            calls = [(_whole_call(PARTITIONED_CALLS[scope]), n)]
        for call, times in calls:
            key = (call.kernel, call.signature, call.static)
            found.setdefault(key, call)
            counts[key] = counts.get(key, 0) + times
    return [dataclasses.replace(c, count=counts.get(k) or 1) for k, c in found.items()]


def _traced(fn: Callable, trace: Callable[[], Any]) -> Any:
    """`trace()`, its failure one AutotuneError that names `fn`."""
    try:
        return trace()
    except AutotuneError:
        raise
    except Exception as e:
        raise AutotuneError(
            f"calls_in: tracing {getattr(fn, '__name__', fn)!r} failed: {type(e).__name__}: {e}"
        ) from e


def _on_devices(arrays: Sequence[Any]) -> bool:
    """Whether every argument's sharding is on this process's devices (a `jax.sharding.Mesh`,
    not an AbstractMesh described for a device this host lacks): the program can be compiled."""
    import jax

    meshes = [getattr(a.sharding, "mesh", None) for a in arrays if a.sharding is not None]
    return all(m is None or isinstance(m, jax.sharding.Mesh) for m in meshes)


def _abstract(a: Any) -> Any:
    """An array's shape and dtype, and its sharding where it is a mesh's (a sharded program
    traces its calls at each device's shape)."""
    import jax

    sharding = getattr(a, "sharding", None)
    named = sharding if isinstance(sharding, jax.sharding.NamedSharding) else None
    return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=named)


def _scopes(*prefixes: str) -> re.Pattern:
    """The named scopes a prefix and a number name (one of `prefixes`)."""
    return re.compile(f"(?:{'|'.join(map(re.escape, prefixes))})\\d+")


def _name_stacks(jaxpr: Any) -> Iterator[str]:
    """The name stack of every operation in a jaxpr and the jaxprs inside it, in order."""
    for eqn in jaxpr.eqns:
        yield str(eqn.source_info.name_stack)
        for inner in _inner_jaxprs(eqn):
            yield from _name_stacks(inner)


# the primitives of a jitted function's call: a kernel's entry, or JAX's transpose of one
_JIT_PRIMITIVES = ("jit", "pjit")


def _scope_counts(jaxpr: Any, pattern: re.Pattern) -> dict[str, int]:
    """How many times each traced call's scope runs a kernel in `jaxpr`. Each entry of a kernel
    is a jit of its own, whose jaxpr holds the call's operations under its scope: a call counts
    once per visit of a jaxpr (a jit's jaxpr is visited once per call of it) in which an
    operation under the scope launches a kernel (a `pallas_call`, or one inside it). JAX's
    transpose of a forward call carries the forward's scope on operations that launch none
    (the backward's kernels run under scopes of their own): not counted again."""
    counts: dict[str, int] = {}
    launches: dict[int, bool] = {}
    todo: list[tuple[Any, frozenset[str]]] = [(jaxpr, frozenset())]
    while todo:
        current, inside = todo.pop()
        here: set[str] = set()
        for eqn in current.eqns:
            scopes = set(pattern.findall(str(eqn.source_info.name_stack)))
            inner = list(_inner_jaxprs(eqn))
            counted = eqn.primitive.name not in _JIT_PRIMITIVES and scopes - inside
            if counted and _launches_kernel(eqn, inner, launches):
                here |= scopes - inside
            todo += [(j, inside | scopes) for j in inner]
        for scope in here:
            counts[scope] = counts.get(scope, 0) + 1
    return counts


def _inner_jaxprs(eqn: Any) -> Iterator[Any]:
    for value in eqn.params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            inner = getattr(v, "jaxpr", v)  # a ClosedJaxpr holds its Jaxpr
            if hasattr(inner, "eqns"):
                yield inner


def _launches_kernel(eqn: Any, inner: list[Any], memo: dict[int, bool]) -> bool:
    """Whether an operation is a `pallas_call` or holds one (memoised per jaxpr)."""
    if eqn.primitive.name == "pallas_call":
        return True
    for jaxpr in inner:
        if id(jaxpr) not in memo:
            memo[id(jaxpr)] = False  # (a jaxpr does not hold itself)
            memo[id(jaxpr)] = any(
                _launches_kernel(e, list(_inner_jaxprs(e)), memo) for e in jaxpr.eqns
            )
        if memo[id(jaxpr)]:
            return True
    return False


def _program_call(traced: Any, detail: str = "") -> ProgramCall:
    """A traced call as listed, with the configuration a lookup gives it now (calls_in traces
    apart from real calls' traces, so the two agree); `detail` says why a call is listed as
    it is where that needs saying."""
    kernel = traced.kernel
    explained = kernel.explain(*traced.args, **dict(traced.kwargs))
    source, config = explained["source"], explained["config"]
    tunables = kernel.spec.tunables | {"interpret"}
    return ProgramCall(
        kernel=kernel.spec.name,
        signature=explained["key"]["signature"],
        static=explained["key"]["static"],
        source=source,
        config=config,
        args=traced.args,
        kwargs={k: v for k, v in traced.kwargs.items() if k not in tunables},
        mesh_axes=traced.mesh_axes,
        detail=detail,
        gathered=traced.gathered,
    )


def _whole_call(traced: Any) -> ProgramCall:
    """A call on a mesh's Auto axes, listed at its global shape: how XLA splits it is decided
    only when it compiles the program, which this host cannot (its arguments' mesh is not of
    this process's devices)."""
    detail = (
        "on a mesh's Auto axes: listed at its global shape, as XLA splits it only when it "
        "compiles the program; give the arguments shardings over a jax.sharding.Mesh of this "
        "host's devices (or over Explicit axes) to list each device's call"
    )
    return _program_call(traced, detail)
