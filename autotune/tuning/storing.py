"""Storing a tuning run's winner: the database a run writes to, the best entry it stores, and,
for a worker of a shared study, deciding beside the entries other workers stored.

Workers of one study finish in any order: one that finds another's winner it has not
re-measured re-measures it beside its finalists first, so the entry is decided from
side-by-side figures, not from two machines' lucky samples; and so is one stored meanwhile, up
to MAX_ROUNDS times.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from autotune.signature import TuningKey
from autotune.trial import BestEntry, StoredEntry, TrialRecord
from autotune.tuning.result import TuneResult

log = logging.getLogger(__name__)

# A worker of a shared study re-measures its finalists beside each winner another worker
# stored meanwhile; past this many rounds (workers finishing in a stream) it keeps theirs.
MAX_ROUNDS = 3


def open_db(db: Any) -> Any:
    """`db` as a TuningDB: one given is used as is; a URL or path (None: the per-user
    default) is opened, for the caller to close."""
    from autotune.db import TuningDB

    return db if isinstance(db, TuningDB) else TuningDB(db)


def best_entry(result: TuneResult, strategy: str, device: Any) -> BestEntry:
    """The entry a run stores for its key: its winner, measured on `device`."""
    best = next(t for t in result.trials if t.config == result.best_config and t.status == "ok")
    return BestEntry(
        config=result.best_config,
        time_s=result.best_time_s,
        default_time_s=result.default_time_s,
        speedup=result.speedup,
        n_trials=result.n_measured,
        n_rejected=result.n_rejected,
        trial_id=best.db_id,
        run_id=result.run_id,
        strategy=strategy,
        timer=best.timer or "wall",
        jax_version=device.jax_version,
        jaxlib_version=device.jaxlib_version,
        runtime_version=device.runtime_summary,
    )


def decide_and_store(
    winner: Callable[[StoredEntry | None], TuneResult],
    key: TuningKey,
    trials: list[TrialRecord],
    handle: Any,
    strategy: str,
    device: Any,
    shared: bool,
) -> TuneResult:
    """The winner (`winner(rival)`: the finalists re-measured, `rival`, another worker's
    stored entry, among them), stored unless `handle` is None. Under a shared study the entry
    another worker of it stored is re-measured beside ours (see the module docstring)."""
    stored = handle.best(key) if handle is not None and shared else None
    rival = stored if stored and stored.trial_id in {t.db_id for t in trials} else None
    for _ in range(MAX_ROUNDS):
        result = winner(rival)
        if handle is None:
            return result
        rival = _store(handle, result, strategy, device, shared, rival)
        if rival is None:
            return result
    log.warning(
        "%s %s: other workers of the study kept storing new winners; theirs was kept",
        key.kernel,
        key.signature,
    )
    return result


def _store(
    handle: Any,
    result: TuneResult,
    strategy: str,
    device: Any,
    shared: bool,
    rival: StoredEntry | None,
) -> StoredEntry | None:
    """Store the best entry (its trials are stored as they are measured); `rival` is the entry
    another worker of the study had stored when the finalists were chosen. Returns the entry
    another worker stored since, which this one has not judged (nothing is stored then)."""
    entry = best_entry(result, strategy, device)
    if shared:  # workers of one study finish in any order
        ids = {t.db_id for t in result.trials}
        if result.finalists:  # judged side by side: the stored entry re-measured beside ours
            compared = {
                rival.trial_id
                for f in result.finalists
                if rival and f.config == rival.config and f.timing is not None
            }
        else:  # no re-measurement: the first figures of every trial of the study decided
            compared = ids
        newer = handle.put_best_among(result.key, entry, ids, compared)
        if newer is not None:
            return newer
    else:
        handle.put_best(result.key, entry)
    log.info("stored %s %s: %s", result.kernel, result.key.signature, result.best_config)
    return None
