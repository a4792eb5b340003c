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
from types import ModuleType
from typing import Any

from autotune.backends import interpret, mosaic_gpu, mosaic_tpu, triton
from autotune.hardware import lowering_for
from autotune.platforms import PLATFORMS

# Each module holds one backend's facts under the same names: NAME, PLATFORM, MARKER (the
# jax._src.pallas module its compiler parameters and meshes come from), LOWERING_PLATFORM,
# TIMERS (best first), COMPILER_PARAMS and KNOBS, interpret_mode() and reset_interpret_state().
# Listed with each platform's default first.
MODULES: tuple[ModuleType, ...] = (interpret, mosaic_tpu, triton, mosaic_gpu)
BY_NAME = {m.NAME: m for m in MODULES}

# The backends a Pallas kernel may compile through on each platform, the default first.
PLATFORM_BACKENDS = {p: tuple(m.NAME for m in MODULES if p == m.PLATFORM) for p in PLATFORMS}
KNOWN = frozenset(BY_NAME)

# Recognition's precedence where a function traces to several backends: the Mosaic ones first,
# since a Mosaic kernel runs on a CPU only under its own interpret mode, which the backend picks.
RECOGNISED = (mosaic_gpu, mosaic_tpu, triton)


def default(platform: str) -> str:
    """The backend a kernel on `platform` compiles through unless it says otherwise (an unknown
    platform is its own)."""
    return PLATFORM_BACKENDS.get(platform, (platform,))[0]


def timers(platform: str) -> tuple[str, ...]:
    """The timers `platform`'s device has, best first (those of its default backend: a
    platform's backends share its device's clocks); the wall clock alone where unknown."""
    return BY_NAME.get(default(platform), interpret).TIMERS


def key_backend(declared: str | None, platform: str) -> str:
    """The backend a kernel's results on `platform` are stored under: its own where it runs
    on that platform; for a kernel that names none (a plain `pallas_call`) on a GPU, the one
    jax lowers it through there (`plain_gpu_backend`); else the platform's default (a Mosaic
    GPU kernel on a CPU runs in interpret mode)."""
    backends = PLATFORM_BACKENDS.get(platform, (platform,))
    if declared in backends:
        return declared
    if declared is None and platform == triton.PLATFORM:
        return plain_gpu_backend()
    return backends[0]


def plain_gpu_backend() -> str:
    """What a `pallas_call` without compiler parameters lowers through on a GPU: Mosaic GPU
    where jax's `jax_pallas_use_mosaic_gpu` is on (its default in jax 0.10), else Triton."""
    import jax

    on = getattr(jax.config, "jax_pallas_use_mosaic_gpu", False)
    return mosaic_gpu.NAME if on else triton.NAME


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
    `pallas_call`, None here, runs under either)."""
    return BY_NAME.get(backend, interpret).interpret_mode()


def reset_interpret_state(backend: str | None) -> None:
    """Clear what that interpret mode keeps after a kernel raised, for the next kernel."""
    BY_NAME.get(backend, interpret).reset_interpret_state()


def recognise(fn: Callable, args: Sequence[Any]) -> str | None:
    """The backend `fn(*args)` lowers through, read from the Pallas calls it traces to
    (their compiler parameters and meshes): "mosaic_gpu", "mosaic_tpu", "triton", or None
    where nothing says (a plain `pallas_call` runs on any platform's default: see
    `key_backend`)."""
    import jax

    found: set[ModuleType] = set()

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            for name, value in eqn.params.items():
                for v in value if isinstance(value, tuple) else (value,):
                    inner = getattr(v, "jaxpr", v)  # a ClosedJaxpr holds its Jaxpr
                    if hasattr(inner, "eqns"):
                        walk(inner)
                    elif name in ("compiler_params", "mesh", "meshes") and v is not None:
                        module = type(v).__module__
                        found.update(b for b in RECOGNISED if b.MARKER in module)

    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "dtype") else a for a in args]
    # kernels choose their compiler parameters by the platform they are lowered for: traced as
    # for a GPU, where the backends differ, whatever this host's device
    with lowering_for(triton.PLATFORM):
        walk(jax.make_jaxpr(fn)(*abstract).jaxpr)
    return next((b.NAME for b in RECOGNISED if b in found), None)
