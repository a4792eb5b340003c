"""Tuned tables shipped with a kernel (`tuned=`) and overlays, in the runtime's lookup order:
an active overlay, the user's database, the shipped table, then the fallback."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from test_db_tools import cli, put
from toy_kernels import make_input

import autotune
from autotune import BestEntry, TuningDB, registry
from autotune.device import current_device

X = make_input(48, 128)  # rows divide 8, 16, 24 and 48; not 32


def _key(kernel):
    device = current_device()
    return kernel.spec.key(kernel.spec.signature([X], {}, device), device)


def _export(kernel, block_rows: int, path: Path) -> None:
    """The kernel's entry for X at block_rows, written as `autotune db export` writes it."""
    path.parent.mkdir(exist_ok=True)
    with TuningDB(path.with_suffix(".db")) as db:  # beside it: a table reads *.json only
        put(db, _key(kernel), block_rows, 1e-4)
        doc = db.export(kernel=kernel.spec.name)
    path.write_text(json.dumps(doc, default=str))


@pytest.fixture
def library(tmp_path, monkeypatch):
    """tests/toy_shipped.py as an installed library `mylib` whose tuned/cpu.json serves X at
    block_rows=16; returns the kernel."""
    package = tmp_path / "site" / "mylib"
    package.mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "toy_shipped.py", package / "toy_shipped.py")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    # registered for this test only: its table (tampered by some tests) leaves with it; the
    # shipped kernels are imported first, or they would leave with it too
    monkeypatch.setattr(registry, "_REGISTRY", registry.registered())
    spec = importlib.util.spec_from_file_location("mylib.toy_shipped", package / "toy_shipped.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "mylib.toy_shipped", module)
    spec.loader.exec_module(module)
    kernel = module.shipped_scale
    _export(kernel, 16, package / "tuned" / "cpu.json")
    return kernel


def test_a_shipped_table_serves_a_user_with_an_empty_database(library, db_url):
    got = library.explain(X)
    assert (got["source"], got["config"]) == ("shipped", {"block_rows": 16})
    np.testing.assert_allclose(library(X), X * 2.0)
    with TuningDB(db_url) as db:
        assert db.query() == [] and db.misses() == []  # a served table entry is no miss


def test_the_users_own_entry_wins_over_the_shipped_table(library, db_url):
    with TuningDB(db_url) as db:
        put(db, _key(library), 24, 1e-4)
    got = library.explain(X)
    assert (got["source"], got["config"]) == ("db", {"block_rows": 24})


def test_the_shipped_table_serves_the_nearest_shape_the_users_entry_first_on_a_tie(
    library, db_url, monkeypatch
):
    x = make_input(96, 128)  # one doubling from the shipped 48 rows
    got = library.explain(x)
    assert (got["source"], got["config"]) == ("nearest", {"block_rows": 16})
    assert got["detail"] == "tuned for f32[48,128] (shipped table)"
    with TuningDB(db_url) as db:  # the user tuned 192 rows: one doubling the other way
        put(db, dataclasses.replace(_key(library), signature="f32[192,128]"), 32, 1e-4)
    autotune.configure()
    got = library.explain(x)
    assert (got["config"], got["detail"]) == ({"block_rows": 32}, "tuned for f32[192,128]")
    monkeypatch.setenv("PALLAS_AUTOTUNE_FALLBACK", "default")
    autotune.configure()
    assert library.explain(x)["source"] == "default"


def test_an_overlay_wins_within_its_context_innermost_first(library, tmp_path):
    outer = tmp_path / "outer.json"
    _export(library, 8, outer)
    inner = {**json.loads(outer.read_text())["entries"][0], "config": {"block_rows": 24}}
    np.testing.assert_allclose(library(X), X * 2.0)  # traced with the shipped entry first
    with autotune.overlay(outer):
        assert library.explain(X)["config"] == {"block_rows": 8}
        with autotune.overlay([inner]):
            got = library.explain(X)
            assert (got["source"], got["config"]) == ("overlay", {"block_rows": 24})
            np.testing.assert_allclose(library(X), X * 2.0)
        assert library.explain(X)["config"] == {"block_rows": 8}
    assert library.explain(X)["source"] == "shipped"


def test_calls_in_reports_the_overlays_config_a_function_jitted_inside_it_keeps_its_trace(
    library, tmp_path
):
    import jax

    overlaid = tmp_path / "overlay.json"
    _export(library, 24, overlaid)
    with autotune.overlay(overlaid):
        step = jax.jit(lambda x: library(x) + 1)
        np.testing.assert_allclose(step(X), X * 2.0 + 1)
        (call,) = autotune.calls_in(step, (X,))
        assert (call.source, call.config) == ("overlay", {"block_rows": 24})
    assert "grid=(2,)" in str(jax.make_jaxpr(step)(X)).replace(" ", "")  # 48 rows / 24: still
    np.testing.assert_allclose(step(X), X * 2.0 + 1)
    (after,) = autotune.calls_in(step, (X,))  # what a trace made now runs
    assert (after.source, after.config, after.detail) == ("shipped", {"block_rows": 16}, "")


def test_a_tampered_shipped_entry_falls_back_with_one_warning(library, caplog):
    table = Path(library.spec.tuned) / "cpu.json"
    doc = json.loads(table.read_text())
    doc["entries"][0]["config"] = {"block_rows": 32}  # in the space, but 32 does not divide 48
    table.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="autotune.runtime.state"):
        assert library.explain(X)["source"] == "default"
        np.testing.assert_allclose(library(X), X * 2.0)
        np.testing.assert_allclose(library(X + 1), (X + 1) * 2.0)
    warnings = [r.getMessage() for r in caplog.records if "shipped_scale" in r.getMessage()]
    assert len(warnings) == 1
    assert "shipped config of shipped_scale" in warnings[0] and "rows_divide" in warnings[0]


def test_a_table_of_another_kernel_version_is_not_served(library, caplog):
    table = Path(library.spec.tuned) / "cpu.json"
    doc = json.loads(table.read_text())
    doc["entries"][0]["kernel_version"] = "0" * 12
    table.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="autotune.runtime.state"):
        assert library.explain(X)["source"] == "default"
    assert "only for a different version of the kernel (000000000000" in caplog.text


def test_db_list_shipped_and_db_check_read_the_shipped_tables(library, capsys, db_url):
    imp = ["--import", "mylib.toy_shipped"]
    rc, out, _ = cli(capsys, "db", "list", "--shipped", "--format", "json", *imp)
    (row,) = json.loads(out)
    assert rc == 0 and row["kernel"] == "shipped_scale" and row["config"] == {"block_rows": 16}
    assert row["served"] == "yes"
    assert not Path(db_url).exists()  # listing a shipped table opens no database

    table = Path(library.spec.tuned) / "cpu.json"
    doc = json.loads(table.read_text())
    doc["entries"][0]["config"] = {"block_rows": 5}
    table.write_text(json.dumps(doc))
    autotune.db.tables._SHIPPED.clear()  # the CLI reads a table once per process, as model code
    TuningDB(db_url).close()  # a sound, empty database: the problem is the table's
    rc, out, _ = cli(capsys, "db", "check", "--db", db_url, *imp)
    db_line, table_line, problem = out.splitlines()
    assert rc == 1 and db_line.endswith("no problems found")
    assert table_line == "shipped tables: 1 entries: 1 problem(s)"
    assert f"{library.spec.tuned}: shipped_scale f32[48,128] on cpu: config not served" in problem
    assert "block_rows=5" in problem


@pytest.mark.parametrize(
    "source, words",
    [
        (3, "cannot overlay int: give a path, an export document"),
        ("no/such/h200.json", "overlay no/such/h200.json does not exist: give an `autotune db"),
        (
            [{"kernel": "matmul", "signature": "f32[8,8],f32[8,8]", "config": {"block_m": 8}}],
            "lacks kernel_version, platform, device_kind, backend, static: give entries as",
        ),
    ],
)
def test_an_overlay_of_something_else_is_refused_with_what_to_give(source, words):
    with pytest.raises(autotune.AutotuneError, match=re.escape(words)):
        autotune.overlay(source).__enter__()


def test_one_unreadable_table_is_said_and_the_others_are_listed(library, capsys, tmp_path):
    import jax.numpy as jnp

    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "cpu.json").write_text("{not json")
    autotune.variants("broken_table", [jnp.dot], tuned=tmp_path / "broken")
    imp = ["--import", "mylib.toy_shipped"]
    rc, out, err = cli(capsys, "db", "list", "--shipped", "--format", "json", *imp)
    assert rc == 1 and [r["kernel"] for r in json.loads(out)] == ["shipped_scale"]
    assert err.count("\n") == 1 and f"tuned table {tmp_path / 'broken' / 'cpu.json'}" in err


def test_a_table_nested_too_deeply_is_a_warning_and_the_fallback(library, tmp_path, capsys, caplog):
    import jax

    nested = '{"entries": ' + "[" * 200_000 + "]" * 200_000 + "}"
    table = Path(library.spec.tuned) / "cpu.json"
    table.write_text(nested)
    overlaid = tmp_path / "overlay.json"
    overlaid.write_text(nested)
    with caplog.at_level(logging.WARNING, logger="autotune.runtime.state"):
        np.testing.assert_allclose(jax.jit(lambda x: library(x))(X), X * 2.0)
        with autotune.overlay(overlaid):
            np.testing.assert_allclose(jax.jit(lambda x: library(x) + 1)(X), X * 2.0 + 1)
            assert library.explain(X)["source"] == "default"
    warnings = [r.getMessage() for r in caplog.records if "nested too deeply" in r.getMessage()]
    assert len(warnings) == 2  # one for the table, one for the overlay
    assert str(table) in warnings[0] and str(overlaid) in warnings[1]

    imp = ["--import", "mylib.toy_shipped"]
    rc, out, err = cli(capsys, "db", "list", "--shipped", *imp)  # the other tables' listed
    assert rc == 1 and len(err.splitlines()) == 1 and "nested too deeply" in err
    rc, out, _ = cli(capsys, "db", "check", *imp)
    assert rc == 1 and f"tuned table {table} is not a readable" in out
    rc, out, err = cli(capsys, "db", "import", str(overlaid))
    assert rc == 2 and len(err.splitlines()) == 1 and "nested too deeply" in err


def test_a_lookup_reads_only_its_device_kinds_entries_and_checks_only_its_kernels(
    library, capsys, caplog
):
    table = Path(library.spec.tuned) / "cpu.json"
    doc = json.loads(table.read_text())
    (mine,) = doc["entries"]
    other = {**mine, "kernel": "other_kernel", "time_s": -1.0}  # malformed: never looked up here
    table.write_text(json.dumps({**doc, "entries": [other, mine]}))
    elsewhere = {**mine, "device_kind": "NVIDIA H200", "platform": "gpu", "time_s": -1.0}
    (table.parent / "h200.json").write_text(json.dumps({**doc, "entries": [elsewhere]}))
    with caplog.at_level(logging.WARNING, logger="autotune.runtime.state"):
        got = library.explain(X)
    assert (got["source"], got["config"]) == ("shipped", {"block_rows": 16})
    assert caplog.records == []
    rc, out, _ = cli(capsys, "db", "check", "--import", "mylib.toy_shipped")
    assert rc == 1 and "time_s -1.0 is not a positive number" in out  # the tools read it whole


def test_a_table_entry_naming_no_kernel_and_a_stale_overlay_entry_each_warn_once(
    library, tmp_path, caplog
):
    table = Path(library.spec.tuned) / "cpu.json"
    doc = json.loads(table.read_text())
    (mine,) = doc["entries"]
    table.write_text(json.dumps({**doc, "entries": [{**mine, "kernel": 5}, mine]}))
    stale = tmp_path / "stale.json"  # tuned for another version of the kernel
    old = {**mine, "kernel_version": "0" * 12, "config": {"block_rows": 24}}
    stale.write_text(json.dumps({**doc, "entries": [old]}))
    with caplog.at_level(logging.WARNING, logger="autotune.runtime.state"):
        for _ in range(2):
            got = library.explain(X)
            with autotune.overlay(stale):
                overlaid = library.explain(X)
    assert (got["source"], got["config"]) == ("shipped", {"block_rows": 16})
    assert (overlaid["source"], overlaid["config"]) == ("shipped", {"block_rows": 16})
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert f"{table}: entry 1 names no kernel (kernel 5): never served" in warnings[0]
    assert f"overlay {stale} has shipped_scale f32[48,128] only for kernel version" in warnings[1]


def test_a_variant_groups_shipped_choice_is_served_and_resolved_beside_its_module(
    tmp_path, db_url, monkeypatch
):
    import jax.numpy as jnp

    # registered for this test only: the second group's table does not exist
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    members = [autotune.Member(jnp.dot, name="dot"), autotune.Member(jnp.matmul, name="xla")]
    group = autotune.variants("shipped_dot", members, tuned=tmp_path / "tuned")
    x, y = jnp.ones((4, 3)), jnp.ones((3, 2))
    device = current_device()
    key = group.spec.key(group.spec.signature([x, y], {}, device), device)
    (tmp_path / "tuned").mkdir()
    with TuningDB(tmp_path / "author.db") as db:  # the library author's tuning, exported
        db.put_best(key, BestEntry({"variant": "xla"}, 1e-6, 2, run_id="r", strategy="variants"))
        (tmp_path / "tuned" / "cpu.json").write_text(json.dumps(db.export(), default=str))

    got = group.explain(x, y)  # untuned, the group would call its first member, dot
    assert (got["variant"], got["source"]) == ("xla", "shipped")
    np.testing.assert_allclose(group(x, y), x @ y)
    relative = autotune.variants("shipped_dot_here", members, tuned="tuned")
    assert relative.spec.tuned == Path(__file__).resolve().parent / "tuned"


def test_a_shipped_entry_without_tuned_at_is_listed_and_checked(library, capsys, db_url):
    table = Path(library.spec.tuned) / "cpu.json"
    doc = json.loads(table.read_text())
    del doc["entries"][0]["tuned_at"]  # the export format does not require it
    table.write_text(json.dumps(doc))
    autotune.db.tables._SHIPPED.clear()
    imp = ["--import", "mylib.toy_shipped"]
    rc, out, _ = cli(capsys, "db", "list", "--shipped", "--format", "json", *imp)
    assert rc == 0 and json.loads(out)[0]["served"] == "yes"
    TuningDB(db_url).close()
    rc, out, _ = cli(capsys, "db", "check", "--db", db_url, *imp)
    assert rc == 0 and "shipped tables: 1 entries: no problems found" in out


def test_a_shipped_entry_of_another_device_kind_is_measured_first(library, db_url):
    other = dataclasses.replace(_key(library), device_kind="cpu (another kind)")
    tuned = Path(library.spec.tuned)
    with TuningDB(tuned.parent / "other.db") as db:
        put(db, other, 24, 1e-4)
        (tuned / "other.json").write_text(json.dumps(db.export(), default=str))
    result = autotune.tune(library, [X], n_trials=2, seed=0, finalists=0)
    assert [t.config["block_rows"] for t in result.trials] == [8, 24]  # the default first
    assert [t.transferred_from for t in result.trials] == [None, "cpu (another kind)"]
    off = autotune.tune(library, [X], n_trials=2, seed=0, finalists=0, transfer=False)
    assert not any(t.transferred_from for t in off.trials)
