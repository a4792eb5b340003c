"""What a tuning run returns: the winner, the default beside it, every trial and the finalists'
side-by-side figures, and where the time went."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.measure.finalists import Finalist, undecided
from autotune.signature import TuningKey
from autotune.trial import TrialRecord, config_text


@dataclass
class TuneResult:
    kernel: str
    key: TuningKey
    best_config: dict[str, Any]
    best_time_s: float
    default_config: dict[str, Any]
    default_time_s: float | None
    trials: list[TrialRecord] = field(default_factory=list)
    run_id: str = ""
    db_url: str | None = None
    finalists: list[Finalist] = field(default_factory=list)  # the winner first
    wall_s: float = 0.0  # the whole tuning run, set-up and storing included
    restarts: int = 0  # device workers started again after a crash or timeout
    finalists_s: float = 0.0  # the interleaved re-measurement, its compiles included
    oracle_s: float = 0.0  # compiling and running the default in interpret mode, checking it
    oracle: str = ""  # which oracle judged the candidates: "interpret" or "reference"
    worker_start_s: float = 0.0  # starting the first device worker (0 in process)
    resumed: int = 0  # trials measured by earlier runs of the study before this one began
    # why fewer programs were measured than the budget allowed: "" where none is missing
    programs_note: str = ""

    @property
    def speedup(self) -> float | None:
        return self.default_time_s / self.best_time_s if self.default_time_s else None

    @property
    def why_default_kept(self) -> str | None:
        """Why the default won although a candidate measured faster at first (None if none
        did): the side-by-side re-measurement found the difference within the noise."""
        if self.best_config != self.default_config:
            return None
        default = next((f for f in self.finalists if f.config == self.default_config), None)
        faster = [f for f in self.finalists if default and f.first_s < default.first_s]
        if not faster:
            return None
        f = min(faster, key=lambda f: f.first_s)
        return (
            f"{config_text(f.config)} measured faster at first ({f.first_s * 1e3:.4f} ms against the default's "
            f"{default.first_s * 1e3:.4f} ms), but side by side with the default "
            f"({f.time_s * 1e3:.4f} ms against {default.time_s * 1e3:.4f} ms) not beyond the "
            "noise, so the default was kept"
        )

    @property
    def within_noise(self) -> str | None:
        """What the winner could not be told apart from side by side, when the re-measurement
        reached its cap with finalists the fastest had not beaten (None: decided)."""
        if len(self.finalists) < 2 or not (beyond := undecided(self.finalists)):
            return None
        rounds = len(self.finalists[0].rounds)
        tied = [min(self.finalists, key=lambda f: f.time_s), *beyond]
        others = ", ".join(config_text(f.config) for f in tied if f.config != self.best_config)
        return (
            f"after {rounds} interleaved rounds the winner and {others} were not told apart "
            "(sign test, autotune.measure.finalists): the choice is within the noise"
        )

    @property
    def first_pass(self) -> bool:
        """Whether the finalists' side-by-side re-measurement failed (a worker crashed or was
        killed), so that the winner was chosen on first-pass figures."""
        return len(self.finalists) > 1 and all(f.timing is None for f in self.finalists)

    @property
    def transfer_note(self) -> str:
        """Which trials other device kinds' results had measured first, from which device
        kinds, and how the fastest of them fared ("" where none was)."""
        led = [t for t in self.trials if t.transferred_from]
        if not led:
            return ""
        devices = list(dict.fromkeys(d for t in led for d in t.transferred_from.split(", ")))
        ran = [t for t in led if t.status == "ok" and t.time_s is not None]
        n = f"{len(led)} trial{'s' if len(led) > 1 else ''}"
        text = f"{n} measured first from the results of {', '.join(devices)}"
        if not ran:
            return f"{text}; none ran"
        fastest = min(ran, key=lambda t: t.time_s)
        won = " (the winner)" if fastest.config == self.best_config else ""
        return f"{text}; the fastest of them {fastest.time_s * 1e3:.4f} ms{won}"

    @property
    def summary(self) -> str:
        """The result in one line, as a job reports a tuned task: the winner, its time, the
        speedup, the trials."""
        speedup = f"{self.speedup:.2f}x" if self.speedup else "n/a"
        resumed = f" ({self.resumed_note})" if self.resumed else ""
        first = ", first-pass figures" if self.first_pass else ""
        first += ", within the noise" if self.within_noise else ""
        return (
            f"{config_text(self.best_config)} {self.best_time_s * 1e3:.4f} ms"
            f"{self.side_by_side_note}, speedup {speedup}, "
            f"{self.n_measured} trials{self.duplicates_note}{resumed}{first}"
        )

    @property
    def side_by_side_note(self) -> str:
        """' (side by side with the default; first pass 0.0916 ms)': where the finalists were
        re-measured, the best time is their figure, not the first pass's best that the
        progress showed (a first pass shares the device with compiling and the other
        searches)."""
        if len(self.finalists) < 2 or self.first_pass:
            return ""
        measured = [t.time_s for t in self.trials if t.status == "ok" and t.time_s]
        first = f"; first pass {min(measured) * 1e3:.4f} ms" if measured else ""
        return f" (re-measured side by side with the default{first})"

    @property
    def duplicates_note(self) -> str:
        """' (+3 duplicates)': the trials stored but not measured, their program measured
        already."""
        n = self.n_duplicates
        return f" (+{n} duplicate{'s' * (n != 1)})" if n else ""

    @property
    def resumed_note(self) -> str:
        """'4 of 10 trials already measured': what a resumed study did not measure again."""
        return f"{self.resumed} of {self.n_measured} trials already measured"

    @property
    def n_rejected(self) -> int:
        return sum(t.status == "rejected" for t in self.trials)

    @property
    def n_measured(self) -> int:
        """Trials measured: every one but the duplicates (what the budget counts)."""
        return len(self.trials) - self.n_duplicates

    @property
    def n_duplicates(self) -> int:
        """Trials that compiled to a program measured already (stored, not measured)."""
        return sum(t.status == "duplicate" for t in self.trials)

    @property
    def n_crashed(self) -> int:
        return sum(t.status in ("crashed", "timeout") for t in self.trials)
