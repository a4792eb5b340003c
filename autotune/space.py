"""Search spaces: tunable parameters, their candidate values per platform, and constraints.

A space file ``search_spaces/<kernel>.toml`` has a ``[common]`` section and optional ``[cpu]``,
``[tpu]`` and ``[gpu]`` sections; a platform section overrides (or adds to) the common one::

    [common]
    block_m = [32, 64, 128]                                 # explicit values
    block_n = { kind = "pow2", min = 32, max = 256 }        # powers of two, inclusive
    block_k = { kind = "range", start = 32, stop = 128, step = 32 }  # inclusive stop
    unroll  = { kind = "bool" }

Constraints are Python callables ``constraint(config, sig) -> bool`` in the kernel's module:
the files are data, never code.
"""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from autotune.backends.platforms import PLATFORMS
from autotune.errors import SpaceError
from autotune.signature import Signature

log = logging.getLogger(__name__)
# (constraint, exception type) pairs already reported: a constraint is asked once per config
_REPORTED: set[tuple[str, type]] = set()

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SECTIONS = ("common", *PLATFORMS)
MAX_CANDIDATES = 4096  # per parameter; a larger list is a typo, not a search space

Constraint = Callable[[dict[str, Any], Signature], bool]
Scalar = bool | int | float | str


@dataclass(frozen=True)
class Param:
    """One tunable parameter and its candidate values, in order."""

    name: str
    values: tuple[Scalar, ...]

    @property
    def ordered(self) -> bool:
        """Numeric parameters (block sizes, counts) are ordered; bools and strings are not."""
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.values)

    def admits(self, value: Any) -> bool:
        # type-exact: True == 1 in Python, but a bool is not a block size
        return any(type(value) is type(v) and value == v for v in self.values)


@dataclass(frozen=True)
class Space:
    """The candidates of one kernel on one platform, with its constraints. `fixed`: the values
    of parameters this platform does not tune, which constraints see beside the candidate's
    (a kernel's block sizes not tuned here, at their defaults)."""

    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...] = ()
    fixed: tuple[tuple[str, Any], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise SpaceError(f"unknown parameter {name!r}: the space has {', '.join(self.names)}")

    @property
    def size(self) -> int:
        n = 1
        for p in self.params:
            n *= len(p.values)
        return n

    def all_configs(self) -> Iterator[dict[str, Scalar]]:
        for values in itertools.product(*(p.values for p in self.params)):
            yield dict(zip(self.names, values))

    def violations(self, config: Mapping[str, Any], sig: Signature) -> list[str]:
        """Names of the constraints that `config` breaks for this call (empty: valid)."""
        broken = []
        for c in self.constraints:
            try:
                ok = bool(c({**dict(self.fixed), **config}, sig))
            except Exception as e:  # a constraint that raises rules the config out, loudly
                ok = False
                broken.append(f"{_name(c)} raised {type(e).__name__}: {e}")
                if (_name(c), type(e)) not in _REPORTED:  # once: it may be asked a million times
                    _REPORTED.add((_name(c), type(e)))
                    log.warning(
                        "constraint %s raised %s: %s (for %s at %s): the configurations it "
                        "raises for are ruled out; fix the constraint",
                        _name(c),
                        type(e).__name__,
                        e,
                        dict(config),
                        sig.text,
                    )
                continue
            if not ok:
                broken.append(_name(c))
        return broken

    def is_valid(self, config: Mapping[str, Any], sig: Signature) -> bool:
        return not self.violations(config, sig)

    def valid_configs(self, sig: Signature) -> list[dict[str, Scalar]]:
        return [c for c in self.all_configs() if self.is_valid(c, sig)]

    def check_stored(self, config: Any) -> str | None:
        """Why a stored config cannot be used with this space (None: it can).

        The database is data: a config read back is checked for shape, names, types and
        membership before it reaches a kernel.
        """
        if config is None:
            return "config is not valid JSON"
        if not isinstance(config, dict):
            return f"config is a JSON {type(config).__name__}, not an object"
        unknown = sorted(set(config) - set(self.names))
        if unknown:
            return f"unknown parameter(s) {', '.join(_short(u) for u in unknown)}"
        for p in self.params:
            if p.name not in config:
                return f"parameter {p.name!r} is missing"
            if not p.admits(config[p.name]):
                value = config[p.name]
                return (
                    f"{p.name}={_short(value)} ({type(value).__name__}) is not a candidate "
                    "of the current space"
                )
        return None


def _short(value: Any, limit: int = 60) -> str:
    """A repr fit for a one-line message, however large a tampered value is."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", repr(fn))


# ---------------------------------------------------------------------------- parsing


def parse_param(where: str, name: str, spec: Any) -> Param:
    """Turn one TOML entry into a Param; errors name `where` (file and section) and `name`."""

    def fail(problem: str) -> SpaceError:
        return SpaceError(f"{where} {name}: {problem}")

    if not isinstance(name, str) or not name.isidentifier():
        raise fail("a parameter name must be a Python identifier")
    if isinstance(spec, list):
        values = spec
    elif isinstance(spec, dict):
        kind = spec.get("kind")
        keys = set(spec) - {"kind"}
        if kind == "values":
            _expect_keys(fail, keys, {"values"})
            values = spec["values"]
            if not isinstance(values, list):
                raise fail("'values' must be a list")
        elif kind == "pow2":
            _expect_keys(fail, keys, {"min", "max"})
            lo, hi = _pos_int(fail, spec, "min"), _pos_int(fail, spec, "max")
            if lo & (lo - 1) or hi & (hi - 1):
                raise fail(f"'min' and 'max' must be powers of two, got {lo} and {hi}")
            if lo > hi:
                raise fail(f"'min' ({lo}) is larger than 'max' ({hi})")
            values = [1 << e for e in range(lo.bit_length() - 1, hi.bit_length())]
        elif kind == "range":
            _expect_keys(fail, keys, {"start", "stop"}, optional={"step"})
            start, stop = _int(fail, spec, "start"), _int(fail, spec, "stop")
            step = _pos_int(fail, spec, "step") if "step" in spec else 1
            if start > stop:
                raise fail(f"'start' ({start}) is larger than 'stop' ({stop})")
            if (stop - start) // step + 1 > MAX_CANDIDATES:
                raise fail(f"the range has more than {MAX_CANDIDATES} values: raise 'step'")
            values = list(range(start, stop + 1, step))
        elif kind == "bool":
            _expect_keys(fail, keys, set())
            values = [False, True]
        else:
            raise fail(
                f'unknown kind {kind!r}: use a list, or kind = "values", "pow2", "range" or "bool"'
            )
    else:
        raise fail(f"expected a list of values or a table with 'kind', got {type(spec).__name__}")

    if not values:
        raise fail("no candidate values")
    if len(values) > MAX_CANDIDATES:
        raise fail(f"more than {MAX_CANDIDATES} candidate values")
    for v in values:
        if not isinstance(v, (bool, int, float, str)):
            raise fail(f"candidate {v!r} is not a number, bool or string")
    if len({(type(v), v) for v in values}) != len(values):
        raise fail("candidate values repeat")
    kinds = {"number" if type(v) in (int, float) else type(v).__name__ for v in values}
    if len(kinds) > 1:
        raise fail(f"candidate values mix types ({', '.join(sorted(kinds))})")
    # numbers are kept sorted so that neighbours in the list are neighbours in value
    return Param(name, tuple(sorted(values)) if kinds == {"number"} else tuple(values))


def _expect_keys(
    fail: Callable[[str], SpaceError],
    keys: set,
    required: set,
    optional: frozenset | set = frozenset(),
) -> None:
    extra = keys - required - optional
    missing = required - keys
    if extra:
        raise fail(f"unexpected key(s) {', '.join(sorted(map(str, extra)))}")
    if missing:
        raise fail(f"missing key(s) {', '.join(sorted(missing))}")


def _int(fail: Callable[[str], SpaceError], spec: dict, key: str) -> int:
    v = spec.get(key)
    if type(v) is not int:
        raise fail(f"'{key}' must be an integer, got {v!r}")
    return v


def _pos_int(fail: Callable[[str], SpaceError], spec: dict, key: str) -> int:
    v = _int(fail, spec, key)
    if v <= 0:
        raise fail(f"'{key}' must be a positive integer, got {v}")
    return v


def parse_sections(where: str, doc: Any) -> dict[str, tuple[Param, ...]]:
    """Parse a whole space document into one parameter tuple per platform."""
    if not isinstance(doc, dict):
        raise SpaceError(f"{where}: expected a table of sections {', '.join(SECTIONS)}")
    unknown = sorted(set(doc) - set(SECTIONS))
    if unknown:
        raise SpaceError(
            f"{where}: unknown section(s) {', '.join(map(repr, unknown))}: use {', '.join(SECTIONS)}"
        )
    parsed: dict[str, dict[str, Param]] = {}
    for section in SECTIONS:
        body = doc.get(section, {})
        if not isinstance(body, dict):
            raise SpaceError(f"{where} [{section}]: expected a table of parameters")
        parsed[section] = {n: parse_param(f"{where} [{section}]", n, s) for n, s in body.items()}
    spaces = {}
    for platform in PLATFORMS:
        merged = {**parsed["common"], **parsed[platform]}
        if not merged:
            raise SpaceError(
                f"{where}: no parameters for platform {platform!r}: add a [common] section"
            )
        spaces[platform] = tuple(merged.values())
    return spaces


def load_space_file(path: Path) -> dict[str, tuple[Param, ...]]:
    """Read and parse a space file: its parameters, per platform."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpaceError(f"{path}: cannot read the search space ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise SpaceError(f"{path}: not UTF-8 text ({e.reason})") from e
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpaceError(f"{path}: not valid TOML: {e}") from e
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise SpaceError(f"{path}: not valid TOML: nested too deeply") from None
    return parse_sections(str(path), doc)


def resolve_space_path(name: str | Path, near: Path | None = None) -> Path:
    """Find a space file: an explicit path, a file beside the kernel's module, or a shipped one."""
    candidates = []
    p = Path(name)
    if p.suffix == ".toml":
        candidates += [p] if p.is_absolute() or near is None else [near / p, p]
    else:
        if near is not None:
            candidates.append(near / "search_spaces" / f"{name}.toml")
        candidates.append(Path(str(resources.files("autotune.search_spaces") / f"{name}.toml")))
    for c in candidates:
        if c.is_file():
            return c
    raise SpaceError(
        f"search space {str(name)!r} not found (looked in {', '.join(map(str, candidates))}): "
        "pass a dict of candidate lists, or create the file"
    )


def space_from_dict(where: str, spec: Mapping[str, Any]) -> dict[str, tuple[Param, ...]]:
    """A dict of candidate lists (the same for every platform), or a dict with platform sections."""
    if set(spec) and set(spec) <= set(SECTIONS):
        return parse_sections(where, dict(spec))
    return parse_sections(
        where,
        {"common": {k: list(v) if isinstance(v, (tuple, range)) else v for k, v in spec.items()}},
    )
