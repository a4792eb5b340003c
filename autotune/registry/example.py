"""Example: a small call a kernel declares, so that code which covers every registered kernel
(the test suites, the hardware check's plan, `benchmarks/tune_kernels.py`) can call it without
a list of its own.

The arrays are written as a signature's text (`f32[37,45],f32[45,29]`: autotune.signature),
the static arguments as keywords: `Example("f32[1,2,19,8],f32[1,2,23,8],f32[1,2,23,8]",
sm_scale=0.3)`. Shapes stay small: the suites run the example in interpret mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.errors import KernelError, SignatureError
from autotune.signature import ArgSpec, Signature, parse_args, static_value


@dataclass(frozen=True, init=False)
class Example:
    """A small call of a kernel: its arrays (a signature's text) and its static arguments."""

    args: tuple[ArgSpec, ...]
    static: dict[str, Any] = field(default_factory=dict, hash=False)

    def __init__(self, args: str, **static: Any) -> None:
        try:
            parsed = parse_args(args)
            checked = {k: static_value(k, v) for k, v in static.items()}
        except SignatureError as e:
            raise KernelError(
                f"Example({args!r}): {e}; write the arrays as f32[37,45],f32[45,29] and the "
                "static arguments as keywords"
            ) from None
        object.__setattr__(self, "args", parsed)
        object.__setattr__(self, "static", dict(static))
        object.__setattr__(self, "_checked", checked)

    def arrays(self) -> list[Any]:
        """The arrays as jax.ShapeDtypeStruct (what lowering and eval_shape take)."""
        import jax

        return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self.args]

    def signature(self, platform: str, device_kind: str, backend: str = "") -> Signature:
        """The call's signature on a device of `platform`, as constraints receive it."""
        return Signature(self.args, self._checked, platform, device_kind, backend)
