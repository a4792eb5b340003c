"""Group sizes that look like a mixture-of-experts layer's: how many of the m rows (tokens)
each of the groups (experts) takes, summing to at most m. A grouped matmul's speed depends on
them (a tile that straddles two groups is visited twice), and random integers are no group
sizes at all: the tuner makes them with one of these (KernelOptions.workloads)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# the skewed workload's share of the rows routed (the rest dropped, as a capacity factor does)
SKEWED_ROUTED = 0.875
SKEW = 1.5  # Zipf exponent of the experts' popularity


def balanced(m: int, groups: int, rng: np.random.Generator) -> np.ndarray:
    """Every group the same rows (the first m % groups one more): all m rows routed."""
    del rng
    sizes = np.full(groups, m // groups, np.int32)
    sizes[: m % groups] += 1
    return sizes


def skewed(m: int, groups: int, rng: np.random.Generator) -> np.ndarray:
    """A few popular groups take most rows, some none (Zipf-like popularity in a random order);
    7/8 of the rows routed."""
    weights = 1.0 / np.arange(1, groups + 1) ** SKEW
    rng.shuffle(weights)
    routed = int(m * SKEWED_ROUTED)
    sizes = np.floor(weights / weights.sum() * routed).astype(np.int32)
    sizes[np.argmax(weights)] += routed - int(sizes.sum())
    return sizes


def group_size_workloads(
    rows: Callable[[Sequence[Any]], int], index: int
) -> dict[str, Callable[[Sequence[Any], np.random.Generator], dict[int, np.ndarray]]]:
    """The workloads of a kernel whose argument `index` holds the group sizes ([groups] int32)
    of `rows(args)` rows."""

    def maker(sizes: Callable) -> Callable:
        def make(args: Sequence[Any], rng: np.random.Generator) -> dict[int, np.ndarray]:
            return {index: sizes(rows(args), args[index].shape[0], rng)}

        return make

    return {"balanced": maker(balanced), "skewed": maker(skewed)}
