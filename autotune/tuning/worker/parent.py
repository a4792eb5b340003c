"""A device worker, the parent side: a child process (child.py) that owns the device.

The child imports the kernel by name, receives the inputs and the oracle once, then measures
one candidate per request (see protocol.py). This process enforces a compile and a run time
limit per candidate; a child that dies (abort, segfault, out of memory) or overruns a limit is
killed, the candidate is recorded as `crashed` or `timeout`, and a fresh child takes the next
one. A child killed while it starts (for memory, by an operator) is started again, a few times
in a row at most (START_TRIES): the run goes on.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autotune import backends
from autotune.device import DeviceInfo, current_device
from autotune.errors import KernelError, SettingsError
from autotune.measure.compile_pool import AHEAD_PER_WORKER, default_compile_workers
from autotune.measure.policies import DEFAULT_LIMITS, DEFAULT_POLICY, TimingPolicy, WorkerLimits
from autotune.trial import Config, ConfigId, TrialRecord, config_id
from autotune.tuning.task import Task
from autotune.tuning.worker.protocol import Kind, Setup, pack, unpack

if TYPE_CHECKING:
    from autotune.tuning.settings import TuneSettings


# A child that dies while it starts is started again, this many times in a row at most: a kill
# from outside (for memory, by an operator) is no reason to end the run, while a child that
# can never start (it crashes importing the kernel) ends it after a few tries, not a loop.
START_TRIES = 3


class _Died(Exception):
    """The worker process ended, or overran its limit and was killed."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status  # "crashed" or "timeout"


class DeviceWorker:
    """A worker process that owns the device; restarted after each crash or timeout.

    The child imports `task`'s kernel by its 'package.module:function' path (worker_task).
    `args`, the inputs the task is measured with, and the oracle (given once known:
    `set_oracle`) travel as NumPy arrays; `device` is the worker's DeviceInfo. The child sees
    this process's `sys.path` (so it imports what this process imports) and
    `JAX_PLATFORMS=platforms` where given. A worker given `device_index` is pinned to that
    local device (`backends.pinned_env`; `worker.child.pinned_device`); `device_id` names the
    device its trials record ("gpu:3").

    A compile running ahead in the child's pool can crash it while another candidate is
    measured: that candidate is then measured again alone in a fresh worker, and the configs
    that were compiling ahead are only ever compiled when measured, so each crash is recorded
    against the config that caused it.
    """

    def __init__(
        self,
        task: Task,
        args: Sequence[Any],
        policy: TimingPolicy = DEFAULT_POLICY,
        limits: WorkerLimits = DEFAULT_LIMITS,
        platforms: str | None = None,
        compile_workers: int | None = None,
        device_index: int | None = None,
    ) -> None:
        self.limits = limits
        self.platforms = platforms
        self.device_index = device_index
        self.restarts = 0
        self._setup = Setup.of(worker_task(task), args, policy, compile_workers)
        self._proc: subprocess.Popen | None = None
        self._stderr: Any = None
        self._prefetched: set[ConfigId] = set()  # sent to this child to compile ahead, not measured
        self._suspects: set[ConfigId] = set()  # compiling ahead when a child crashed
        self.device = self._start()
        self.device_id = f"{self.device.platform}:{device_index or 0}"
        # the child sizes its pool by the same rule, from the same device
        self._ahead = AHEAD_PER_WORKER * (
            default_compile_workers(self.device) if compile_workers is None else compile_workers
        )

    # ---------------------------------------------------------------- requests

    def set_task(
        self, task: Task, args: Sequence[Any], policy: TimingPolicy = DEFAULT_POLICY
    ) -> Any:
        """Measure another task from now on, in the same worker (no new start-up); returns
        the worker's DeviceInfo."""
        self._setup = Setup.of(worker_task(task), args, policy, self._setup.compile_workers)
        self._suspects = set()  # configs of the task before
        if self._proc is None:
            self.restarts += 1
            return self._start()
        try:
            return self._set_up("set-up")
        except _Died as d:
            if d.status != "crashed":
                raise KernelError(
                    f"the device worker for {self._setup.task.kernel!r} {d}"
                ) from None
            self.restarts += 1  # it died while it took the new task: a fresh one takes it
            return self._start()

    def set_oracle(self, oracle: Any) -> None:
        """The output every candidate must match (the kernel's default in interpret mode)."""
        import jax
        import numpy as np

        self._setup = replace(self._setup, oracle=jax.tree_util.tree_map(np.asarray, oracle))
        if self._proc is not None:
            # if it died, the next request starts a fresh worker, which gets it at set-up
            with contextlib.suppress(_Died):
                self._send(Kind.ORACLE, self._setup.oracle)

    def prefetch(self, configs: Sequence[Config]) -> None:
        """Have the worker compile these, the configs measured after the next one, ahead."""
        if not self._ahead or self._proc is None:  # a crashed worker restarts on measure
            return
        ahead = [dict(c) for c in configs if config_id(c) not in self._suspects][: self._ahead]
        try:
            self._send(Kind.PREFETCH, ahead)
        except _Died:
            self._suspects |= self._prefetched
            return
        self._prefetched.update(config_id(c) for c in ahead)

    def measure(
        self, config: Config, known: Collection[str] = (), max_memory: int | None = None
    ) -> TrialRecord:
        """One candidate's trial record (a `duplicate` if its program's fingerprint is
        `known`, `over_memory` if its peak memory is above `max_memory` bytes); `crashed` /
        `timeout` if the worker did not survive it (the next request starts a fresh worker)."""
        config = dict(config)
        stage, sent = "compile", False
        try:
            fresh = self._ensure_started()
            logged = self._stderr_size()  # what the child logs from here on is this trial's
            self._send(Kind.MEASURE, config, list(known), max_memory)
            sent = True
            # the limit counts from the request: a compile still running ahead gets no more
            deadline = time.monotonic() + self.limits.compile_s
            while True:
                kind, value = self._recv(deadline, stage)
                if kind is Kind.COMPILED:
                    stage, deadline = "run", time.monotonic() + self.limits.run_s
                elif kind is Kind.RESULT:
                    self._prefetched.discard(config_id(config))
                    if value.status == "runtime_error":
                        # the exception is often a summary ("INTERNAL: ..."); the device's own
                        # words (a CUDA error, a failed launch) are what XLA logged meanwhile:
                        # its first lines (the cause) and its last
                        value.error = (value.error or "") + self._stderr_tail(logged, 4, first=4)
                    sticky = backends.of_platform(self.device.platform).sticky_faults
                    if value.status == "runtime_error" and sticky:
                        # every later launch in this process would fail too: the next
                        # request starts a fresh worker
                        self._kill()
                    return value
        except _Died as d:
            if d.status == "crashed" and self._prefetched:
                # a compile ahead may have killed it, not this config: see the class docstring
                self._suspects |= self._prefetched
                # in a fresh worker, with nothing ahead
                return self.measure(config, known, max_memory)
            if not sent and not fresh:
                # it died between trials (killed for memory, say): this config never reached it
                return self.measure(config, known, max_memory)  # in a fresh worker
            return TrialRecord(config, d.status, error=str(d))

    def interleaved(
        self, configs: Sequence[Config], rounds: int, reps: int
    ) -> tuple[list[list[float]], str] | None:
        """Interleaved samples of configs that measured fine before, and their timer; None if
        the worker did not survive (the caller keeps the first measurements)."""
        n = len(configs)
        limit = n * (self.limits.compile_s + self.limits.run_s)
        sent = False
        try:
            fresh = self._ensure_started()
            self._send(Kind.INTERLEAVED, [dict(c) for c in configs], rounds, reps)
            sent = True
            kind, value = self._recv(time.monotonic() + limit, "re-measurement")
            return value if kind is Kind.SAMPLES else None
        except _Died:
            if not sent and not fresh:  # it died since the last trial: this never reached it
                return self.interleaved(configs, rounds, reps)  # in a fresh worker
            return None

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._send(Kind.EXIT)
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired, _Died):
                pass
            self._kill()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> DeviceWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- process

    def _ensure_started(self) -> bool:
        """Start a fresh worker if there is none; True if one was started."""
        if self._proc is not None:
            return False
        self.restarts += 1
        self._start()
        return True

    def _start(self) -> Any:
        """Start a worker and set it up; one that dies while it starts is started again, up to
        START_TRIES in a row (each counted in `restarts` after the first). A worker that
        refuses the set-up, or overruns the start-up limit, is not tried again: a KernelError."""
        tries = 1
        while True:
            try:
                return self._start_once()
            except _Died as d:
                if d.status != "crashed" or tries == START_TRIES:
                    times = f" ({tries} times in a row)" if tries > 1 else ""
                    raise KernelError(
                        f"the device worker for {self._setup.task.kernel!r} {d}{times}"
                    ) from None
            tries += 1
            self.restarts += 1

    def _start_once(self) -> Any:
        env = child_env(self.platforms, self.device_index)
        pin = [] if self.device_index is None else [str(self.device_index)]
        if self._stderr is not None:
            self._stderr.close()
        # a file, not a pipe: a chatty worker can never block on it; read back after a crash
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the worker)
        self._proc = _popen(
            [sys.executable, "-c", _CHILD, *pin],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            start_new_session=True,  # its own process group: killing it kills its children
        )
        self._buffer = b""
        self._prefetched = set()
        return self._set_up("start-up")

    def _set_up(self, stage: str) -> Any:
        """Send the task's set-up and wait for the worker's DeviceInfo (_Died if it dies or
        overruns the start-up limit meanwhile). A worker that refuses it is killed: the next
        request starts a fresh one with this set-up, never measures the task before under this
        one's name."""
        self._send(Kind.SETUP, self._setup)
        kind, value = self._recv(time.monotonic() + self.limits.start_s, stage)
        if kind is not Kind.READY:
            self._kill()
            raise KernelError(
                f"the device worker cannot set up {self._setup.task.kernel!r}: {value}"
            )
        return value

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            # a request that failed to send is still buffered: closing retries it, into a dead pipe
            with contextlib.suppress(OSError):
                stream.close()

    def _send(self, kind: Kind, *fields: Any) -> None:
        try:
            self._proc.stdin.write(pack(kind, *fields))
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._died("crashed", "died while receiving a request")

    def _recv(self, deadline: float, stage: str) -> tuple:
        """The child's next reply, read without blocking past `deadline`."""
        fd = self._proc.stdout.fileno()
        while True:
            message, self._buffer = unpack(self._buffer)
            if message is not None:
                return message
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                self._died("timeout", f"exceeded the {stage} time limit")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self._died("crashed", f"died during {stage}")
            self._buffer += chunk

    def _died(self, status: str, what: str) -> None:
        proc = self._proc
        if status == "timeout":
            self._kill()
            raise _Died(status, f"{what}; the worker was killed")
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._kill()
        how = (
            f"signal {signal.Signals(-code).name}"
            if code is not None and code < 0
            else f"exit code {code}"
        )
        raise _Died(status, f"{what} ({how}){self._stderr_tail()}")

    def _stderr_size(self) -> int:
        return os.fstat(self._stderr.fileno()).st_size

    def _stderr_tail(self, since: int = 0, lines: int = 3, first: int = 0) -> str:
        """The first `first` and the last `lines` lines the child wrote to stderr after byte
        `since`, as a suffix of an error's text ("" if none). Read with pread: the child
        shares the file's offset."""
        fd = self._stderr.fileno()
        text = os.pread(fd, max(0, self._stderr_size() - since), since)
        written = [ln for ln in text.decode(errors="replace").splitlines() if ln.strip()]
        if len(written) > first + lines:
            written = written[:first] + (["..."] if first else []) + written[-lines:]
        return f"; stderr: {' | '.join(written)[-200 * (first + lines) :]}" if written else ""


def _popen(cmd: list[str], **kwargs: Any) -> subprocess.Popen:
    """Start a child process from a thread that lives as long as this process: a worker child
    dies with the thread that started it (PR_SET_PDEATHSIG, worker.child), and the threads of
    a search on several devices end before their workers do."""
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(cmd, **kwargs)
    started: concurrent.futures.Future = concurrent.futures.Future()
    _spawner().put((started, cmd, kwargs))
    return started.result()


@functools.cache
def _spawner() -> queue.SimpleQueue:
    """The queue of a thread that starts child processes for other threads, until this
    process ends (started at its first use)."""
    requests: queue.SimpleQueue = queue.SimpleQueue()

    def spawn() -> None:
        while True:
            started, cmd, kwargs = requests.get()
            try:
                started.set_result(subprocess.Popen(cmd, **kwargs))
            except BaseException as e:
                started.set_exception(e)

    threading.Thread(target=spawn, name="autotune-worker-spawner", daemon=True).start()
    return requests


def worker_task(task: Task) -> Task:
    """`task` with its kernel named as a worker child imports it: 'package.module:function' as
    given, else the import path of the kernel registered here under that name (the child
    imports no module that registered it here), checked here."""
    from autotune.registry import import_path, resolve

    if ":" in task.kernel:
        return task
    return dataclasses.replace(task, kernel=import_path(resolve(task.kernel)))


def child_env(platforms: str | None, device_index: int | None = None) -> dict[str, str]:
    """A worker child's environment: this process's `sys.path`, in its order (so that it
    imports what this process imports, and a module in the working directory never shadows an
    installed one unless it does here), `JAX_PLATFORMS=platforms` where given, and the
    settings that give it local device `device_index` alone where given."""
    env = dict(os.environ)
    if device_index is not None:
        env.update(backends.pinned_env(device_index, os.environ))
    paths = [p or os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if os.path.isdir(p)))
    if platforms is not None:
        env["JAX_PLATFORMS"] = platforms
    if not {PREALLOCATE, MEM_FRACTION} & env.keys():
        # XLA takes 75% of a GPU's memory up front by default: the search process (or the
        # hardware check) beside this child would hold it, and a child could not get memory
        # for its first launch. A user who set either variable keeps that choice.
        env[PREALLOCATE] = "false"
    return env


PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"


# `python -c` (and -m) puts the working directory first on sys.path, where a jax.py would
# shadow the installed jax: a child drops it and finds modules through PYTHONPATH (child_env).
# (`python -P` does the same from Python 3.11 on.)
_SAFE_PATH = "import sys; sys.path.pop(0); "
_CHILD = (
    _SAFE_PATH
    + "import runpy; runpy.run_module('autotune.tuning.worker.child', run_name='__main__')"
)
_REPORT_DEVICES = _SAFE_PATH + (
    "import dataclasses, json; from autotune.device import current_device, local_device_units; "
    "print(json.dumps([dataclasses.asdict(current_device()), local_device_units()]))"
)


@functools.cache
def worker_devices(platforms: str | None, timeout_s: float) -> tuple[DeviceInfo, int]:
    """The device a worker started with `platforms` measures on, and how many workers its
    local devices take (`local_device_units`: a TPU's chips, not a v7x's TensorCores), asked
    once of a short-lived child: what keys the tasks of a run whose own process keeps to
    another platform (the CLI keeps to the CPU while its workers own the accelerator), and how
    many devices `--devices all` means there."""
    fields, count = json.loads(_ask_child(_REPORT_DEVICES, platforms, timeout_s))
    return DeviceInfo(**{**fields, "packages": tuple(map(tuple, fields["packages"]))}), count


def _ask_child(code: str, platforms: str | None, timeout_s: float) -> str:
    """What a short-lived child running `code` prints."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=child_env(platforms),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise KernelError(
            f"a device worker did not report its device within {timeout_s:.0f} s"
        ) from None
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])[-600:]
        raise KernelError(f"a device worker cannot start (exit code {proc.returncode}): {tail}")
    return proc.stdout


def tuning_device(settings: TuneSettings) -> DeviceInfo:
    """The device that tasks run with `settings` are measured on, which keys them: a device
    worker's where the workers keep to other platforms than this process (the CLI keeps itself
    to the CPU while they own the accelerator), else this process's."""
    if _apart(settings):
        return worker_devices(settings.worker_platforms, settings.limits.start_s)[0]
    return current_device()


def device_count(settings: TuneSettings) -> int:
    """How many local devices measure a task at once (settings.devices), checked against the
    devices a worker sees: counted in this process where the workers keep to its platforms,
    else reported with their device (one child asked once for both: this process never looks
    at the accelerator its workers own)."""
    if settings.devices == 1:
        return 1
    if _apart(settings):
        found = worker_devices(settings.worker_platforms, settings.limits.start_s)[1]
    else:
        from autotune.device import local_device_units

        found = local_device_units()  # a TPU's chips: v7x has two devices a chip
    if settings.devices == "all":
        return found
    if settings.devices > found:
        raise SettingsError(
            "devices",
            f"asks for {settings.devices} devices and this host has {found} local "
            f"{'device' if found == 1 else 'devices'}: give at most {found}, or all",
        )
    return settings.devices


def _apart(settings: TuneSettings) -> bool:
    """Whether the workers keep to other platforms than this process."""
    isolated = settings.isolate or settings.devices != 1
    return isolated and settings.worker_platforms is not None
