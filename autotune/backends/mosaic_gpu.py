"""Mosaic GPU, Pallas's backend for Hopper and newer NVIDIA GPUs: its limits, knobs and
interpret mode.

Mosaic GPU kernels lower for "cuda" on a CPU-only host, and the lowering applies Mosaic GPU's
own rules (shared memory among them), so a configuration can be checked without a GPU
(`autotune.measure.lowering`). They run on a CPU under GPU interpret mode, a simulator of the GPU's
memories, threads and barriers: correct but slow (its cost grows with the number of tile steps).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from autotune.backends.hardware import GPU_SMEM, by_kind, gpu_l2_bytes
from autotune.backends.platforms import platform_of
from autotune.errors import KernelError

NAME = "mosaic_gpu"
TITLE = "Mosaic GPU"  # in messages
PLATFORM = "gpu"
MARKER = "pallas.mosaic_gpu"  # where jax._src keeps its compiler parameters and meshes
LOWERING_PLATFORM = "cuda"  # what `.lower(lowering_platforms=...)` calls a GPU
# CUPTI reads the kernels' own durations; a profiler trace the same where CUPTI is refused
TIMERS = ("cupti", "trace", "wall")
COMPILER_PARAMS = "jax.experimental.pallas.mosaic_gpu.CompilerParams"
KNOBS = ("max_concurrent_steps",)  # the depth of its pipelines (shared-memory slots)
SLOW_INTERPRET = True  # GPU interpret mode simulates the GPU's threads and barriers
STICKY_FAULTS = True  # a CUDA fault fails every later launch in the process
DEFAULT_KIND = "NVIDIA H200"  # the GPU a check assumes where none is named
cache_bytes = gpu_l2_bytes  # inputs smaller than the L2 are rotated when timing

# Shared memory a block may allocate (the opt-in maximum; Mosaic GPU refuses a kernel that
# asks for more with "exceeds available shared memory: smem_bytes=N > max_smem_bytes=M").
# The figures per GPU are hardware.GPU_SMEM's (227 KiB on an H100 or H200); this is the default.
SMEM_LIMIT_DEFAULT = 232_448  # Hopper: Mosaic GPU's kernels target sm_90a and newer
# Streaming multiprocessors: a persistent kernel launches one block per SM.
NUM_SMS = {"H100 PCIe": 114, "H100": 132, "H200": 132, "GH200": 132}
NUM_SMS_DEFAULT = 132
# Blocks a persistent kernel launches under GPU interpret mode: the simulator runs every
# warpgroup of every block as a host thread, so one block walking every tile costs least.
INTERPRET_SMS = 1
# wgmma: a warpgroup's tile is a multiple of 64 rows and of 8 columns (at most 256 in one
# instruction); operands in shared memory are swizzled by 32, 64 or 128 bytes along their
# minor dimension.
WGMMA_M = 64
WGMMA_N_STEP = 8
WGMMA_N_MAX = 256
SWIZZLES = (128, 64, 32)  # the largest that divides the minor dimension is used
WARPGROUP_THREADS = 128
# A float32 accumulator lives in its warpgroup's registers, one per element per thread. A
# consumer thread has at most 255; with the epilogue's converted copy and addressing beside
# it, more than 128 for the accumulator spills (a budget, not a rule the lowering checks).
ACC_REGISTERS_MAX = 128
BARRIER_BYTES = 8  # one mbarrier in shared memory
# Hopper GPUs by the device kind jax reports: Mosaic GPU's kernels need warpgroup MMA and TMA
HOPPER = re.compile(r"\bG?H(100|200|800|20)\b")


def why_not(platform: str, device_kind: str) -> str | None:
    """Why a Mosaic GPU kernel cannot run on this device, or None where it can."""
    if platform != PLATFORM:
        return f"a Mosaic GPU kernel needs a Hopper GPU; this call runs on {platform}"
    if not HOPPER.search(device_kind):
        return (
            f"a Mosaic GPU kernel needs a Hopper GPU (H100, H200, H800, GH200), not {device_kind}"
        )
    return None


def plgpu() -> Any:
    """`jax.experimental.pallas.mosaic_gpu`, or a KernelError saying what to install."""
    try:
        import jax.experimental.pallas.mosaic_gpu as module
    except ImportError as e:
        raise KernelError(
            f"Mosaic GPU is not importable here ({e}): pip install absl-py "
            "(or pallas-autotune[mosaic_gpu])"
        ) from e
    return module


def _interpret_module() -> Any:
    # jax 0.10 keeps GPU interpret mode private; later versions may re-export it.
    public = plgpu()
    if hasattr(public, "InterpretGPUParams") and hasattr(public, "force_gpu_interpret_mode"):
        return public
    try:
        from jax._src.pallas.mosaic_gpu.interpret import params
    except ImportError as e:
        raise KernelError(
            f"this jax has no GPU interpret mode ({e}): Mosaic GPU kernels cannot run on a "
            "CPU; upgrade jax (0.10.2 has it)"
        ) from e
    return params


def interpret_params() -> Any:
    """The `interpret=` value that runs a Mosaic GPU kernel under GPU interpret mode."""
    return _interpret_module().InterpretGPUParams()


@contextlib.contextmanager
def interpret_mode() -> Iterator[None]:
    """Run every Mosaic GPU kernel traced inside under GPU interpret mode (for kernels that
    take no `interpret` argument)."""
    module = _interpret_module()
    with module.force_gpu_interpret_mode(module.InterpretGPUParams()):
        yield


def swizzle_bytes(minor_bytes: int) -> int | None:
    """The swizzle for an operand whose minor dimension holds `minor_bytes` (None: too narrow
    or misaligned for wgmma)."""
    return next((s for s in SWIZZLES if minor_bytes % s == 0), None)


def smem_limit(device_kind: str) -> int:
    """The shared memory one block may allocate on this GPU."""
    return by_kind(GPU_SMEM, device_kind, SMEM_LIMIT_DEFAULT)


def num_sms(interpret: bool) -> int:
    """How many blocks a persistent kernel launches: one per SM of this GPU; on a host
    without one (lowering for "cuda" on a CPU), an H100's or H200's count."""
    if interpret:
        return INTERPRET_SMS
    import jax

    device = jax.devices()[0]
    if platform_of(device.platform) == "gpu":
        return int(getattr(device, "core_count", 0) or by_kind(NUM_SMS, device.device_kind, 0))
    return NUM_SMS_DEFAULT


def interpreting() -> bool:
    """Whether Mosaic GPU kernels traced now run under GPU interpret mode (inside
    `interpret_mode()`): a kernel that sizes its grid by the SM count can then launch
    INTERPRET_SMS blocks (see `num_sms`)."""
    from jax._src import config  # where force_gpu_interpret_mode keeps its parameters

    params = config.pallas_tpu_interpret_mode_context_manager.value
    return isinstance(params, _interpret_module().InterpretGPUParams)


def reset_interpret_state() -> None:
    """Clear GPU interpret mode's simulated state, which it keeps after a kernel raised."""
    module = _interpret_module()
    reset = getattr(module, "reset_gpu_interpret_mode_state", None)
    if reset is None:  # jax 0.10 keeps it beside the interpreter
        from jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call import (
            reset_gpu_interpret_mode_state as reset,
        )
    reset()
