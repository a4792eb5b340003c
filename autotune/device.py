"""Which accelerator this process runs on, and the versions that matter for reading a figure."""

from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from autotune import backends
from autotune.backends.platforms import platform_of

log = logging.getLogger(__name__)


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


def local_device_units(devices: list | None = None) -> int:
    """How many tuning workers this host's local devices take, one pinned to each: a TPU's
    chips (a v7x chip is two jax devices, one per TensorCore, and a worker is pinned by chip:
    `mosaic_tpu.pinned_env`), every other platform's devices. `devices`: jax's local devices
    (default: this process's)."""
    if devices is None:
        import jax

        devices = jax.local_devices()
    if not devices or devices[0].platform != "tpu":
        return len(devices)
    # a TPU device names its TensorCore on its chip (core_on_chip); one per chip is core 0
    return sum(getattr(d, "core_on_chip", 0) == 0 for d in devices)


def accelerator_packages() -> tuple[tuple[str, str], ...]:
    from importlib import metadata

    found = []
    for name in ACCELERATOR_PACKAGES:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            continue
    return tuple(found)


def available_cores(cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may run on: its CPU affinity (a cpuset, `taskset`), bounded by a
    cgroup's CPU quota (a container's `--cpus`) where one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = cgroup.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):  # no cgroup v2 quota here
        pass
    return cores


def shared_cores(platform: str, devices: int, cores: int | None = None) -> str | None:
    """What measuring on `devices` devices side by side means where they share cores (CPU
    devices beyond the cores this process has), in words; None where they do not."""
    cores = available_cores() if cores is None else cores
    if platform != "cpu" or devices <= cores:
        return None
    return (
        f"{devices} CPU devices measure side by side on {cores} core{'s' * (cores != 1)}: they "
        "share cores, so each search's first-pass times are inflated (several times over) and "
        "noisy; the finalists are re-measured side by side on one device, which keeps the "
        f"choice sound, but for first-pass figures to trust give --devices {cores} or fewer"
    )


@functools.cache
def warn_shared_cores(platform: str, devices: int) -> None:
    """Say once per run (per process) that `devices` devices share cores, where they do."""
    note = shared_cores(platform, devices)
    if note:
        log.warning("pallas-autotune: %s", note)
