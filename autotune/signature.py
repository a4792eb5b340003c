"""The canonical key of a call: argument shapes and dtypes, static arguments, and the device.

An argument signature is text such as ``f32[1024,512],bf16[512,256]``; static (non-array)
arguments are a canonical JSON object such as ``{"causal":true}``. Both round-trip.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import SignatureError

# Short dtype names, as XLA prints them; anything else is spelled as numpy names it.
_SHORT = {
    "float64": "f64",
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "s64",
    "int32": "s32",
    "int16": "s16",
    "int8": "s8",
    "uint64": "u64",
    "uint32": "u32",
    "uint16": "u16",
    "uint8": "u8",
    "bool": "pred",
    "complex64": "c64",
    "complex128": "c128",
}
_LONG = {short: long for long, short in _SHORT.items()}
_ARG_RE = re.compile(r"([a-z][a-z0-9_]*)\[((?:[0-9]+(?:,[0-9]+)*)?)\]")


def dtype_name(dtype: Any) -> str:
    """The canonical (numpy) name of a dtype-like value: 'float32', 'bfloat16', ..."""
    import jax.numpy as jnp

    try:
        return jnp.dtype(dtype).name
    except TypeError as e:
        raise SignatureError(
            f"unknown dtype {dtype!r}: use a name such as float32 or bfloat16"
        ) from e


def short_dtype(name: str) -> str:
    return _SHORT.get(name, name)


@functools.lru_cache(maxsize=1024)  # signatures are parsed by the thousand; dtypes are few
def parse_dtype(text: str) -> str:
    """Accept 'f32', 'float32', 'bf16', ... and return the canonical name (numbers and bool
    only: numpy also parses 'i4,i4', 'U10' or 'O', which no kernel argument is)."""
    import jax.numpy as jnp

    text = text.strip()
    try:
        dtype = jnp.dtype(_LONG.get(text, text))
    except (TypeError, ValueError, SyntaxError):
        dtype = None
    if dtype is None or not (jnp.issubdtype(dtype, jnp.number) or dtype == jnp.bool_):
        raise SignatureError(f"unknown dtype {text!r}: use a name such as float32 or bfloat16")
    return dtype.name


@dataclass(frozen=True)
class ArgSpec:
    shape: tuple[int, ...]
    dtype: str  # canonical name, e.g. "float32"

    @property
    def text(self) -> str:
        return f"{short_dtype(self.dtype)}[{','.join(map(str, self.shape))}]"


def is_array(value: Any) -> bool:
    """Arrays, tracers and jax.ShapeDtypeStruct all have a shape and a dtype."""
    return hasattr(value, "shape") and hasattr(value, "dtype")


def call_shape(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple:
    """A cheap hashable summary of a call: (shape, dtype) per array, the value otherwise
    (TypeError for an unhashable static value, once hashed)."""
    return (
        tuple((a.shape, a.dtype) if is_array(a) else ("=", a) for a in args),
        tuple(
            (k, (v.shape, v.dtype) if is_array(v) else ("=", v)) for k, v in sorted(kwargs.items())
        ),
    )


def static_value(name: str, value: Any) -> Any:
    """Check that a non-array argument can be part of a key, and return its JSON form."""
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, float) and not math.isfinite(value):
            raise SignatureError(f"static argument {name}={value!r} is not finite")
        return value
    if isinstance(value, (tuple, list)):
        return [static_value(name, v) for v in value]
    import numpy as np  # loaded with JAX already: only a dtype or a wrong value gets here

    if isinstance(value, (type, np.dtype)):
        return dtype_name(value)
    raise SignatureError(
        f"argument {name!r} of type {type(value).__name__} is neither an array nor a static "
        "value (None, bool, int, float, str, dtype or a tuple of these): pass it as one of those"
    )


@dataclass(frozen=True)
class Signature:
    """What a kernel is called with, and where: constraints receive it beside the config."""

    args: tuple[ArgSpec, ...]
    static: dict[str, Any] = field(default_factory=dict)
    platform: str = "cpu"
    device_kind: str = "cpu"
    backend: str = ""  # the backend the kernel lowers through where it matters, e.g. "mosaic_gpu"

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(a.shape for a in self.args)

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(a.dtype for a in self.args)

    @property
    def text(self) -> str:
        return format_args(self.args)

    @property
    def static_text(self) -> str:
        return json.dumps(self.static, sort_keys=True, separators=(",", ":"))

    def __hash__(self) -> int:
        return hash((self.args, self.static_text, self.platform, self.device_kind, self.backend))


def format_args(args: tuple[ArgSpec, ...]) -> str:
    return ",".join(a.text for a in args)


def parse_args(text: str) -> tuple[ArgSpec, ...]:
    """Parse ``f32[8,128],s32[]`` back into ArgSpecs (inverse of format_args)."""
    specs: list[ArgSpec] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _ARG_RE.match(text, pos)
        if not m:
            raise SignatureError(
                f"malformed signature {text!r} at position {pos}: expected e.g. f32[256,256]"
            )
        dims = m.group(2)
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        specs.append(ArgSpec(shape, parse_dtype(m.group(1))))
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                raise SignatureError(f"malformed signature {text!r}: expected ',' at {pos}")
            pos += 1
    if not specs:
        raise SignatureError("empty signature: expected e.g. f32[256,256],f32[256,256]")
    return tuple(specs)


def parse_static(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise SignatureError(f"static arguments {text!r} are not a JSON object: {e}") from e
    except RecursionError:
        raise SignatureError(f"static arguments {text[:40]!r}... are nested too deeply") from None
    if not isinstance(value, dict):
        raise SignatureError(f"static arguments {text!r} are not a JSON object")
    return value


def shape_distance(a: tuple[ArgSpec, ...], b: tuple[ArgSpec, ...]) -> float | None:
    """How far apart two signatures are (sum of |log2 ratio| over dims); None if incomparable.

    Comparable means the same number of arguments, with the same dtypes and ranks.
    """
    if len(a) != len(b):
        return None
    total = 0.0
    for x, y in zip(a, b):
        if x.dtype != y.dtype or len(x.shape) != len(y.shape):
            return None
        total += sum(
            abs(math.log2(max(p, 1)) - math.log2(max(q, 1))) for p, q in zip(x.shape, y.shape)
        )
    return total


@dataclass(frozen=True)
class TuningKey:
    """The database key of one tuned entry."""

    kernel: str
    kernel_version: str
    platform: str
    device_kind: str
    backend: str
    signature: str
    static: str = "{}"

    def as_dict(self) -> dict[str, str]:
        return {
            "kernel": self.kernel,
            "kernel_version": self.kernel_version,
            "platform": self.platform,
            "device_kind": self.device_kind,
            "backend": self.backend,
            "signature": self.signature,
            "static": self.static,
        }
