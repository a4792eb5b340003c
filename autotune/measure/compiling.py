"""A candidate's program: lowered, fingerprinted, then compiled ahead of any timed run.

The fingerprint is a hash of the lowered module's text (StableHLO, with what the backend put in
it: a Triton or Mosaic kernel's serialized IR included), taken before compiling. Two
configurations whose fingerprints agree compile to the same program (block sizes clamped to the
array, say), so a study measures that program once (autotune.tuning.kernel). Lowering is the cheap half:
milliseconds, against a compile's tenths of seconds in interpret mode and seconds on a GPU. The
text names the platform and backend lowered for, so a fingerprint is exact per backend; text
that differs only in names is taken as another program (measured again, never merged wrongly).
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.registry.spec import KernelSpec
    from autotune.trial import Config


@dataclass(frozen=True)
class Program:
    """A candidate's program: its fingerprint, its executable (None where it was not compiled:
    its fingerprint was among those to skip), the seconds lowering and compiling took, and the
    compiler's memory figures (`memory_figures`; {} where it was not compiled)."""

    fingerprint: str
    executable: Callable | None
    compile_s: float
    memory: dict[str, int | None] = field(default_factory=dict)


# The compiler's memory analysis, as a trial's columns: bytes of its arguments, outputs,
# temporaries, and its peak (XLA's CompiledMemoryStats; CPU and GPU report every one)
MEMORY_FIELDS = {
    "memory_argument_bytes": "argument_size_in_bytes",
    "memory_output_bytes": "output_size_in_bytes",
    "memory_temp_bytes": "temp_size_in_bytes",
    "memory_peak_bytes": "peak_memory_in_bytes",
}


def memory_figures(executable: Any) -> dict[str, int | None]:
    """An executable's memory figures by trial column, None where the backend reports none (a
    figure of 0 for the peak is no report: every program holds its arguments)."""
    try:
        stats = executable.memory_analysis()
    except Exception:  # a backend without the analysis (it raises "unimplemented")
        stats = None
    figures = {}
    for column, attr in MEMORY_FIELDS.items():
        value = getattr(stats, attr, None)
        figures[column] = int(value) if isinstance(value, int) and value >= 0 else None
    if not figures["memory_peak_bytes"]:
        figures["memory_peak_bytes"] = None
    return figures


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
    if fp in skip:
        return Program(fp, None, time.perf_counter() - start)
    executable = lowered.compile()
    return Program(fp, executable, time.perf_counter() - start, memory_figures(executable))


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
