"""A device worker, the child side: `python -m autotune.worker.child`, started by parent.py.

It serves one task at a time (a SETUP message: see protocol.py) with an InProcessWorker, so a
candidate is measured here exactly as in a search process that measures in process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import BinaryIO

from autotune.measure import one_line
from autotune.worker.inprocess import InProcessWorker
from autotune.worker.protocol import Kind, Setup, read, write


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """Answer the parent's requests until EXIT, or until a first SETUP fails."""
    worker: InProcessWorker | None = None
    while True:
        kind, *fields = read(inp)
        if kind is Kind.SETUP:
            try:
                loaded = _load(fields[0])
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
            config, known = fields
            record = worker.measure(config, known, lambda s: write(out, Kind.COMPILED, s))
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


def _load(setup: Setup) -> InProcessWorker:
    """A task's worker: its kernel, device-resident inputs, oracle and settings."""
    import jax

    from autotune import registry

    spec = registry.resolve(setup.task.kernel).spec
    args = [jax.device_put(a) for a in setup.args]
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


def main() -> None:
    _die_with_parent()
    # The protocol owns the original stdout; anything the kernel prints goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
