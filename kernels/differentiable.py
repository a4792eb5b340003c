"""One way to give a Pallas kernel a gradient: a custom VJP over its array arguments.

A `pallas_call` has no JVP rule, so `jax.grad` through a shipped kernel needs its backward
spelled out. `@differentiable(bwd)` decorates a kernel function whose positional parameters are
its arrays and whose keyword-only ones are options (block sizes, flags): the options are static
to the VJP, `fwd(forward, *arrays, **options)` returns the output and what the backward keeps
(the inputs, by default), and `bwd(residuals, cotangent, **options)` turns those and the output's
cotangent into one cotangent per array. Both see every option, defaults included. A backward
that calls other `@autotuned` kernels gets their tuned configurations, looked up under their
own keys.

Inside `jax.shard_map` the arrays are first cast to vary over the same mesh axes
(`autotune.registry.varying.vary_alike`): the VJP's cotangents then have their inputs' types, and the
cotangent of an array that is the same on every device is summed over the devices (by the
cast's transpose), as plain JAX code's would be. The output is typed to vary over those axes
too (`vary_like`), also where the kernel's Pallas call lost them (Mosaic GPU's).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax

from autotune.registry.varying import vary_alike, vary_like


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
            return vary_like(forward(*values, **dict(options)), *values)

        def call_fwd(options: tuple, *values: Any) -> tuple[Any, Any]:
            out, residuals = fwd(forward, *values, **dict(options))
            return vary_like(out, *values), residuals

        def call_bwd(options: tuple, residuals: Any, cotangent: Any) -> tuple:
            return tuple(bwd(residuals, cotangent, **dict(options)))

        call.defvjp(call_fwd, call_bwd)

        @functools.wraps(forward)
        def run(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            given = bound.arguments
            options = tuple(sorted((n, v) for n, v in given.items() if n not in arrays))
            return call(options, *vary_alike(*(given[n] for n in arrays)))

        return run

    return decorate


def through_lse(forward: Callable, backward: Callable[[], Callable]) -> tuple[Callable, Callable]:
    """The (bwd, fwd) of an attention whose backward is a kernel of its own fed the forward's
    log-sum-exp (JAX's attentions, called unedited): `forward(q, k, v, causal, sm_scale,
    block_sizes, interpret, residuals=True)` gives the output and the lse; `backward()` (asked
    at the backward's time: it is defined after the forward) turns (q, k, v, out, lse, do) into
    (dq, dk, dv)."""

    def fwd(_, q, k, v, *, causal, sm_scale, precision, block_sizes, interpret):
        out, lse = forward(q, k, v, causal, sm_scale, block_sizes, interpret, residuals=True)
        return out, (q, k, v, out, lse)

    def bwd(residuals: tuple, do: Any, *, causal, sm_scale, precision, interpret, **_):
        options = dict(causal=causal, sm_scale=sm_scale, precision=precision, interpret=interpret)
        return backward()(*residuals, do, **options)

    return bwd, fwd
