"""A candidate's program: lowered, fingerprinted, then compiled ahead of any timed run.

The fingerprint is a hash of the lowered module's text (StableHLO, with what the backend put in
it: a Triton or Mosaic kernel's serialized IR included), taken before compiling. Two
configurations whose fingerprints agree compile to the same program (block sizes clamped to the
array, say), so a study measures that program once (autotune.tuner). Lowering is the cheap half:
milliseconds, against a compile's tenths of seconds in interpret mode and seconds on a GPU. The
text names the platform and backend lowered for, so a fingerprint is exact per backend; text
that differs only in names is taken as another program (measured again, never merged wrongly).
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.registry import KernelSpec
    from autotune.trial import Config


@dataclass(frozen=True)
class Program:
    """A candidate's program: its fingerprint, its executable (None where it was not compiled:
    its fingerprint was among those to skip), and the seconds lowering and compiling took."""

    fingerprint: str
    executable: Callable | None
    compile_s: float


def fingerprint(lowered: Any) -> str:
    """A hash of a lowered module's text: equal for configurations that compile alike."""
    return hashlib.sha256(lowered.as_text().encode()).hexdigest()[:32]


def compile_ahead(fn: Callable, args: Sequence[Any], skip: Container[str] = ()) -> Program:
    """`jax.jit(fn)` lowered for `args` and, unless its fingerprint is in `skip`, compiled
    (outside any timed region)."""
    import jax

    start = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    fp = fingerprint(lowered)
    executable = None if fp in skip else lowered.compile()
    return Program(fp, executable, time.perf_counter() - start)


def compile_config(
    spec: KernelSpec,
    config: Config,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    skip: Container[str] = (),
) -> Program:
    """The kernel at `config`, lowered for `args` and compiled unless its program is in `skip`."""
    fn = functools.partial(spec.bound_function(config, interpret=True), **kwargs)
    return compile_ahead(fn, args, skip)
