"""The calls that kernels' jitted entries traced, by the named scope each was traced in.

A kernel's entry traces each distinct call inside a `jax.named_scope` of its own name
(`traced_call_scope`). The scope's name stays on the operations of the entry's jaxpr, which jit
caches and reuses: so `autotune.calls_in` finds a call in a program's jaxpr whether or not this
trace ran it, and reads the call back from TRACED_CALLS. A call that runs on each device's part
of its arrays is traced at its local shape, and noted with the mesh axes it is mapped over and
what its layout gathered first (`laid_out`).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
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
    # what the call's layout gathered to every device first ("x's axis 1 (over mesh axis 'd')")
    gathered: tuple[str, ...] = ()


# Every call an entry traced in this process, by the name of the scope it was traced in.
TRACED_CALLS: dict[str, TracedCall] = {}
TRACED_SCOPE_PREFIX = "autotuned_call_"
_SCOPES: dict[tuple, str] = {}
# Per thread: the layout of the call being traced for each device's part (laid_out).
_LAYOUT = threading.local()


@contextlib.contextmanager
def laid_out(axes: Mapping[str, int] | None, gathered: tuple[str, ...]) -> Iterator[None]:
    """Within: calls traced are each device's part of a call that gathered `gathered` first,
    mapped over `axes` (mesh axes and sizes), or over the trace's own manual axes where `axes`
    is None (a shard_map's). XLA's partitioner traces each device's call outside any shard_map,
    with no mesh in sight (autotune.runtime.partitioned): it passes the axes."""
    before = getattr(_LAYOUT, "value", None)
    _LAYOUT.value = (None if axes is None else dict(axes), tuple(gathered))
    try:
        yield
    finally:
        _LAYOUT.value = before


def traced_call_scope(
    kernel: Any, args: Sequence[Any], kwargs: Mapping[str, Any], config: dict[str, Any], source: str
) -> contextlib.AbstractContextManager:
    """The named scope a kernel's entry traces a call in with `config` (one name per distinct
    call and configuration: a jaxpr that jit's caches hand back says what it runs)."""
    import jax

    mesh_axes = mapped_axes()
    gathered = _layout()[1]
    try:
        ran = (json.dumps(config, sort_keys=True, default=str), source)
        key = (
            kernel.spec.name,
            kernel.spec.version,
            call_shape(args, kwargs),
            ran,
            gathered,
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
            kernel, tuple(map(abstract, args)), named, mesh_axes, dict(config), source, gathered
        )
    return jax.named_scope(name)


def mapped_axes() -> dict[str, int]:
    """The mesh axes this trace is mapped over (a `jax.shard_map`'s, or a sharded call's, manual
    axes), with their sizes: a call traced here runs on each device's part, at its local shape."""
    import jax

    axes = _layout()[0]
    if axes is not None:
        return dict(axes)
    mesh = jax.sharding.get_abstract_mesh()
    manual = jax.sharding.AxisType.Manual
    return {
        name: size
        for name, size, kind in zip(mesh.axis_names, mesh.axis_sizes, mesh.axis_types)
        if kind == manual
    }


def _layout() -> tuple[dict[str, int] | None, tuple[str, ...]]:
    return getattr(_LAYOUT, "value", None) or (None, ())
