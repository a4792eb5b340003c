"""`autotune db show|export|import|merge|stale|prune|stats` on real SQLite files."""

import dataclasses
import json
import math
import sqlite3
import subprocess
import sys

import pytest
from toy_kernels import scale

from autotune import TuningDB
from autotune.cli import main
from autotune.signature import TuningKey
from autotune.trial import BestEntry, TrialRecord


def key(signature="f32[64,128]", version=None, device_kind="TPU v5 lite", platform="tpu"):
    return TuningKey(
        kernel="scale",
        kernel_version=version or scale.spec.version,
        platform=platform,
        device_kind=device_kind,
        backend={"tpu": "mosaic_tpu", "cpu": "interpret"}[platform],
        signature=signature,
    )


def put(db, k, block_rows, time_s, n_trials=4):
    (trial_id,) = db.add_trials(k, "run", [TrialRecord({"block_rows": block_rows}, "ok")])
    db.put_best(
        k,
        BestEntry(
            {"block_rows": block_rows},
            time_s=time_s,
            default_time_s=2 * time_s,
            speedup=2.0,
            n_trials=n_trials,
            trial_id=trial_id,
            run_id="run",
            strategy="tpe",
        ),
    )


def cli(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def filled(db_url):
    with TuningDB(db_url) as db:
        put(db, key(), 16, 1e-3)
        put(db, key("bf16[64,128]"), 32, 2e-3)
        put(db, key(device_kind="cpu", platform="cpu"), 8, 5e-3)
    return db_url


def test_export_then_import_round_trips_and_conflicts_keep_the_faster(filled, tmp_path, capsys):
    out_file = tmp_path / "tpu.json"
    rc, out, _ = cli(capsys, "db", "export", "--device-kind", "TPU v5 lite", "--out", str(out_file))
    assert rc == 0 and "exported 2 entries" in out
    doc = json.loads(out_file.read_text())
    assert doc["format"] == "pallas-autotune-export" and len(doc["entries"]) == 2

    other = str(tmp_path / "other.db")
    with TuningDB(other) as db:
        put(db, key(), 8, 0.5e-3)  # faster than the file's entry for the same key
        put(db, key("bf16[64,128]"), 8, 9e-3)  # slower
    rc, out, _ = cli(capsys, "db", "import", str(out_file), "--db", other)
    assert rc == 0 and out.strip() == "0 added, 1 replaced, 1 kept"
    with TuningDB(other) as db:
        got = {e.key.signature: e.config["block_rows"] for e in db.query()}
    assert got == {"f32[64,128]": 8, "bf16[64,128]": 32}

    newest = str(tmp_path / "newest.db")
    with TuningDB(newest) as db:
        put(db, key(), 32, 7e-3)  # slower, but tuned after everything above
    rc, out, _ = cli(capsys, "db", "merge", newest, "--db", other)
    assert out.strip() == "0 added, 0 replaced, 1 kept"
    rc, out, _ = cli(capsys, "db", "merge", newest, "--db", other, "--prefer", "newer")
    assert out.strip() == "0 added, 1 replaced, 0 kept"
    with TuningDB(other) as db:
        assert {e.key.signature: e.config["block_rows"] for e in db.query()}["f32[64,128]"] == 32


def test_a_bulk_import_merges_across_batches_and_repeated_keys(filled, tmp_path, monkeypatch):
    from autotune.db import write as dbwrite

    monkeypatch.setattr(dbwrite, "KEYS_PER_QUERY", 2)  # 5 signatures: three lookups
    entries = {e.key.signature: e.as_row() for e in TuningDB(filled).query(platform="tpu")}
    doc = TuningDB(filled).export(platform="tpu")
    base = dict(entries["f32[64,128]"], run_id="new", tuned_at="2026-12-05T00:00:00+00:00")
    doc["entries"] = [
        dict(base, config={"block_rows": 8}, time_s=0.5e-3),  # faster than the stored 1e-3
        dict(base, signature="bf16[64,128]", config={"block_rows": 8}, time_s=9e-3),  # slower
        dict(base, signature="f32[96,128]", config={"block_rows": 8}, time_s=4e-3),
        dict(base, signature="f32[96,128]", config={"block_rows": 16}, time_s=3e-3),  # again
        dict(base, signature="f32[96,128]", config={"block_rows": 32}, time_s=5e-3),  # slower
        dict(base, signature="f32[16,128]", config={"block_rows": 16}, time_s=1e-3),
        dict(base, signature="f32[32,128]", config={"block_rows": 32}, time_s=1e-3),
    ]
    for e in doc["entries"]:
        e.pop("id", None)
        e.pop("trial_id", None)
    with TuningDB(filled) as db:
        counts = db.import_entries(doc)
        got = {e.key.signature: e.config["block_rows"] for e in db.query(platform="tpu")}
    assert counts == {"added": 3, "replaced": 2, "kept": 2}
    assert got == {
        "f32[64,128]": 8,
        "bf16[64,128]": 32,
        "f32[96,128]": 16,
        "f32[16,128]": 16,
        "f32[32,128]": 32,
    }


@pytest.mark.parametrize(
    "text, message",
    [
        ("[1, 2]", "not a pallas-autotune export"),
        ("{nope", "is not JSON"),
        (
            '{"format": "pallas-autotune-export", "schema": 3, "entries": [{"kernel": "x"}]}',
            "entry 1",
        ),
    ],
)
def test_a_bad_import_file_changes_nothing(filled, tmp_path, capsys, text, message):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    before = TuningDB(filled).query()
    rc, out, err = cli(capsys, "db", "import", str(bad))
    assert rc == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1
    assert TuningDB(filled).query() == before


def test_an_import_with_one_bad_entry_imports_none(filled, tmp_path, capsys):
    doc = TuningDB(filled).export()
    doc["entries"][1]["time_s"] = -1.0
    target = str(tmp_path / "t.db")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    rc, _, err = cli(capsys, "db", "import", str(bad), "--db", target)
    assert rc == 2 and "entry 2 (scale bf16[64,128]): time_s -1.0 is not a positive number" in err
    assert TuningDB(target).query() == []


def test_an_import_fills_the_provenance_an_entry_leaves_out(filled, tmp_path, capsys):
    # a hand-written table holds the key, the config and the figures; the rest takes the
    # defaults a shipped table's entries take (StoredEntry), not a NOT NULL failure
    doc = TuningDB(filled).export(platform="cpu")
    provenance = ("run_id", "strategy", "timer", "jax_version", "jaxlib_version", "tuned_at")
    for e in doc["entries"]:
        for name in provenance:
            e.pop(name)
    short = tmp_path / "short.json"
    short.write_text(json.dumps(doc))
    target = str(tmp_path / "t.db")
    rc, out, err = cli(capsys, "db", "import", str(short), "--db", target)
    assert rc == 0, err
    (entry,) = TuningDB(target).query()
    assert entry.config == {"block_rows": 8} and entry.time_s == 5e-3
    assert (entry.run_id, entry.strategy, entry.timer) == ("", "", "wall")
    assert (entry.jax_version, entry.jaxlib_version) == ("", "")
    assert entry.tuned_at is not None  # the import's date


# What an import refuses, each the way `db check` would find it afterwards (or worse, what it
# used to take silently): (the document's change, the words of the one line naming it)
BAD_DOCUMENTS = {
    "schema 99": ({"schema": 99}, 'the export has 99 as its "schema" version'),
    "schema three": ({"schema": "three"}, "the export has 'three' as its \"schema\" version"),
    "no schema": ({"schema": None}, 'the export has no "schema" version'),
    "NaN config": ({"config": {"block_rows": math.nan}}, "config block_rows=nan is not a value"),
    "unknown parameter": (
        {"config": {"block_rows": 8, "bogus": 1}},
        "config not served: unknown parameter(s) 'bogus'",
    ),
    "5 MB config": ({"config": {"block_rows": 8, "x": "a" * 5_000_000}}, "config x='aaaa"),
    "static not JSON": ({"static": "{not json"}, "unreadable key: static arguments '{not json'"),
    "empty version": ({"kernel_version": ""}, "kernel_version '' is not a non-empty string"),
    "infinite time": ({"time_s": math.inf}, "time_s inf is not a positive number"),
    "infinite speedup": ({"speedup": math.inf}, "speedup inf is not a positive number"),
    "negative trials": ({"n_trials": -5}, "n_trials -5 is not a whole number from 0 to"),
    "1e30 trials": ({"n_trials": 10**30}, "n_trials 1000000000000000000000000000000 is not"),
    "2^31 trials": ({"n_trials": 2**31}, "n_trials 2147483648 is not a whole number"),
    "a date yesterday": ({"tuned_at": "yesterday"}, "tuned_at 'yesterday' is not a date"),
    "an import path": ({"kernel": "os:system"}, "kernel 'os:system' is an import path"),
}


@pytest.mark.parametrize("case", BAD_DOCUMENTS)
def test_an_import_refuses_what_check_would_flag_in_one_line_naming_entry_and_field(
    filled, tmp_path, capsys, case
):
    change, words = BAD_DOCUMENTS[case]
    doc = TuningDB(filled).export(platform="cpu")
    for name, value in change.items():
        if name == "schema":
            doc.pop("schema") if value is None else doc.update(schema=value)
        else:
            doc["entries"][0][name] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    target = tmp_path / "t.db"
    rc, out, err = cli(capsys, "db", "import", str(bad), "--db", str(target))
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, err
    assert words in err and err.rstrip().endswith("nothing was imported"), err
    if name != "schema":
        assert "export entry 1 (" in err  # the entry, by number, kernel and signature
    assert not target.exists()  # refused before a database is opened


def test_check_flags_an_import_path_for_a_kernel_and_an_infinite_time(filled, capsys):
    with sqlite3.connect(filled) as conn:
        conn.execute("UPDATE autotune_results SET kernel = 'os:system' WHERE platform = 'cpu'")
        conn.execute("UPDATE autotune_results SET time_s = 9e999 WHERE platform = 'tpu'")
    conn.close()
    rc, out, _ = cli(capsys, "db", "check", "--db", filled)
    assert rc == 1 and "kernel 'os:system' is an import path" in out, out
    assert out.count("time_s inf is not a positive number") == 2, out


def test_a_report_of_a_kernel_with_no_entries_is_refused_as_its_export_is(filled, tmp_path, capsys):
    out = tmp_path / "report"
    rc, _, err = cli(capsys, "report", "--kernel", "nosuch", "--out", str(out), "--db", filled)
    assert rc == 2 and err == (
        "autotune: error: no entries match --kernel nosuch: no report written (see "
        "`autotune db list`)\n"
    )
    assert not out.exists()
    rc, _, err = cli(capsys, "db", "export", "--kernel", "nosuch", "--db", filled)
    assert rc == 2 and "no entries match --kernel nosuch" in err


def test_merge_from_another_database_with_filters(filled, tmp_path, capsys):
    target = str(tmp_path / "t.db")
    rc, out, _ = cli(capsys, "db", "merge", filled, "--db", target, "--dtype", "bf16")
    assert rc == 0 and out.strip() == "1 added, 0 replaced, 0 kept"
    (entry,) = TuningDB(target).query()
    assert entry.key.signature == "bf16[64,128]" and entry.trial_id is None


def test_stale_and_prune(filled, capsys, db_url):
    with TuningDB(db_url) as db:
        put(db, key("f32[8,128]", version="0ld0ld0ld0ld"), 8, 1e-3)
        db.record_miss(key())  # answered since: it has an entry
        db.record_miss(key("f32[999,128]"))  # still open
    rc, out, _ = cli(capsys, "db", "stale", "--format", "json")
    (stale,) = json.loads(out)
    assert stale["kernel_version"] == "0ld0ld0ld0ld"
    assert stale["current_version"] == scale.spec.version
    rc, out, _ = cli(capsys, "db", "prune", "--dry-run")
    assert "would delete 1 stale entries and 1 answered misses" in out
    assert len(TuningDB(db_url).query()) == 4
    rc, out, _ = cli(capsys, "db", "prune")
    assert rc == 0 and "deleted 1 stale entries" in out
    with TuningDB(db_url) as db:
        assert len(db.query()) == 3 and db.trials(signature="f32[8,128]") == []
        assert [m["signature"] for m in db.misses()] == ["f32[999,128]"]


def test_show_and_stats(filled, capsys, db_url):
    (entry,) = TuningDB(db_url).query(device_kind="cpu")
    rc, out, _ = cli(capsys, "db", "show", str(entry.id), "--format", "json")
    shown = json.loads(out)
    assert shown["config"] == {"block_rows": 8} and len(shown["trials"]) == 1
    assert shown["trials"][0]["id"] == entry.trial_id
    rc, _, err = cli(capsys, "db", "show", "999")
    assert rc == 2 and "no entry with id 999" in err
    rc, out, _ = cli(capsys, "db", "stats", "--format", "json")
    stats = {(r["kernel"], r["device_kind"]): r for r in json.loads(out)}
    assert stats[("scale", "TPU v5 lite")]["entries"] == 2
    assert stats[("scale", "TPU v5 lite")]["trials"] == 2
    assert stats[("scale", "cpu")]["median_speedup"] == 2.0
    rc, out, _ = cli(capsys, "db", "stats", "--format", "csv")
    assert out.splitlines()[0].startswith("kernel,device_kind,entries,trials,misses")
    rc, out, _ = cli(capsys, "db", "stats")  # the table has the figures too
    head, *rows = out.splitlines()
    assert head.split() == [
        "kernel",
        "device_kind",
        "entries",
        "trials",
        "misses",
        "median_speedup",
        "max_speedup",
    ]
    assert rows[0].split()[-2:] == ["2.00x", "2.00x"]


def test_a_miss_is_answered_when_its_key_is_tuned(db_url):
    with TuningDB(db_url) as db:
        db.record_miss(key())
        db.record_miss(key("f32[999,128]"))
        put(db, key(), 8, 1e-3)
        assert [m["signature"] for m in db.misses()] == ["f32[999,128]"]


def test_python_api_queries_with_the_same_filters(filled):
    db = TuningDB(filled)
    assert len(db.query(kernel="scale", device_kind="TPU v5 lite")) == 2
    assert [e.key.signature for e in db.query(dtype="bfloat16")] == ["bf16[64,128]"]
    assert [e.key.platform for e in db.query(platform="cpu")] == ["cpu"]


def test_every_command_that_resolves_kernels_sees_your_own_with_import(
    tmp_path, subprocess_env, db_url, capsys
):
    # a fresh process knows only the shipped kernels until --import registers the user's: each
    # command in a process of its own (this one has imported them)
    def run(args, env, check_rc=0):
        proc = subprocess.run(
            [sys.executable, "-m", "autotune.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == check_rc, proc.stderr
        return proc

    with TuningDB(db_url) as db:
        put(db, key(platform="cpu", device_kind="cpu"), 16, 1e-3)
        put(db, key("f32[32,128]", version="old", platform="cpu", device_kind="cpu"), 8, 1e-3)
    imp = ["--import", "toy_kernels"]
    assert "picky_scale" in run(["kernels", *imp], subprocess_env).stdout
    check = run(["db", "check", *imp], subprocess_env, check_rc=1).stdout
    assert "not registered" not in check and "stale" in check
    stale = run(["db", "stale", "--format", "json", *imp], subprocess_env).stdout
    assert [r["signature"] for r in json.loads(stale)] == ["f32[32,128]"]
    pruned = run(["db", "prune", *imp], subprocess_env).stdout
    assert pruned.startswith("deleted 1 stale entries")
    # what the prune left, checked here, where the kernels are imported already
    rc, out, _ = cli(capsys, "db", "check", "--db", db_url)
    assert rc == 0 and out.endswith("no problems found\n"), out


def test_check_says_which_kernels_it_could_not_check_and_passes_what_it_could(capsys, db_url):
    # a database with a user's kernel, checked by a process that does not know that kernel
    with TuningDB(db_url) as db:
        put(db, key(device_kind="cpu", platform="cpu"), 16, 1e-3)
        put(
            db,
            dataclasses.replace(key(device_kind="cpu", platform="cpu"), kernel="theirs"),
            8,
            1e-3,
        )
    rc, out, _ = cli(capsys, "db", "check", "--db", db_url)
    head, unchecked = out.splitlines()
    assert rc == 0 and head.endswith("no problems found")
    assert unchecked.startswith(
        "not checked against their kernel: theirs (1 entry): not registered"
    )
    assert "pass --import MODULE" in unchecked


def test_on_a_fresh_home_db_list_says_nothing_is_tuned_yet_and_creates_nothing(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("PALLAS_AUTOTUNE_DB")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for command in (["db", "list"], ["db", "misses"], ["db", "stats"]):
        rc, out, err = cli(capsys, *command)
        assert rc == 0 and err == "", err
        assert out.startswith("nothing is tuned yet: there is no tuning database at ")
        assert "`autotune tune KERNEL --shape ...`" in out
    rc, out, err = cli(capsys, "db", "show", "1")  # a thing asked for by id: an error
    assert rc == 2 and "nothing is tuned yet" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "cache").exists()
