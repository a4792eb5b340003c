"""The inputs a tuning task is measured on: random data of its arguments' shapes and dtypes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from autotune.errors import SignatureError


def random_inputs(args: Sequence[Any], seed: int = 0) -> list[Any]:
    """Concrete arrays for a call: arrays pass through, ShapeDtypeStructs become random data."""
    import jax
    import jax.numpy as jnp

    # NumPy draws them: jax.random would compile a sampler per shape, harness time per task
    rng = np.random.default_rng(seed)
    out = []
    for a in args:
        if isinstance(a, jax.ShapeDtypeStruct):
            dt = jnp.dtype(a.dtype)
            if jnp.issubdtype(dt, jnp.floating):
                a = jnp.asarray(rng.standard_normal(a.shape, np.float32), dt)
            elif jnp.issubdtype(dt, jnp.integer):
                a = jnp.asarray(rng.integers(-8, 8, a.shape), dt)
            elif dt == jnp.bool_:
                a = jnp.asarray(rng.random(a.shape) < 0.5)
            else:
                raise SignatureError(
                    f"cannot make random inputs of dtype {dt.name}: pass concrete arrays"
                )
        out.append(a)
    return out


def workload_name(spec: Any, workload: str | None) -> str | None:
    """The workload a kernel's inputs are made by: `workload`, else its first (None where it
    declares none)."""
    return workload if workload is not None else next(iter(spec.workloads), None)


def task_inputs(spec: Any, args: Sequence[Any], seed: int = 0, workload: str | None = None) -> list:
    """The inputs a kernel is tuned on: random data (random_inputs), and where the kernel
    declares workloads, its integer arguments that are data (group sizes, lengths, page
    tables) made by the one named (default: its first). An argument the caller gave as an
    array is kept: the caller's data is its own workload."""
    from autotune.errors import SettingsError

    workloads = spec.workloads
    if workload is not None and workload not in workloads:
        known = ", ".join(workloads) or "none: it takes no data arguments"
        raise SettingsError(
            "workload", f"{workload!r} is not a workload of {spec.name} (its workloads: {known})"
        )
    out = random_inputs(args, seed)
    if not workloads:
        return out
    import jax
    import jax.numpy as jnp

    maker = workloads[workload_name(spec, workload)]
    abstract = [isinstance(a, jax.ShapeDtypeStruct) for a in args]
    made = maker(list(args), np.random.default_rng(seed))
    for i, value in made.items():
        if abstract[i]:
            out[i] = jnp.asarray(value, args[i].dtype)
    return out
