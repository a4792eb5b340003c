"""Transfer: other device kinds' results given to a search (autotune.search.transfer), read from
a real tuning database by the tuner (autotune.tuning.transfer), on recorded landscapes by replay."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import numpy as np
import pytest
from toy_kernels import make_input, scale

import autotune
from autotune import TuningDB, cli
from autotune.errors import JobError
from autotune.search.landscapes import load_landscape, replay
from autotune.search.transfer import LEADS, OtherDevice, agreement, leads, slope
from autotune.service.jobfile import load_job
from autotune.trial import TrialRecord

OTHER = "cpu (another kind)"


def write(path: Path, time_of) -> Path:
    """A landscape over bx, by (powers of two) with times `time_of(bx, by)` (None: failed)."""
    lines = ["bx,by,time_ms,status"]
    for bx in (1, 2, 4, 8, 16, 32, 64, 128):
        for by in (1, 2, 4, 8, 16, 32):
            t = time_of(bx, by)
            lines.append(f"{bx},{by},,compile_error" if t is None else f"{bx},{by},{t},ok")
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


def bowl(cx: int, cy: int, scale_ms: float = 1.0):
    return lambda bx, by: (
        scale_ms * (1.0 + (bx.bit_length() - cx) ** 2 * 0.4 + (by.bit_length() - cy) ** 2 * 0.3)
    )


def test_leads_rank_by_each_devices_time_relative_to_its_own_fastest():
    a = OtherDevice("a", (({"b": 1}, 1.0), ({"b": 2}, 1.1), ({"b": 3}, 9.0), ({"b": 4}, None)))
    # device b is 100x slower overall: its own relative times count, not its milliseconds
    b = OtherDevice("b", (({"b": 1}, 130.0), ({"b": 2}, 100.0), ({"b": 3}, 900.0)))
    found = leads([a, b], lambda c: True, 4)
    assert [c["b"] for c, _ in found] == [2, 1, 3]  # 4 failed on a and ran nowhere
    assert found[0][1] == ["a", "b"]
    assert [c["b"] for c, _ in leads([a, b], lambda c: c["b"] != 2, 1)] == [1]


def test_agreement_counts_pairs_the_other_device_separates():
    r = np.array([0.0, 0.01, 1.0, 2.0])
    assert agreement(r, r * 3) > 0.8
    assert agreement(r, -r) < -0.5
    # the near tie (0 against 0.01) ordered the other way barely lowers it
    assert agreement(r, np.array([0.5, 0.4, 1.5, 3.0])) > 0.8


def test_slope_keeps_its_prior_without_evidence_and_follows_the_data_with_it():
    m = np.array([0.0, 0.0, 0.0])
    assert slope(m, np.array([1.0, 2.0, 3.0])) == 1.0  # the others cannot tell them apart
    m = np.linspace(0, 2, 30)
    assert slope(m, 0.3 * m + 5 + np.sin(7 * m) * 0.01) == pytest.approx(0.3, abs=0.05)
    assert slope(m, -m) == 0.0  # inverted: no prior, never a negative one


def test_replay_without_others_is_the_cold_search(tmp_path):
    path = write(tmp_path / "here.csv.gz", bowl(5, 2))
    assert replay(path, 20, seed=3) == replay(path, 20, seed=3, others=[])


def test_replay_measures_the_others_best_first_and_finds_a_shared_optimum_sooner(tmp_path):
    here = write(tmp_path / "here.csv.gz", bowl(6, 4))
    others = [write(tmp_path / f"o{i}.csv.gz", bowl(6, 4, 10.0**i)) for i in range(2)]
    found = replay(here, 12, seed=0, others=others)
    best_of_others = leads(
        [
            OtherDevice("o", tuple(zip(load_landscape(o).configs, load_landscape(o).times)))
            for o in others
        ],
        lambda c: True,
        LEADS,
    )
    assert [f["config"] for f in found[:LEADS]] == [c for c, _ in best_of_others]
    assert found[0]["config"] == {"bx": 32, "by": 8}  # the shared optimum, measured first


def test_a_device_unlike_the_others_still_finds_its_own_optimum(tmp_path):
    # the others are fastest at one corner, this device at the opposite one
    here = write(tmp_path / "here.csv.gz", bowl(1, 1))
    others = [write(tmp_path / f"o{i}.csv.gz", bowl(8, 6, 1.0 + i)) for i in range(3)]
    best = load_landscape(here).best_ms
    found = replay(here, 30, seed=0, others=others)
    assert min(f["time_ms"] for f in found if f["time_ms"] is not None) == best


# --- the tuner: other device kinds' stored trials ---


def _store_other_device(db_url: str, key, times: dict[int, float | None]) -> None:
    """Trials of `scale` at `key`'s shape as a device kind OTHER measured them."""
    other = dataclasses.replace(key, device_kind=OTHER)
    records = [
        TrialRecord(
            {"block_rows": b},
            "ok" if t is not None else "compile_error",
            time_s=t,
        )
        for b, t in times.items()
    ]
    with TuningDB(db_url) as db:
        db.add_trials(other, "elsewhere", records)


def test_tune_measures_another_device_kinds_best_configs_first(db_url, tmp_path):
    x = make_input(rows=48)  # block_rows 8, 12, 16, 24 divide 48; 32 does not
    key = autotune.tune(scale, [x], n_trials=1, store=False, db=tmp_path / "probe.db").key
    # on the other device 24 is fastest, then 16; 12 failed there; 32 does not fit 48 rows
    _store_other_device(db_url, key, {24: 1e-4, 16: 2e-4, 32: 5e-5, 12: None, 8: 4e-4})
    result = autotune.tune(scale, [x], n_trials=3, db=db_url, seed=0, finalists=0)
    assert [t.config["block_rows"] for t in result.trials] == [8, 24, 16]  # the default first
    assert [t.transferred_from for t in result.trials] == [None, OTHER, OTHER]
    assert f"2 trials measured first from the results of {OTHER}" in result.transfer_note
    with TuningDB(db_url) as db:  # stored with the trial
        stored = [t for t in db.trials(kernel="scale") if t.key.device_kind == key.device_kind]
    assert [t.transferred_from for t in stored] == [None, OTHER, OTHER]

    # without transfer, the search is the one a database without the other device gives
    off = autotune.tune(
        scale, [x], n_trials=3, db=db_url, seed=0, transfer=False, warm_start=False, store=False
    )
    cold = autotune.tune(
        scale, [x], n_trials=3, db=tmp_path / "empty.db", seed=0, warm_start=False, store=False
    )
    assert [t.config for t in off.trials] == [t.config for t in cold.trials]
    assert not any(t.transferred_from for t in off.trials) and not off.transfer_note


def test_the_cli_names_transferred_trials_and_no_transfer_turns_it_off(db_url, tmp_path, capsys):
    x = make_input(rows=48)
    key = autotune.tune(scale, [x], n_trials=1, store=False, db=tmp_path / "probe.db").key
    _store_other_device(db_url, key, {24: 1e-4, 16: 2e-4, 8: 4e-4})
    argv = ["tune", "scale", "--shape", "48x128", "--trials", "2", "--seed", "0", "--no-isolate"]
    argv += ["--finalists", "0", "--db", db_url]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"block_rows=24  (from {OTHER})" in out
    assert f"transfer: 1 trial measured first from the results of {OTHER}" in out
    assert cli.main([*argv, "--no-transfer"]) == 0
    out = capsys.readouterr().out
    assert "(from " not in out and "transfer:" not in out
    assert cli.main(["db", "trials", "--kernel", "scale", "--db", db_url]) == 0
    out = capsys.readouterr().out
    assert "transferred_from" in out.splitlines()[0] and OTHER in out


def test_job_files_take_transfer_per_task(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(
        '[defaults]\ntransfer = false\n[[task]]\nkernel = "matmul"\nshapes = ["8x8,8x8"]\n'
        '[[task]]\nkernel = "matmul"\nshapes = ["16x16,16x16"]\ntransfer = true\n'
    )
    first, second = load_job(job)
    assert (first.transfer, second.transfer) == (False, True)
    run = autotune.TuneSettings(transfer=True)
    assert first.settings(run).transfer is False
    job.write_text('[[task]]\nkernel = "matmul"\nshapes = ["8x8,8x8"]\ntransfer = "no"\n')
    with pytest.raises(JobError, match="transfer must be true or false"):
        load_job(job)
