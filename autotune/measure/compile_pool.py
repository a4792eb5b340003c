"""Compiling the candidates a search will measure next, in threads, while the current one is timed.

XLA compiles with the GIL released, so `workers` threads compile that many candidates at once
beside the timing thread. On the CPU backend they would compete with the timed runs for the
same cores, so the default there is none.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from autotune.trial import ConfigId, config_id

MAX_DEFAULT_WORKERS = 4
AHEAD_PER_WORKER = 2  # configs compiled ahead per thread: enough to keep it busy, few executables


def default_compile_workers(device: Any) -> int:
    """Compile threads sized to the host: none on the CPU, where they would disturb timing."""
    return 0 if device.interpret else min(MAX_DEFAULT_WORKERS, os.cpu_count() or 1)


class CompilePool:
    """Compiles configs ahead with `compile` (config -> its autotune.measure.compiling.Program); `take`
    hands a config's result over, compiling it now where it was not prefetched.

    Memory stays bounded: at most `AHEAD_PER_WORKER * workers` configs are compiled ahead, and
    a config's executable leaves the pool when it is taken, or when it is no longer upcoming.
    """

    def __init__(self, workers: int, compile: Callable[[dict[str, Any]], Any]):
        self.workers = workers
        self._compile = compile
        self._executor = ThreadPoolExecutor(workers, "autotune-compile") if workers else None
        self._futures: dict[ConfigId, Future] = {}
        self._window: set[ConfigId] = set()

    def prefetch(self, configs: Sequence[Mapping[str, Any]]) -> None:
        """Start compiling the first few of `configs`, the ones measured after the next."""
        if self._executor is None:
            return
        ahead = [dict(c) for c in configs[: AHEAD_PER_WORKER * self.workers]]
        self._window = {config_id(c) for c in ahead}
        for config in ahead:
            key = config_id(config)
            if key not in self._futures:
                self._futures[key] = self._executor.submit(self._compile, config)

    def take(self, config: Mapping[str, Any]) -> Any:
        """What compiling `config` gave, waiting for a compile in progress; a compile error
        found in a thread is raised here."""
        future = self._futures.pop(config_id(config), None)
        # the window was set before this config was requested: what is outside it now will
        # not be asked for soon (measured, or taken by another worker of a shared study)
        for key in [k for k in self._futures if k not in self._window]:
            self._futures.pop(key).cancel()
        return future.result() if future is not None else self._compile(dict(config))

    def close(self) -> None:
        """Drop what is compiled ahead; a compile already running finishes in its thread."""
        self._futures.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
