"""The database and the space files are data: nothing in the package executes them, SQL is
parameterised, and the default database is private to the user."""

from __future__ import annotations

import ast
import os
import re
import stat
from pathlib import Path

import pytest

from autotune import TuningDB

ROOT = Path(__file__).parent.parent
SOURCES = sorted(p for d in ("autotune", "kernels") for p in (ROOT / d).rglob("*.py"))
FORBIDDEN = re.compile(
    r"\b(pickle|cPickle|dill|marshal|shelve|cloudpickle|jsonpickle)\b"
    r"|(?<![.\w])(eval|exec|compile|__import__)\(|yaml\.(unsafe_)?load\(|builtins\.(eval|exec)"
)
SQL_CALLS = {"execute", "exec_driver_sql", "executescript", "text", "DDL"}
# SQL built from our own identifiers, never from data: (file, enclosing function) -> why
ALLOWED_DYNAMIC_SQL = {
    ("sql.py", "on_connect"): "PRAGMA busy_timeout takes no parameter; the value is an int",
}


# Files that may use pickle, and why: never on data from the database or the space files.
ALLOWED_PICKLE = {
    "protocol.py": "messages between the search process and the device worker it spawned, over "
    "the child's private stdin/stdout pipes (inputs, oracle, results); no file or database is read",
}


def test_sources_were_found():
    assert len(SOURCES) > 10 and any(p.name == "database.py" for p in SOURCES)


def test_no_pickle_eval_or_exec():
    found = []
    for path in SOURCES:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if path.name in ALLOWED_PICKLE:
                code = re.sub(r"\bpickle\b", "", code)
            if FORBIDDEN.search(code):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == [], "\n".join(found)


def test_sql_text_is_always_a_literal():
    """Values reach SQL only as bound parameters: no SQL string is formatted."""
    found = [
        f"{path.relative_to(ROOT)}:{line} (in {function})"
        for path in SOURCES
        for function, line in formatted_sql(ast.parse(path.read_text(), str(path)))
        if (path.name, function) not in ALLOWED_DYNAMIC_SQL
    ]
    assert found == [], "\n".join(found)


def test_the_source_checks_name_every_offending_file_and_line(tmp_path, monkeypatch):
    # the checks above read every file, not the first that fails: each one found is named
    bad = [tmp_path / "a.py", tmp_path / "b.py"]
    bad[0].write_text("import pickle\n")
    bad[1].write_text("x = 1\ny = eval('2')\n")
    monkeypatch.setitem(globals(), "SOURCES", bad)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    with pytest.raises(AssertionError) as e:
        test_no_pickle_eval_or_exec()
    assert "a.py:1: import pickle" in str(e.value) and "b.py:2: y = eval('2')" in str(e.value)


def test_the_sql_check_catches_formatted_sql():
    snippet = "def f(c, x):\n    c.execute(f'SELECT {x}')\n    c.execute('SELECT ?', (x,))\n"
    assert formatted_sql(ast.parse(snippet)) == [("f", 2)]


def formatted_sql(tree):
    """(function, line) of every SQL call whose text is built by formatting."""
    found = []
    for name, call in _calls(tree, "<module>"):
        callee = getattr(call.func, "attr", getattr(call.func, "id", None))
        if callee not in SQL_CALLS or not call.args:
            continue
        arg = call.args[0]
        if isinstance(arg, (ast.JoinedStr, ast.BinOp)) or (
            isinstance(arg, ast.Call) and getattr(arg.func, "attr", "") == "format"
        ):
            found.append((name, call.lineno))
    return found


def _calls(node, name):
    """(innermost enclosing function name, call) for every call under `node`."""
    for child in ast.iter_child_nodes(node):
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else name
        if isinstance(child, ast.Call):
            yield name, child
        yield from _calls(child, inner)


def test_new_database_files_are_private(tmp_path):
    path = tmp_path / "tuning.db"
    db = TuningDB(path)
    with db.engine.connect() as conn:  # open a connection so the -wal file exists
        conn.exec_driver_sql("SELECT 1")
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p
    db.close()
