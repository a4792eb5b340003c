"""The map in docs/architecture.md, held against the code: the import graph of autotune/ (lazy
imports inside functions included) has no circle, and the directions it states hold."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "autotune"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(name: str) -> set[str]:
    """The modules of autotune/ that module `name` imports, anywhere in its body (a function's
    lazy import too), but for imports only a type checker sees."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in GRAPH[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


def test_the_import_graph_of_the_package_has_no_circle():
    circles = sorted(m for m in MODULES if m in reachable(m))
    assert circles == [], f"modules on an import circle: {circles}"


@pytest.mark.parametrize(
    ("module", "never"),
    [
        # tuning goes one way: the public entry chooses, the group's tuning uses the tuner
        ("autotune.tuner", {"autotune.tuning", "autotune.variant_tuning", "autotune.variants"}),
        ("autotune.variant_tuning", {"autotune.tuning"}),
        # neither the tuner nor the worker imports the runtime (registry.entry_stored instead)
        ("autotune.tuner", {"autotune.runtime", "autotune.runtime_state", "autotune.lookup"}),
        ("autotune.worker", {"autotune.runtime", "autotune.runtime_state", "autotune.lookup"}),
        # the runtime path never loads the tuner, the search or the studies
        ("autotune.runtime", {"autotune.tuner", "autotune.tuning", "autotune.search"}),
        ("autotune.runtime", {"autotune.studies", "autotune.worker"}),
        # overlays drop lookups through the state, below the runtime
        ("autotune.overlays", {"autotune.runtime", "autotune.lookup"}),
        ("autotune.runtime_state", {"autotune.runtime", "autotune.lookup", "autotune.overlays"}),
        # the database knows neither the runtime nor the tuner; the registry opens no database
        ("autotune.db", {"autotune.runtime", "autotune.lookup", "autotune.overlays"}),
        ("autotune.db", {"autotune.runtime_state", "autotune.tuner", "autotune.tuning"}),
        ("autotune.registry", {"autotune.db", "autotune.runtime", "autotune.tuner"}),
        # the chip tables ask no platform: the backends read them
        ("autotune.hardware", set(MODULES) - {"autotune.hardware"}),
    ],
)
def test_dependencies_point_the_way_the_map_says(module, never):
    assert reachable(module) & never == set()


def test_the_graph_reads_lazy_imports():
    # a function's import counts: the runtime state opens the database lazily
    assert "autotune.db" in GRAPH["autotune.runtime_state"]
    assert "autotune.tuning" in GRAPH["autotune.jobs"]  # imported inside run_tasks
