"""Claims in a shared study (autotune.search.studies), on a real SQLite Optuna storage."""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import optuna
import pytest

from autotune.search import loop as search_module
from autotune.search.loop import _Encoding, run_search
from autotune.search.studies import SharedStudy
from autotune.space import Param, Space
from autotune.trial import Evaluation, config_id


def test_a_config_another_worker_measured_since_the_last_refresh_is_taken(tmp_path):
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    enc = _Encoding(Space((Param("block", (16, 32, 64)),)))
    first, second = (
        SharedStudy(storage, "matmul", optuna.samplers.RandomSampler(seed=0)) for _ in range(2)
    )
    config = {"block": 32}
    # both workers are given the config (queued by each before either measured it)
    for worker in (first, second):
        worker.study.enqueue_trial(enc.encode(config))
    mine = first.study.ask(enc.distributions)
    assert not first.taken(mine, config_id(config), enc)
    mine.set_user_attr("status", "ok")
    first.study.tell(mine, 1.0)  # measured and finished: no longer a running claim

    late = second.study.ask(enc.distributions)
    assert enc.decode(late.params) == config
    assert second.taken(late, config_id(config), enc)

    other = {"block": 64}
    second.study.enqueue_trial(enc.encode(other))
    fresh = second.study.ask(enc.distributions)
    assert enc.decode(fresh.params) == other and not second.taken(fresh, config_id(other), enc)


def test_an_interrupted_search_leaves_its_shared_study(tmp_path):
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    space = Space((Param("block", (16, 32, 64)),))

    def interrupted(config):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        valid = [{"block": b} for b in (16, 32, 64)]
        run_search(
            space, None, interrupted, n_trials=3, valid=valid, storage=storage, study_name="s"
        )
    # a long-lived process (a notebook) that was interrupted no longer holds the study
    attrs = optuna.load_study(study_name="s", storage=storage).user_attrs
    assert attrs[f"worker {socket.gethostname()}:{os.getpid()}"] is False


def test_two_workers_claiming_the_last_trial_at_once_never_exceed_the_budget(tmp_path, monkeypatch):
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    space = Space((Param("block", (16, 32, 64, 128)),))
    valid = [{"block": b} for b in (16, 32, 64, 128)]
    # both workers find the budget's one trial free, then both claim a configuration of it
    meet = threading.Barrier(2, timeout=60)
    first_claim = threading.local()
    taken = SharedStudy.taken

    def claim_together(self, trial, cid, enc):
        if not getattr(first_claim, "done", False):
            first_claim.done = True
            meet.wait()
        return taken(self, trial, cid, enc)

    monkeypatch.setattr(SharedStudy, "taken", claim_together)
    measured = []

    def search(first):
        def evaluate(config):
            measured.append(config)
            return Evaluation.of(config, 1.0)

        # each worker queues another configuration first: the two claims differ
        run_search(
            space,
            None,
            evaluate,
            n_trials=1,
            valid=valid,
            initial=[first],
            storage=storage,
            study_name="s",
        )

    with ThreadPoolExecutor(2) as pool:  # a worker a thread, as on several devices
        for done in [pool.submit(search, config) for config in valid[:2]]:
            done.result()
    assert len(measured) == 1


def test_a_trial_another_worker_finishes_during_the_budget_check_still_counts(
    tmp_path, monkeypatch
):
    # Concurrent tunes of one key once measured 4 trials for a budget of 3: the check read the
    # study's measured trials, then its running ones, and a trial another worker finished
    # between the two reads was in neither. Here it finishes right after every full read.
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    enc = _Encoding(Space((Param("block", (16, 32, 64)),)))
    other, mine = (SharedStudy(storage, "s", None) for _ in range(2))
    other.worker += "/other"  # two workers of this process, as on two devices
    for worker in (other, mine):
        worker.join()
    theirs = other.study.ask(enc.distributions)
    assert not other.taken(theirs, config_id(enc.decode(theirs.params)), enc)
    ours = mine.study.ask(enc.distributions)  # asked after theirs: theirs comes first

    get_trials = optuna.Study.get_trials
    finished = []

    def then_theirs_finishes(study, deepcopy=True, states=None):
        trials = get_trials(study, deepcopy=deepcopy, states=states)
        if states is None and not finished:
            finished.append(theirs.number)
            other.keep(theirs, Evaluation.of(enc.decode(theirs.params), 1.0))
            other.study.tell(theirs, 1.0)
        return trials

    monkeypatch.setattr(optuna.Study, "get_trials", then_theirs_finishes)
    # a budget of 1: theirs, running or measured, spends it; ours must give way
    assert search_module._over(mine, enc, 1, ours)
    assert finished == [theirs.number]  # it did finish during the check


def test_a_worker_interrupted_in_the_middle_of_an_ask_leaves_the_rerun_its_budget(
    tmp_path, monkeypatch
):
    # an ask writes the trial's parameters one at a time: an interrupt (a signal) landing
    # between two of them leaves the trial running, unclaimed, its parameters half written
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    space = Space((Param("a", (1, 2, 3)), Param("b", (1, 2, 3))))
    valid = [{"a": a, "b": b} for a in (1, 2, 3) for b in (1, 2, 3)]
    measured = []
    interrupting = [True]

    def evaluate(config):
        measured.append(config)
        return Evaluation.of(config, float(10 * config["a"] + config["b"]))

    suggest = optuna.Trial._suggest

    def interrupted(self, name, distribution):
        if interrupting[0] and len(measured) == 2 and name == "b":
            raise KeyboardInterrupt
        return suggest(self, name, distribution)

    monkeypatch.setattr(optuna.Trial, "_suggest", interrupted)

    def search():
        return run_search(
            space,
            None,
            evaluate,
            n_trials=4,
            strategy="random",
            seed=0,
            valid=valid,
            storage=storage,
            study_name="s",
            upcoming=lambda configs: None,  # reads the queue, as a measurer does
        )

    with pytest.raises(KeyboardInterrupt):
        search()
    study = optuna.load_study(study_name="s", storage=storage)
    (orphan,) = [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert orphan.params.keys() == {"a"} and "worker" not in orphan.user_attrs

    interrupting[0] = False
    over = search_module._over

    def never_gives_way(shared, enc, budget, trial):
        # the rerun is the study's only worker: no one else holds a share of its budget
        assert not over(shared, enc, budget, trial), "gave way to a trial no one is asking for"
        return False

    monkeypatch.setattr(search_module, "_over", never_gives_way)
    found = search()
    assert len(found) == 4 and len(measured) == 4  # the 2 measured, and what was left
    study = optuna.load_study(study_name="s", storage=storage)
    assert study.trials[orphan.number].state == optuna.trial.TrialState.FAIL
    for t in study.trials:  # its half-written parameters were not queued again
        assert t.system_attrs.get("fixed_params", {"a": 1, "b": 1}).keys() == {"a", "b"}


def test_an_unclaimed_trial_is_released_after_the_grace_while_others_search(tmp_path, monkeypatch):
    from autotune.search import studies

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    monkeypatch.setattr(studies, "HEARTBEAT_S", 0.2)
    shared = SharedStudy(storage, "s", None)
    shared.join()
    # a live worker on another host searches the study: an unclaimed trial may be its ask
    shared.study.set_user_attr("worker elsewhere:1", True)
    half = shared.study.ask()
    half.suggest_int("a", 0, 2)  # interrupted before its second parameter
    shared.study.enqueue_trial({"a": 1, "b": 2})
    popped = shared.study.ask()  # took a configuration from the queue, then interrupted
    assert shared._release_dead() == []  # younger than the grace: maybe an ask in progress
    time.sleep(1.0)  # older than the grace of three heartbeats
    assert shared._release_dead() == [{"a": 1, "b": 2}]  # what the queue held, nothing else
    states = {t.number: t.state for t in shared.study.trials}
    assert states[half.number] == states[popped.number] == optuna.trial.TrialState.FAIL


class _Interrupting(sqlite3.Connection):
    """A connection whose SELECT is interrupted as it returns, once armed: a signal's handler
    raising there, the statement begun and unfinished."""

    armed = False

    def cursor(self, factory=None):
        return super().cursor(factory or _InterruptingCursor)


class _InterruptingCursor(sqlite3.Cursor):
    def execute(self, sql, *args):
        out = super().execute(sql, *args)
        if _Interrupting.armed and sql.lstrip().upper().startswith("SELECT"):
            _Interrupting.armed = False
            raise KeyboardInterrupt
        return out


def test_an_interrupt_inside_a_read_leaves_the_studies_file_writable(tmp_path, monkeypatch):
    from autotune.search import studies

    # read's write lock must go with its connection, not wait for the exception to be dropped
    connect_args = {"isolation_level": None, "timeout": 2.0, "factory": _Interrupting}
    monkeypatch.setattr(studies, "_SQLITE_ENGINE", {"connect_args": connect_args})
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    reader, writer = SharedStudy(storage, "s", None), SharedStudy(storage, "s", None)
    reader.study.enqueue_trial({"a": 1})
    _Interrupting.armed = True
    try:
        reader.study.get_trials(deepcopy=False)
    except KeyboardInterrupt as interrupt:
        assert interrupt.__traceback__ is not None  # alive, as while the run cleans up
        writer.study.set_user_attr("worker elsewhere:1", False)  # the clean-up's write
        reader.leave()  # and the interrupted worker's own
    else:
        pytest.fail("the read was not interrupted")
    assert not _Interrupting.armed
