"""The tuned shapes nearest a call's, searched in memory: a kernel's entries on one device,
read once per process.

A call whose shape has no entry is served the config of the nearest tuned shape
(autotune.runtime.lookup). A fleet's database holds 100k entries of one kernel; reading and parsing
them all at every such call cost ~77 us an entry (7.7 s at 100k, inside model code, while jit
traces the call). A ShapeIndex holds them instead: their signatures, kernel versions and
configs, read in one query, the entries of the current kernel version grouped by their
arguments' dtypes and ranks, each group's dimensions as log2 in one array, so that a search is
one vectorised distance and a sort. The runtime keeps one per kernel, device and static
arguments (`cached`, in autotune.runtime.state) and compares it with the database's
`entries_state` before each search: another process's write (an entry added, replaced or
deleted) is read at the next search. A shipped table's entries are indexed the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import AutotuneError
from autotune.signature import ArgSpec, parse_args

# a dimension in a signature's text: the digits after "[" or "," (dtypes begin with a letter)
_DIM = re.compile(r"(?<=[\[,])[0-9]+")

Form = tuple[tuple[str, int], ...]  # each argument's dtype and rank


@dataclass
class _Group:
    """The entries of one form: signatures, configs (JSON text from a database, or decoded),
    and their dimensions as log2, one row each."""

    signatures: list[str] = field(default_factory=list)
    configs: list[Any] = field(default_factory=list)
    logs: Any = None  # numpy array (entries x dims)


@dataclass
class ShapeIndex:
    """Tuned entries of one kernel version, searchable by shape distance."""

    groups: dict[Form, _Group]
    stale: dict[str, str]  # signature -> the other kernel version it was tuned for
    state: Any = None  # the database's entries_state it was read at (None: a table's)

    @classmethod
    def of(cls, entries: Sequence[Sequence[Any]], version: str, state: Any = None) -> ShapeIndex:
        """The index of (signature, kernel version, config) `entries` for kernel `version`;
        the entries of other versions are kept as `stale`, a malformed signature left out.
        Built in a few passes over whole columns, not a Python step per entry where it can
        (100k entries: ~0.1 s)."""
        import numpy as np  # not at import: `import autotune` loads no numpy

        signatures = [e[0] for e in entries]
        versions = [e[1] for e in entries]
        configs = [e[2] for e in entries]
        forms = _DIM.sub("#", "\n".join(signatures)).split("\n")
        if len(forms) != len(signatures):  # a signature holding a line break: one at a time
            forms = [_DIM.sub("#", signature) for signature in signatures]
        stale: dict[str, str] = {}
        by_form: dict[str, list[int]] = {}
        if set(versions) <= {version} and len(set(forms)) <= 1:  # the usual case: one group
            by_form = {forms[0]: list(range(len(forms)))} if forms else {}
        else:
            for i, (form, kernel_version) in enumerate(zip(forms, versions)):
                if kernel_version != version:
                    stale.setdefault(signatures[i], kernel_version)
                else:
                    by_form.setdefault(form, []).append(i)
        groups: dict[Form, _Group] = {}
        for members in by_form.values():
            try:  # one parse stands for the group: its members differ only in their digits
                form = _form(parse_args(signatures[members[0]]))
            except AutotuneError:
                continue
            group_signatures = [signatures[i] for i in members]
            dims = np.array(_DIM.findall("\n".join(group_signatures)), dtype=np.float64)
            n_dims = sum(rank for _, rank in form)
            logs = np.log2(np.maximum(dims, 1)).reshape(len(members), n_dims)
            into = groups.setdefault(form, _Group())
            into.signatures += group_signatures
            into.configs += [configs[i] for i in members]
            into.logs = logs if into.logs is None else np.concatenate([into.logs, logs])
        return cls(groups, stale, state)

    def nearest(self, args: tuple[ArgSpec, ...]) -> Iterator[tuple[float, str, Any]]:
        """(distance, signature, config) of the entries comparable to `args` (the same dtypes
        and ranks), nearest first, ties by signature; `signature.shape_distance` rounded to
        1e-9, so hosts whose libm differs in the last bit still agree."""
        import numpy as np

        group = self.groups.get(_form(args))
        if group is None:
            return
        query = np.log2(np.maximum([d for a in args for d in a.shape], 1))
        distance = np.round(np.abs(group.logs - query).sum(axis=1), 9)
        order = np.argsort(distance, kind="stable")
        start = 0
        while start < len(order):
            d = distance[order[start]]
            end = start + 1
            while end < len(order) and distance[order[end]] == d:
                end += 1
            for i in sorted(order[start:end], key=lambda i: group.signatures[i]):
                yield float(d), group.signatures[i], _decoded(group.configs[i])
            start = end


def _decoded(config: Any) -> Any:
    """A config as served: a database's JSON text decoded (never executed), a table's as is."""
    if not isinstance(config, str):
        return config
    from autotune.db.schema import decode_config  # a database is open: SQLAlchemy is loaded

    return decode_config(config)


def _form(args: tuple[ArgSpec, ...]) -> Form:
    return tuple((a.dtype, len(a.shape)) for a in args)


def cached(
    cache: dict[tuple, ShapeIndex],
    db: Any,
    filters: Mapping[str, Any],
    version: str,
) -> ShapeIndex:
    """The index of `db`'s entries under `filters` (every key column but the signature and
    kernel version), for kernel `version`: `cache`'s, unless the database changed since it
    was read (`entries_state`), then read again."""
    key = (tuple(sorted(filters.items())), version)
    index = cache.get(key)
    if index is None or index.state != db.entries_state(**filters):
        state, rows = db.entry_shapes(**filters)
        index = cache[key] = ShapeIndex.of(rows, version, state)
    return index
