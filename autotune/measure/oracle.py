"""The oracle: what a candidate's output is judged against, and which one a tuning run uses.

Two oracles, chosen per run and recorded on every trial (`oracle`):

- "interpret": the kernel at its default configuration in Pallas interpret mode, at the real
  shape, itself checked against the kernel's reference. A kernel without an `interpret`
  argument runs under its backend's interpret mode (GPU interpret for Mosaic GPU, TPU
  interpret otherwise).
- "reference": the kernel's plain-JAX reference at the real shape, computed by XLA where the
  search process runs, after the default configuration was checked under interpret mode at a
  reduced shape of the same structure (every dimension cut to at most REDUCED_DIM).

GPU interpret mode simulates every warpgroup and barrier of every tile step: 256^3 takes
seconds, 4096^3 would take hours. So a Mosaic GPU kernel whose inputs hold more than
GPU_INTERPRET_MAX_ELEMENTS is judged by the "reference" oracle, and must have a reference.
Other backends' interpret modes keep the "interpret" oracle at every shape, and so does a
kernel that takes `interpret` when tuned on a CPU: there every candidate runs in interpret
mode at the real shape anyway (the signature names no backend for it).

A kernel that Pallas interpret mode cannot run (`not_interpretable`: JAX's ragged paged
attention in TPU interpret mode) has no interpret oracle: on its own platform its reference
judges it at the real shape; on a host that would run it in interpret mode (a CPU) nothing
can, and tuning refuses in one line rather than storing unchecked results.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune import backends
from autotune.errors import KernelError
from autotune.measure.verify import compare
from autotune.signature import is_array

# The input elements (all array arguments together) up to which GPU interpret mode judges a
# Mosaic GPU kernel at the real shape: two 256x256 matrices.
GPU_INTERPRET_MAX_ELEMENTS = 2 * 256 * 256
REDUCED_DIM = 256  # each dimension of the reduced shape, at most


@dataclass(frozen=True)
class Oracle:
    """What candidates are compared with, and which oracle produced it."""

    output: Any
    name: str  # "interpret" or "reference"


def interpret_affordable(backend: str | None, args: Sequence[Any]) -> bool:
    """Whether interpret mode can judge a kernel of `backend` at these arguments' shapes."""
    if not backends.get(backend).slow_interpret:
        return True
    return sum(int(np.prod(a.shape)) for a in args if is_array(a)) <= GPU_INTERPRET_MAX_ELEMENTS


def reduced(args: Sequence[Any]) -> list[Any]:
    """The arguments cut to at most REDUCED_DIM along every dimension (leading slices, so
    dimensions that must agree across arguments still do)."""
    return [
        a[tuple(slice(0, min(d, REDUCED_DIM)) for d in a.shape)] if is_array(a) else a for a in args
    ]


def make_oracle(
    spec: Any,
    default: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    backend: str | None,
    device: Any = None,
) -> Oracle:
    """The oracle of a tuning run of a kernel of `backend` (see the module docstring; the
    call signature's `backend`) whose candidates run on `device` (a DeviceInfo; default: this
    process's); KernelError where the default configuration fails or disagrees with the
    reference, or where no oracle can judge."""
    if spec.not_interpretable is not None:
        return _reference_only(spec, default, args, kwargs, device)
    if interpret_affordable(backend, args):
        return Oracle(_checked_default(spec, default, args, kwargs), "interpret")
    if spec.reference is None:
        raise KernelError(
            f"{spec.name}: interpret mode cannot judge this shape in reasonable time and the "
            "kernel has no reference: register it with reference=..., or tune a smaller shape"
        )
    _checked_default(spec, default, reduced(args), kwargs)
    import jax

    # the kernel's output types, from a trace (nothing runs): the reference is cast to them
    out = jax.eval_shape(functools.partial(spec.interpreted(default), **kwargs), *args)
    expected = jax.jit(functools.partial(spec.reference, **kwargs))(*args)
    output = jax.tree_util.tree_map(lambda r, o: np.asarray(r).astype(o.dtype), expected, out)
    return Oracle(output, "reference")


def _reference_only(
    spec: Any,
    default: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    device: Any = None,
) -> Oracle:
    """The reference oracle of a kernel interpret mode cannot run, whose candidates run on
    `device`: on its own platform only (the reference computed here, by XLA)."""
    from autotune.device import current_device

    device = device or current_device()
    if device.interpret or spec.reference is None:
        where = (
            f"this {device.platform} host runs kernels in interpret mode"
            if device.interpret
            else "it has no reference"
        )
        raise KernelError(
            f"{spec.name} cannot be tuned here: {where}, and interpret mode cannot run it "
            f"({spec.not_interpretable}), so no oracle can check a candidate: tune it on its "
            "own platform (`autotune check` cross-lowers its candidates from this host)"
        )
    import jax

    out = jax.eval_shape(
        functools.partial(spec.bound_function(default, interpret=False), **kwargs), *args
    )
    expected = jax.jit(functools.partial(spec.reference, **kwargs))(*args)
    output = jax.tree_util.tree_map(lambda r, o: np.asarray(r).astype(o.dtype), expected, out)
    return Oracle(output, "reference")


def _describe(e: Exception) -> str:
    """The exception's message; for one without (a bare assert), its type and where it was
    raised."""
    if str(e):
        return str(e)
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return type(e).__name__
    f = frames[-1]
    return f"{type(e).__name__} at {f.filename}:{f.lineno}: {f.line}"


def _checked_default(
    spec: Any, default: Mapping[str, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """The kernel's output in interpret mode at its default configuration; checked against
    the kernel's plain-JAX reference when it has one."""
    import jax

    fn = functools.partial(spec.interpreted(default), **kwargs)
    try:
        output = jax.block_until_ready(jax.jit(fn)(*args))
    except Exception as e:
        raise KernelError(
            f"{spec.name} fails in interpret mode at its default configuration {dict(default)}: "
            f"{_describe(e)}"
        ) from e
    if spec.reference is not None:
        # jitted: one compile, where run op by op each of its operations compiles on its own
        reference = jax.jit(functools.partial(spec.reference, **kwargs))(*args)
        expected = jax.tree_util.tree_map(
            lambda r, o: np.asarray(r).astype(o.dtype), reference, output
        )
        verdict = compare(output, expected)
        if not verdict.ok:
            raise KernelError(
                f"{spec.name} at its default configuration disagrees with its reference: "
                f"{verdict.message}"
            )
    return output
