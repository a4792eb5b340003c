"""TuneSettings: one checked set of settings for tune(), the CLI and job files."""

import ast
import subprocess
import sys

import pytest
from toy_kernels import make_input, scale

import autotune
from autotune import SettingsError, TuneSettings
from autotune.tuning.worker import WorkerLimits


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"n_trials": 0}, "n_trials must be at least 1, got 0"),
        ({"n_trials": 2.5}, "n_trials must be a whole number, got 2.5"),
        ({"strategy": "annealing"}, "strategy must be one of tpe, gp"),
        ({"seed": -1}, "seed must be a whole number from 0 to 4294967295, got -1"),
        ({"seed": True}, "seed must be a whole number"),
        ({"time_limit_s": float("nan")}, "time_limit_s must be a positive number of seconds"),
        ({"time_limit_s": 0}, "time_limit_s must be a positive number of seconds"),
        ({"limits": WorkerLimits(run_s=0)}, "limits.run_s must be a positive number of seconds"),
        ({"limits": WorkerLimits(compile_s=-1)}, "limits.compile_s must be a positive"),
        ({"patience": 0}, "patience must be at least 1 trial, got 0"),
        ({"finalists": -1}, "finalists must be 0 or more, got -1"),
        ({"compile_workers": -1}, "compile_workers must be 0 or more, got -1"),
    ],
)
def test_a_bad_setting_is_refused_in_one_line_naming_it(changes, message):
    with pytest.raises(SettingsError, match=message) as e:
        TuneSettings(**changes)
    assert "\n" not in str(e.value)
    with pytest.raises(SettingsError, match=message):
        TuneSettings().replace(**changes)  # a changed copy is checked too


def test_a_refusal_can_name_the_setting_as_a_front_end_spells_it():
    with pytest.raises(SettingsError) as e:
        TuneSettings(n_trials=0)
    assert str(e.value.naming({"n_trials": "--trials"})) == "--trials must be at least 1, got 0"
    assert str(e.value.naming({})) == str(e.value)


def test_tune_takes_settings_and_refuses_an_unknown_one_before_measuring():
    with pytest.raises(
        TypeError, match="unknown tuning setting.* trials: the settings are n_trials"
    ):
        autotune.tune(scale, [make_input(rows=32)], trials=3)
    with pytest.raises(SettingsError, match="n_trials must be at least 1"):
        autotune.tune(scale, [make_input(rows=32)], settings=TuneSettings(), n_trials=0)
    quick = TuneSettings(n_trials=2, strategy="grid", finalists=0, warm_start=False)
    result = autotune.tune(scale, [make_input(rows=32)], settings=quick, store=False, n_trials=1)
    assert len(result.trials) == 1  # the override wins over the settings given


@pytest.fixture(scope="module")
def loaded_by_the_settings():
    """The modules a fresh process holds once it has made a TuneSettings (one process for the
    module's tests)."""
    script = "import sys, autotune; autotune.TuneSettings(); print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return ast.literal_eval(out.stdout.strip())


def test_the_settings_load_neither_optuna_nor_sqlalchemy(loaded_by_the_settings):
    assert [m for m in ("optuna", "sqlalchemy", "jax") if m in loaded_by_the_settings] == []


def test_the_settings_load_no_worker_and_no_measurement(loaded_by_the_settings):
    prefixes = ("autotune.tuning.worker", "autotune.measure.timing", "numpy")
    assert [m for m in loaded_by_the_settings if m.startswith(prefixes)] == []
