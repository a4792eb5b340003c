"""Claims in a shared study (autotune.studies), on a real SQLite Optuna storage."""

from __future__ import annotations

import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import optuna
import pytest

from autotune.search import _Encoding, run_search
from autotune.space import Param, Space
from autotune.studies import SharedStudy
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
