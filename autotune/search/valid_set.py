"""The valid configurations a search chooses from: a given list, or drawn from the space.

A configuration is held as its positions: per parameter, the index of its value among the
parameter's candidates. Model inputs are computed from positions in bulk, so that scoring
thousands of candidates builds no dict per candidate.

A listed set holds the valid configurations given (a recorded landscape, or a space small
enough to enumerate with its constraints). A drawn set never enumerates: it draws random points
of the grid and keeps those the constraints admit, so a space of 10^6 or more configurations
costs what the search looks at, not what it holds.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Any

import numpy as np

from autotune.signature import Signature
from autotune.space import Param, Space

Position = tuple[int, ...]
# A drawn set gives up on a request after DRAWS_PER_WANTED batches of grid points, each as many
# as asked for (at least 64): a space whose constraints admit fewer than 1 point in 20 is
# searched from fewer candidates.
DRAWS_PER_WANTED = 20
CHECKS_KEPT = 100_000  # constraint results a drawn set remembers


class ValidSet:
    """Positions, model inputs and validity of a space's configurations (see the subclasses)."""

    count: int | None  # how many valid configurations there are, where known

    def __init__(self, space: Space) -> None:
        self.space = space
        self.sizes = np.array([len(p.values) for p in space.params], dtype=np.int64)
        self._where = [{(type(v), v): i for i, v in enumerate(p.values)} for p in space.params]
        self._ordered = [p.ordered for p in space.params]
        self._late = [
            (j, np.array([float(_power_of_two(v)) for v in p.values]))
            for j, p in enumerate(space.params)
            if _mixes(p)
        ]

    def position(self, config: Mapping[str, Any]) -> Position | None:
        """The positions of a config's values; None where a value is not a candidate."""
        try:
            return tuple(
                w[type(config[p.name]), config[p.name]]
                for w, p in zip(self._where, self.space.params)
            )
        except (KeyError, TypeError):
            return None

    def config(self, pos: Sequence[int]) -> dict[str, Any]:
        return {p.name: p.values[int(i)] for p, i in zip(self.space.params, pos)}

    def from_params(self, params: Mapping[str, Any]) -> Position | None:
        """The positions of a trial's Optuna parameters (ordered ones are positions already)."""
        config = {}
        for p, ordered in zip(self.space.params, self._ordered):
            v = params.get(p.name)
            if ordered:
                if not isinstance(v, int) or not 0 <= v < len(p.values):
                    return None
                v = p.values[v]
            config[p.name] = v
        return self.position(config)

    def to_params(self, pos: Sequence[int]) -> dict[str, Any]:
        """Optuna parameters of a configuration: ordered ones by position, others by value."""
        return {
            p.name: int(i) if ordered else p.values[int(i)]
            for p, ordered, i in zip(self.space.params, self._ordered, pos)
        }

    def features(self, pos: np.ndarray) -> np.ndarray:
        """Model inputs of rows of positions: ordered parameters at their unit-cube position;
        categories one-hot, scaled so that any two categories are as far apart as the ends of an
        ordered range."""
        cols = []
        for j, n in enumerate(self.sizes):
            if self._ordered[j]:
                cols.append((pos[:, j] / max(int(n) - 1, 1))[:, None])
            else:
                cols.append((pos[:, j, None] == np.arange(n)) / np.sqrt(2))
        return np.hstack(cols) if cols else np.zeros((len(pos), 0))

    def late_features(self, pos: np.ndarray) -> np.ndarray:
        """1.0 where an integer parameter is a power of two, for each parameter whose candidates
        mix powers of two and other values (its rank position cannot say which is which)."""
        if not self._late:
            return np.zeros((len(pos), 0))
        return np.column_stack([table[pos[:, j]] for j, table in self._late])

    def coords(self, pos: np.ndarray) -> np.ndarray:
        """Position in the unit cube, every parameter as if ordered (for nearest neighbours)."""
        return pos / np.maximum(self.sizes - 1, 1)

    def neighbours(self, pos: Sequence[int]) -> np.ndarray:
        """Every point of the grid that differs from `pos` in one parameter."""
        base = np.asarray(pos, dtype=np.int64)
        out = []
        for j, n in enumerate(self.sizes):
            rows = np.repeat(base[None, :], n - 1, axis=0)
            rows[:, j] = np.delete(np.arange(n), base[j])
            out.append(rows)
        return np.vstack(out) if out else np.zeros((0, len(base)), dtype=np.int64)

    def admit(self, pos: np.ndarray, seen: Container[Position]) -> np.ndarray:
        """The rows of `pos` that are valid, not `seen` and not repeated, in order."""
        keep, taken = [], set()
        for i, row in enumerate(map(tuple, pos.tolist())):
            if row not in taken and row not in seen and self.is_valid(row):
                keep.append(i)
            taken.add(row)
        return pos[keep]

    def contains(self, config: Mapping[str, Any]) -> bool:
        pos = self.position(config)
        return pos is not None and self.is_valid(pos)

    def is_valid(self, pos: Position) -> bool:
        raise NotImplementedError

    def draw(self, rng: np.random.Generator, k: int, seen: Container[Position]) -> np.ndarray:
        """Up to `k` valid configurations not `seen`, at random, as rows of positions."""
        raise NotImplementedError

    def nearest_unseen(self, pos: Position, seen: Container[Position]) -> Position | None:
        """A valid configuration not `seen` near `pos` (L1 in the unit cube); None if none."""
        raise NotImplementedError


class ListedSet(ValidSet):
    """The valid configurations, listed."""

    def __init__(self, space: Space, configs: Sequence[Mapping[str, Any]]) -> None:
        super().__init__(space)
        self.configs = list(configs)
        self.count = len(self.configs)
        self.rows = np.array([self.position(c) for c in self.configs], dtype=np.int64).reshape(
            self.count, len(space.params)
        )
        self.index = {row: i for i, row in enumerate(map(tuple, self.rows.tolist()))}
        self._coords = self.coords(self.rows)

    def is_valid(self, pos: Position) -> bool:
        return pos in self.index

    def unseen_rows(self, seen: Container[Position]) -> np.ndarray:
        """The indices of the configurations not `seen`, in list order."""
        mask = np.ones(self.count, dtype=bool)
        for row in seen:
            i = self.index.get(row)
            if i is not None:
                mask[i] = False
        return np.flatnonzero(mask)

    def draw(self, rng: np.random.Generator, k: int, seen: Container[Position]) -> np.ndarray:
        unseen = self.unseen_rows(seen)
        if len(unseen) > k:
            unseen = np.sort(rng.choice(unseen, k, replace=False))
        return self.rows[unseen]

    def nearest_unseen(self, pos: Position, seen: Container[Position]) -> Position | None:
        unseen = self.unseen_rows(seen)
        if not len(unseen):
            return None
        d = np.abs(self._coords[unseen] - self.coords(np.array([pos]))).sum(axis=1)
        return tuple(self.rows[unseen[int(np.argmin(d))]].tolist())  # the first of equals


class DrawnSet(ValidSet):
    """The valid configurations of a space for one call, found by drawing points of the grid
    and checking the space's constraints, never by listing them."""

    def __init__(self, space: Space, sig: Signature) -> None:
        super().__init__(space)
        self.sig = sig
        self.count = None
        self._checked: dict[Position, bool] = {}  # the neighbours of the best come up again

    def is_valid(self, pos: Position) -> bool:
        known = self._checked.get(pos)
        if known is None:
            if len(self._checked) >= CHECKS_KEPT:
                self._checked.clear()
            known = self._checked[pos] = self.space.is_valid(self.config(pos), self.sig)
        return known

    def draw(self, rng: np.random.Generator, k: int, seen: Container[Position]) -> np.ndarray:
        found = np.zeros((0, len(self.sizes)), dtype=np.int64)
        taken: set[Position] = set()
        for _ in range(DRAWS_PER_WANTED):
            if len(found) >= k:
                break
            batch = rng.integers(0, self.sizes, size=(max(k, 64), len(self.sizes)))
            new = self.admit(batch, _Either(seen, taken))
            taken.update(map(tuple, new.tolist()))
            found = np.vstack([found, new])
        return found[:k]

    def nearest_unseen(self, pos: Position, seen: Container[Position]) -> Position | None:
        # its neighbours first, then a random sample: near, if not always the nearest
        rng = np.random.default_rng(list(pos))
        near = np.vstack([self.admit(self.neighbours(pos), seen), self.draw(rng, 256, seen)])
        if not len(near):
            return None
        d = np.abs(self.coords(near) - self.coords(np.array([pos]))).sum(axis=1)
        return tuple(near[int(np.argmin(d))].tolist())


class _Either:
    """Membership in either of two containers."""

    def __init__(self, a: Container, b: Container) -> None:
        self.a, self.b = a, b

    def __contains__(self, item: object) -> bool:
        return item in self.a or item in self.b


def _power_of_two(v: Any) -> bool:
    return v > 0 and v & (v - 1) == 0


def _mixes(p: Param) -> bool:
    """Whether an integer parameter has powers of two and other values among its candidates."""
    ints = p.ordered and all(isinstance(v, int) for v in p.values)  # ordered: no bools
    return ints and len({_power_of_two(v) for v in p.values}) == 2
