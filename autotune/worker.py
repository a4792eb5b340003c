"""Measuring candidates: in this process, or in a device worker process that may die.

A `DeviceWorker` is a child process (`python -m autotune.worker`) that owns the device: it
imports the kernel by name, receives the inputs and the oracle once, then measures one
candidate per request (compile ahead, run once, verify, time). The search process enforces a
compile and a run time limit per candidate; a worker that dies (abort, segfault, out of
memory) or overruns a limit is killed, the candidate is recorded as `crashed` or `timeout`,
and a fresh worker takes the next one. `InProcessWorker` measures the same way without the
isolation, for interactive use and tune-on-miss.

Both compile the candidates the search will measure next (`prefetch`) in a `CompilePool` of
`compile_workers` threads while the current one is timed (None: sized to the host, see
`default_compile_workers`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.compile_pool import AHEAD_PER_WORKER, CompilePool, default_compile_workers
from autotune.errors import KernelError
from autotune.measure import (
    DEFAULT_POLICY,
    TimingPolicy,
    cache_bytes,
    compile_config,
    interleaved_samples,
    measure_candidate,
    one_line,
    rotation_sets,
)
from autotune.trial import Config, TrialRecord, config_id


@dataclass(frozen=True)
class WorkerLimits:
    """Per-candidate time limits of a device worker, in seconds."""

    compile_s: float = 300.0  # tracing, lowering and compiling one candidate
    run_s: float = 120.0  # the verifying run and every timed repetition of one candidate
    start_s: float = 300.0  # starting a worker: importing JAX and the kernel, taking the inputs


DEFAULT_LIMITS = WorkerLimits()


class InProcessWorker:
    """Measures candidates in this process: no isolation, no start-up cost."""

    def __init__(
        self,
        kernel: Any,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        oracle: Any,
        policy: TimingPolicy = DEFAULT_POLICY,
        compile_workers: int | None = None,
    ) -> None:
        from autotune.device import current_device

        self.kernel, self.args, self.kwargs = kernel, list(args), dict(kwargs)
        self.oracle, self.policy = oracle, policy
        self.device = current_device()
        self.arg_sets = rotation_sets(self.args, cache_bytes(self.device))
        self.compiled: dict[tuple, Any] = {}
        self.restarts = 0
        if compile_workers is None:
            compile_workers = default_compile_workers(self.device)
        self.pool = CompilePool(
            compile_workers, lambda c: compile_config(self.kernel.spec, c, self.args, self.kwargs)
        )

    def prefetch(self, configs: Sequence[Mapping[str, Any]]) -> None:
        """Compile these, the configs measured after the next one, ahead."""
        self.pool.prefetch(configs)

    def measure(self, config: Config) -> TrialRecord:
        return measure_candidate(
            self.kernel.spec,
            config,
            self.args,
            self.kwargs,
            self.oracle,
            self.policy,
            arg_sets=self.arg_sets,
            cache=self.compiled,
            pool=self.pool,
        )

    def interleaved(
        self, configs: Sequence[Mapping[str, Any]], rounds: int, reps: int
    ) -> tuple[list[list[float]], str]:
        return interleaved_samples(
            self.kernel.spec,
            configs,
            [self.args, *self.arg_sets],
            self.kwargs,
            rounds,
            reps,
            self.compiled,
            self.policy,
        )

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> InProcessWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Died(Exception):
    """The worker process ended, or overran its limit and was killed."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status  # "crashed" or "timeout"


class DeviceWorker:
    """A worker process that owns the device; restarted after each crash or timeout.

    `target` is what the worker imports: a registered kernel name or 'package.module:function'.
    `args` and the oracle (given once known: `set_oracle`) travel as NumPy arrays; `device` is
    the worker's DeviceInfo. The child sees this process's `sys.path` (so it
    imports what this process imports) and `JAX_PLATFORMS=platforms` where given.

    A compile running ahead in the child's pool can crash it while another candidate is
    measured: that candidate is then measured again alone in a fresh worker, and the configs
    that were compiling ahead are only ever compiled when measured, so each crash is recorded
    against the config that caused it.
    """

    def __init__(
        self,
        target: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        policy: TimingPolicy = DEFAULT_POLICY,
        limits: WorkerLimits = DEFAULT_LIMITS,
        platforms: str | None = None,
        compile_workers: int | None = None,
    ) -> None:
        import numpy as np

        self.limits = limits
        self.platforms = platforms
        self.restarts = 0
        self._setup = {
            "target": target,
            "args": [np.asarray(a) for a in args],
            "kwargs": dict(kwargs),
            "oracle": None,
            "policy": policy,
            "compile_workers": compile_workers,
        }
        self._proc: subprocess.Popen | None = None
        self._stderr: Any = None
        self._prefetched: set[tuple] = set()  # sent to this child to compile ahead, not measured
        self._suspects: set[tuple] = set()  # compiling ahead when a child crashed
        self.device = self._start()
        # the child sizes its pool by the same rule, from the same device
        self._ahead = AHEAD_PER_WORKER * (
            default_compile_workers(self.device) if compile_workers is None else compile_workers
        )

    # ---------------------------------------------------------------- requests

    def set_task(
        self,
        target: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        policy: TimingPolicy = DEFAULT_POLICY,
    ) -> Any:
        """Measure another kernel or call from now on, in the same worker (no new start-up);
        returns the worker's DeviceInfo."""
        import numpy as np

        self._setup = {
            "target": target,
            "args": [np.asarray(a) for a in args],
            "kwargs": dict(kwargs),
            "oracle": None,
            "policy": policy,
            "compile_workers": self._setup["compile_workers"],
        }
        self._suspects = set()  # configs of the task before
        if self._proc is None:
            self.restarts += 1
            return self._start()
        try:
            self._send(("setup", self._setup))
            kind, value = self._recv(time.monotonic() + self.limits.start_s, "set-up")
        except _Died as d:
            raise KernelError(f"the device worker for {target!r} {d}") from None
        if kind != "ready":
            raise KernelError(f"the device worker cannot set up {target!r}: {value}")
        return value

    def set_oracle(self, oracle: Any) -> None:
        """The output every candidate must match (the kernel's default in interpret mode)."""
        import jax
        import numpy as np

        self._setup["oracle"] = jax.tree_util.tree_map(np.asarray, oracle)
        if self._proc is not None:
            # if it died, the next request starts a fresh worker, which gets it at set-up
            with contextlib.suppress(_Died):
                self._send(("oracle", self._setup["oracle"]))

    def prefetch(self, configs: Sequence[Mapping[str, Any]]) -> None:
        """Have the worker compile these, the configs measured after the next one, ahead."""
        if not self._ahead or self._proc is None:  # a crashed worker restarts on measure
            return
        ahead = [dict(c) for c in configs if config_id(c) not in self._suspects][: self._ahead]
        try:
            self._send(("prefetch", ahead))
        except _Died:
            self._suspects |= self._prefetched
            return
        self._prefetched.update(config_id(c) for c in ahead)

    def measure(self, config: Config) -> TrialRecord:
        """One candidate's trial record; `crashed` / `timeout` if the worker did not survive it
        (the next request starts a fresh worker)."""
        config = dict(config)
        stage, sent = "compile", False
        try:
            fresh = self._ensure_started()
            self._send(("measure", config))
            sent = True
            # the limit counts from the request: a compile still running ahead gets no more
            deadline = time.monotonic() + self.limits.compile_s
            while True:
                kind, value = self._recv(deadline, stage)
                if kind == "compiled":
                    stage, deadline = "run", time.monotonic() + self.limits.run_s
                elif kind == "result":
                    self._prefetched.discard(config_id(config))
                    return value
        except _Died as d:
            if d.status == "crashed" and self._prefetched:
                # a compile ahead may have killed it, not this config: see the class docstring
                self._suspects |= self._prefetched
                return self.measure(config)  # in a fresh worker, which has nothing ahead
            if not sent and not fresh:
                # it died between trials (killed for memory, say): this config never reached it
                return self.measure(config)  # in a fresh worker
            return TrialRecord(config, d.status, error=str(d))

    def interleaved(
        self, configs: Sequence[Mapping[str, Any]], rounds: int, reps: int
    ) -> tuple[list[list[float]], str] | None:
        """Interleaved samples of configs that measured fine before, and their timer; None if
        the worker did not survive (the caller keeps the first measurements)."""
        n = len(configs)
        limit = n * (self.limits.compile_s + self.limits.run_s)
        try:
            self._ensure_started()
            self._send(("interleaved", [dict(c) for c in configs], rounds, reps))
            kind, value = self._recv(time.monotonic() + limit, "re-measurement")
            return value if kind == "samples" else None
        except _Died:
            return None

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._send(("exit",))
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
        env = dict(os.environ)
        paths = [p or os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if os.path.isdir(p)))
        if self.platforms is not None:
            env["JAX_PLATFORMS"] = self.platforms
        if self._stderr is not None:
            self._stderr.close()
        # a file, not a pipe: a chatty worker can never block on it; read back after a crash
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the worker)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            start_new_session=True,  # its own process group: killing it kills its children
        )
        self._buffer = b""
        self._prefetched = set()
        try:
            self._send(("setup", self._setup))
            kind, value = self._recv(time.monotonic() + self.limits.start_s, "start-up")
        except _Died as d:
            raise KernelError(f"the device worker for {self._setup['target']!r} {d}") from None
        if kind != "ready":
            self._kill()
            raise KernelError(f"the device worker cannot set up {self._setup['target']!r}: {value}")
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

    def _send(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._proc.stdin.write(struct.pack("<Q", len(data)) + data)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._died("crashed", "while receiving a request")

    def _recv(self, deadline: float, stage: str) -> tuple[str, Any]:
        fd = self._proc.stdout.fileno()
        while True:
            if len(self._buffer) >= 8:
                (size,) = struct.unpack("<Q", self._buffer[:8])
                if len(self._buffer) >= 8 + size:
                    data, self._buffer = self._buffer[8 : 8 + size], self._buffer[8 + size :]
                    return pickle.loads(data)
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

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        lines = [ln for ln in self._stderr.read().decode(errors="replace").splitlines() if ln]
        return f"; stderr: {' | '.join(lines[-3:])[-600:]}" if lines else ""


# -------------------------------------------------------------------- the child side


def _serve(inp: Any, out: Any) -> None:
    def send(message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(struct.pack("<Q", len(data)) + data)
        out.flush()

    def recv() -> Any:
        head = inp.read(8)
        if len(head) < 8:
            return ("exit",)
        return pickle.loads(inp.read(struct.unpack("<Q", head)[0]))

    task: dict[str, Any] | None = None
    while True:
        message = recv()
        if message[0] == "setup":
            try:
                loaded = _load(message[1])
            except Exception as e:
                send(("setup_error", one_line(e)))
                if task is None:
                    return
                continue
            if task is not None:
                task["pool"].close()
            task = loaded
            send(("ready", task["device"]))
        elif message[0] == "oracle":
            task["oracle"] = message[1]
        elif message[0] == "prefetch":
            task["pool"].prefetch(message[1])
        elif message[0] == "measure":
            fields = measure_candidate(
                task["spec"],
                message[1],
                task["args"],
                task["kwargs"],
                task["oracle"],
                task["policy"],
                on_compiled=lambda s: send(("compiled", s)),
                arg_sets=task["arg_sets"],
                cache=task["compiled"],
                pool=task["pool"],
            )
            send(("result", fields))
        elif message[0] == "interleaved":
            _, configs, rounds, reps = message
            try:
                samples = interleaved_samples(
                    task["spec"],
                    configs,
                    [task["args"], *task["arg_sets"]],
                    task["kwargs"],
                    rounds,
                    reps,
                    task["compiled"],
                    task["policy"],
                )
                send(("samples", samples))
            except Exception as e:
                send(("error", one_line(e)))
        else:
            if task is not None:  # drop what is queued ahead: exit waits only for a running compile
                task["pool"].close()
            return


def _load(setup: dict[str, Any]) -> dict[str, Any]:
    """A task's kernel, device-resident inputs and settings, from its set-up message."""
    import jax

    from autotune import registry
    from autotune.device import current_device

    device = current_device()
    args = [jax.device_put(a) for a in setup["args"]]
    spec = registry.resolve(setup["target"]).spec
    workers = setup["compile_workers"]
    if workers is None:
        workers = default_compile_workers(device)
    return {
        "spec": spec,
        "pool": CompilePool(workers, lambda c: compile_config(spec, c, args, setup["kwargs"])),
        "device": device,
        "args": args,
        "arg_sets": rotation_sets(args, cache_bytes(device)),
        "compiled": {},  # verified executables by config, for the finalists
        "kwargs": setup["kwargs"],
        "oracle": setup["oracle"],
        "policy": setup["policy"],
    }


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
    _serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
