"""A kernel's code, as its version hashes it: what the kernel runs, not where it is written.

The version hashes the code the kernel reaches: the top-level statement that defines its
function (the whole statement: a function nested in another, or a method, brings the function
or class around it), and, followed by name, every top-level function, class, constant and
assignment of its package that this code refers to, transitively (`body(x)` brings `def body`;
`rowwise.fits(...)` brings `fits` of the module `rowwise`; an import of a module of the package
inside a function is followed too). Unrelated code of the same module (a constant nothing
refers to, the statements of a script that calls the kernel) is not part of it, and neither are
the names of the modules the code sits in: the same kernel defined in a script (`__main__`) and
in `mymodule.py` has one version, and moving a helper to another module of the package keeps
it. A name imported from outside the package counts as its import (`import jax.numpy as jnp`):
JAX, NumPy and the autotune library are not followed, so their releases stale no tuned entry.
The constraints and a `bind` function are reached the same way.

The package a kernel's references are followed into: the kernel's top-level package (for a
module outside any package, the modules beside it in its folder); for the kernels shipped with
autotune, `autotune.kernels` (every kernel's own package or module under it); for a kernel that
lives inside JAX (or autotune), only the package that holds its module.

Each statement is written out from its syntax tree, with docstrings (and any other bare string
statement) dropped; comments and formatting never reach the tree. The tree is written out field
by field, leaving out empty fields, because `ast.dump` differs between Python releases (3.12
adds `type_params=[]` to every function, 3.13 drops empty fields): the same code gives the same
version on every supported Python. A kernel whose code lives elsewhere declares its own version
(`@autotuned(..., version=...)`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from autotune.space import Constraint, Param

# packages whose own kernels reach only the package that holds them: following a reference of
# such a kernel into the rest of the package (pallas_call's implementation, autotune's runtime)
# would stale its entries at every release
_LIBRARIES = frozenset({"jax", "jaxlib", "numpy", "autotune"})
SHIPPED_KERNELS_PACKAGE = "autotune.kernels"  # the kernels shipped with autotune: reached whole


def kernel_version(
    fn: Callable,
    spaces: Mapping[str, tuple[Param, ...]],
    constraints: Sequence[Constraint],
    bind: Callable | str | None,
) -> str:
    """A kernel's version: a hash of the code it reaches (see the module docstring) from its
    function, its constraints and `bind` (the text of a declarative one), and its space as
    parsed."""
    roots = [fn, *constraints, *([bind] if callable(bind) else [])]
    hasher = hashlib.sha256()
    for _, code in kernel_code(*roots):
        hasher.update(f"{code}\0".encode())
    hasher.update(repr(sorted(spaces.items())).encode())
    if isinstance(bind, str):
        hasher.update(f"\0{bind}".encode())
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
    """A function's own code, normalised where its source parses alone (a function whose
    module cannot be read: a notebook cell)."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):  # built in, or defined where no source is kept
        return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    try:
        return normalised(source)
    except (SyntaxError, RecursionError):  # a lambda's line, cut out of a call; or too deep
        return source


def kernel_code(*roots: Any) -> list[tuple[str, str]]:
    """(module name, normalised code) of each top-level statement the functions `roots` reach
    (the kernel's function first, then its constraints), in the order they are reached; the
    hash takes the code alone. A function with no module file gives its own code."""
    reach = _Reach(_scope_of(roots[0]) if roots else None)
    for root in roots:
        reach.root(root)
    return reach.parts


# ------------------------------------------------------------------ modules as parsed


@dataclass
class _Module:
    """A module's top-level statements, and which of them bind each name."""

    name: str
    package: str  # what its relative imports are relative to
    file: Path | None
    source: str
    statements: list[ast.stmt]
    bindings: dict[str, list[int]]  # name -> the statements binding it, in order
    stars: list[int]  # `from m import *` statements
    code: dict[int, str] = field(default_factory=dict)  # a statement's normalised code


@functools.lru_cache(maxsize=256)
def _parsed(source: bytes) -> tuple[list[ast.stmt], dict[str, list[int]], list[int]] | None:
    """A module's statements and bindings (None: it does not parse); cached, as kernels
    share modules."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    bindings: dict[str, list[int]] = {}
    stars: list[int] = []
    for i, stmt in enumerate(tree.body):
        for node in _bound_by(stmt):
            if isinstance(node, ast.alias) and node.name == "*":
                stars.append(i)
            elif isinstance(node, str):
                bindings.setdefault(node, []).append(i)
    return tree.body, bindings, stars


def _bound_by(stmt: ast.stmt) -> Iterator[Any]:
    """The names a top-level statement binds at module level (a '*' alias for a star
    import); a compound statement (if, try, with, for) binds what its body binds."""
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    yield alias
                else:
                    yield alias.asname or alias.name.partition(".")[0]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                yield from (n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if isinstance(node, (ast.For, ast.AsyncFor)):
                todo += node.body + node.orelse
        elif isinstance(node, (ast.If, ast.While)):
            todo += node.body + node.orelse
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    yield from (
                        n.id for n in ast.walk(item.optional_vars) if isinstance(n, ast.Name)
                    )
            todo += node.body
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            todo += node.body + node.orelse + node.finalbody  # type: ignore[attr-defined]
            for handler in node.handlers:  # type: ignore[attr-defined]
                todo += handler.body
                if handler.name:
                    yield handler.name
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.NamedExpr):
            yield node.value.target.id


def _load(name: str, file: Path | None, package: str | None = None) -> _Module | None:
    if file is None:
        return None
    try:
        source = file.read_bytes()
    except OSError:  # gone since it was imported
        return None
    if package is None:
        package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    return _module(name, package, file, source)


@functools.lru_cache(maxsize=256)
def _module(name: str, package: str, file: Path, source: bytes) -> _Module:
    """A module as parsed, its statements' code written out once (kernels share modules)."""
    text = source.decode(errors="replace")
    parsed = _parsed(source)
    if parsed is None:
        return _Module(name, package, file, text, [], {}, [])
    return _Module(name, package, file, text, *parsed)


def _module_file(name: str) -> Path | None:
    """The source file of module `name`, found without running it (None: none, or not Python)."""
    module = sys.modules.get(name)
    if module is not None:
        return _file(module)
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
    return Path(path).resolve() if isinstance(path, str) and path.endswith(".py") else None


# ------------------------------------------------------------------ the kernel's package


@dataclass(frozen=True)
class _Scope:
    """Which modules are the kernel's own: those under `package`, or, for a kernel outside
    any package, the modules and packages in `folder`."""

    package: str
    folder: Path | None

    def file_of(self, module: str) -> Path | None:
        """The file of `module` where it is the kernel's own, else None."""
        if self.package:
            if module != self.package and not module.startswith(self.package + "."):
                return None
        else:
            top = _module_file(module.partition(".")[0])
            beside = top.parent.parent if top and top.name == "__init__.py" else top and top.parent
            if top is None or beside != self.folder:
                return None
        return _module_file(module)


def _home(fn: Any) -> tuple[str, str | None, Path] | None:
    """The module a function is defined in: its name (as `python -m` names it), the package
    its relative imports are relative to, and its file; None where it has no Python file (a
    notebook cell, a built-in). A module gone from sys.modules is found by its code's file."""
    module = inspect.getmodule(fn)
    file = _file(module)
    code = getattr(fn, "__code__", None)
    if file is None and code is not None and code.co_filename.endswith(".py"):
        path = Path(code.co_filename)
        file = path.resolve() if path.is_file() else None
    if file is None:
        return None
    if module is None:
        return getattr(fn, "__module__", None) or "__main__", None, file
    spec = getattr(module, "__spec__", None)
    name = getattr(spec, "name", None) or module.__name__  # `python -m pkg.mod`: pkg.mod
    return name, getattr(module, "__package__", None), file


def _scope_of(fn: Any) -> _Scope | None:
    home = _home(_unwrapped(fn))
    if home is None:
        return None
    name, _, file = home
    if name == SHIPPED_KERNELS_PACKAGE or name.startswith(SHIPPED_KERNELS_PACKAGE + "."):
        return _Scope(SHIPPED_KERNELS_PACKAGE, None)
    top, dot, _ = name.partition(".")
    if name == "__main__" or (not dot and file.name != "__init__.py"):
        return _Scope("", file.parent)  # a script, or a module outside any package
    if top in _LIBRARIES:
        return _Scope(name if file.name == "__init__.py" else name.rpartition(".")[0], None)
    return _Scope(top, None)


def _unwrapped(fn: Any) -> Any:
    """The function a wrapper stands for (functools.wraps, jax.jit); a partial's function."""
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
            continue
        try:
            inner = inspect.unwrap(fn)
        except ValueError:  # a cycle of __wrapped__
            return fn
        if inner is fn:
            return fn
        fn = inner


# ------------------------------------------------------------------ following references


class _Reach:
    """The top-level statements reached from the roots, in the order they are reached."""

    def __init__(self, scope: _Scope | None) -> None:
        self.scope = scope
        self.parts: list[tuple[str, str]] = []
        self.modules: dict[str, _Module | None] = {}
        self.seen: set[tuple] = set()
        self.todo: list[tuple[_Module, int]] = []

    # roots

    def root(self, fn: Any) -> None:
        inner = _unwrapped(fn)
        if isinstance(fn, functools.partial):  # its bound arguments are part of what runs
            self._add(("partial", id(fn)), "", _partial_code(fn))
        home = _home(inner)
        code = getattr(inner, "__code__", None)
        parsed = None if home is None else self._module(home[0], home[2], home[1])
        if parsed is None or code is None or Path(code.co_filename).resolve() != parsed.file:
            self._add(("fn", id(inner)), "", function_code(inner))
            return
        index = _statement_at(parsed.statements, code.co_firstlineno)
        if index is None:  # not inside any top-level statement: the whole module, as it is
            self._add(("module", parsed.name), parsed.name, _whole(parsed))
            return
        self._statement(parsed, index)
        self._drain()

    def _module(self, name: str, file: Path, package: str | None = None) -> _Module | None:
        if name not in self.modules:
            self.modules[name] = _load(name, file, package or None)
        return self.modules[name]

    def _own(self, name: str) -> _Module | None:
        """Module `name` where it is the kernel's own (parsed), else None."""
        if self.scope is None or name in ("", "__main__"):
            return None
        file = self.scope.file_of(name)
        return None if file is None else self._module(name, file)

    # statements

    def _add(self, key: tuple, module: str, code: str) -> None:
        if key not in self.seen:
            self.seen.add(key)
            self.parts.append((module, code))

    def _statement(self, module: _Module, index: int) -> None:
        key = ("stmt", module.name, index)
        if key in self.seen:
            return
        stmt = module.statements[index]
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            return  # an import at the top: each name it binds is followed where it is used
        self._add(key, module.name, _statement_code(module, index))
        self.todo.append((module, index))

    def _drain(self) -> None:
        while self.todo:
            module, index = self.todo.pop(0)
            for head, attrs, imported in _references(module.statements[index]):
                if imported is not None:  # a name an import inside a function binds
                    self._through_import(module, imported, head, attrs)
                else:
                    self._name(module, head, attrs)

    # names

    def _name(self, module: _Module, name: str, attrs: list[str]) -> None:
        """Follow `name` (then `.attrs`) as module `module` binds it at the top."""
        followed = ("name", module.name, name, *attrs)
        if followed in self.seen:  # once: two modules may import a name from each other
            return
        self.seen.add(followed)
        bound = module.bindings.get(name)
        if not bound:
            for index in module.stars:  # `from m import *`: m's own name, if m is ours
                star = module.statements[index]
                assert isinstance(star, ast.ImportFrom)
                base = _resolved(star, module.package)
                target = base and self._own(base)
                if target is not None:
                    self._name(target, name, attrs)
                else:
                    self._add(("star", module.name, index), "", _statement_code(module, index))
            return
        for index in bound:
            stmt = module.statements[index]
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                self._through_import(module, stmt, name, attrs)
            else:
                self._statement(module, index)
                if isinstance(stmt, _COMPOUND):  # taken whole; an import inside is followed
                    self._drain_imports(module, stmt, name, attrs)

    def _drain_imports(self, module: _Module, stmt: ast.stmt, name: str, attrs: list[str]) -> None:
        for node in ast.walk(stmt):
            binds = isinstance(node, (ast.Import, ast.ImportFrom)) and node is not stmt
            if binds and any((a.asname or a.name.partition(".")[0]) == name for a in node.names):
                self._through_import(module, node, name, attrs)

    def _through_import(self, module: _Module, node: Any, name: str, attrs: list[str]) -> None:
        """Follow `name`, bound by the import `node` of `module`, into the kernel's package;
        an import from elsewhere counts as its text."""
        for alias in node.names:
            if (alias.asname or alias.name.partition(".")[0]) != name:
                continue
            if isinstance(node, ast.Import):
                # `import a.b as n`: n is a.b; `import a.b`: the name is a, the rest attributes
                target = alias.name if alias.asname else name
                own = self._own(target)
                if own is not None:
                    self._module_attrs(own, attrs)
                else:
                    as_ = f" as {alias.asname}" if alias.asname else ""
                    self._add(("import", alias.name, name), "", f"import {alias.name}{as_}")
                continue
            base = _resolved(node, module.package)
            own = base and self._own(base)
            if own is None:
                self._add(
                    ("from", base, alias.name, name),
                    "",
                    f"from {base} import {alias.name} as {name}",
                )
                continue
            sub = self._own(f"{base}.{alias.name}")
            if sub is not None and alias.name not in own.bindings:
                self._module_attrs(sub, attrs)
            else:
                self._name(own, alias.name, attrs)

    def _module_attrs(self, module: _Module, attrs: list[str]) -> None:
        """Follow `module.attrs[0].attrs[1]...`: the first a name of the module (or one of its
        submodules); a module used as a value (no attribute) is reached whole."""
        if not attrs:
            for index in range(len(module.statements)):
                self._statement(module, index)
            return
        first, rest = attrs[0], attrs[1:]
        if first not in module.bindings:
            sub = self._own(f"{module.name}.{first}")
            if sub is not None:
                self._module_attrs(sub, rest)
                return
        self._name(module, first, rest)


_COMPOUND = (ast.If, ast.Try, getattr(ast, "TryStar", ast.Try), ast.With, ast.For, ast.While)
_COMPOUND += (ast.AsyncWith, ast.AsyncFor)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclass(frozen=True)
class _Locals:
    """The names a function (or class body, or comprehension) binds, and which of them an
    import binds (followed like a module-level import)."""

    names: frozenset[str]
    imports: Mapping[str, ast.AST]
    is_class: bool = False


@functools.lru_cache(maxsize=4096)
def _references(stmt: ast.stmt) -> list[tuple[str, list[str], ast.AST | None]]:
    """The module-level names a top-level statement uses, each with the attributes read off
    it (`rowwise.fits` is ("rowwise", ["fits"])) and, for a name an import inside a function
    binds, that import; in source order. A function's parameters and locals are not
    module-level names (a script's `x = ...` is not the kernel's `x`). Iterative, so that deep
    code does not recurse."""
    found: list[tuple[tuple[int, int], str, list[str], ast.AST | None]] = []
    stack: list[tuple[ast.AST, tuple[_Locals, ...]]] = [(stmt, ())]
    while stack:
        node, env = stack.pop()
        if isinstance(node, _FUNCTIONS):
            args = node.args
            outer = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
            if not isinstance(node, ast.Lambda):
                outer += [*node.decorator_list, *([node.returns] if node.returns else [])]
                every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
                every += [a for a in (args.vararg, args.kwarg) if a is not None]
                outer += [a.annotation for a in every if a.annotation is not None]
            stack += [(n, env) for n in outer]
            body = [node.body] if isinstance(node, ast.Lambda) else node.body
            inner = tuple(s for s in env if not s.is_class)  # a class body encloses no method
            scope = _bound_in(body, _parameters(args))
            stack += [(n, (*inner, scope)) for n in body]
        elif isinstance(node, ast.ClassDef):
            stack += [(n, env) for n in (*node.decorator_list, *node.bases, *node.keywords)]
            scope = dataclasses.replace(_bound_in(node.body, set()), is_class=True)
            stack += [(n, (*env, scope)) for n in node.body]
        elif isinstance(node, _COMPREHENSIONS):
            first, *rest = node.generators
            stack.append((first.iter, env))
            targets = {
                n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)
            }
            scope = _Locals(frozenset(targets), {})
            elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            parts = [*elements, first.target, *first.ifs]
            for g in rest:
                parts += [g.target, g.iter, *g.ifs]
            stack += [(n, (*env, scope)) for n in parts]
        elif isinstance(node, ast.Attribute):
            attrs, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                attrs.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                _found(found, value, attrs[::-1], env)
            else:
                stack.append((value, env))
        elif isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Store):  # what a statement binds is no reference
                _found(found, node, [], env)
        else:
            stack += [(n, env) for n in ast.iter_child_nodes(node)]
    return [(name, attrs, imported) for _, name, attrs, imported in sorted(found, key=_first)]


def _first(item: tuple) -> tuple[int, int]:
    return item[0]


def _found(found: list, name: ast.Name, attrs: list[str], env: tuple[_Locals, ...]) -> None:
    for scope in reversed(env):
        if name.id in scope.names:
            imported = scope.imports.get(name.id)
            if imported is not None:
                found.append((_position(name), name.id, attrs, imported))
            return  # a local of the function (or class body): not the module's
    found.append((_position(name), name.id, attrs, None))


def _parameters(args: ast.arguments) -> set[str]:
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    return {a.arg for a in every}


def _bound_in(body: list[ast.AST], names: set[str]) -> _Locals:
    """The names a function body (or class body) binds, nested functions' own bodies left
    out; `global` and `nonlocal` names are not its own."""
    names = set(names)
    imports: dict[str, ast.AST] = {}
    declared: set[str] = set()
    todo = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Lambda, *_COMPREHENSIONS)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    bound = alias.asname or alias.name.partition(".")[0]
                    names.add(bound)
                    imports[bound] = node
            continue
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        todo.extend(ast.iter_child_nodes(node))
    names -= declared
    return _Locals(frozenset(names), {k: v for k, v in imports.items() if k in names})


def _position(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)


def _resolved(node: ast.ImportFrom, package: str) -> str | None:
    try:
        return importlib.util.resolve_name("." * node.level + (node.module or ""), package)
    except (ImportError, ValueError):  # a relative import beyond the top package
        return None


def _statement_at(statements: list[ast.stmt], line: int) -> int | None:
    """The top-level statement spanning `line` (a decorator's line included)."""
    for i, stmt in enumerate(statements):
        decorators = getattr(stmt, "decorator_list", [])
        first = min([stmt.lineno, *(d.lineno for d in decorators)])
        if first <= line <= (stmt.end_lineno or stmt.lineno):
            return i
    return None


def _statement_code(module: _Module, index: int) -> str:
    if index not in module.code:
        stmt = module.statements[index]
        try:
            module.code[index] = _dump(stmt)
        except RecursionError:  # nested deeper than _dump recurses (compile() goes further)
            module.code[index] = ast.get_source_segment(module.source, stmt) or ""
    return module.code[index]


def _whole(module: _Module) -> str:
    try:
        return _dump(module.statements)
    except RecursionError:
        return module.source


def _partial_code(fn: functools.partial) -> str:
    """A partial's bound arguments, where they are plain values (others by their type)."""

    def plain(v: Any) -> str:
        if v is None or isinstance(v, (bool, int, float, str)):
            return repr(v)
        if isinstance(v, (tuple, list)):
            return "(" + ", ".join(map(plain, v)) + ")"
        return type(v).__qualname__

    keywords = ", ".join(f"{k}={plain(v)}" for k, v in sorted(fn.keywords.items()))
    return f"partial({', '.join(map(plain, fn.args))}; {keywords})"
