"""The calls that kernels' jitted entries traced, by the named scope each was traced in.

A kernel's entry traces each distinct call inside a `jax.named_scope` of its own name
(`traced_call_scope`). The scope's name stays on the operations of the entry's jaxpr, which jit
caches and reuses: so `autotune.calls_in` finds a call in a program's jaxpr whether or not this
trace ran it, and reads the call back from TRACED_CALLS.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.signature import call_shape, is_array


@dataclass(frozen=True)
class TracedCall:
    """A call that a kernel's jitted entry traced: arrays as jax.ShapeDtypeStruct."""

    kernel: Any  # the AutotunedKernel called
    args: tuple
    kwargs: dict[str, Any]
    mesh_axes: dict[str, int]  # the mesh axes the call is mapped over (mapped_axes), sizes
    config: dict[str, Any]  # the configuration the trace runs
    source: str  # where it came from (autotune.runtime.lookup.LOOKUP_ORDER, or "caller")


# Every call an entry traced in this process, by the name of the scope it was traced in.
TRACED_CALLS: dict[str, TracedCall] = {}
TRACED_SCOPE_PREFIX = "autotuned_call_"
_SCOPES: dict[tuple, str] = {}


def traced_call_scope(
    kernel: Any, args: Sequence[Any], kwargs: Mapping[str, Any], config: dict[str, Any], source: str
) -> contextlib.AbstractContextManager:
    """The named scope a kernel's entry traces a call in with `config` (one name per distinct
    call and configuration: a jaxpr that jit's caches hand back says what it runs)."""
    import jax

    mesh_axes = mapped_axes()
    try:
        ran = (json.dumps(config, sort_keys=True, default=str), source)
        key = (
            kernel.spec.name,
            kernel.spec.version,
            call_shape(args, kwargs),
            ran,
            *mesh_axes.items(),
        )
        name = _SCOPES.get(key)
    except TypeError:  # an unhashable static argument: not listed by calls_in
        return contextlib.nullcontext()
    if name is None:
        name = _SCOPES[key] = f"{TRACED_SCOPE_PREFIX}{len(_SCOPES)}"

        def abstract(a: Any) -> Any:  # no array (or tracer) outlives the call
            return jax.ShapeDtypeStruct(a.shape, a.dtype) if is_array(a) else a

        named = {k: abstract(v) for k, v in kwargs.items()}
        TRACED_CALLS[name] = TracedCall(
            kernel, tuple(map(abstract, args)), named, mesh_axes, dict(config), source
        )
    return jax.named_scope(name)


def mapped_axes() -> dict[str, int]:
    """The mesh axes this trace is mapped over (a `jax.shard_map`'s, or a sharded call's, manual
    axes), with their sizes: a call traced here runs on each device's part, at its local shape."""
    import jax

    mesh = jax.sharding.get_abstract_mesh()
    manual = jax.sharding.AxisType.Manual
    return {
        name: size
        for name, size, kind in zip(mesh.axis_names, mesh.axis_sizes, mesh.axis_types)
        if kind == manual
    }
