"""Triton, a Pallas backend on a GPU: its knobs and how it is told apart.

jax 0.10.2 lowers a Triton kernel for "cuda" on a CPU-only host (to Triton IR inside a custom
call: `autotune.measure.lowering`), which enforces Pallas-Triton's rules (e.g. every array's size a power of
two); Triton's own compile, with its shared-memory and register limits, runs on the GPU only
(later jax versions call `triton.compile` at lowering through the CUDA plugin: checked there).
A kernel passes Triton's compiler parameters (`compiler_params`) to say it lowers through Triton:
without them, a `pallas_call` lowers through Mosaic GPU on this jax. On a CPU it runs in
interpret mode through its own `interpret` argument, passing no compiler parameters there (TPU
interpret mode, all a kernel without that argument gets, refuses Triton's). The GPU's limits that
Triton kernels' constraints use (shared memory, registers, the element cap of a block) are in
`autotune.backends.hardware`, beside the helpers the kernels import them with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.backends import interpret
from autotune.backends.hardware import gpu_l2_bytes

NAME = "triton"
TITLE = "Triton"  # in messages
PLATFORM = "gpu"
MARKER = "pallas.triton"  # where jax._src keeps its compiler parameters
LOWERING_PLATFORM = "cuda"  # what jax lowers it for, on any host
# CUPTI reads the kernels' own durations; a profiler trace the same where CUPTI is refused
TIMERS = ("cupti", "trace", "wall")
COMPILER_PARAMS = "jax.experimental.pallas.triton.CompilerParams"
KNOBS = ("num_warps", "num_stages")  # warps per block; software-pipelining depth
POW2_BLOCKS = True  # Triton's blocks are powers of two
STICKY_FAULTS = True  # a CUDA fault fails every later launch in the process
DEFAULT_KIND = "NVIDIA H200"  # the GPU a check assumes where none is named
cache_bytes = gpu_l2_bytes  # inputs smaller than the L2 are rotated when timing


def pinned_env(index: int, env: Mapping[str, str]) -> dict[str, str]:
    """The environment that gives a process local GPU `index` alone (a tuning worker pinned
    to it): the visible-devices setting of CUDA (ROCm's HIP reads its own), counted within
    a list the host's environment already narrowed. Not yet checked on a host with several
    GPUs: a worker that still sees them all takes device `index` itself (worker.child)."""
    visible = _nth_visible(env.get("CUDA_VISIBLE_DEVICES"), index)
    return {"CUDA_VISIBLE_DEVICES": visible, "HIP_VISIBLE_DEVICES": visible}


def _nth_visible(listed: str | None, index: int) -> str:
    """Device `index` of a visible-devices list ("2,3": index 1 is "3"); `index` without one."""
    names = [n.strip() for n in (listed or "").split(",") if n.strip()]
    return names[index] if index < len(names) else str(index)


# a kernel recognised as Triton but taking no `interpret` argument gets the general interpreter
interpret_mode = interpret.interpret_mode
reset_interpret_state = interpret.reset_interpret_state


def compiler_params(num_warps: int, num_stages: int | None, platform: str) -> Any:
    """Triton's knobs for a kernel laid out for `platform` (`autotune.backends.kernel_platform`:
    the platform it is lowered for, a GPU's even on a CPU host under `autotune.measure.lowering`); None
    elsewhere (TPU and interpret mode take their compilers' defaults)."""
    if platform != PLATFORM:
        return None
    from jax.experimental.pallas import triton as pltriton

    if num_stages is None:
        return pltriton.CompilerParams(num_warps=num_warps)
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
