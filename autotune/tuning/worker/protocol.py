"""The wire between a device worker's parent (parent.py) and child (child.py).

A message is a tuple `(Kind, *fields)`, pickled and prefixed by its length (8 bytes, little
endian), on the child's stdin (requests) and its original stdout (replies).

    SETUP (Setup)          -> READY (DeviceInfo) | SETUP_ERROR (text)
    ORACLE (outputs)       (no reply)
    PREFETCH ([Config])    (no reply)
    MEASURE (Config, [fingerprint], max_memory) -> COMPILED (seconds), then RESULT (TrialRecord)
    INTERLEAVED ([Config], rounds, reps) -> SAMPLES ((samples, timer)) | ERROR (text)
    EXIT                   (no reply; also what the end of the stream reads as)
"""

from __future__ import annotations

import enum
import pickle
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from autotune.measure.policies import TimingPolicy
from autotune.tuning.task import Task

_LENGTH = struct.Struct("<Q")


class Kind(enum.Enum):
    # requests, parent to child
    SETUP = "setup"
    ORACLE = "oracle"
    PREFETCH = "prefetch"
    MEASURE = "measure"
    INTERLEAVED = "interleaved"
    EXIT = "exit"
    # replies, child to parent
    READY = "ready"
    SETUP_ERROR = "setup_error"
    COMPILED = "compiled"
    RESULT = "result"
    SAMPLES = "samples"
    ERROR = "error"


@dataclass(frozen=True)
class Setup:
    """A task for the child: the Task (its kernel named as the child imports it), the call's
    inputs (NumPy arrays), and how to judge and time candidates."""

    task: Task
    args: list[Any]
    policy: TimingPolicy
    compile_workers: int | None
    oracle: Any = None  # NumPy arrays; None until the parent knows it (then an ORACLE message)

    @classmethod
    def of(
        cls,
        task: Task,
        args: Sequence[Any],
        policy: TimingPolicy,
        compile_workers: int | None,
    ) -> Setup:
        """A task's set-up, its arrays copied to the host: NumPy arrays travel, device buffers
        do not."""
        import numpy as np

        return cls(task, [np.asarray(a) for a in args], policy, compile_workers)


def pack(kind: Kind, *fields: Any) -> bytes:
    data = pickle.dumps((kind, *fields), protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


def unpack(buffer: bytes) -> tuple[tuple | None, bytes]:
    """The first whole message in `buffer` and what follows it; (None, buffer) if none is whole."""
    if len(buffer) < _LENGTH.size:
        return None, buffer
    (size,) = _LENGTH.unpack_from(buffer)
    end = _LENGTH.size + size
    if len(buffer) < end:
        return None, buffer
    return pickle.loads(buffer[_LENGTH.size : end]), buffer[end:]


def write(stream: BinaryIO, kind: Kind, *fields: Any) -> None:
    stream.write(pack(kind, *fields))
    stream.flush()


def read(stream: BinaryIO) -> tuple:
    """The next message, waiting for it; EXIT at the end of the stream."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return (Kind.EXIT,)
    return pickle.loads(stream.read(_LENGTH.unpack(head)[0]))
