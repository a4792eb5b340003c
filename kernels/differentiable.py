"""One way to give a Pallas kernel a gradient: a custom VJP over its array arguments.

A `pallas_call` has no JVP rule, so `jax.grad` through a shipped kernel needs its backward
spelled out. `differentiable(forward, fwd, bwd)` wraps a kernel function taking arrays
positionally and options (block sizes, flags) by keyword: the options are static to the VJP,
`fwd` returns the output and what the backward keeps, and `bwd` turns those and the output's
cotangent into one cotangent per array. A backward that calls other `@autotuned` kernels gets
their tuned configurations, looked up under their own keys.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax


def differentiable(forward: Callable, fwd: Callable, bwd: Callable) -> Callable:
    """`forward(*arrays, **options)` with a VJP: `fwd(*arrays, **options) -> (out, residuals)`,
    `bwd(residuals, cotangent, **options) -> one cotangent per array`."""

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def call(options: tuple, *arrays: Any) -> Any:
        return forward(*arrays, **dict(options))

    def call_fwd(options: tuple, *arrays: Any) -> tuple[Any, Any]:
        return fwd(*arrays, **dict(options))

    def call_bwd(options: tuple, residuals: Any, cotangent: Any) -> tuple:
        return tuple(bwd(residuals, cotangent, **dict(options)))

    call.defvjp(call_fwd, call_bwd)

    @functools.wraps(forward)
    def run(*arrays: Any, **options: Any) -> Any:
        return call(tuple(sorted(options.items())), *arrays)

    return run
