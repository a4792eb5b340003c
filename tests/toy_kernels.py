"""Small kernels written for the tests: each is real Pallas, run in interpret mode."""

from __future__ import annotations

import os
import signal
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from autotune import autotuned

# The configurations each kernel wrapper was traced with (wrappers run at trace time only).
TRACED: dict[str, list[dict]] = {"scale": [], "buggy_scale": []}


def _scale_call(x, block_rows, interpret, bug=False):
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + (1.0 if bug else 0.0)

    rows, cols = x.shape
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // block_rows,),
        in_specs=[pl.BlockSpec((block_rows, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((block_rows, cols), lambda i: (i, 0)),
        interpret=interpret,
    )(x)


def rows_divide(config, sig):
    return sig.shapes[0][0] % config["block_rows"] == 0


def scale_reference(x):
    return x * 2.0


@autotuned(
    name="scale",
    space={"block_rows": [8, 12, 16, 24, 32]},
    constraints=[rows_divide],
    reference=scale_reference,
)
def scale(x, *, block_rows=8, interpret=False):
    TRACED["scale"].append({"block_rows": block_rows})
    return _scale_call(x, block_rows, interpret)


@autotuned(
    name="buggy_scale",
    space={"block_rows": [8, 16, 32]},
    constraints=[rows_divide],
    reference=scale_reference,
)
def buggy_scale(x, *, block_rows=8, interpret=False):
    """Right everywhere except at block_rows=32, which also happens to run fastest."""
    TRACED["buggy_scale"].append({"block_rows": block_rows})
    return _scale_call(x, block_rows, interpret, bug=block_rows == 32)


HANG_S = 3600.0  # far beyond any worker time limit in the tests


def _sleep_then(x):
    time.sleep(HANG_S)
    return x


@autotuned(
    name="fragile_scale",
    space={"block_rows": [8, 16, 32, 64]},
    constraints=[rows_divide],
    reference=scale_reference,
)
def fragile_scale(x, *, block_rows=8, interpret=False):
    """For device-worker tests only: aborts the process while tracing block_rows=16, hangs
    tracing block_rows=32, and hangs at run time at block_rows=64; block_rows=8 is healthy."""
    if block_rows == 16:
        os.abort()
    if block_rows == 32:
        time.sleep(HANG_S)
    out = _scale_call(x, block_rows, interpret)
    if block_rows == 64:
        out = jax.pure_callback(_sleep_then, jax.ShapeDtypeStruct(x.shape, x.dtype), out)
    return out


# (block_rows, thread) of each trace of picky_scale: compiles ahead trace in a pool thread
PICKY_TRACED: list[tuple[int, str]] = []


@autotuned(
    name="picky_scale",
    space={"block_rows": [8, 16, 32]},
    constraints=[rows_divide],
    reference=scale_reference,
)
def picky_scale(x, *, block_rows=8, interpret=False):
    """Fails to compile at block_rows=16; the others are healthy."""
    PICKY_TRACED.append((block_rows, threading.current_thread().name))
    if block_rows == 16:
        raise ValueError("picky_scale refuses block_rows=16")
    return _scale_call(x, block_rows, interpret)


def _abort_if_doomed(x):
    if os.path.exists(os.environ.get("TOY_DOOMED_MARKER", "/nonexistent")):
        os.abort()
    return x


@autotuned(
    name="doomed_scale",
    space={"block_rows": [8, 16, 32]},
    constraints=[rows_divide],
    reference=scale_reference,
)
def doomed_scale(x, *, block_rows=8, interpret=False):
    """Aborts the process that runs it once the file $TOY_DOOMED_MARKER exists."""
    out = _scale_call(x, block_rows, interpret)
    return jax.pure_callback(_abort_if_doomed, jax.ShapeDtypeStruct(x.shape, x.dtype), out)


# interrupt_scale raises KeyboardInterrupt at these traces of its default, counted from 1 (the
# oracle's is the first): a Ctrl-C while that configuration is measured; and at the trace
# $TOY_KILL_AT_TRACE names, it kills its process (kill -9)
INTERRUPT_TRACES: set[int] = set()
_DEFAULT_TRACES = [0]


@autotuned(
    name="interrupt_scale",
    space={"block_rows": [8, 12, 16, 24, 32]},
    constraints=[rows_divide],
    reference=scale_reference,
)
def interrupt_scale(x, *, block_rows=8, interpret=False):
    if block_rows == 8:
        _DEFAULT_TRACES[0] += 1
        if _DEFAULT_TRACES[0] in INTERRUPT_TRACES:
            raise KeyboardInterrupt
        if str(_DEFAULT_TRACES[0]) == os.environ.get("TOY_KILL_AT_TRACE"):
            os.kill(os.getpid(), signal.SIGKILL)
    return _scale_call(x, block_rows, interpret)


def _gathered_reference(x):
    """scale's reference, reached once every one of $TOY_GATHER_N processes has reached it (a
    file each in $TOY_GATHER_DIR), where set: concurrent runs of one key then search together,
    none done before the last has joined its study."""
    folder = os.environ.get("TOY_GATHER_DIR")
    if folder is None:
        return x * 2.0
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 300
    while len(os.listdir(folder)) < int(os.environ["TOY_GATHER_N"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return x * 2.0


@autotuned(
    name="gathered_scale",
    space={"block_rows": [4, 8, 12, 16, 24, 32, 48, 96]},
    constraints=[rows_divide],
    reference=_gathered_reference,
)
def gathered_scale(x, *, block_rows=8, interpret=False):
    """96 or 192 rows give 8 valid configurations, 8 distinct programs."""
    return _scale_call(x, block_rows, interpret)


@autotuned(name="asserting_scale", space={"block_rows": [8, 16]}, constraints=[rows_divide])
def asserting_scale(x, *, block_rows=8, interpret=False):
    """Fails a bare assert, as a Triton kernel called without interpret=True on a CPU does."""
    assert not interpret
    return _scale_call(x, block_rows, interpret)


def make_input(rows=64, cols=128, dtype=jnp.float32):
    """Normal samples drawn by numpy: jax.random compiles a program at each new shape."""
    x = np.random.default_rng(0).standard_normal((rows, cols), np.float32)
    return jnp.asarray(x.astype(dtype))


class KernelFault(Exception):
    """Raised inside a compiled call: it surfaces as jax's runtime error, as a device fault does."""


_FAULTS = []


def _fault(x):
    # what a device's runtime logs before the error surfaces (XLA's CUDA executor writes such
    # lines to stderr, where the exception says only "INTERNAL: ..."), numbered per process
    _FAULTS.append(1)
    os.write(
        2,
        f"E0000 cuda_executor.cc:42] CUDA_ERROR_ILLEGAL_ADDRESS (fault {len(_FAULTS)})\n".encode(),
    )
    raise KernelFault("illegal memory access in the kernel")


@autotuned(
    name="faulting_scale",
    space={"block_rows": [8, 16]},
    constraints=[rows_divide],
    reference=scale_reference,
)
def faulting_scale(x, *, block_rows=8, interpret=False):
    """Compiles at every block_rows; fails every run at block_rows=16 (for device-worker tests)."""
    out = _scale_call(x, block_rows, interpret)
    if block_rows == 16:
        out = jax.pure_callback(_fault, jax.ShapeDtypeStruct(x.shape, x.dtype), out)
    return out
