"""Calls under `jax.jit` on a mesh whose axes are Auto (`jax.sharding.Mesh(devices, names)`, as
most model code builds it): each device runs the kernel on its own part.

On Auto axes the arrays' types name their mesh while jit traces, never how they are split: XLA's
partitioner decides that when it compiles the program, and it cannot split a Pallas call itself
(it would gather its operands). So the kernel's entry hands the call to it as an operation of
`jax.experimental.custom_partitioning`, told how the call splits by the kernel's `Split`:

- its sharding rule (Shardy's, JAX's default partitioner) names each dimension of each array by
  its letter in the Split; a letter that is not batch-like must be whole on every device;
- `partition`, which XLA calls while it compiles, with the shardings it chose, lays the call
  out with the same function as the Explicit path's shard_map (`split.lay_out`), says once per
  kernel, mesh and axis what it gathers, and traces the call at each device's shape: looked up,
  named for `calls_in` and recorded as a miss there, as inside a shard_map;
- the operation's body, which jit traces with the call, is the call at its global shape, for its
  output's type only: at the kernel's default configuration, nothing looked up or recorded;
- gradients: a custom VJP whose forward and backward are each such an operation; the backward
  runs the kernel's own VJP on each device's part and sums the cotangent of an array over the
  mesh axes of the batch-like axes it lacks (matmul's y, rows split), as a shard_map's transpose
  does. Where the kernel's VJP keeps only its inputs, XLA drops the forward the backward
  recomputes; flash attention's keeps its output, so its backward runs its forward again.

What `partition` traces is what runs, so a listing that wants each device's calls compiles the
program (autotune.runtime.calls). `partition` reads nothing of the caller's context (JAX 0.10
calls it on a thread of its own): what it needs, the call's options, the overlays active and
the listing in progress when the call was traced, travels in the operation's static argument.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.registry.split import ELLIPSIS, Layout, Split, lay_out
from autotune.runtime import overlays
from autotune.runtime import state as runtime_state
from autotune.runtime.sharded import (
    argument_names,
    dims_of,
    gathered_text,
    mesh_text,
    spec_of,
    warn_gathered,
)
from autotune.runtime.traced_calls import TracedCall, laid_out
from autotune.signature import call_shape

# The named scope each call handed to XLA's partitioner is traced in, and its backward's (the
# same number), and the call at its global shape by its scope: calls_in reads them.
PARTITIONED_SCOPE_PREFIX = "autotuned_partitioned_"
BACKWARD_SCOPE_PREFIX = "autotuned_partitioned_backward_"
PARTITIONED_CALLS: dict[str, TracedCall] = {}
_SCOPES: dict[tuple, str] = {}
# Per thread: whether an operation's body (the call at its global shape, for its type) is being
# traced, whose kernel calls run whole too (a variant group's member, a backward's kernels).
_BODY = threading.local()
# Per thread: whether a call under jax.vmap is being traced, which runs unsplit, as before.
_BATCHED = threading.local()


def auto_mesh(args: Sequence[Any], kwargs: dict[str, Any]) -> Any | None:
    """The mesh a call's arrays are on where its axes are all Auto and it has several devices
    (the abstract mesh jit's types name); None for any other call: on Explicit axes
    (autotune.runtime.sharded), inside a shard_map, on one device, with an array passed by
    keyword (a Split names positional arrays only), or batched by jax.vmap."""
    import jax

    if any(hasattr(v, "dtype") for v in kwargs.values()) or getattr(_BATCHED, "inside", False):
        return None
    for a in args:
        sharding = getattr(jax.typeof(a), "sharding", None) if hasattr(a, "dtype") else None
        mesh = getattr(sharding, "mesh", None)
        if mesh is not None and not mesh.empty:
            auto = all(kind == jax.sharding.AxisType.Auto for kind in mesh.axis_types)
            return mesh if auto and mesh.size > 1 else None
    return None


def warn_interpret_mode(kernel_name: str, mesh: Any) -> None:
    """Say once per kernel and mesh that a call on an Auto mesh in an interpret mode (TPU's or
    GPU's) runs at its global shape, its arrays gathered first: such a kernel cannot be traced
    inside XLA's partitioner (its ordered effects cannot lower there, JAX 0.10-0.12)."""
    runtime_state.warn_once(
        f"interpret mode {kernel_name} {mesh_text(mesh)}",
        f"{kernel_name}: on a mesh with Auto axes ({mesh_text(mesh)}) in an interpret mode "
        "(TPU's or GPU's), the call runs at its global shape, its arrays gathered first: "
        "XLA's partitioner cannot split a kernel run in an interpret mode. Use Pallas's plain "
        "interpreter (interpret=True) on a CPU, or a mesh with Explicit axes (jax.make_mesh).",
    )


def in_body() -> bool:
    """Whether an operation's body is being traced here: the call at its global shape, which
    gives its type and runs nowhere XLA splits it."""
    return getattr(_BODY, "inside", False)


@dataclass(frozen=True)
class Caller:
    """A call as its operations' static argument carries it to `partition`: its options, its
    positional arguments that are no arrays, how it splits, and the overlays and the listing in
    effect where it was traced. Equal calls share the operations' traces."""

    options: tuple  # (name, value) of each keyword argument, sorted
    statics: tuple  # (position, value) of each positional argument that is no array
    n_args: int
    split: Split | None  # over the positional arrays (None: gathered whole)
    arg_names: tuple[str, ...]  # of the positional arrays, as messages say them
    scope: str
    overlays: tuple
    listing: runtime_state.Listing | None

    def arguments(self, arrays: Sequence[Any]) -> tuple[tuple, dict[str, Any]]:
        """The call's (args, kwargs), `arrays` in the positions of its arrays."""
        fixed = dict(self.statics)
        given = iter(arrays)
        args = tuple(fixed[i] if i in fixed else next(given) for i in range(self.n_args))
        return args, dict(self.options)

    def split_of(self, backward: bool, n_outputs: int) -> Split | None:
        """How the forward (or backward) operation splits, the kernel's outputs being
        `n_outputs`: None where the kernel declares no Split or its outputs are not those its
        Split names."""
        if self.split is None or len(self.split.outputs) != n_outputs:
            return None
        return self.split.backward() if backward else self.split


def run(
    kernel: Any,
    arg_names: Sequence[str],
    mesh: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    local: Callable[[tuple, dict[str, Any]], Any],
    whole: Callable[[tuple, dict[str, Any]], Any],
    way: Any,
) -> Any:
    """`kernel`'s call of `args` on `mesh` (auto_mesh's), split by XLA's partitioner as the
    kernel's Split says: `local(args, kwargs)` runs each device's part (looked up there),
    `whole(args, kwargs)` is the call at its global shape (its type); `way` names how they run
    the kernel (its entry's trace, or the general path), each way with operations of its own."""
    positions = [i for i, a in enumerate(args) if hasattr(a, "dtype")]
    names = argument_names(arg_names, len(args))
    caller = Caller(
        options=tuple(sorted(kwargs.items())),
        statics=tuple((i, a) for i, a in enumerate(args) if i not in positions),
        n_args=len(args),
        split=_over_arrays(kernel.spec.split, positions, len(args)),
        arg_names=tuple(names[i] for i in positions),
        scope=_scope(kernel, args, kwargs, mesh),
        overlays=overlays.active_overlays(),
        listing=runtime_state.in_listing(),
    )
    call = _CALLS.get((kernel, way))
    if call is None:
        call = _CALLS[(kernel, way)] = _call(kernel.spec.name, local, whole)
    return call(caller, *(args[i] for i in positions))


_CALLS: dict[tuple, Callable] = {}


def local_parts(split: Split | None, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple:
    """Each device's part of `args` on an Auto mesh, laid out as `partition` lays out a call on
    arrays sharded as these are (their own shardings: arrays outside jit, or
    jax.ShapeDtypeStructs given one), as jax.ShapeDtypeStructs; `args` as they are elsewhere."""
    import jax
    from jax.sharding import NamedSharding

    named = [getattr(a, "sharding", None) for a in args if hasattr(a, "dtype")]
    meshes = [s.mesh for s in named if isinstance(s, NamedSharding)]
    if auto_mesh(args, kwargs) is None or not meshes:
        return tuple(args)
    positions = [i for i, a in enumerate(args) if hasattr(a, "dtype")]
    plan = lay_out(_over_arrays(split, positions, len(args)), [_dims(args[i]) for i in positions])
    parts = list(args)
    for i, dims in zip(positions, plan.inputs):
        parts[i] = jax.ShapeDtypeStruct(_local(args[i].shape, dims, meshes[0]), args[i].dtype)
    return tuple(parts)


def _over_arrays(split: Split | None, positions: list[int], n_args: int) -> Split | None:
    """`split` over the positional arrays only (a call may pass None, or a value, for some of
    the arguments it names); None where it names other arguments than the call has."""
    if split is None or len(split.inputs) != n_args:
        return None
    if len(positions) == n_args:
        return split
    inputs = [split.inputs[i] for i in positions]
    axes = f"{','.join(inputs)}->{','.join(split.outputs)}"
    along = "".join(c for c in split.along.replace(ELLIPSIS, "") if c in axes)
    if ELLIPSIS in split.along and ELLIPSIS in "".join(inputs):
        along = ELLIPSIS + along
    return Split(axes, along)


def _scope(kernel: Any, args: Sequence[Any], kwargs: dict[str, Any], mesh: Any) -> str:
    """The named scope of a call handed to the partitioner (one per distinct call and mesh),
    the call at its global shape noted for calls_in."""
    import jax

    key = (kernel.spec.name, kernel.spec.version, call_shape(args, kwargs), mesh_text(mesh))
    name = _SCOPES.get(key)
    if name is None:
        name = _SCOPES[key] = f"{PARTITIONED_SCOPE_PREFIX}{len(_SCOPES)}"

        def abstract(a: Any) -> Any:
            return jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "dtype") else a

        given = tuple(map(abstract, args))
        PARTITIONED_CALLS[name] = TracedCall(kernel, given, dict(kwargs), {}, {}, "")
    return name


def backward_scope(scope: str) -> str:
    """The scope of the backward of the call traced in `scope`."""
    return BACKWARD_SCOPE_PREFIX + scope.removeprefix(PARTITIONED_SCOPE_PREFIX)


def _call(
    kernel_name: str,
    local: Callable[[tuple, dict[str, Any]], Any],
    whole: Callable[[tuple, dict[str, Any]], Any],
) -> Callable:
    """The jitted `(caller, *arrays) -> outputs` of a kernel: a custom VJP over its forward and
    backward operations (jitted, so that an eager call is partitioned too), its outputs typed
    on the arrays' mesh."""
    import jax

    forward = _batchable(kernel_name, _operation(kernel_name, local, whole, False), local, False)
    backward = _batchable(kernel_name, _operation(kernel_name, local, whole, True), local, True)

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def call(caller: Caller, *arrays: Any) -> Any:
        with jax.named_scope(caller.scope):
            return forward(caller, *arrays)

    def call_fwd(caller: Caller, *arrays: Any) -> tuple[Any, tuple]:
        return call(caller, *arrays), arrays

    def call_bwd(caller: Caller, arrays: tuple, cotangent: Any) -> tuple:
        with jax.named_scope(backward_scope(caller.scope)):
            return tuple(backward(caller, *arrays, *jax.tree.leaves(cotangent)))

    call.defvjp(call_fwd, call_bwd)

    def on_mesh(caller: Caller, *arrays: Any) -> Any:
        # The operation's outputs (as a Pallas call's) are typed with no mesh: a kernel called
        # on them next would not see the Auto mesh. A sharding constraint that leaves every
        # dimension to the partitioner types them on the mesh again, at no collective's cost.
        mesh = auto_mesh(arrays, {})
        free = jax.sharding.PartitionSpec.UNCONSTRAINED
        return jax.tree.map(
            lambda o: jax.lax.with_sharding_constraint(
                o, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*[free] * o.ndim))
            ),
            call(caller, *arrays),
        )

    return jax.jit(on_mesh, static_argnums=(0,))


def _batchable(
    kernel_name: str,
    operation: Callable,
    local: Callable[[tuple, dict[str, Any]], Any],
    backward: bool,
) -> Callable:
    """`operation`, or under `jax.vmap` (which custom_partitioning cannot batch) the call as it
    ran before it was split: whole, looked up at its global shape, XLA gathering its arrays
    (said once per kernel and mesh)."""
    import jax

    def bind(caller: Caller, *values: Any) -> Any:
        @jax.custom_batching.custom_vmap
        def split(*values: Any) -> Any:
            return operation(caller, *values)

        @split.def_vmap
        def unsplit(axis_size: int, batched: list, *values: Any) -> tuple[Any, Any]:
            mesh = auto_mesh(values, {})
            runtime_state.warn_once(
                f"batched {kernel_name} {mesh_text(mesh)}",
                f"{kernel_name}: under jax.vmap on a mesh with Auto axes ({mesh_text(mesh)}) the "
                "call runs at its global shape, its arrays gathered first where sharded: XLA's "
                "partitioner cannot split a batched kernel. Call it on arrays with a batch axis "
                "instead (a Split's leading axes), or shard over Explicit axes (jax.make_mesh).",
            )
            before = getattr(_BATCHED, "inside", False)
            _BATCHED.inside = True
            try:
                axes = [0 if b else None for b in batched]
                out = jax.vmap(lambda *v: _body(caller, v, local, backward), in_axes=axes)(*values)
            finally:
                _BATCHED.inside = before
            return out, jax.tree.map(lambda _: True, out)

        return split(*values)

    return bind


def _body(caller: Caller, values: Sequence[Any], run: Callable, backward: bool) -> Any:
    """The call's outputs from its arrays (forward), or its arrays' cotangents from its arrays
    and its outputs' cotangents (backward: the kernel's own VJP), `run` calling the kernel."""
    import jax

    def forward(*arrays: Any) -> Any:
        return run(*caller.arguments(arrays))

    if not backward:
        return forward(*values)
    n = len(caller.arg_names)
    # jitted, so that a forward whose output the backward does not use is dead code as a
    # whole, and calls_in counts the kernel calls that run (`_live`)
    out, pullback = jax.vjp(jax.jit(forward), *values[:n])
    return tuple(pullback(jax.tree.unflatten(jax.tree.structure(out), values[n:])))


def _operation(
    kernel_name: str,
    local: Callable[[tuple, dict[str, Any]], Any],
    whole: Callable[[tuple, dict[str, Any]], Any],
    backward: bool,
) -> Callable:
    """A custom_partitioning operation `(caller, *arrays)`, the call's forward or backward
    (`_body`): traced whole at the global shape for its type, and by `partition` locally at
    each device's shape."""
    import jax
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.extend.core import jaxpr_as_fun
    from jax.sharding import NamedSharding

    @functools.partial(custom_partitioning, static_argnums=(0,))
    def operation(caller: Caller, *values: Any) -> Any:
        before = in_body()
        _BODY.inside = True
        try:
            return _body(caller, values, whole, backward)
        finally:
            _BODY.inside = before

    def split_of(caller: Caller, n_operands: int, n_results: int) -> Split | None:
        # a backward's operands are the arrays and one cotangent per output of the kernel
        n_outputs = n_operands - len(caller.arg_names) if backward else n_results
        return caller.split_of(backward, n_outputs)

    def partition(caller: Caller, mesh: Any, arg_shapes: tuple, result_shape: Any) -> tuple:
        results, tree = jax.tree.flatten(result_shape)
        n = len(arg_shapes)
        split = split_of(caller, n, len(results))
        # the operands first, then a batch-like axis a result is wanted split along (a
        # sharding the caller asked for, propagated back): slicing a replicated operand along
        # it costs no collective, and each device then computes only its part
        both = split and Split(
            f"{','.join(split.inputs + split.outputs)}->{','.join(split.outputs)}", split.along
        )
        plan = lay_out(both, [_dims(s) for s in (*arg_shapes, *results)])
        ins = plan.inputs[:n]
        outs = plan.inputs[n:] if split else [[()] * len(r.shape) for r in results]
        names = [*caller.arg_names, *["the cotangent"] * (n - len(caller.arg_names))]
        own = Layout(ins, None, plan.over, [g for g in plan.gathered if g[0] < n])
        gathered = gathered_text(own, names)
        warn_gathered(kernel_name, mesh_text(mesh), gathered)
        parts = [
            jax.ShapeDtypeStruct(_local(s.shape, d, mesh), s.dtype) for s, d in zip(arg_shapes, ins)
        ]
        # a backward's cotangent of an array that lacks an axis split is each device's part of
        # a sum over those mesh axes (matmul's dy, x's rows split)
        sums = split and backward and own.summed(split, [len(s.shape) for s in arg_shapes])

        def traced(*values: Any) -> Any:
            out = _body(caller, values, local, backward)
            return tuple(jax.lax.psum(g, s) if s else g for g, s in zip(out, sums)) if sums else out

        with (
            overlays.restored(caller.overlays),
            runtime_state.resumed(caller.listing),
            laid_out(dict(mesh.shape), gathered),  # run on each device, as a shard_map's
        ):
            closed = jax.make_jaxpr(traced, axis_env=list(mesh.shape.items()))(*parts)
        if caller.listing is not None:  # what this program's call runs as, for calls_in
            scope = backward_scope(caller.scope) if backward else caller.scope
            caller.listing.partitioned.setdefault(scope, _live(closed.jaxpr))
        fn = jaxpr_as_fun(closed)
        return (
            mesh,
            lambda *values: jax.tree.unflatten(tree, fn(*values)),
            jax.tree.unflatten(tree, [NamedSharding(mesh, spec_of(d)) for d in outs]),
            tuple(NamedSharding(mesh, spec_of(d)) for d in ins),
        )

    def infer(caller: Caller, mesh: Any, arg_shapes: tuple, result_shape: Any) -> Any:
        """GSPMD's question (Shardy reads the rule instead): the results' sharding."""
        results, tree = jax.tree.flatten(result_shape)
        split = split_of(caller, len(arg_shapes), len(results))
        plan = lay_out(split, [_dims(s) for s in arg_shapes])
        dims = plan.outputs or [[()] * len(r.shape) for r in results]
        return jax.tree.unflatten(tree, [NamedSharding(mesh, spec_of(d)) for d in dims])

    def rule(caller: Caller, mesh: Any, operands: list, results: list) -> tuple[str, dict]:
        split = split_of(caller, len(operands), len(results))
        return sharding_rule(split, _ranks(operands), _ranks(results))

    operation.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule)
    return operation


def sharding_rule(
    split: Split | None, in_ranks: Sequence[int], out_ranks: Sequence[int]
) -> tuple[str, dict]:
    """Shardy's rule for an operation split as `split` says ("m k, k n -> m n"), with its
    keywords: a factor that is not batch-like must be whole (need_replication_factors, in the
    order the factors first appear, as Shardy requires). No Split: every dimension its own
    factor, each whole."""
    if split is None or len(split.inputs) != len(in_ranks) or len(split.outputs) != len(out_ranks):
        ins = [[f"i{i}d{d}" for d in range(r)] for i, r in enumerate(in_ranks)]
        outs = [[f"o{j}d{d}" for d in range(r)] for j, r in enumerate(out_ranks)]
        batch: set[str] = set()
    else:
        in_names, out_names = split.names(list(in_ranks))
        # the ellipsis's dimensions are named "0", "1", ...: a factor's name starts with a letter
        factor = {n: n if n.isalpha() else f"e{n}" for names in in_names + out_names for n in names}
        ins = [[factor[n] for n in names] for names in in_names]
        outs = [[factor[n] for n in names] for names in out_names]
        batch = {f for n, f in factor.items() if split.parallel(n)}
    factors = list(dict.fromkeys(f for names in (*ins, *outs) for f in names))
    whole = tuple(f for f in factors if f not in batch)
    text = f"{', '.join(' '.join(n) for n in ins)} -> {', '.join(' '.join(n) for n in outs)}"
    return text, ({"need_replication_factors": whole} if whole else {})


def _live(jaxpr: Any) -> Any:
    """`jaxpr` without what computes none of its outputs, as XLA runs it: a backward's
    recomputed forward whose output it does not use (a VJP that keeps only its inputs; a
    Pallas call on its own is never dead code to JAX, the jit around it is)."""
    from jax._src.interpreters import partial_eval  # JAX's dead-code pass has no public name

    return partial_eval.dce_jaxpr(jaxpr, True)[0]


def _local(shape: Sequence[int], dims: Sequence[tuple[str, ...]], mesh: Any) -> tuple[int, ...]:
    """Each device's part of an array of `shape` split over `dims` (XLA pads an uneven one)."""
    return tuple(-(-n // math.prod(mesh.shape[a] for a in axes)) for n, axes in zip(shape, dims))


def _ranks(types: Sequence[Any]) -> list[int]:
    from jax.extend.mlir import ir

    return [ir.RankedTensorType(t).rank for t in types]


def _dims(shape: Any) -> list[tuple[str, ...]]:
    """The mesh axes each dimension of an operand or result is split over, as the partitioner
    says (a sharding over no named mesh: none)."""
    from jax.sharding import NamedSharding

    sharding = getattr(shape, "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return [()] * len(shape.shape)
    return dims_of(sharding.spec, len(shape.shape))
