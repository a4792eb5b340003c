"""Pallas calls inside `jax.shard_map`: the mesh axes a value varies over.

With shard_map's default `check_vma=True`, a `pallas_call` must say how its output varies over
the mesh's manual axes: its out_shape's `jax.ShapeDtypeStruct` carries them, in the field JAX
0.10 to 0.12 call `manual_axis_type` (a `jax.sharding.ManualAxisType`; releases before 0.10,
which this package does not support, called it `vma`). Written here once, for every kernel.
Outside shard_map the axes are empty and JAX ignores them.

A kernel computes each output from all its inputs, so an output varies over every axis any input
varies over (`out_struct`). For gradients the inputs must agree too (`vary_alike`): a custom VJP
returns one cotangent per input of that input's type, and a weight that is the same on every
device (invariant) gets a cotangent that differs per device until it is summed. Casting the
weight to varying before the kernel makes JAX insert that sum, as the cast's transpose.
A cast adds no work: it changes the type, not the data.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jax

# jax is imported in each function: `import autotune` loads no jax (tests/test_tune_settings.py)


def varying_axes(x: Any) -> frozenset:
    """The mesh axes along which `x` (an array or tracer) differs from device to device."""
    import jax

    mat = getattr(jax.typeof(x), "manual_axis_type", None)
    return frozenset() if mat is None else frozenset(mat.varying)


def _union(inputs: Sequence[Any]) -> frozenset:
    return frozenset().union(*(varying_axes(x) for x in inputs if hasattr(x, "dtype")))


def out_struct(shape: Sequence[int], dtype: Any, *inputs: Any) -> jax.ShapeDtypeStruct:
    """The `jax.ShapeDtypeStruct` of a Pallas call's output computed from `inputs`: varying
    over every mesh axis that any input varies over (inside `jax.shard_map`), the plain
    struct elsewhere. Use it as `out_shape` so the kernel runs under check_vma=True."""
    import jax

    mat = jax.sharding.ManualAxisType(varying=_union(inputs))
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=mat)


def vary_alike(*arrays: Any) -> tuple:
    """`arrays` cast to vary over the same mesh axes (the union of theirs); values unchanged.
    Non-arrays pass through. Outside shard_map this returns the arrays as they are."""
    axes = _union(arrays)
    return tuple(_vary(a, axes) if hasattr(a, "dtype") else a for a in arrays)


def vary_like(out: Any, *inputs: Any) -> Any:
    """Every array in the pytree `out` cast to vary over the mesh axes `inputs` vary over: for
    a kernel whose output type lost them (Mosaic GPU's `plgpu.kernel` traces with check_vma
    off in JAX 0.10-0.12, so its outputs come back typed as the same on every device)."""
    import jax

    axes = _union(inputs)
    return jax.tree.map(lambda a: _vary(a, axes), out)


def unchecked(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` for a kernel written without manual axes: JAX's own kernels, called
    unedited, give their `pallas_call` a plain out_shape, which shard_map's check_vma refuses.
    It is traced with the check off, as Mosaic GPU's `plgpu.kernel` traces itself, and its
    output cast back to vary over its inputs' axes (`vary_like`). The check is a JAX config
    that only jax._src exposes (JAX 0.10 to 0.12): where it is gone, the call runs as is."""
    from jax._src import config

    check = getattr(config, "_check_vma", None)
    with check(False) if check is not None else contextlib.nullcontext():
        out = fn(*args, **kwargs)
    return vary_like(out, *args, *kwargs.values())


def _vary(x: Any, axes: frozenset) -> Any:
    import jax

    missing = tuple(sorted(axes - varying_axes(x), key=str))
    return jax.lax.pcast(x, missing, to="varying") if missing else x
