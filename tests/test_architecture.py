"""The map in docs/architecture.md, held against the code: the import graph of autotune/ (lazy
imports inside functions included) has no circle, its packages are layered as the map draws
them, and the directions it states hold."""

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
        (
            "autotune.tuning.kernel",
            {"autotune.tuning.tune", "autotune.tuning.group", "autotune.runtime.variants"},
        ),
        ("autotune.tuning.group", {"autotune.tuning.tune"}),
        # neither the tuner nor the worker imports the runtime (registry.entry_stored instead)
        (
            "autotune.tuning.kernel",
            {"autotune.runtime.decorator", "autotune.runtime.state", "autotune.runtime.lookup"},
        ),
        (
            "autotune.tuning.worker",
            {"autotune.runtime.decorator", "autotune.runtime.state", "autotune.runtime.lookup"},
        ),
        # the runtime path never loads the tuner, the search or the studies
        (
            "autotune.runtime.decorator",
            {"autotune.tuning.kernel", "autotune.tuning.tune", "autotune.search"},
        ),
        ("autotune.runtime.decorator", {"autotune.search.studies", "autotune.tuning.worker"}),
        # overlays drop lookups through the state, below the runtime
        ("autotune.runtime.overlays", {"autotune.runtime.decorator", "autotune.runtime.lookup"}),
        (
            "autotune.runtime.state",
            {"autotune.runtime.decorator", "autotune.runtime.lookup", "autotune.runtime.overlays"},
        ),
        # the database knows neither the runtime nor the tuner; the registry opens no database
        (
            "autotune.db",
            {"autotune.runtime.decorator", "autotune.runtime.lookup", "autotune.runtime.overlays"},
        ),
        (
            "autotune.db",
            {"autotune.runtime.state", "autotune.tuning.kernel", "autotune.tuning.tune"},
        ),
        (
            "autotune.registry",
            {"autotune.db", "autotune.runtime.decorator", "autotune.tuning.kernel"},
        ),
        # the chip tables ask no platform: the backends read them
        ("autotune.backends.hardware", set(MODULES) - {"autotune.backends.hardware"}),
    ],
)
def test_dependencies_point_the_way_the_map_says(module, never):
    assert reachable(module) & never == set()


# The packages from the ground up, as docs/architecture.md draws them: a package imports only
# the flat modules and the packages below it (a lazy import inside a function included).
FLAT = {
    "autotune.errors",
    "autotune.signature",
    "autotune.space",
    "autotune.trial",
    "autotune.device",
    "autotune.sql",
}
LAYERS = [
    ["autotune.backends"],
    ["autotune.registry"],
    ["autotune.db", "autotune.search", "autotune.measure"],
    ["autotune.runtime", "autotune"],  # the package's face: the runtime, and the rest lazily
    ["autotune.tuning"],
    ["autotune.service"],
    ["autotune.report"],
    ["autotune.cli"],
]


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_at_most_eight_modules_sit_flat_in_the_package():
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= 8, flat
    assert {f"autotune.{n[:-3]}" for n in flat} - {"autotune.__init__"} == FLAT


@pytest.mark.parametrize("level", range(len(LAYERS)), ids=lambda i: "+".join(LAYERS[i]))
def test_each_package_imports_only_the_layers_below_it(level):
    below = {p for layer in LAYERS[:level] for p in layer}
    for package in LAYERS[level]:
        for module in (m for m in MODULES if package_of(m) == package):
            for target in GRAPH[module]:
                other = package_of(target)
                face = package == "autotune" and other in LAYERS[level]  # it hands names on
                allowed = target in FLAT or other == package or other in below or face
                assert allowed, f"{module} imports {target}, which is not below {package}"


@pytest.mark.parametrize(
    ("package", "never"),
    [
        ("autotune.db", "autotune.runtime"),  # the database serves the runtime, not the reverse
        ("autotune.search", "autotune.db"),  # search never knows where results are stored
        ("autotune.report", "autotune.tuning"),  # a report reads; it never tunes
        ("autotune.report", "autotune.service"),
        ("autotune.runtime", "autotune.tuning"),  # model code never loads the tuner
    ],
)
def test_the_rules_a_reader_assumes_hold(package, never):
    modules = [m for m in MODULES if package_of(m) == package]
    reached = {r for m in modules for r in reachable(m)}
    assert not {r for r in reached if package_of(r) == never}


def test_the_graph_reads_lazy_imports():
    # a function's import counts: the runtime state opens the database lazily
    assert "autotune.db" in GRAPH["autotune.runtime.state"]
    assert "autotune.tuning.tune" in GRAPH["autotune.service.jobs"]  # imported inside run_tasks


DOC = (PACKAGE.parent / "docs" / "architecture.md").read_text()


def test_the_map_names_every_module_and_package():
    """docs/architecture.md's tree names every module and package of autotune/ (its Alembic
    revisions aside), so a module added or moved without the map fails here."""
    parts = DOC[DOC.index("## The parts") : DOC.index("## Floors")]
    unnamed = [
        str(p.relative_to(PACKAGE.parent))
        for p in PACKAGE.rglob("*.py")
        if "versions" not in p.parts
        and p.name not in ("__init__.py", "__main__.py")
        and p.name not in parts
    ]
    packages = [p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()]
    assert unnamed == [], f"modules the map does not name: {unnamed}"
    assert [p for p in packages if f"{p}/" not in parts] == []


def test_the_floors_the_map_states_are_the_layers_held_here():
    floors = DOC[DOC.index("## Floors") :].split("\n\n")[1]
    named = [p.split(".")[-1] for layer in LAYERS for p in layer if p != "autotune"]
    positions = [floors.index(f"`{n}`") for n in named]
    assert positions == sorted(positions), f"the map's floors are not in the order {named}"
