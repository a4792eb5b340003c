"""Registers and spills of a Triton candidate for a GPU, on a host without one.

Triton keeps a kernel's tiles in registers; past 255 a thread (or past what the warps leave
it) ptxas spills them to local memory, and the candidate runs slowly however it is tuned.
Whether a candidate spills is known only after Triton's compile and ptxas, which XLA runs on
the GPU. Here the same Triton IR is compiled on the CPU: the kernel is lowered for "cuda"
(`autotune.backends.lowering_for`, as `autotune check --platform gpu` does), the Triton module
jax emits for each `pallas_call` is captured, compiled by pip's `triton` for the GPU's
architecture (`triton.compile` with an explicit target: no driver), and its PTX assembled by
the `ptxas` the triton wheel bundles (`ptxas -v`: registers, spill stores and loads).

The optional extra `registers` (`pip install -e ".[registers]"`) provides triton. Where it is
absent, `unavailable()` says why and the constraints' register models alone decide. The figures
are a proxy: XLA compiles the same module with the Triton it bundles, which may allocate a few
registers differently; the shared-memory figure matched the constraints' models exactly.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Compute capability by a device_kind substring (more specific names first), and by name.
GPU_ARCH = {"H200": 90, "H100": 90, "GH200": 90, "A100": 80, "L40": 89, "L4": 89, "A10": 86}
ARCHS = {"sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_90": 90}

_CAPTURE = threading.Lock()  # one lowering at a time patches jax's Triton lowering


@dataclass(frozen=True)
class Usage:
    """What ptxas reports for one kernel (the largest of a candidate's pallas_calls)."""

    registers: int  # per thread
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    shared_bytes: int  # Triton's shared memory, as it launches the kernel

    @property
    def spills(self) -> bool:
        return self.spill_stores + self.spill_loads > 0

    def merged(self, other: Usage) -> Usage:
        return Usage(
            max(self.registers, other.registers),
            self.spill_stores + other.spill_stores,
            self.spill_loads + other.spill_loads,
            max(self.shared_bytes, other.shared_bytes),
        )


def arch_of(target: str) -> int:
    """A compute capability from "sm_90", "90" or a device kind ("NVIDIA H100 80GB HBM3")."""
    if target in ARCHS:
        return ARCHS[target]
    if target.isdigit():
        return int(target)
    found = next((arch for name, arch in GPU_ARCH.items() if name in target), None)
    if found is None:
        raise ValueError(
            f"unknown GPU {target!r}: give sm_80, sm_90 or a device kind naming one of "
            f"{', '.join(GPU_ARCH)}"
        )
    return found


def unavailable() -> str | None:
    """Why this host cannot compile Triton candidates (None: it can)."""
    try:
        import triton  # noqa: F401
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError as e:
        return f"pip triton is not installed ({e}): pip install -e '.[registers]'"
    path = get_ptxas(90).path
    if not path or not os.path.exists(path):
        return "triton's bundled ptxas is missing"
    return None


def triton_modules(
    kernel: Any,
    config: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    device_kind: str | None = None,
) -> list[tuple[str, int, int]]:
    """The Triton modules jax emits for `kernel` at `config` lowered for a GPU: (the module's
    text, num_warps, num_stages) for each of its pallas_calls."""
    import jax
    from jax._src.pallas.triton import lowering as triton_lowering

    from autotune import backends

    spec = kernel.spec
    fn = functools.partial(spec.fn, **spec.kernel_kwargs(config), **dict(kwargs or {}))
    texts: list[str] = []
    with _CAPTURE, _capturing(triton_lowering, texts), backends.lowering_for("gpu", device_kind):
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    # the custom calls' backend configs, in order: "num_stages = 3 : i32, num_warps = 4 : i32"
    knobs = re.findall(r"num_stages = (\d+) : i32, num_warps = (\d+) : i32", lowered)
    if len(knobs) != len(texts):
        raise RuntimeError(
            f"{spec.name}: {len(texts)} Triton modules but {len(knobs)} launch configurations "
            "in the lowered module: this jax emits Triton calls differently"
        )
    return [(text, int(warps), int(stages)) for text, (stages, warps) in zip(texts, knobs)]


@contextlib.contextmanager
def _capturing(module: Any, texts: list[str]) -> Iterator[None]:
    """jax's `lower_jaxpr_to_triton_module`, wrapped to keep each module's text."""
    original = module.lower_jaxpr_to_triton_module

    def capture(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        texts.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    module.lower_jaxpr_to_triton_module = capture
    try:
        yield
    finally:
        module.lower_jaxpr_to_triton_module = original


@functools.lru_cache(maxsize=4096)
def compile_usage(ttir: str, num_warps: int, num_stages: int, arch: int) -> Usage:
    """Compile one Triton module for compute capability `arch` and read the report of the
    ptxas run Triton makes itself (its own flags: a second run without them could allocate
    differently), printed where Triton is asked to (`dump_ptxas_log`)."""
    import io

    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # 3.9's default, without its warning
    digest = hashlib.sha256(ttir.encode()).hexdigest()[:16]
    report = io.StringIO()
    saved = knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(report):
        path = os.path.join(tmp, f"k{digest}.ttir")
        with open(path, "w") as f:
            f.write(ttir)
        # compiled afresh (a cached kernel runs no ptxas), its log printed
        knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = True, True
        try:
            compiled = triton.compile(
                path,
                target=GPUTarget("cuda", arch, 32),
                options={"num_warps": num_warps, "num_stages": num_stages},
            )
        finally:
            knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = saved
    return parse_ptxas(report.getvalue(), getattr(compiled.metadata, "shared", 0))


def parse_ptxas(report: str, shared_bytes: int = 0) -> Usage:
    """Registers and spills from `ptxas -v`'s report (the largest and the sum over its
    entry functions)."""
    registers = [int(n) for n in re.findall(r"Used (\d+) registers", report)]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    if not registers:
        raise RuntimeError(f"no register count in ptxas's report: {report[-300:]}")
    return Usage(
        max(registers),
        sum(int(s) for s, _ in spills),
        sum(int(lo) for _, lo in spills),
        shared_bytes,
    )


def candidate_usage(
    kernel: Any,
    config: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    device_kind: str | None = None,
    arch: int | None = None,
) -> Usage:
    """Registers and spills of `kernel` at `config` on the GPU `device_kind` (its compute
    capability, or `arch`): every pallas_call it makes compiled and assembled."""
    from autotune import backends

    kind = device_kind or backends.of_platform("gpu").default_kind
    arch = arch or arch_of(kind)
    usages = [compile_usage(*m, arch) for m in triton_modules(kernel, config, args, kwargs, kind)]
    if not usages:
        raise RuntimeError(f"{kernel.spec.name} makes no Triton call at {dict(config)}")
    return functools.reduce(Usage.merged, usages)
