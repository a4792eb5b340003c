"""Pallas backends: which one a kernel compiles through on each platform, and its facts.

The device says which platform this is; the backend is a property of the kernel: on a GPU a
Pallas kernel lowers through Triton or through Mosaic GPU. A kernel declares its backend
(`autotuned(..., backend="mosaic_gpu")`) or it is recognised from what it traces to
(`recognise`). The backend is part of every tuning key, so an entry tuned for one backend is
never served to another.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from autotune.backends import interpret, mosaic_gpu, mosaic_tpu, triton
from autotune.backends.hardware import next_pow2
from autotune.backends.platforms import PLATFORMS, platform_of


def _no_cache(device_kind: str) -> int:
    return 0


def _any_kind(device_kind: str) -> str | None:
    return None


def _not_pinned(index: int, env: Mapping[str, str]) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Backend:
    """One Pallas backend's facts: what the rest of the package asks of a platform, answered
    here instead of by `platform == "gpu"` tests. Each backend module states them under the
    same names (`Backend.of`); those with defaults only where they differ."""

    name: str  # NAME: how keys and kernels name it
    title: str  # TITLE: how messages name it
    platform: str  # PLATFORM: the device platform it compiles for (cpu, tpu, gpu)
    marker: str | None  # MARKER: the jax._src.pallas module its compiler params come from
    lowering_platform: str | None  # LOWERING_PLATFORM: lowered on this host for it (None: not)
    timers: tuple[str, ...]  # TIMERS: best first
    compiler_params: str | None  # COMPILER_PARAMS: the class its knobs go in
    knobs: tuple[str, ...]  # KNOBS: compiler parameters a space may tune
    interpret_mode: Callable[[], contextlib.AbstractContextManager]
    reset_interpret_state: Callable[[], None]
    # SLOW_INTERPRET: its interpret mode simulates the device (threads, barriers), too slow to
    # judge candidates at every shape (autotune.measure.oracle)
    slow_interpret: bool = False
    # POW2_BLOCKS: its blocks are powers of two (whole_block, clamp_block)
    pow2_blocks: bool = False
    # STICKY_FAULTS: a kernel that fails at run time leaves the process's device unusable
    # (a CUDA fault), so a device worker is replaced after one (autotune.tuning.worker.parent)
    sticky_faults: bool = False
    # KIND_PREFIX: how its platform's device kinds begin ("TPU v5 lite"; "": any)
    kind_prefix: str = ""
    # DEFAULT_KIND: the device whose limits constraints assume where none is named (a check
    # on a host without the device: autotune.measure.lowering)
    default_kind: str = ""
    # unknown_kind(device_kind): why a device kind named by a user is not one of its chips
    # this project knows (None: it is, or the backend takes any)
    unknown_kind: Callable[[str], str | None] = _any_kind
    # cache_bytes(device_kind): the cache a repeated call's inputs could stay in between
    # timed calls, so timing rotates copies of smaller inputs (autotune.measure.timing)
    cache_bytes: Callable[[str], int] = _no_cache
    # pinned_env(index, env): the environment that gives a process its platform's local device
    # `index` alone, `env` the host's (a CPU's forced host devices share one process: none)
    pinned_env: Callable[[int, Mapping[str, str]], dict[str, str]] = _not_pinned

    @classmethod
    def of(cls, module: ModuleType) -> Backend:
        return cls(
            name=module.NAME,
            title=module.TITLE,
            platform=module.PLATFORM,
            marker=module.MARKER,
            lowering_platform=module.LOWERING_PLATFORM,
            timers=module.TIMERS,
            compiler_params=module.COMPILER_PARAMS,
            knobs=module.KNOBS,
            interpret_mode=module.interpret_mode,
            reset_interpret_state=module.reset_interpret_state,
            slow_interpret=getattr(module, "SLOW_INTERPRET", False),
            pow2_blocks=getattr(module, "POW2_BLOCKS", False),
            sticky_faults=getattr(module, "STICKY_FAULTS", False),
            kind_prefix=getattr(module, "KIND_PREFIX", ""),
            default_kind=getattr(module, "DEFAULT_KIND", ""),
            unknown_kind=getattr(module, "unknown_kind", _any_kind),
            cache_bytes=getattr(module, "cache_bytes", _no_cache),
            pinned_env=getattr(module, "pinned_env", _not_pinned),
        )


# The backend modules, each platform's default first.
MODULES: tuple[ModuleType, ...] = (interpret, mosaic_tpu, triton, mosaic_gpu)
BACKENDS: tuple[Backend, ...] = tuple(Backend.of(m) for m in MODULES)
BY_NAME = {b.name: b for b in BACKENDS}

# The backends a Pallas kernel may compile through on each platform, the default first.
PLATFORM_BACKENDS = {p: tuple(b.name for b in BACKENDS if p == b.platform) for p in PLATFORMS}
KNOWN = frozenset(BY_NAME)

# Recognition's precedence where a function traces to several backends: the Mosaic ones first,
# since a Mosaic kernel runs on a CPU only under its own interpret mode, which the backend picks.
RECOGNISED = tuple(BY_NAME[m.NAME] for m in (mosaic_gpu, mosaic_tpu, triton))


def default(platform: str) -> str:
    """The backend a kernel on `platform` compiles through unless it says otherwise (an unknown
    platform is its own)."""
    return PLATFORM_BACKENDS.get(platform, (platform,))[0]


def of_platform(platform: str) -> Backend:
    """The default backend of `platform`, whose facts are the device's (a platform's backends
    share its clocks and caches); the interpreter's where the platform is unknown."""
    return BY_NAME.get(default(platform), BY_NAME[interpret.NAME])


def pinned_env(index: int, env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a worker process pinned to local device `index`, whichever platform
    it finds (each platform's settings leave the others' devices alone). A process that still
    sees several devices (a CPU's forced host devices) takes device `index` itself."""
    pinned: dict[str, str] = {}
    for platform in PLATFORMS:
        pinned.update(of_platform(platform).pinned_env(index, env))
    return pinned


def get(name: str | None) -> Backend:
    """The backend named `name`; the interpreter's for None (a plain `pallas_call`)."""
    return BY_NAME.get(name, BY_NAME[interpret.NAME])


def timers(platform: str) -> tuple[str, ...]:
    """The timers `platform`'s device has, best first; the wall clock alone where unknown."""
    return of_platform(platform).timers


def interprets(platform: str) -> bool:
    """Whether Pallas kernels on `platform` run only in interpret mode (a CPU's)."""
    return default(platform) == interpret.NAME


def whole_block(dim: int, platform: str) -> int:
    """The block that holds a whole dimension on `platform`: the dimension itself, or where
    the platform's blocks are powers of two (Triton's), the power of two that covers it."""
    return next_pow2(dim) if of_platform(platform).pow2_blocks else dim


def clamp_block(block: int, dim: int, platform: str) -> int:
    """A block no larger than its dimension needs (`whole_block`)."""
    return min(block, whole_block(dim, platform))


def kernel_platform(interpret: bool) -> str:
    """The platform a kernel lays its blocks out for (and picks its compiler parameters for):
    "cpu" in interpret mode, else the platform it is being lowered for (`lowering_for`), else
    the default backend's ("tpu", "gpu")."""
    if interpret:
        return "cpu"
    import jax

    return _LOWERING_FOR.get() or platform_of(jax.default_backend())


_LOWERING_FOR: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "lowering_for", default=None
)


@contextlib.contextmanager
def lowering_for(platform: str, device_kind: str | None = None) -> Iterator[None]:
    """Trace kernels for `platform` ("tpu", "gpu") whatever this host's device: what lowering
    for another platform on a CPU-only host needs (`autotune.measure.lowering`). For a GPU, the
    lowering is also told which one (`device_kind`, default the platform's DEFAULT_KIND): JAX
    0.11+ lowers Pallas-Triton only for a GPU it can name, the host's or the abstract device
    of the abstract mesh in effect (`jax.sharding.use_abstract_mesh`); where no mesh is in
    effect, an empty one naming that GPU is (`gpu_abstract_mesh`)."""
    token = _LOWERING_FOR.set(platform)
    try:
        with contextlib.ExitStack() as stack:
            if platform == triton.PLATFORM:
                mesh = gpu_abstract_mesh(device_kind or of_platform(platform).default_kind)
                if mesh is not None:
                    import jax

                    stack.enter_context(jax.sharding.use_abstract_mesh(mesh))
            yield
    finally:
        _LOWERING_FOR.reset(token)


def gpu_abstract_mesh(device_kind: str) -> Any:
    """An empty abstract mesh whose abstract device is the GPU `device_kind` (its SM count from
    the chip tables), for lowering on a host without it; None where an abstract mesh is in
    effect already (a caller's, which then names the device itself) or JAX has no abstract
    devices."""
    import jax

    from autotune.backends.hardware import gpu_sm_count

    device_cls = getattr(jax.sharding, "AbstractDevice", None)
    if device_cls is None or not jax.sharding.get_abstract_mesh().empty:
        return None
    device = device_cls(device_kind, gpu_sm_count(device_kind), "gpu")
    return jax.sharding.AbstractMesh((), (), abstract_device=device)


def backend_matters(platform: str, takes_interpret: bool) -> bool:
    """Whether which backend a kernel lowers through belongs in its key on `platform`: where
    the platform has several (Triton or Mosaic GPU on a GPU), and in interpret mode for a kernel
    run under its backend's interpret mode (one without an `interpret` argument)."""
    return len(PLATFORM_BACKENDS.get(platform, ())) > 1 or (
        interprets(platform) and not takes_interpret
    )


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
    return get(backend).interpret_mode()


def interpret_mode_forced() -> bool:
    """Whether an interpret mode (TPU's or GPU's) is forced on the kernels traced now: Pallas
    then runs `interpret=True` kernels in it too, not in its plain interpreter."""
    from jax._src import config  # where force_tpu_interpret_mode keeps its parameters

    return config.pallas_tpu_interpret_mode_context_manager.value is not None


def reset_interpret_state(backend: str | None) -> None:
    """Clear what that interpret mode keeps after a kernel raised, for the next kernel."""
    get(backend).reset_interpret_state()


def recognise(fn: Callable, args: Sequence[Any]) -> str | None:
    """The backend `fn(*args)` lowers through, read from the Pallas calls it traces to
    (their compiler parameters and meshes): "mosaic_gpu", "mosaic_tpu", "triton", or None
    where nothing says (a plain `pallas_call` runs on any platform's default: see
    `key_backend`)."""
    import jax

    found: set[Backend] = set()

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            for name, value in eqn.params.items():
                for v in value if isinstance(value, tuple) else (value,):
                    inner = getattr(v, "jaxpr", v)  # a ClosedJaxpr holds its Jaxpr
                    if hasattr(inner, "eqns"):
                        walk(inner)
                    elif name in ("compiler_params", "mesh", "meshes") and v is not None:
                        module = type(v).__module__
                        found.update(b for b in RECOGNISED if b.marker in module)

    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "dtype") else a for a in args]
    # kernels choose their compiler parameters by the platform they are lowered for: traced as
    # for a GPU, where the backends differ, whatever this host's device
    with lowering_for(triton.PLATFORM):
        walk(jax.make_jaxpr(fn)(*abstract).jaxpr)
    return next((b.name for b in RECOGNISED if b in found), None)
