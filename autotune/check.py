"""Static pre-validation that costs no device time: does a candidate lower for a TPU?

On a CPU-only host, `jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",))` runs the Pallas
TPU (Mosaic) lowering, which enforces the block-shape rules; it raises for a block that a TPU
would refuse. Nothing is compiled or run.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.device import BACKENDS, DeviceInfo

# The TPU generation constraints assume when checking on a host that has none.
DEFAULT_TPU_KIND = "TPU v5 lite"


def tpu_lowering_error(
    kernel: Any,
    config: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
) -> str | None:
    """Why `kernel` at `config` does not lower for TPU with these arguments (None: it lowers).

    `args` may be arrays or jax.ShapeDtypeStruct; `kwargs` are the static arguments.
    """
    import jax

    spec = kernel.spec
    fn = functools.partial(spec.fn, **spec.kernel_kwargs(config), **dict(kwargs or {}))
    try:
        jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))
    except Exception as e:  # the lowering reports bad blocks as ValueError, others vary
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


@dataclass(frozen=True)
class CheckRow:
    config: dict[str, Any]
    violations: tuple[str, ...]  # the constraints it breaks (empty: the space accepts it)
    lowering_error: str | None  # None: it lowers for TPU

    @property
    def accepted(self) -> bool:
        return not self.violations


def check_tpu_space(
    kernel: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    device_kind: str = DEFAULT_TPU_KIND,
) -> list[CheckRow]:
    """Every candidate of `kernel`'s TPU space for these arguments: does its constraints accept
    it, and does it lower for TPU? (A candidate accepted but not lowering is a constraint bug;
    one refused that lowers is a pruning the constraints may be too strict about.)"""
    spec = kernel.spec
    kwargs = dict(kwargs or {})
    device = DeviceInfo("tpu", device_kind, BACKENDS["tpu"], "", "", "")
    sig = spec.signature(args, kwargs, device)
    space = spec.space("tpu")
    return [
        CheckRow(
            config,
            tuple(space.violations(config, sig)),
            tpu_lowering_error(kernel, config, args, kwargs),
        )
        for config in space.all_configs()
    ]
