"""Transfer: what other device kinds measured of the same kernel, given to a search.

A device's time relative to its own optimum says which configurations are fast there. Devices
differ (an AMD GPU from an NVIDIA one, a small chip from a large one), but rarely entirely: the
same tiles that waste shared memory, the same loop orders that spill, are slow everywhere. The
search gets, for each other device, its measured configurations and times (`OtherDevice`, plain
data: the tuning layer reads them from the database, `replay` from recorded landscapes), and
uses them in two ways:

- `leads`: the configurations best on the others on average (each device's log time relative to
  its own fastest), measured first;
- `Prior`: the others' relative log times as the prior mean of the `gp` model, each device
  weighted by how well its order of the configurations measured here agrees with this device's,
  and the whole scaled by a slope fitted to this device's timings with a prior of 1 (the devices
  alike). Where the others disagree with what this device measured, the weights fall and the
  model becomes the cold one (autotune.search.samplers.gp).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.trial import config_id

# Configurations measured first, ranked by the others' mean relative log time. 4 is the cold
# search's start-up count (strategies.STARTUP_TRIALS): the model starts from as many timings.
LEADS = 4


@dataclass(frozen=True)
class OtherDevice:
    """What one other device kind measured: (config, time; None where it failed) pairs."""

    device: str
    trials: tuple[tuple[Mapping[str, Any], float | None], ...]

    def relative(self) -> dict[tuple, float]:
        """Each measured configuration's log time above the device's fastest (failed ones: the
        slowest's), by config_id; {} where nothing ran."""
        ok = [(c, t) for c, t in self.trials if t is not None and t > 0]
        if not ok:
            return {}
        logs = np.log([t for _, t in ok])
        rel = compress(logs - logs.min())
        out = {config_id(c): float(r) for (c, _), r in zip(ok, rel)}
        worst = float(rel.max())
        for c, _ in self.trials:
            out.setdefault(config_id(c), worst)
        return out


def compress(r: np.ndarray) -> np.ndarray:
    """Relative log times with their slow half compressed as the `gp` model compresses its own
    targets (samplers.gp.compress_slow), so that the others' prior and this device's timings
    are on one scale."""
    m = float(np.median(r))
    return np.where(r > m, m + np.log1p(np.maximum(r - m, 0.0)), r)


def leads(
    others: Sequence[OtherDevice], valid: Any, n: int = LEADS
) -> list[tuple[dict[str, Any], list[str]]]:
    """The `n` valid configurations with the lowest mean relative log time over the devices
    that measured them (a configuration measured by more devices first where the means tie),
    each with the devices whose results rank it. `valid` is a callable admitting a config."""
    rel = [(o.device, o.relative()) for o in others]
    configs: dict[tuple, Mapping[str, Any]] = {}
    for o in others:
        for c, t in o.trials:
            if t is not None:
                configs.setdefault(config_id(c), c)
    scored = []
    for cid, c in configs.items():
        known = [(d, r[cid]) for d, r in rel if cid in r]
        scored.append((float(np.mean([v for _, v in known])), -len(known), cid, c, known))
    scored.sort(key=lambda s: s[:3])
    out: list[tuple[dict[str, Any], list[str]]] = []
    for _, _, _, c, known in scored:
        if valid(c):
            out.append((dict(c), [d for d, _ in known]))
            if len(out) == n:
                break
    return out


class Prior:
    """The others' relative log times at positions of a valid set, and their weighted mean as a
    prior mean for this device's (compressed) log times. A position another device did not
    measure takes that device's median."""

    def __init__(self, others: Sequence[OtherDevice], valid: Any) -> None:
        self.devices = [o.device for o in others]
        self._rel = []
        known: dict[tuple, None] = {}
        for o in others:
            by_pos = {}
            for cid, r in o.relative().items():
                pos = valid.position({k: v for k, _, v in cid})
                if pos is not None:
                    by_pos[pos] = r
                    known.setdefault(pos)
            self._rel.append(by_pos)
        # the valid positions some other device measured, and their values: the candidates the
        # prior can point to
        rows = [p for p in known if valid.is_valid(p)]
        self.known = np.array(rows, dtype=np.int64).reshape(len(rows), len(valid.sizes))
        self.known_values = self.matrix(self.known)

    def matrix(self, pos: np.ndarray) -> np.ndarray:
        """(len(pos), devices): each device's relative log time at each position (the median of
        its measured ones where it has none there)."""
        out = np.empty((len(pos), len(self._rel)))
        keys = list(map(tuple, np.asarray(pos).tolist()))
        for j, by_pos in enumerate(self._rel):
            fill = float(np.median(list(by_pos.values()))) if by_pos else 0.0
            out[:, j] = [by_pos.get(k, fill) for k in keys]
        return out

    def weights(self, ok_pos: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Per-device weights from this device's timings `y` at `ok_pos`: each device's
        agreement with them (see `agreement`), negative agreement counted as none."""
        r = self.matrix(ok_pos)
        return np.array([max(agreement(r[:, j], y), 0.0) for j in range(r.shape[1])])


# Agreement before evidence: the prior count of concordant pairs, in units of pair weight (the
# others' relative log-time difference), and the agreement it stands for.
PRIOR_PAIRS = 1.0
PRIOR_AGREEMENT = 0.5


def agreement(r: np.ndarray, y: np.ndarray) -> float:
    """How well the order `r` (another device's relative log times) predicts the order `y`
    (this device's) of the same configurations: Kendall's tau over pairs, each pair weighted by
    how far apart `r` puts it, so that pairs the other device barely separates (near ties, as
    among its best configurations) say little; shrunk towards PRIOR_AGREEMENT by PRIOR_PAIRS."""
    dr = r[:, None] - r[None, :]
    dy = y[:, None] - y[None, :]
    upper = np.triu(np.ones_like(dr, dtype=bool), 1)
    w = np.abs(dr)[upper]
    s = np.sign(dr[upper] * dy[upper])
    return float((w @ s + PRIOR_PAIRS * PRIOR_AGREEMENT) / (w.sum() + PRIOR_PAIRS))


# The slope of this device's log times on the others' prior mean, before evidence: 1 (the
# devices alike), with this standard deviation.
SLOPE_PRIOR_SD = 0.5


def slope(m: np.ndarray, y: np.ndarray) -> float:
    """The slope of `y` (this device's compressed log times) on `m` (the others' weighted
    relative ones at the same configurations): a Bayesian linear regression with an intercept,
    the slope's prior N(1, SLOPE_PRIOR_SD^2), the noise the residual variance of the least-
    squares fit; at least 0 (a device that runs the others' fast configurations slowly gets no
    prior, not an inverted one)."""
    dm, dy = m - m.mean(), y - y.mean()
    sxx, sxy = float(dm @ dm), float(dm @ dy)
    if sxx <= 1e-12:
        return 1.0
    b_ls = sxy / sxx
    noise = max(float(((dy - b_ls * dm) ** 2).mean()), 1e-4)
    b = (sxy / noise + 1.0 / SLOPE_PRIOR_SD**2) / (sxx / noise + 1.0 / SLOPE_PRIOR_SD**2)
    return max(b, 0.0)
