"""A user's kernel as a library ships it, with a tuned table in `tuned/` beside this module.

The tests copy this file into a temporary package and write the table there (a table names
the kernel's version, which hashes the kernel's code)."""

from __future__ import annotations

from toy_kernels import _scale_call, rows_divide, scale_reference

from autotune import autotuned


@autotuned(
    name="shipped_scale",
    space={"block_rows": [8, 16, 24, 32]},
    constraints=[rows_divide],
    reference=scale_reference,
    tuned="tuned",
)
def shipped_scale(x, *, block_rows=8, interpret=False):
    return _scale_call(x, block_rows, interpret)
