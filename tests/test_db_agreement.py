"""The tools agree with each other and with the runtime: misses that can be tuned, tools that
read never creating a database, entries without trials, tampered rows. Real SQLite files."""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3

import pytest
from test_db_tools import key, put
from test_reliability import store
from toy_kernels import make_input, scale

import autotune
from autotune import TuningDB
from autotune.cli import main
from autotune.device import current_device
from autotune.service.pending import pending_tasks


def add_misses(path, *signatures):
    with TuningDB(path) as db:
        for signature in signatures:
            db.record_miss(key(signature, device_kind="cpu", platform="cpu"))


def test_a_bad_miss_is_reported_and_skipped_by_pending(tmp_path, caplog):
    path = tmp_path / "t.db"
    add_misses(path, "f32[64,128]", "f32[100000000,100000000]", "f32[32,128]")
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "UPDATE autotune_misses SET signature = 'f32[[' WHERE signature = ?", ("f32[32,128]",)
        )
    conn.close()
    with TuningDB(path) as db, caplog.at_level(logging.WARNING, logger="autotune.service.pending"):
        tasks, unknown = pending_tasks(db, current_device())
    assert [t.shapes for t in tasks] == [((64, 128),)] and not unknown
    skipped = [r.getMessage() for r in caplog.records]
    assert len(skipped) == 2 and all("db misses --delete" in m for m in skipped)


def test_pending_counts_misses_the_way_db_misses_lists_them(tmp_path, capsys):
    path = tmp_path / "t.db"
    cpu = {"device_kind": "cpu", "platform": "cpu"}
    gone = dataclasses.replace(key(**cpu), kernel="gone")  # not registered here
    with TuningDB(path) as db:
        for k in (key(version="old", **cpu), key("f32[32,128]", **cpu), gone, gone, gone):
            db.record_miss(k)  # `gone` three times: one miss of three lookups
        put(db, key(**cpu), 16, 1e-3)  # answers the older version's miss of that shape too
    assert main(["db", "misses", "--db", str(path), "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(m["kernel"] for m in listed) == ["gone", "scale"]
    with TuningDB(path) as db:
        tasks, unknown = pending_tasks(db, current_device())
    assert [t.shapes for t in tasks] == [((32, 128),)] and unknown == {"gone": 1}


def test_misses_are_deleted_by_kernel_and_signature(tmp_path, capsys):
    path = tmp_path / "t.db"
    add_misses(path, "f32[64,128]", "f32[32,128]")
    args = ["db", "misses", "--db", str(path), "--kernel", "scale"]
    assert main([*args, "--signature", "f32[32,128]", "--delete"]) == 0
    assert "deleted 1 miss(es)" in capsys.readouterr().out
    assert main([*args, "--signature", "garbage", "--delete"]) == 2  # as export's filters
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "autotune: error: no misses match --kernel scale, --signature garbage: nothing deleted "
        "(see `autotune db misses`)\n"
    )
    with TuningDB(path) as db:
        assert [m["signature"] for m in db.misses()] == ["f32[64,128]"]


@pytest.mark.parametrize(
    "command",
    [
        ["db", "list"],
        ["db", "stats"],
        ["db", "export"],
        ["db", "landscape", "--kernel", "scale", "--signature", "f32[64,128]"],
        ["report", "--out", "{tmp}/report"],
        ["db", "merge", "{tmp}/typo.db", "--db", "{tmp}/main.db"],
    ],
)
def test_tools_that_read_never_create_a_database(tmp_path, capsys, command):
    argv = [a.format(tmp=tmp_path) for a in command]
    if "--db" not in argv:
        argv += ["--db", str(tmp_path / "typo.db")]
    assert main(argv) == 2
    assert "does not exist" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "report") == []


def test_an_imported_entry_without_trials_passes_check_and_says_where_it_came_from(
    tmp_path, capsys
):
    a, b, doc = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "a.json"
    with TuningDB(a) as db:
        put(db, key(device_kind="cpu", platform="cpu"), 16, 1e-3)
    assert main(["db", "export", "--db", str(a), "--out", str(doc)]) == 0
    assert main(["db", "import", str(doc), "--db", str(b)]) == 0
    capsys.readouterr()
    assert main(["db", "check", "--db", str(b)]) == 0
    out = capsys.readouterr().out
    assert "1 entries imported without trials" in out and "no problems found" in out


TAMPERED = {
    "a tuned_at that is not a date": "UPDATE autotune_results SET tuned_at = 'not a date'",
    "a trial created_at that is not a date": "UPDATE autotune_trials SET created_at = 'x'",
    "a deeply nested config": "UPDATE autotune_results SET config = '"
    + "[" * 200_000
    + "]" * 200_000
    + "'",
    "a schema version that is not a number": "UPDATE schema_info SET version = 'two'",
    "a trial config that is a list": "UPDATE autotune_trials SET config = '[1]'",
    "a trial config that is null": "UPDATE autotune_trials SET config = 'null'",
    "a trial config missing a key": "UPDATE autotune_trials SET config = '{}'",
}
READERS = [
    ["db", "list"],
    ["db", "stats"],
    ["db", "export"],
    ["db", "stale"],
    ["db", "prune", "--dry-run"],
    ["db", "trials"],
    ["db", "show", "1"],
    ["db", "landscape", "--kernel", "scale", "--signature", "f32[64,128]"],
]


@pytest.mark.parametrize("case", TAMPERED)
def test_a_tampered_column_is_found_by_check_and_never_a_traceback(tmp_path, capsys, case):
    path = tmp_path / "t.db"
    with TuningDB(path) as db:
        put(db, key(device_kind="cpu", platform="cpu"), 16, 1e-3)
        put(db, key("f32[32,128]", device_kind="cpu", platform="cpu"), 8, 1e-3)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(TAMPERED[case])
    conn.close()
    assert main(["db", "check", "--db", str(path)]) == 1
    for argv in [*READERS, ["report", "--out", str(tmp_path / "r")]]:
        rc = main([*argv, "--db", str(path)])  # a traceback fails the test
        assert rc in (0, 2), argv
    err = capsys.readouterr().err
    assert "Traceback" not in err


RESULT_READERS = {"list", "stats", "export", "stale", "prune", "show", "merge", "report"}
TRIAL_READERS = {"trials", "stats", "show", "landscape", "report"}


@pytest.mark.parametrize("case", [c for c in TAMPERED if "schema" not in c])
def test_the_read_tools_skip_a_tampered_row_with_one_line_naming_it(tmp_path, caplog, case):
    path = tmp_path / "t.db"
    with TuningDB(path) as db:  # best entry 1 and trial 1: f32[64,128]; 2 and 2: f32[32,128]
        put(db, key(device_kind="cpu", platform="cpu"), 16, 1e-3)
        put(db, key("f32[32,128]", device_kind="cpu", platform="cpu"), 8, 1e-3)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(TAMPERED[case] + " WHERE id = 1")
    conn.close()
    trial = "trial" in case
    row = (
        "trial 1 (scale f32[64,128] on cpu)" if trial else "best entry 1 (scale f32[64,128] on cpu)"
    )
    merge = ["db", "merge", str(path), "--db", str(tmp_path / "m.db")]
    report = ["report", "--out", str(tmp_path / "r"), "--db", str(path)]
    for argv in [*[[*a, "--db", str(path)] for a in READERS], merge, report]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="autotune.db.read"):
            main(argv)
        said = [r.getMessage() for r in caplog.records if r.name == "autotune.db.read"]
        reads = argv[argv[0] == "db"] in (TRIAL_READERS if trial else RESULT_READERS)
        assert len(said) == reads, (argv, said)
        assert all(m.startswith(f"skipped {row}: its ") for m in said), said


def test_a_tampered_date_does_not_stop_the_runtime_serving_the_kernel(tmp_path):
    path = tmp_path / "t.db"
    store(path, make_input(rows=64))  # tuned for this device; 32 rows: the nearest shape
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE autotune_results SET tuned_at = 'yesterday'")
    conn.close()
    autotune.configure(db=path, fallback="nearest")
    assert scale.explain(make_input(rows=64))["source"] == "db"
    assert scale.explain(make_input(rows=32))["source"] == "nearest"


def test_a_trial_of_an_older_kernel_version_passes_check_as_the_read_tools_keep_it(tmp_path):
    from autotune.db.check import check_database
    from autotune.trial import TrialRecord

    path = tmp_path / "t.db"
    old = key("f32[64,128]", version="old", device_kind="cpu", platform="cpu")
    with TuningDB(path, skip_tampered=True) as db:  # an older space named its parameter so
        db.add_trials(old, "run", [TrialRecord({"rows_per_block": 8}, "ok", time_s=1e-3)])
        assert len(db.trials(kernel="scale")) == 1
    assert check_database(str(path))[0] == []
