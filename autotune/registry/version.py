"""A kernel's code, as its version hashes it: what the code does, not how it is written.

The version hashes the abstract syntax tree of the kernel's module, with docstrings (and any
other bare string statement) dropped; comments and formatting never reach the tree. The tree
is written out field by field, leaving out empty fields, because `ast.dump` differs between
Python releases (3.12 adds `type_params=[]` to every function, 3.13 drops empty fields): the
same code gives the same version on every supported Python.

The kernel runs more than its own module: the modules of its own package that it imports (at
the top or inside a function; for a module outside any package, the modules beside it in its
folder) are hashed too, transitively. A shipped kernel's package is its op's, inside the
shipped kernels' package (autotune.kernels.matmul, ...), and the ops share helpers there
(kernels/differentiable.py, kernels/precision.py): its own code is every module of
autotune.kernels it imports (`rows/layout.py` for softmax, `matmul/tiles.py` for bmm, the
shared masks and TPU bodies for the flash backward), and no other op's. JAX, NumPy and the
autotune library itself are not: their releases do not stale a tuned entry. A kernel whose
code lives elsewhere declares its own version (`@autotuned(..., version=...)`).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import inspect
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from autotune.space import Constraint, Param

# The shipped kernels' package: one package per op inside it, sharing helpers across them
SHIPPED_KERNELS_PACKAGE = "autotune.kernels"


def kernel_version(
    fn: Callable,
    spaces: Mapping[str, tuple[Param, ...]],
    constraints: Sequence[Constraint],
    bind: Callable | str | None,
) -> str:
    """A kernel's version: a hash of its code (its module and the modules of its package that it
    imports), its space as parsed, and its constraints' and bind's code (`bind`: the text of a
    declarative bind)."""
    qualified = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
    hasher = hashlib.sha256(f"{qualified}\0".encode())
    for module, code in kernel_code(fn):
        hasher.update(f"{module}\0{code}\0".encode())
    hasher.update(repr(sorted(spaces.items())).encode())
    for part in (*constraints, bind):
        text = part if isinstance(part, str) or part is None else function_code(part)
        hasher.update(f"\0{text}".encode())
    return hasher.hexdigest()[:12]


def normalised(source: str) -> str:
    """The code of `source` written out from its syntax tree: docstrings, comments and
    formatting left out, the same text on every supported Python. Raises SyntaxError."""
    return _dump(ast.parse(source))


def _dump(node: Any) -> str:
    if isinstance(node, list):
        return "[" + ", ".join(_dump(n) for n in node if not _is_string_statement(n)) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = [
        f"{name}={_dump(value)}"
        for name, value in ast.iter_fields(node)
        if value is not None and value != []
    ]
    return f"{type(node).__name__}({', '.join(fields)})"


def _is_string_statement(node: Any) -> bool:
    """A docstring, or any statement that is only a string: it does nothing."""
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def function_code(fn: Any) -> str:
    """A function's code (a constraint, a bind), normalised where its source parses alone."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):  # built in, or defined where no source is kept
        return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    try:
        return normalised(source)
    except (SyntaxError, RecursionError):  # a lambda's line, cut out of a call; or too deep
        return source


def kernel_code(fn: Any) -> list[tuple[str, str]]:
    """(module name, normalised code) of the module defining `fn` and of the modules of its
    package it imports, transitively, sorted by name; a function with no module file (a
    notebook cell) gives its own code."""
    module = inspect.getmodule(fn)
    path = _file(module)
    if module is None or path is None:
        return [(getattr(fn, "__qualname__", ""), function_code(fn))]
    name = module.__name__
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if package.startswith(SHIPPED_KERNELS_PACKAGE + "."):  # an op's package: see the docstring
        package = SHIPPED_KERNELS_PACKAGE
    folder = path.parent

    def ours(other: str) -> Path | None:
        """The file of module `other` where it is the kernel's own: in the kernel's package,
        or, for a kernel outside any package, in a module or package beside it."""
        if package:
            if other != package and not other.startswith(package + "."):
                return None
        else:
            top = _module_file(other.partition(".")[0])
            if (
                top is None
                or (top.parent.parent if top.name == "__init__.py" else top.parent) != folder
            ):
                return None
        return _module_file(other)

    code: dict[str, str] = {}
    todo = [(name, path)]
    while todo:
        mod, file = todo.pop()
        if mod in code:
            continue
        try:
            code[mod], imports = _module_code(file.read_bytes(), mod, file.name)
        except OSError:  # gone since it was imported: its name still counts
            code[mod], imports = "", ()
        for base, names in imports:
            base_file = ours(base)
            if base_file is None:
                continue
            rest = not names  # `import m`; `from m import x` where x is no submodule of m
            for n in names:
                sub = ours(f"{base}.{n}") if base_file.name == "__init__.py" else None
                if sub is None:
                    rest = True
                else:
                    todo.append((f"{base}.{n}", sub))
            if rest:
                todo.append((base, base_file))
    return sorted(code.items())


@functools.lru_cache(maxsize=256)
def _module_code(
    source: bytes, name: str, filename: str
) -> tuple[str, tuple[tuple[str, tuple[str, ...]], ...]]:
    """A module's normalised code and its imports, each (module, names imported from it);
    cached, as kernels share modules."""
    text = source.decode(errors="replace")
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return text, ()
    package = name if filename == "__init__.py" else name.rpartition(".")[0]
    imports: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            except (ImportError, ValueError):  # a relative import beyond the top package
                continue
            imports.append((base, tuple(alias.name for alias in node.names)))
    try:
        return _dump(tree), tuple(imports)
    except RecursionError:  # nested deeper than _dump recurses (compile() goes further)
        return text, tuple(imports)


def _module_file(name: str) -> Path | None:
    """The source file of module `name`, found without running it (None: none, or not Python)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith(".py"):
        return None
    return Path(origin).resolve()


def _file(module: ModuleType | None) -> Path | None:
    path = getattr(module, "__file__", None)
    return Path(path).resolve() if path and path.endswith(".py") else None
