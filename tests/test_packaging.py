"""The distribution's package list: every subpackage is installed, under the `autotune` name."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_folder_of_python_code_is_a_listed_package():
    # setuptools installs only the packages listed: a subpackage missing here works in an
    # editable install and is absent from the wheel (and the docker images built from it)
    config = _setuptools()
    folders = {
        "autotune": ROOT / "autotune",
        **{k: ROOT / v for k, v in config["package-dir"].items()},
    }
    found = set()
    for name, folder in folders.items():
        for init in folder.rglob("__init__.py"):
            relative = init.parent.relative_to(folder).parts
            found.add(".".join((name, *relative)))
    assert sorted(config["packages"]) == sorted(found)


def test_nothing_installs_under_a_generic_top_level_name():
    assert {p.split(".")[0] for p in _setuptools()["packages"]} == {"autotune"}


def test_the_shipped_kernels_and_spaces_are_found_under_the_package():
    from autotune import registry
    from autotune.space import resolve_space_path

    assert registry.resolve("matmul").spec.fn.__module__ == "autotune.kernels.matmul.matmul"
    assert resolve_space_path("matmul").parent == ROOT / "search_spaces"


def test_the_shipped_kernels_read_the_tuned_folder_that_ships_with_them():
    # every file the folder holds is package data (a table left out of the wheel is served in
    # an editable install and nowhere else), and every shipped kernel and group reads it
    import fnmatch

    from autotune import registry

    folder = ROOT / "kernels" / "tuned"
    patterns = _setuptools()["package-data"]["autotune.kernels"]
    files = [p.relative_to(ROOT / "kernels").as_posix() for p in folder.iterdir()]
    assert "tuned/README.md" in files
    assert all(any(fnmatch.fnmatch(f, p) for p in patterns) for f in files), files
    shipped = [
        k
        for k in registry.registered().values()
        if k.spec.fn.__module__.startswith("autotune.kernels")
    ]
    assert len(shipped) >= 16
    assert {k.spec.tuned for k in shipped} == {folder}
