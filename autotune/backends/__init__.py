"""Pallas backends: which one a kernel compiles through on each platform, and its facts.

The device says which platform this is; the backend is a property of the kernel: on a GPU a
Pallas kernel lowers through Triton or through Mosaic GPU. A kernel declares its backend
(`autotuned(..., backend="mosaic_gpu")`) or it is recognised from what it traces to
(`recognise`). The backend is part of every tuning key, so an entry tuned for one backend is
never served to another.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from autotune.backends import mosaic_gpu, mosaic_tpu

# The backends a Pallas kernel may compile through on each platform, the default first. On
# the CPU there is no compiler for Pallas: kernels run in interpret mode.
PLATFORM_BACKENDS = {
    "cpu": ("interpret",),
    "tpu": ("mosaic_tpu",),
    "gpu": ("triton", "mosaic_gpu"),
}
KNOWN = frozenset(b for bs in PLATFORM_BACKENDS.values() for b in bs)


def key_backend(declared: str | None, platform: str) -> str:
    """The backend a kernel's results on `platform` are stored under: its own where it runs
    on that platform, else the platform's default (a Mosaic GPU kernel on a CPU runs in
    interpret mode)."""
    backends = PLATFORM_BACKENDS.get(platform, (platform,))
    return declared if declared in backends else backends[0]


def check_declared(name: str, backend: str | None) -> None:
    from autotune.errors import KernelError

    if backend is not None and backend not in KNOWN - {"interpret"}:
        raise KernelError(
            f"{name}: unknown backend {backend!r}: use one of "
            f"{', '.join(sorted(KNOWN - {'interpret'}))}, or leave it out to recognise it"
        )


def interpret_mode(backend: str | None) -> contextlib.AbstractContextManager:
    """The interpret mode that runs a kernel of `backend` without an `interpret` argument on
    a CPU: GPU interpret mode for Mosaic GPU, TPU interpret mode otherwise (a plain
    `pallas_call` runs under either)."""
    return (mosaic_gpu if backend == mosaic_gpu.NAME else mosaic_tpu).interpret_mode()


def reset_interpret_state(backend: str | None) -> None:
    """Clear what that interpret mode keeps after a kernel raised, for the next kernel."""
    (mosaic_gpu if backend == mosaic_gpu.NAME else mosaic_tpu).reset_interpret_state()


def recognise(fn: Callable, args: Sequence[Any]) -> str | None:
    """The backend `fn(*args)` lowers through, read from the Pallas calls it traces to
    (their compiler parameters and meshes): "mosaic_gpu", "mosaic_tpu", "triton", or None
    where nothing says (a plain `pallas_call` runs on any backend's default)."""
    import jax

    found: set[str] = set()

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            for name, value in eqn.params.items():
                for v in value if isinstance(value, tuple) else (value,):
                    inner = getattr(v, "jaxpr", v)  # a ClosedJaxpr holds its Jaxpr
                    if hasattr(inner, "eqns"):
                        walk(inner)
                    elif name in ("compiler_params", "mesh", "meshes") and v is not None:
                        module = type(v).__module__
                        found.update(b for marker, b in _MARKERS if marker in module)

    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "dtype") else a for a in args]
    walk(jax.make_jaxpr(fn)(*abstract).jaxpr)
    for backend in ("mosaic_gpu", "mosaic_tpu", "triton"):
        if backend in found:
            return backend
    return None


# Where each backend's compiler parameters and meshes live in jax._src.pallas.
_MARKERS = (
    ("pallas.mosaic_gpu", "mosaic_gpu"),
    ("pallas.mosaic.", "mosaic_tpu"),
    ("pallas.triton", "triton"),
)
