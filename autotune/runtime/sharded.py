"""Calls on sharded arrays under `jax.jit`: each device runs the kernel on its own part.

A Pallas call cannot be partitioned by XLA. Where a call's arrays are sharded over a mesh's
Explicit axes (`jax.make_mesh`'s default), their types say so while jit traces, so the kernel's
entry wraps the call in a `jax.shard_map` built from those shardings (`plan`, `run`): each
device's kernel is looked up and traced for its local shape, and the result keeps the sharding
of the batch-like axes. A kernel says which axes those are with `Split` (`@autotuned(split=...)`),
and `split.lay_out` decides the layout from it, as it does for a mesh's Auto axes, where XLA's
partitioner asks (autotune.runtime.partitioned). A sharding that cannot be kept (a contracted
axis, or a kernel with no `Split`) is gathered first: the call still runs, and says so once.

On Explicit axes a shard_map rather than `jax.experimental.custom_partitioning` (which Auto
axes need): the entry sees the shardings while jit traces it, so everything that reads a trace
(the lookup, `calls_in`, recorded misses) sees the local shapes without compiling, and
gradients need nothing more (a shard_map transposes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.registry.split import Layout, Split, lay_out
from autotune.registry.varying import varying_axes
from autotune.runtime import traced_calls
from autotune.runtime.state import warn_once


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
    dims = [tuple(a for a in d if a in explicit) for d in dims_of(sharding.spec, x.ndim)]
    return (mesh, dims) if any(dims) else None


def dims_of(spec: Any, ndim: int) -> list[tuple[str, ...]]:
    """The mesh axes of each of `ndim` dimensions that a PartitionSpec names."""
    padded = list(spec) + [None] * (ndim - len(spec))
    return [(p,) if isinstance(p, str) else tuple(p or ()) for p in padded]


def spec_of(dims: Sequence[tuple[str, ...]]) -> Any:
    """The PartitionSpec of an array whose dimensions are split over `dims` (mesh axes each)."""
    from jax.sharding import PartitionSpec as P

    return P(*(None if not axes else axes[0] if len(axes) == 1 else axes for axes in dims))


@dataclass(frozen=True)
class Plan:
    """A sharded call's shard_map: its mesh, the specs of its arrays and outputs, and what it
    gathers first (each said as "x's axis 1 (over mesh axis 'd')")."""

    mesh: Any
    in_specs: tuple
    out_specs: Any
    gathered: tuple[str, ...]


def gathered_text(layout: Layout, names: Sequence[str]) -> tuple[str, ...]:
    """What a layout gathers, each said as "x's axis 1 (over mesh axis 'd')"."""
    return tuple(
        f"{names[i]}'s axis {d} (over mesh axis {', '.join(map(repr, axes))})"
        for i, d, axes in layout.gathered
    )


def argument_names(arg_names: Sequence[str], n: int) -> list[str]:
    """The names of a call's `n` positional arguments, as messages say them."""
    return [*arg_names, *(f"argument {i}" for i in range(len(arg_names), n))][:n]


def warn_gathered(kernel_name: str, mesh: str, gathered: Sequence[str]) -> None:
    """Say once per kernel, mesh and axis that a call gathers an axis before it runs."""
    for what in gathered:
        warn_once(
            f"gathered {kernel_name} {mesh} {what}",
            f"{kernel_name}: {what} is gathered first on the mesh ({mesh}): the kernel cannot "
            "split along it so (a contracted axis, or one another argument splits otherwise). "
            "Shard the call's batch-like axes to keep it sharded.",
        )


def mesh_text(mesh: Any) -> str:
    """A mesh as messages say it: "d=4", "data=2,model=2"."""
    return ",".join(f"{name}={size}" for name, size in mesh.shape.items())


def plan(split: Split | None, args: Sequence[Any], arg_names: Sequence[str]) -> Plan | None:
    """The shard_map for a call whose positional `args` are sharded over a mesh's Explicit
    axes; None where none is (a call outside jit's explicit sharding, or inside a
    `shard_map`, runs as it is)."""
    from jax.sharding import PartitionSpec as P

    specs = [_explicit_spec(a) for a in args]
    found = [s for s in specs if s is not None]
    if not found:
        return None
    layout = lay_out(split, [_dims(a) if hasattr(a, "dtype") else None for a in args])
    gathered = gathered_text(layout, argument_names(arg_names, len(args)))
    in_specs = tuple(map(spec_of, layout.inputs))
    if layout.outputs is None:  # gathered whole
        return Plan(found[0][0], in_specs, P(), gathered)
    outs = [spec_of(dims) for dims in layout.outputs]
    return Plan(found[0][0], in_specs, outs[0] if len(outs) == 1 else tuple(outs), gathered)


def run(kernel_name: str, p: Plan, call: Callable[..., Any], args: Sequence[Any]) -> Any:
    """`call(*local_args)` on each device's part of `args`, laid out as `p` says, the result
    sharded as `p.out_specs`; what `p` gathers is said once per kernel and axis."""
    import jax
    from jax.sharding import NamedSharding

    warn_gathered(kernel_name, mesh_text(p.mesh), p.gathered)

    def placed(a: Any, spec: Any) -> Any:
        if not hasattr(a, "dtype") or _dims(a) == dims_of(spec, a.ndim):
            return a
        return jax.sharding.reshard(a, NamedSharding(p.mesh, spec))

    # A shard_map also where everything is gathered: Pallas's interpreter cannot mix arrays
    # typed with an explicit mesh and arrays of its own. check_vma off, as Pallas's
    # interpreter cannot run under it (docs/architecture.md, known limits); the transpose
    # then sums the cotangent of an array that is the same on every device itself.
    mapped = jax.shard_map(
        call, mesh=p.mesh, in_specs=p.in_specs, out_specs=p.out_specs, check_vma=False
    )
    with traced_calls.laid_out(None, p.gathered):  # the calls it traces are noted so
        return mapped(*map(placed, args, p.in_specs))


def warn_plain_interpreter(kernel_name: str, args: Sequence[Any]) -> None:
    """Say once what to do where Pallas's plain interpreter runs a call inside a
    `jax.shard_map` with check_vma=True (its arrays' types vary over manual axes): in JAX 0.10
    to 0.12 the program then fails to lower, in JAX's code, long after this trace, with
    nothing of this package on the stack ("Primitive div requires varying manual axes to
    match", "Scan carry ... mismatched varying manual axes", "while_loop body function carry
    input and carry output must have equal types"). A warning, not an error: a kernel whose
    forward is never lowered (dead code) runs, and a JAX release may lift the limit."""
    axes = tuple(sorted(frozenset().union(*(varying_axes(a) for a in args if hasattr(a, "dtype")))))
    if not axes:
        return
    warn_once(
        "plain interpreter under check_vma",
        f"{kernel_name}: Pallas's plain interpreter (interpret=True, a CPU's) cannot run inside "
        "jax.shard_map with check_vma=True in JAX 0.10 to 0.12: lowering the step fails "
        "with 'requires varying manual axes to match' (or a scan's or while_loop's carry "
        "types that differ). On a CPU, run the step under "
        "jax.experimental.pallas.tpu.force_tpu_interpret_mode(), and differentiate with respect "
        f"to jax.lax.pcast(params, {axes!r}, to='varying') inside the shard_map (each device's "
        "gradients, reduced outside: no collective in the program), or pass check_vma=False "
        "to jax.shard_map. On a GPU or TPU nothing is needed.",
    )


def local_parts(p: Plan, args: Sequence[Any]) -> tuple:
    """Each device's part of `args`, as `run` lays them out, as jax.ShapeDtypeStructs."""
    import jax

    def part(a: Any, spec: Any) -> Any:
        if not hasattr(a, "dtype"):
            return a
        dims = dims_of(spec, a.ndim)
        shape = [
            n // math.prod(p.mesh.shape[name] for name in axes) for n, axes in zip(a.shape, dims)
        ]
        return jax.ShapeDtypeStruct(tuple(shape), a.dtype)

    return tuple(map(part, args, p.in_specs))


def _dims(x: Any) -> list[tuple[str, ...]]:
    """The Explicit mesh axes of each dimension of `x` (none where it has none)."""
    explicit = _explicit_spec(x)
    return explicit[1] if explicit is not None else [()] * x.ndim
