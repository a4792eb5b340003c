"""Static pre-validation that costs no device time: does a candidate lower for the device?

On a CPU-only host, `jax.jit(f).trace(*args).lower(lowering_platforms=(...,))` runs a Pallas
backend's lowering, which enforces its rules: Mosaic TPU's block shapes ("tpu"), Mosaic GPU's
shared memory and wgmma shapes and Pallas-Triton's power-of-two arrays ("cuda"). It raises for a
candidate the device would refuse. Nothing is compiled or run, so what only a compile checks
(Triton's shared memory and registers) stays with the constraints. The kernel is traced for the
platform checked (`autotune.backends.lowering_for`): laid out, and given compiler parameters, as
on that device.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune import backends
from autotune.device import DeviceInfo

# What each platform's kernels are lowered for on this host (`lowering_platforms=`): a platform's
# backends share it (Triton and Mosaic GPU both lower for "cuda").
LOWERING_TARGETS = {
    b.platform: b.lowering_platform for b in backends.BACKENDS if b.lowering_platform
}


def lowering_error(
    kernel: Any,
    config: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    platform: str = "tpu",
    device_kind: str | None = None,
) -> str | None:
    """Why `kernel` at `config` does not lower for `platform` ("tpu" or "gpu"; the device
    `device_kind`, default the platform's) with these arguments (None: it lowers).

    `args` may be arrays or jax.ShapeDtypeStruct; `kwargs` are the static arguments.
    """
    import jax

    spec = kernel.spec
    fn = functools.partial(spec.fn, **spec.kernel_kwargs(config), **dict(kwargs or {}))
    target = LOWERING_TARGETS[platform]
    try:
        with backends.lowering_for(platform, device_kind):
            jax.jit(fn).trace(*args).lower(lowering_platforms=(target,))
    except Exception as e:  # the lowerings report bad configs as ValueError, others vary
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def tpu_lowering_error(
    kernel: Any,
    config: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
) -> str | None:
    """Why `kernel` at `config` does not lower for TPU with these arguments (None: it lowers)."""
    return lowering_error(kernel, config, args, kwargs, "tpu")


@dataclass(frozen=True)
class CheckRow:
    config: dict[str, Any]
    violations: tuple[str, ...]  # the constraints it breaks (empty: the space accepts it)
    lowering_error: str | None  # None: it lowers for the platform

    @property
    def accepted(self) -> bool:
        return not self.violations


def check_space(
    kernel: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    platform: str = "tpu",
    device_kind: str | None = None,
    sample: int | None = None,
) -> list[CheckRow]:
    """Candidates of `kernel`'s space for `platform` and these arguments (all, or `sample`
    of them spread evenly over the space): does its constraints accept it, and does it lower?
    (A candidate accepted but not lowering is a constraint bug; one refused that lowers is a
    pruning the constraints may be too strict about.)"""
    spec = kernel.spec
    kwargs = dict(kwargs or {})
    kind = device_kind or backends.of_platform(platform).default_kind
    device = DeviceInfo(platform, kind, backends.default(platform), "", "", "")
    sig = spec.signature(args, kwargs, device)
    space = spec.space(platform)
    configs = list(space.all_configs())
    if sample is not None and sample < len(configs):
        configs = [configs[i * len(configs) // sample] for i in range(sample)]
    return [
        CheckRow(
            config,
            tuple(space.violations(config, sig)),
            lowering_error(kernel, config, args, kwargs, platform, kind),
        )
        for config in configs
    ]


def check_tpu_space(
    kernel: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    device_kind: str | None = None,
) -> list[CheckRow]:
    """Every candidate of `kernel`'s TPU space: see `check_space`."""
    return check_space(kernel, args, kwargs, "tpu", device_kind)
