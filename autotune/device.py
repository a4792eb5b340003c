"""Which accelerator this process runs on, and the versions that matter for reading a figure."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autotune import backends
from autotune.backends.platforms import platform_of


@dataclass(frozen=True)
class DeviceInfo:
    platform: str  # "cpu", "tpu" or "gpu"
    device_kind: str  # e.g. "cpu", "TPU v5 lite", "NVIDIA H100 80GB HBM3"
    backend: str  # the platform's default: "interpret", "mosaic_tpu", "triton"
    jax_version: str
    jaxlib_version: str
    runtime_version: str  # the platform's runtime/driver as jax reports it, "" if unknown
    # installed accelerator runtimes that change what a figure means: libtpu, CUDA plugins
    packages: tuple[tuple[str, str], ...] = ()

    @property
    def runtime_summary(self) -> str:
        """The runtime version and the accelerator packages, as one line for the database."""
        parts = [self.runtime_version] + [f"{n} {v}" for n, v in self.packages]
        return "; ".join(p for p in parts if p)

    @property
    def interpret(self) -> bool:
        """True where Pallas kernels can only run in interpret mode."""
        from autotune import backends

        return backends.interprets(self.platform)


@functools.cache
def current_device() -> DeviceInfo:
    """The first local device of the default backend (cached: it cannot change in a process)."""
    import jax
    import jaxlib

    device = jax.devices()[0]
    platform = platform_of(device.platform)
    try:
        runtime = str(device.client.platform_version)
    except Exception:  # not every client reports one
        runtime = ""
    return DeviceInfo(
        platform=platform,
        device_kind=str(device.device_kind),
        backend=backends.default(platform),
        jax_version=jax.__version__,
        jaxlib_version=jaxlib.__version__,
        runtime_version=runtime,
        packages=accelerator_packages(),
    )


# Distributions whose versions matter for reading a TPU or GPU figure later.
ACCELERATOR_PACKAGES = (
    "libtpu",
    "libtpu-nightly",
    "jax-cuda12-plugin",
    "jax-cuda12-pjrt",
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
    "jax-rocm7-plugin",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cudnn-cu12",
)


def accelerator_packages() -> tuple[tuple[str, str], ...]:
    from importlib import metadata

    found = []
    for name in ACCELERATOR_PACKAGES:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            continue
    return tuple(found)
