"""Interpret mode, the CPU's only backend: there is no compiler for Pallas on a CPU, so every
kernel runs in Pallas's interpreter, and results tuned there are stored under "interpret".

A kernel that takes an `interpret` argument is called with `interpret=True`; one that does not
runs under TPU interpret mode, which runs a plain `pallas_call` (and TPU-only grid specs) without
one. A kernel recognised as Mosaic GPU runs under GPU interpret mode instead (`mosaic_gpu`).
"""

from __future__ import annotations

from autotune.backends import mosaic_tpu

NAME = "interpret"
TITLE = "Pallas interpret mode"  # in messages
PLATFORM = "cpu"
MARKER = None  # nothing a kernel traces to says "interpret": a CPU has no other backend
LOWERING_PLATFORM = None  # nothing to lower for: the interpreter runs the kernel's jaxpr
TIMERS = ("wall",)  # a CPU has no device clock
COMPILER_PARAMS = None  # no compiler, so no knobs
KNOBS: tuple[str, ...] = ()
KIND_PREFIX = "cpu"  # jax calls every CPU device kind "cpu"
DEFAULT_KIND = "cpu"

# TPU interpret mode is the interpreter that runs any kernel without backend-specific parts.
interpret_mode = mosaic_tpu.interpret_mode
reset_interpret_state = mosaic_tpu.reset_interpret_state
