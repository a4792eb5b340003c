"""The progress display of a tuning job, on a rich console."""

from __future__ import annotations

from typing import Any

from autotune.jobs import JobProgress, Outcome


class Display:
    """The job's progress on a rich console: live bars on a terminal, one line per event in a
    log (CI, a Kubernetes pod): task i of N, trial j of M, best so far, elapsed, remaining."""

    def __init__(self, console: Any) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.console = console
        self.live = None
        if console.is_terminal:
            self.live = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                console=console,
            )
            self.tasks_bar = self.live.add_task("tasks", total=None, info="")
            self.trials_bar = self.live.add_task("trials", total=None, info="")

    def __enter__(self) -> Display:
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.stop()

    def __call__(self, p: JobProgress, outcome: Outcome | None) -> None:
        head = f"task {p.task_index}/{p.n_tasks}"
        if outcome is not None:
            line = f"{head} {outcome.status:7s} {outcome.task.label}: {outcome.detail}"
            if self.live:
                self.live.update(self.tasks_bar, completed=p.task_index, total=p.n_tasks)
                self.live.console.print(line, markup=False, highlight=False, soft_wrap=True)
            else:
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            return
        best = f"{p.best_s * 1e3:.4f} ms" if p.best_s else "-"
        eta = _clock(p.eta_s) if p.eta_s is not None else "-"
        info = f"best {best}  elapsed {_clock(p.elapsed_s)}  eta {eta}"
        if self.live:
            self.live.update(
                self.tasks_bar, completed=p.task_index - 1, total=p.n_tasks, info=p.task.label
            )
            self.live.update(self.trials_bar, completed=p.trial, total=p.n_trials, info=info)
        else:
            self.console.print(
                f"{head} trial {p.trial}/{p.n_trials}  {info}  {p.task.label}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
