"""The precision of a shipped kernel's dots, shared by matmul, bmm and the attentions.

jnp.dot's precision for float32 inputs: "highest" computes in float32; "high" and "default"
allow fewer bits (TF32 on NVIDIA GPUs, bfloat16 passes on TPUs), which the oracle's tolerance
follows (autotune.measure.verify). None, the default, is the inputs' own (`dot_precision`).
A static argument annotated Literal[...] is checked up front by `autotune tune` and job files
(autotune.tuning.task.check_call), before any database is opened or kernel traced.
"""

from __future__ import annotations

from typing import Literal, get_args

import jax.numpy as jnp

ACC_DTYPE = jnp.float32  # what the dots accumulate in
Precision = Literal["highest", "high", "default", None]
PRECISIONS = get_args(Precision)


def check_precision(precision: str | None) -> None:
    if precision not in PRECISIONS:
        named = ", ".join(p for p in PRECISIONS if p is not None)
        raise ValueError(f"precision={precision!r}: use one of {named}, or None (the default)")


def dot_precision(precision: str | None, dtype) -> str:
    """The precision a kernel's dots take for inputs of `dtype`: the one the call asked for,
    else "highest" for float32 (the float32 a user means) and "default" for 16-bit floats: a
    product of two of them is exact in the float32 accumulator, so one native pass of the TPU's
    MXU gives what "highest" would, without its multi-pass float32 emulation
    (`contract_precision<fp32>` in Mosaic); on a GPU both are one 16-bit MMA."""
    check_precision(precision)
    if precision is not None:
        return precision
    return "highest" if jnp.dtype(dtype).itemsize >= 4 else "default"
