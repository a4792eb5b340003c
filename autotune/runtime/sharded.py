"""Calls on sharded arrays under `jax.jit`: each device runs the kernel on its own part.

A Pallas call cannot be partitioned by XLA. Where a call's arrays are sharded over a mesh's
Explicit axes (`jax.make_mesh`'s default), their types say so while jit traces, so the kernel's
entry wraps the call in a `jax.shard_map` built from those shardings (`plan`, `run`): each
device's kernel is looked up and traced for its local shape, and the result keeps the sharding
of the batch-like axes. A kernel says which axes those are with `Split` (`@autotuned(split=...)`).
A sharding that cannot be kept (a contracted axis, or a kernel with no `Split`) is gathered
first: the call still runs, and says so once.

Why a shard_map and not `jax.experimental.custom_partitioning`: the entry sees the shardings
while jit traces it, so everything that reads a trace (the lookup, `calls_in`, recorded misses)
sees the local shapes without compiling; custom_partitioning decides only inside XLA's
partitioner, at compile time, has no autodiff rule (the kernels' custom VJPs would have to
move inside it), and traces the kernel at the global shape first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.registry.split import ELLIPSIS, Split
from autotune.runtime.state import warn_once


def _letters(axes: str, n_ellipsis: int) -> list[str]:
    """One name per dimension of an array whose axes are written `axes`, the ellipsis standing
    for `n_ellipsis` dimensions, named "0", "1", ... counted from the right."""
    head, dots, tail = axes.partition(ELLIPSIS)
    middle = [str(n_ellipsis - 1 - i) for i in range(n_ellipsis)] if dots else []
    return [*head, *middle, *tail]


def _n_ellipsis(split: Split, args: Sequence[Any]) -> int:
    """How many dimensions the ellipsis stands for in this call (0 where there is none)."""
    for axes, a in zip(split.inputs, args):
        if ELLIPSIS in axes:
            return max(len(a.shape) - len(axes.replace(ELLIPSIS, "")), 0)
    return 0


def _explicit_spec(x: Any) -> tuple[Any, list[tuple[str, ...]]] | None:
    """(its mesh, the Explicit mesh axes of each dimension) of an array sharded over a mesh's
    Explicit axes as jit traces it (or as it is, outside jit); None for any other value."""
    import jax

    sharding = getattr(jax.typeof(x), "sharding", None) if hasattr(x, "dtype") else None
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty:
        return None
    explicit = {
        name
        for name, kind in zip(mesh.axis_names, mesh.axis_types)
        if kind == jax.sharding.AxisType.Explicit
    }
    dims = [tuple(a for a in d if a in explicit) for d in _dims_of(sharding.spec, x.ndim)]
    return (mesh, dims) if any(dims) else None


def _dims_of(spec: Any, ndim: int) -> list[tuple[str, ...]]:
    """The mesh axes of each of `ndim` dimensions that a PartitionSpec names."""
    padded = list(spec) + [None] * (ndim - len(spec))
    return [(p,) if isinstance(p, str) else tuple(p or ()) for p in padded]


def _mesh_axes(axes: tuple[str, ...] | None) -> Any:
    """A PartitionSpec entry: None, one mesh axis, or a tuple of them."""
    return None if not axes else axes[0] if len(axes) == 1 else axes


@dataclass(frozen=True)
class Plan:
    """A sharded call's shard_map: its mesh, the specs of its arrays and outputs, and what it
    gathers first (each said as "x's axis 1 (over mesh axis 'd')")."""

    mesh: Any
    in_specs: tuple
    out_specs: Any
    gathered: tuple[str, ...]


def _gathered(name: str, d: int, axes: tuple[str, ...]) -> str:
    return f"{name}'s axis {d} (over mesh axis {', '.join(map(repr, axes))})"


def plan(split: Split | None, args: Sequence[Any], arg_names: Sequence[str]) -> Plan | None:
    """The shard_map for a call whose positional `args` are sharded over a mesh's Explicit
    axes; None where none is (a call outside jit's explicit sharding, or inside a
    `shard_map`, runs as it is)."""
    from jax.sharding import PartitionSpec as P

    specs = [_explicit_spec(a) for a in args]
    found = [s for s in specs if s is not None]
    if not found:
        return None
    names = [*arg_names, *(f"argument {i}" for i in range(len(arg_names), len(args)))]
    if split is None or len(split.inputs) != len(args):  # gathered whole
        gathered = [
            _gathered(names[i], d, axes)
            for i, s in enumerate(specs)
            for d, axes in enumerate(s[1] if s is not None else ())
            if axes
        ]
        return Plan(found[0][0], tuple(P() for _ in args), P(), tuple(gathered))

    n_ellipsis = _n_ellipsis(split, args)
    letters = [_letters(axes, n_ellipsis) for axes in split.inputs]
    chosen: dict[str, tuple[str, ...]] = {}  # letter -> the mesh axes it is split over
    gathered = []
    for i, s in enumerate(specs):
        for d, axes in enumerate(s[1] if s is not None else ()):
            letter = letters[i][d]
            if not axes or chosen.get(letter) == axes:
                continue
            taken = {a for used in chosen.values() for a in used}
            if split.parallel(letter) and letter not in chosen and not taken & set(axes):
                chosen[letter] = axes
            else:  # contracted, split otherwise by another array, or its mesh axis taken
                gathered.append(_gathered(names[i], d, axes))

    def spec(dims: list[str]) -> Any:
        return P(*(_mesh_axes(chosen.get(n)) for n in dims))

    outs = [spec(_letters(axes, n_ellipsis)) for axes in split.outputs]
    return Plan(
        found[0][0],
        tuple(spec(dims) for dims in letters),
        outs[0] if len(outs) == 1 else tuple(outs),
        tuple(gathered),
    )


def run(kernel_name: str, p: Plan, call: Callable[..., Any], args: Sequence[Any]) -> Any:
    """`call(*local_args)` on each device's part of `args`, laid out as `p` says, the result
    sharded as `p.out_specs`; what `p` gathers is said once per kernel and axis."""
    import jax
    from jax.sharding import NamedSharding

    for what in p.gathered:
        warn_once(
            f"sharded {kernel_name} {what}",
            f"{kernel_name}: {what} is gathered first: the kernel cannot split along it so "
            "(a contracted axis, or one another argument splits otherwise). Shard the call's "
            "batch-like axes to keep it sharded.",
        )

    def laid_out(a: Any, spec: Any) -> Any:
        if not hasattr(a, "dtype") or _dims(a) == _dims_of(spec, a.ndim):
            return a
        return jax.sharding.reshard(a, NamedSharding(p.mesh, spec))

    # A shard_map also where everything is gathered: Pallas's interpreter cannot mix arrays
    # typed with an explicit mesh and arrays of its own. check_vma off, as Pallas's
    # interpreter cannot run under it (docs/architecture.md, known limits); the transpose
    # then sums the cotangent of an array that is the same on every device itself.
    mapped = jax.shard_map(
        call, mesh=p.mesh, in_specs=p.in_specs, out_specs=p.out_specs, check_vma=False
    )
    return mapped(*map(laid_out, args, p.in_specs))


def local_parts(p: Plan, args: Sequence[Any]) -> tuple:
    """Each device's part of `args`, as `run` lays them out, as jax.ShapeDtypeStructs."""
    import jax

    def part(a: Any, spec: Any) -> Any:
        if not hasattr(a, "dtype"):
            return a
        dims = _dims_of(spec, a.ndim)
        shape = [
            n // math.prod(p.mesh.shape[name] for name in axes) for n, axes in zip(a.shape, dims)
        ]
        return jax.ShapeDtypeStruct(tuple(shape), a.dtype)

    return tuple(map(part, args, p.in_specs))


def _dims(x: Any) -> list[tuple[str, ...]]:
    """The Explicit mesh axes of each dimension of `x` (none where it has none)."""
    explicit = _explicit_spec(x)
    return explicit[1] if explicit is not None else [()] * x.ndim
