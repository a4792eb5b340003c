"""One way to give a Pallas kernel a gradient: a custom VJP over its array arguments.

A `pallas_call` has no JVP rule, so `jax.grad` through a shipped kernel needs its backward
spelled out. `@differentiable(bwd)` decorates a kernel function whose positional parameters are
its arrays and whose keyword-only ones are options (block sizes, flags): the options are static
to the VJP, `fwd(forward, *arrays, **options)` returns the output and what the backward keeps
(the inputs, by default), and `bwd(residuals, cotangent, **options)` turns those and the output's
cotangent into one cotangent per array. Both see every option, defaults included. A backward
that calls other `@autotuned` kernels gets their tuned configurations, looked up under their
own keys.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax


def keep_inputs(forward: Callable, *arrays: Any, **options: Any) -> tuple[Any, tuple]:
    """The forward's output, with its inputs kept for the backward."""
    return forward(*arrays, **options), arrays


def differentiable(bwd: Callable, fwd: Callable = keep_inputs) -> Callable[[Callable], Callable]:
    """Decorate `forward(*arrays, **options)` with a VJP (see the module docstring); the result
    keeps the forward's name, signature and annotations."""

    def decorate(forward: Callable) -> Callable:
        signature = inspect.signature(forward)
        arrays = [p.name for p in signature.parameters.values() if p.kind is not p.KEYWORD_ONLY]

        @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
        def call(options: tuple, *values: Any) -> Any:
            return forward(*values, **dict(options))

        def call_fwd(options: tuple, *values: Any) -> tuple[Any, Any]:
            return fwd(forward, *values, **dict(options))

        def call_bwd(options: tuple, residuals: Any, cotangent: Any) -> tuple:
            return tuple(bwd(residuals, cotangent, **dict(options)))

        call.defvjp(call_fwd, call_bwd)

        @functools.wraps(forward)
        def run(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            given = bound.arguments
            options = tuple(sorted((n, v) for n, v in given.items() if n not in arrays))
            return call(options, *(given[n] for n in arrays))

        return run

    return decorate
