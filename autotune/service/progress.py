"""A tuning job's progress: its state as it goes, and its display on a rich console."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from autotune.tuning.task import Task


@dataclass
class Outcome:
    task: Task
    status: str  # tuned | skipped | failed
    detail: str = ""
    result: Any = None


@dataclass
class JobProgress:
    """What a job reports as it goes; `show` receives it after every trial and task."""

    n_tasks: int
    task_index: int = 0
    task: Task | None = None
    trial: int = 0
    n_trials: int = 0
    best_s: float | None = None
    started: float = field(default_factory=time.monotonic)
    trials_done: int = 0
    budget_left: int = 0  # trials of the tasks after the current one
    record: Any = None  # the current task's last trial (a TrialRecord)
    # the current task's trials that compiled to a program measured already: stored, not
    # measured, so `trial` (what the budget counts) stays where it was
    duplicates: int = 0

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def eta_s(self) -> float | None:
        """Remaining time at the mean pace so far (skipped tasks take none)."""
        if not self.trials_done:
            return None
        left = max(self.n_trials - self.trial, 0) + self.budget_left
        return self.elapsed_s / self.trials_done * left


class Display:
    """The job's progress on a rich console: live bars on a terminal, one line per event in a
    log (CI, a Kubernetes pod): task i of N (`unit`: a program's calls), trial j of M, best so
    far, elapsed, remaining. Tuning on several devices, each device's worker too: its trials,
    and its last one."""

    def __init__(self, console: Any, unit: str = "task") -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.console, self.unit = console, unit
        self.live = None
        if console.is_terminal:
            self.live = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                console=console,
            )
            self.tasks_bar = self.live.add_task(f"{unit}s", total=None, info="")
            self.trials_bar = self.live.add_task("trials", total=None, info="")
        self.workers: dict[str, Any] = {}  # a device's bar, by the device its trials name
        self.measured: dict[str, int] = {}  # trials each device measured in this job

    def __enter__(self) -> Display:
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.stop()

    def __call__(self, p: JobProgress, outcome: Outcome | None) -> None:
        head = f"{self.unit} {p.task_index}/{p.n_tasks}"
        if outcome is not None:
            line = f"{head} {outcome.status:7s} {outcome.task.label}: {outcome.detail}"
            if self.live:
                self.live.update(self.tasks_bar, completed=p.task_index, total=p.n_tasks)
                self.live.console.print(line, markup=False, highlight=False, soft_wrap=True)
            else:
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            return
        device = getattr(p.record, "device", None)
        if device is not None:
            self.measured[device] = self.measured.get(device, 0) + 1
        several = len(self.measured) > 1
        best = f"{p.best_s * 1e3:.4f} ms" if p.best_s else "-"
        eta = _clock(p.eta_s) if p.eta_s is not None else "-"
        info = f"best {best} (first pass)  elapsed {_clock(p.elapsed_s)}  eta {eta}"
        dups = p.duplicates
        repeats = f" +{dups} duplicate{'s' * (dups != 1)} (not measured)" if dups else ""
        if self.live:
            self.live.update(
                self.tasks_bar, completed=p.task_index - 1, total=p.n_tasks, info=p.task.label
            )
            self.live.update(
                self.trials_bar,
                completed=p.trial,
                total=p.n_trials,
                info=f"{info}{repeats}{space_note(p)}",
            )
            if several:
                self._show_worker(device, p.record)
        else:
            on = f" on {device}" if several else ""
            first = space_note(p) if p.trial == 1 and not dups else ""
            self.console.print(
                f"{head} trial {p.trial}/{p.n_trials}{repeats}{on}  {info}  {p.task.label}{first}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    def _show_worker(self, device: str, record: Any) -> None:
        """A bar per device's worker: the trials it measured, its last one's status and time."""
        for name in self.measured.keys() - self.workers.keys():
            self.workers[name] = self.live.add_task(f"  {name}", total=None, info="")
        time = f" {record.time_s * 1e3:.4f} ms" if record.time_s is not None else ""
        self.live.update(
            self.workers[device],
            completed=self.measured[device],
            info=f"last: {record.status}{time}",
        )


def space_note(p: JobProgress) -> str:
    """Where the task's search space holds fewer valid configurations than the trials asked
    for, that the budget is theirs (else "")."""
    asked = getattr(p.task, "trials", 0)
    if not p.n_trials or p.n_trials >= asked:
        return ""
    return (
        f"  (the space holds only {p.n_trials} valid configurations for this call: the budget "
        f"is {p.n_trials} trials, not {asked})"
    )


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
