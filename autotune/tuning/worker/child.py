"""A device worker, the child side: `python -m autotune.tuning.worker.child`, started by parent.py.

It serves one task at a time (a SETUP message: see protocol.py) with an InProcessWorker, so a
candidate is measured here exactly as in a search process that measures in process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any, BinaryIO

from autotune.measure.timing import one_line
from autotune.tuning.worker.inprocess import InProcessWorker
from autotune.tuning.worker.protocol import Kind, Setup, read, write


def serve(inp: BinaryIO, out: BinaryIO, device: Any = None) -> None:
    """Answer the parent's requests until EXIT, or until a first SETUP fails; measure on
    `device` (a jax Device; None: the default one)."""
    worker: InProcessWorker | None = None
    while True:
        kind, *fields = read(inp)
        if kind is Kind.SETUP:
            try:
                loaded = _load(fields[0], device)
            except Exception as e:
                write(out, Kind.SETUP_ERROR, one_line(e))
                if worker is None:
                    return
                continue
            if worker is not None:
                worker.close()
            worker = loaded
            write(out, Kind.READY, worker.device)
        elif kind is Kind.ORACLE:
            worker.set_oracle(fields[0])
        elif kind is Kind.PREFETCH:
            worker.prefetch(fields[0])
        elif kind is Kind.MEASURE:
            config, known, max_memory = fields
            compiled = lambda s: write(out, Kind.COMPILED, s)  # noqa: E731
            record = worker.measure(config, known, max_memory, compiled)
            write(out, Kind.RESULT, record)
        elif kind is Kind.INTERLEAVED:
            try:
                write(out, Kind.SAMPLES, worker.interleaved(*fields))
            except Exception as e:
                write(out, Kind.ERROR, one_line(e))
        else:
            # drop what is queued ahead: exit waits only for a compile already running
            if worker is not None:
                worker.close()
            return


def _load(setup: Setup, device: Any) -> InProcessWorker:
    """A task's worker: its kernel, inputs resident on `device`, oracle and settings."""
    import jax

    from autotune import registry

    spec = registry.resolve(setup.task.kernel).spec
    args = [jax.device_put(a, device) for a in setup.args]
    worker = InProcessWorker(spec, setup.task, args, setup.policy, setup.compile_workers)
    worker.set_oracle(setup.oracle)
    return worker


def _die_with_parent() -> None:
    """Linux: a worker hung in a candidate must not outlive a search process killed outright."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)


def pinned_device(index: int) -> Any:
    """The device of a worker pinned to local device `index`: the one it sees, where its
    environment narrowed its devices to it (a GPU's, a TPU's: backends.pinned_env), else
    device `index` of those it sees (a CPU's forced host devices), made the default, so that
    every array and compile of this process lands on it."""
    import jax

    devices = jax.local_devices()
    if len(devices) > 1 and index >= len(devices):
        raise SystemExit(f"no local device {index}: this host has {len(devices)}")
    device = devices[0] if len(devices) == 1 else devices[index]
    jax.config.update("jax_default_device", device)
    return device


def main() -> None:
    _die_with_parent()
    # The protocol owns the original stdout; anything the kernel prints goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    index = sys.argv[1] if len(sys.argv) > 1 else None  # the device it is pinned to
    serve(sys.stdin.buffer, out, None if index is None else pinned_device(int(index)))


if __name__ == "__main__":
    main()
