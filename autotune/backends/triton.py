"""Triton, Pallas's default backend on a GPU: its knobs and how it is told apart.

A Triton kernel's lowering needs a CUDA driver, so unlike the Mosaic backends it cannot be
checked on a CPU-only host (`autotune.check`). On a CPU it runs in interpret mode through its
own `interpret` argument, passing no compiler parameters there (as the shipped kernels do): TPU
interpret mode, all a kernel without that argument gets, refuses Triton's. The GPU's limits
that Triton kernels' constraints use (shared memory, registers, the element cap of a block) are
in `autotune.hardware`, beside the helpers the kernels import them with.
"""

from __future__ import annotations

from autotune.backends import interpret
from autotune.hardware import gpu_l2_bytes

NAME = "triton"
TITLE = "Triton"  # in messages
PLATFORM = "gpu"
MARKER = "pallas.triton"  # where jax._src keeps its compiler parameters
LOWERING_PLATFORM = None  # its lowering needs a CUDA driver: no check on a CPU-only host
# CUPTI reads the kernels' own durations; a profiler trace the same where CUPTI is refused
TIMERS = ("cupti", "trace", "wall")
COMPILER_PARAMS = "jax.experimental.pallas.triton.CompilerParams"
KNOBS = ("num_warps", "num_stages")  # warps per block; software-pipelining depth
POW2_BLOCKS = True  # Triton's blocks are powers of two
cache_bytes = gpu_l2_bytes  # inputs smaller than the L2 are rotated when timing

# a kernel recognised as Triton but taking no `interpret` argument gets the general interpreter
interpret_mode = interpret.interpret_mode
reset_interpret_state = interpret.reset_interpret_state
