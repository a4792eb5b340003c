"""A tuning run never reports success for work it lost, and never measures a configuration
twice: databases deleted or replaced mid-run, concurrent runs on one SQLite file, studies files
that are corrupt, workers killed mid-study. Real files, real processes, real signals."""

from __future__ import annotations

import os
import shutil

import pytest
from toy_kernels import make_input, scale

import autotune
from autotune import TuningDB
from autotune.errors import DatabaseError


def tune_then(db, n_trials, after_trial, action):
    """Tune `scale` in this process; `action` runs once trial `after_trial` is stored."""

    def progress(record, i, n):
        if i == after_trial:
            action()

    x = make_input(rows=96)
    return autotune.tune(
        scale, [x], n_trials=n_trials, db=db, strategy="grid", finalists=0, progress=progress
    )


def test_a_deleted_database_stops_the_run_and_says_what_was_not_saved(tmp_path):
    db = tmp_path / "t.db"
    with pytest.raises(DatabaseError, match="deleted or replaced") as e:
        tune_then(str(db), 4, 2, lambda: os.remove(db))
    assert "scale f32[96,128]" in str(e.value) and "not saved" in str(e.value)


def test_a_database_moved_over_the_path_is_left_intact(tmp_path):
    db, other = tmp_path / "t.db", tmp_path / "other.db"
    tune_then(str(other), 2, 0, lambda: None)
    with TuningDB(other) as o:
        before = (o.query(), o.trials())
    with pytest.raises(DatabaseError, match="deleted or replaced"):
        tune_then(str(db), 4, 2, lambda: shutil.move(other, db))
    with TuningDB(db) as replaced:
        assert (replaced.query(), replaced.trials()) == before
