"""The interpret-mode oracle's tolerance policy: is a candidate's output the same answer?

The error measure is max |candidate - oracle| / max(|oracle|, tiny), per output leaf: it is
scale-free and not thrown off by entries near zero. NaN or Inf where the oracle is finite never
passes. Tolerances are per dtype, loose enough for a different accumulation order, tight enough
that a wrong tile (a dropped or repeated block) fails by orders of magnitude.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

TOLERANCES = {
    "float64": 1e-9,
    "float32": 1e-4,
    "bfloat16": 2e-2,
    "float16": 5e-3,
}
INTEGER_TOLERANCE = 0.0  # integer kernels must match exactly
DEFAULT_TOLERANCE = 1e-2  # other float types (fp8 and friends)
# A kernel whose static `precision` argument (as jnp.dot's) lets float32 dots use fewer bits is
# held to the tolerance of those bits: "high" is TF32 on NVIDIA GPUs (a float16-sized mantissa)
# or three bfloat16 passes on TPUs; "default" may be one bfloat16 pass (TPUs).
FLOAT32_TOLERANCE_AT = {"highest": 1e-4, "high": 5e-3, "default": 2e-2}


def tolerance(dtype: Any, precision: str | None = None) -> float:
    """The largest normalised error allowed in an output of `dtype`, for a kernel called with
    `precision` (None: the kernel computes at its dtype's full precision)."""
    dt = np.dtype(dtype)
    if dt.kind in "iub":
        return INTEGER_TOLERANCE
    if dt.name == "float32" and precision is not None:
        import jax

        level = jax.lax.Precision(precision).name.lower()  # "tensorfloat32" -> "high", ...
        return FLOAT32_TOLERANCE_AT[level]
    return TOLERANCES.get(dt.name, DEFAULT_TOLERANCE)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    max_error: float  # the worst normalised error over output leaves (inf if not comparable)
    tolerance: float
    message: str  # empty when ok; else what differed, with both outputs' summary


def compare(output: Any, oracle: Any, precision: str | None = None) -> Verdict:
    """Compare a candidate's output pytree with the oracle's, at the tolerance of its dtypes and
    the `precision` the kernel was called with."""
    import jax

    out_leaves, out_tree = jax.tree_util.tree_flatten(output)
    ref_leaves, ref_tree = jax.tree_util.tree_flatten(oracle)
    if out_tree != ref_tree:
        return Verdict(
            False, float("inf"), 0.0, f"output structure {out_tree} != oracle's {ref_tree}"
        )
    worst, worst_tol = 0.0, 0.0
    for i, (o, r) in enumerate(zip(out_leaves, ref_leaves)):
        o, r = np.asarray(o), np.asarray(r)
        if o.shape != r.shape or o.dtype != r.dtype:
            return Verdict(
                False,
                float("inf"),
                0.0,
                f"output {i}: {o.dtype}{list(o.shape)} != oracle's {r.dtype}{list(r.shape)}",
            )
        tol = tolerance(r.dtype, precision)
        o64, r64 = o.astype(np.float64), r.astype(np.float64)
        finite = np.isfinite(r64)
        if not np.array_equal(np.isfinite(o64), finite) or not np.array_equal(
            o64[~finite], r64[~finite], equal_nan=True
        ):
            bad = int(np.count_nonzero(np.isfinite(o64) != finite))
            return Verdict(
                False,
                float("inf"),
                tol,
                f"output {i}: {bad} non-finite value(s) where the oracle differs; {_summary(o64, r64)}",
            )
        if not finite.any():
            continue
        scale = max(float(np.abs(r64[finite]).max()), np.finfo(np.float32).tiny)
        err = float(np.abs(o64[finite] - r64[finite]).max()) / scale
        if err > worst:
            worst, worst_tol = err, tol
        if err > tol:
            return Verdict(
                False,
                err,
                tol,
                f"output {i}: max relative error {err:.3g} > {tol:g} ({r.dtype}); {_summary(o64, r64)}",
            )
    return Verdict(True, worst, worst_tol, "")


def _summary(o: np.ndarray, r: np.ndarray) -> str:
    def stats(a: np.ndarray) -> str:
        f = a[np.isfinite(a)]
        if f.size == 0:
            return "no finite values"
        return f"mean {f.mean():.4g}, min {f.min():.4g}, max {f.max():.4g}"

    return f"candidate {stats(o)}; oracle {stats(r)}"
