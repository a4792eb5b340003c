"""The platforms pallas-autotune tells apart, and what jax calls them.

A platform is the kind of device a process runs on: it picks the search space's section, the
backends a kernel may compile through (`autotune.backends`) and the timers. jax names a GPU by
its runtime ("cuda", "rocm"); a tuning key names it "gpu" whichever runtime it has.
"""

from __future__ import annotations

PLATFORMS = ("cpu", "tpu", "gpu")
GPU_RUNTIMES = ("gpu", "cuda", "rocm")  # what jax's device.platform says on a GPU


def platform_of(jax_platform: str) -> str:
    """The platform a device of jax's `jax_platform` ("cuda", "tpu", ...) is."""
    return "gpu" if jax_platform in GPU_RUNTIMES else jax_platform
