"""The Optuna search loop: it proposes configurations, an `evaluate` callback measures them.

Search never knows how a configuration is measured (a device, a worker, a recorded landscape),
only its objective value or that it failed. Only distinct, valid configurations cost budget:
a proposal that breaks a constraint, or repeats one already measured, is told to the sampler
without measuring and replaced by the nearest valid unmeasured configuration, so the loop
always progresses. An evaluation whose status is `duplicate` (a configuration that compiles to
a program measured already: autotune.tuning.kernel) costs none either: the budget counts distinct
programs, and the sampler is told the program's value under the duplicate's parameters; as
many duplicates in a row as the budget end the search (the space seems to hold no more
distinct programs, or none the sampler finds). A space too large to list is never listed (see
LISTED_UP_TO).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from autotune.errors import SpaceError
from autotune.search.strategies import DEFAULT_STRATEGY, SAMPLERS, STRATEGIES
from autotune.search.studies import SharedStudy
from autotune.search.valid_set import DRAWS_PER_WANTED, DrawnSet, ListedSet, Position, ValidSet
from autotune.signature import Signature
from autotune.space import Space
from autotune.trial import Evaluation, config_id

log = logging.getLogger(__name__)
# Queued configurations told to `upcoming` per trial: more than a measurer compiles ahead, and
# few enough that reading the queue stays cheap on a large grid.
LOOKAHEAD = 16
# A space of more grid points than this is never listed: its valid configurations are drawn at
# random as the search needs them (autotune.search.valid_set), and only `gp` and `random` search it.
# Listing costs a constraint check and a dict per grid point (about 1 s and 100 MB for 10^5).
LISTED_UP_TO = 100_000


class _Encoding:
    """Maps configs to Optuna parameters: ordered parameters by index into their sorted
    candidates (so the sampler sees neighbours as neighbours, and powers of two evenly spaced),
    others as categories."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.ordered = {p.name: p.ordered for p in space.params}
        self.positions = {
            p.name: {(type(v), v): i for i, v in enumerate(p.values)} for p in space.params
        }
        self.distributions: dict[str, BaseDistribution] = {}
        for p in space.params:
            if p.ordered:
                self.distributions[p.name] = IntDistribution(0, len(p.values) - 1)
            else:
                self.distributions[p.name] = CategoricalDistribution(list(p.values))

    def decode(self, params: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        for p in self.space.params:
            v = params[p.name]
            out[p.name] = p.values[v] if self.ordered[p.name] else v
        return out

    def _position(self, name: str, value: Any) -> int:
        return self.positions[name][type(value), value]

    def encode(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {
            p.name: (
                self._position(p.name, config[p.name]) if self.ordered[p.name] else config[p.name]
            )
            for p in self.space.params
        }


def make_sampler(
    strategy: str, seed: int | None, enc: _Encoding, valid: ValidSet
) -> optuna.samplers.BaseSampler:
    """The sampler of `strategy` (autotune.search.strategies.SAMPLERS) over the encoded space."""
    if strategy not in SAMPLERS:
        raise SpaceError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    return SAMPLERS[strategy](enc.distributions, valid, seed)


def run_search(
    space: Space,
    sig: Signature | None,
    evaluate: Callable[[dict[str, Any]], Evaluation],
    *,
    n_trials: int,
    strategy: str = DEFAULT_STRATEGY,
    seed: int | None = None,
    initial: Iterable[Mapping[str, Any]] = (),
    valid: list[dict[str, Any]] | None = None,
    time_limit_s: float | None = None,
    patience: int | None = None,
    noise: float = 0.01,
    storage: str | None = None,
    study_name: str | None = None,
    upcoming: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[Evaluation]:
    """Measure distinct valid configurations until a budget runs out; returns them in order.

    Budgets, whichever comes first: `n_trials` measurements (of distinct programs: duplicates
    are free, but `n_trials` of them in a row end the search), `time_limit_s` seconds of wall
    time, and `patience` measurements in a row that do not beat the best so far by more than
    `noise` (relative). When the valid space is no
    larger than `n_trials` it is searched exhaustively. `initial` configurations (warm starts, the default) are measured first;
    those outside the valid space are skipped. The budgets and the strategy come checked
    (autotune.tuning.settings.TuneSettings); an unknown strategy is refused by make_sampler.

    `valid` lists the valid configurations; without it they are those of `space` that `sig`
    admits, listed when the space has at most LISTED_UP_TO configurations and otherwise drawn
    at random as the search needs them (then only `gp` and `random` can search it, and the
    replacement of a proposal is a near valid one, not always the nearest).

    With `storage` (an Optuna RDB URL) the study `study_name` is created or resumed there:
    configurations it already measured are not measured again and count against `n_trials`,
    which is then the budget of the whole study, shared by every worker that joins it. The
    result then holds every measured trial of the study, each with its record as stored.

    `upcoming`, where given, is called before each `evaluate` with the configurations queued to
    be measured after it, in order (see `_queued`), so that a measurer can compile them
    meanwhile. A model-based sampler's proposals are not known before they are asked for, so
    they are never among them; nor does the call change what is measured, or in what order.
    """
    vset = _valid_set(space, sig, valid, strategy, seed)
    budget = n_trials if vset.count is None else min(n_trials, vset.count)
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    enc = _Encoding(space)
    sampler = make_sampler(strategy, seed, enc, vset)
    seen: set[Position] = set()  # valid configurations measured or being measured

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shared = SharedStudy(storage, study_name, sampler) if storage else None
    if shared:
        shared.join()
    study = shared.study if shared else optuna.create_study(direction="minimize", sampler=sampler)
    _queue_first(study, enc, vset, initial, strategy, n_trials, seed, shared is not None)

    results: list[Evaluation] = []
    measured: dict[tuple, Evaluation] = {}
    claimed: set[tuple] = set()  # configs other live workers are measuring now
    best = np.inf
    since_best = 0
    repeats = 0  # duplicates in a row: `n_trials` of them end the search (see programs_note)
    try:
        while True:
            if shared:
                measured, claimed = shared.refresh(enc)
                # rebuilt each time: a dead worker's released claim is unmeasured again
                seen = set()
                for cid in (*measured, *claimed):
                    pos = vset.position(dict((k, v) for k, _, v in cid))
                    if pos is not None and vset.is_valid(pos):
                        seen.add(pos)
            if _distinct(measured) + len(claimed) >= budget or len(seen) == vset.count:
                if not claimed:
                    _note_programs(results, vset, n_trials)
                    break
                # the budget is spent once the claims are measured; a claim released instead (its
                # worker died) leaves budget that this worker spends
                time.sleep(0.5)
                continue
            if deadline is not None and time.monotonic() >= deadline:
                log.info("search: wall-time limit of %.0f s reached", time_limit_s)
                break
            if repeats >= n_trials:
                _note_programs(results, vset, n_trials)
                break
            if patience is not None and since_best >= patience:
                log.info("search: no improvement beyond %.1f%% in %d trials", noise * 100, patience)
                break
            trial = study.ask(enc.distributions)
            config = enc.decode(trial.params)
            cid = config_id(config)
            pos = vset.position(config)
            admitted = pos is not None and vset.is_valid(pos)
            fresh = admitted and cid not in measured and cid not in claimed
            if (
                shared
                and fresh
                and (shared.taken(trial, cid, enc) or _over(shared, enc, budget, trial))
            ):
                # another worker claimed it at the same moment, or measured it since our refresh;
                # neither measures twice (see taken). Or others asked for what was left of the
                # budget before us (see _over). Queue it again after a
                # random pause, so two workers that both gave it up fall out of step (the one
                # that finds the other measuring it, or done, moves on).
                study.tell(trial, state=TrialState.FAIL)
                time.sleep(random.uniform(0.0, 0.5))
                study.enqueue_trial(enc.encode(config))
                continue
            if not fresh:
                # invalid: a bad region for the sampler (pruned: no timing); a repeat: already
                # known, not new evidence (failed: samplers ignore it)
                study.tell(trial, state=TrialState.FAIL if admitted else TrialState.PRUNED)
                near = None if pos is None else vset.nearest_unseen(pos, seen)
                if near is None:
                    log.info("search: no unmeasured valid configuration found near a proposal")
                    break
                study.enqueue_trial(enc.encode(vset.config(near)))
                continue
            if upcoming is not None:
                upcoming(_queued(study, enc, vset, {cid}, measured, claimed))
            ev = None
            try:
                with shared.heartbeat(trial) if shared else contextlib.nullcontext():
                    ev = evaluate(config)
                _tell(study, trial, ev, shared)
            except BaseException as e:
                # interrupted (KeyboardInterrupt, SystemExit): a measurement that was stored is
                # told to the study, so that it counts against the budget; otherwise the claim is
                # released at once (this process lives on, so no one else would release it)
                ev = ev or getattr(e, "evaluation", None)
                if trial.number not in _told(study):
                    _tell(study, trial, ev, shared)
                raise
            seen.add(pos)
            measured[cid] = ev
            results.append(ev)
            repeats = repeats + 1 if ev.status == "duplicate" else 0
            if repeats:  # nothing measured: no evidence for or against progress
                continue
            if ev.value is None:
                since_best += 1
            else:
                since_best = (
                    0 if ev.value < best * (1 - noise) or best == np.inf else since_best + 1
                )
                best = min(best, ev.value)
        return _every_workers(shared, enc, budget) if shared else results
    except BaseException:
        if shared:  # an interrupted or failed worker no longer searches the study
            with contextlib.suppress(Exception):  # the cause is what is reported, not this
                shared.leave()
        raise


def _over(shared: SharedStudy, enc: _Encoding, budget: int, trial: optuna.Trial) -> bool:
    """Whether the study's distinct programs measured, with the running trials asked for
    before `trial` and `trial` itself, are more than `budget`. Looked at once our claim is in:
    of two workers on the budget's last trial, the later to ask gives it up whichever looks
    first (the earlier's trial, asked for, is running already), and the default, asked for
    first, is kept."""
    measured, _ = shared.refresh(enc)
    return _distinct(measured) + shared.running_before(trial) + 1 > budget


def _distinct(measured: Mapping[tuple, Evaluation]) -> int:
    """How many distinct programs the evaluations measured: the budget's count."""
    return sum(ev.status != "duplicate" for ev in measured.values())


def programs_note(statuses: Sequence[str], n_valid: int | None, n_trials: int) -> str:
    """Why a search of `n_trials` ended with fewer distinct programs measured, where duplicates
    (configurations compiling to a program measured already) are why; "" where they are not.
    `statuses`: its evaluations' in order, one per configuration tried."""
    distinct = sum(s != "duplicate" for s in statuses)
    if distinct >= n_trials or distinct == len(statuses):
        return ""
    if n_valid is not None and len(statuses) >= n_valid:
        return (
            f"the {n_valid} valid configurations compile to {distinct} distinct programs, "
            "every one measured"
        )
    if len(statuses) >= n_trials and all(s == "duplicate" for s in statuses[-n_trials:]):
        return (
            f"the last {n_trials} configurations tried compiled to programs measured already: "
            f"{distinct} distinct programs found"
        )
    return ""


def _note_programs(results: Sequence[Evaluation], vset: ValidSet, n_trials: int) -> None:
    note = programs_note([ev.status for ev in results], vset.count, n_trials)
    if note:
        log.info("search: %s", note)


def _valid_set(
    space: Space,
    sig: Signature | None,
    valid: list[dict[str, Any]] | None,
    strategy: str,
    seed: int | None,
) -> ValidSet:
    """The valid configurations `run_search` searches: `valid` listed, else those of `space`
    that `sig` admits, listed up to LISTED_UP_TO and drawn beyond; refused where none is."""
    where = f" fits {sig.text} on {sig.platform}" if sig is not None else " is valid"
    if valid is None and sig is None:
        raise SpaceError("run_search needs a signature or the list of valid configurations")
    if valid is None and space.size > LISTED_UP_TO:
        drawn = DrawnSet(space, sig)
        if strategy in ("grid", "tpe"):
            raise SpaceError(
                f"strategy {strategy!r} needs every valid configuration listed, and the space has "
                f"{space.size:,} (more than {LISTED_UP_TO:,}): use 'gp' or 'random'"
            )
        if not len(drawn.draw(np.random.default_rng(seed), 1, set())):
            raise SpaceError(
                f"no configuration of the space{where} among {DRAWS_PER_WANTED * 64} drawn at "
                f"random from its {space.size:,}: check its constraints"
            )
        return drawn
    valid = space.valid_configs(sig) if valid is None else valid
    if not valid:
        raise SpaceError(f"no configuration of the space{where}")
    return ListedSet(space, valid)


def _queue_first(
    study: optuna.Study,
    enc: _Encoding,
    vset: ValidSet,
    initial: Iterable[Mapping[str, Any]],
    strategy: str,
    n_trials: int,
    seed: int | None,
    shared: bool,
) -> None:
    """Queue what is measured first: the `initial` configurations that are valid, then, for a
    grid or a listed space no larger than the budget, every valid one."""
    first = [dict(c) for c in initial if vset.contains(c)]
    if isinstance(vset, ListedSet) and (strategy == "grid" or vset.count <= n_trials):
        order = list(vset.configs)
        if strategy != "grid":  # exhaustive anyway; a seeded order finds good ones early on average
            random.Random(seed).shuffle(order)
        first += order
    # workers joining a shared study do not queue again what is queued, claimed or measured;
    # a config whose trial failed unmeasured (its worker was killed) is queued again
    queued = _in_study(study, enc) if shared else set()
    for c in first:
        if config_id(c) not in queued:
            queued.add(config_id(c))
            study.enqueue_trial(enc.encode(c))


def _in_study(study: optuna.Study, enc: _Encoding) -> set[tuple]:
    """The configs of a study's trials that are queued, being measured, or measured."""
    states = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)
    out = set()
    for t in study.get_trials(deepcopy=False, states=states):
        params = t.system_attrs.get("fixed_params", t.params)
        finished = t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        if params.keys() == enc.distributions.keys() and not (
            finished and "status" not in t.user_attrs
        ):
            out.add(config_id(enc.decode(params)))
    return out


def _tell(
    study: optuna.Study, trial: optuna.Trial, ev: Evaluation | None, shared: SharedStudy | None
) -> None:
    """Finish a trial with its evaluation (None: it was not measured)."""
    if ev is None:
        study.tell(trial, state=TrialState.FAIL)
        return
    if shared:
        shared.keep(trial, ev)
    if ev.value is None:
        # failures teach "not here" without a fake timing: TPE puts pruned trials among the
        # bad ones, and no sampler fits a value to them
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, ev.value)


def _told(study: optuna.Study) -> set[int]:
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return {t.number for t in study.get_trials(deepcopy=False, states=states)}


def _every_workers(shared: SharedStudy, enc: _Encoding, budget: int) -> list[Evaluation]:
    """Every worker's measurements of a shared study, once those still running are in."""
    measured, claimed = shared.refresh(enc)
    while claimed:
        time.sleep(0.5)
        measured, claimed = shared.refresh(enc)
    if _distinct(measured) >= budget:  # spent for every worker (a time limit is this one's own)
        shared.close_queue()
    shared.leave()
    return list(measured.values())


def _queued(
    study: optuna.Study, enc: _Encoding, vset: ValidSet, *taken: Container[tuple]
) -> list[dict[str, Any]]:
    """The first LOOKAHEAD configurations waiting in the study's queue, in the order `ask` takes
    them (initial ones, the exhaustive or grid order, replacements), less those invalid,
    repeated or `taken` (measured or being measured)."""
    out: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        config = enc.decode(t.system_attrs["fixed_params"])  # enqueued, not yet asked
        cid = config_id(config)
        if cid not in seen and not any(cid in ids for ids in taken) and vset.contains(config):
            seen.add(cid)
            out.append(config)
            if len(out) == LOOKAHEAD:
                break
    return out
