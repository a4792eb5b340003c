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
from autotune.search.transfer import OtherDevice, Prior
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
    strategy: str,
    seed: int | None,
    enc: _Encoding,
    valid: ValidSet,
    others: Sequence[OtherDevice] = (),
) -> optuna.samplers.BaseSampler:
    """The sampler of `strategy` (autotune.search.strategies.SAMPLERS) over the encoded space,
    told `others`' results where it models them."""
    if strategy not in SAMPLERS:
        raise SpaceError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    prior = Prior(others, valid) if others and strategy == "gp" else None
    return SAMPLERS[strategy](enc.distributions, valid, seed, prior)


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
    others: Sequence[OtherDevice] = (),
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

    `others`: what other device kinds measured of this kernel (autotune.search.transfer); the
    `gp` model takes their relative times as its prior mean, trusted as far as they agree with
    what this search measures. Their best configurations (transfer.leads) are the caller's to
    put in `initial`. Without them the search is the cold one.
    """
    search = _Search(space, sig, n_trials, strategy, seed, valid, storage, study_name, others)
    search.queue_first(initial)
    stopping = _Stopping(n_trials, time_limit_s, patience, noise, search.started)
    try:
        while not (search.spent() or stopping.ends(search.results, search.vset)):
            if not search.step(evaluate, upcoming, stopping):
                break
        return search.evaluations()
    except BaseException:
        search.leave()
        raise


class _Search:
    """One search as it goes: the valid configurations it searches, the sampler's study (in
    memory, or shared in a storage with other workers) and what it measured."""

    def __init__(
        self,
        space: Space,
        sig: Signature | None,
        n_trials: int,
        strategy: str,
        seed: int | None,
        valid: list[dict[str, Any]] | None,
        storage: str | None,
        study_name: str | None,
        others: Sequence[OtherDevice] = (),
    ) -> None:
        self.vset = _valid_set(space, sig, valid, strategy, seed)
        self.n_trials, self.strategy, self.seed = n_trials, strategy, seed
        self.budget = n_trials if self.vset.count is None else min(n_trials, self.vset.count)
        self.started = time.monotonic()
        self.enc = _Encoding(space)
        sampler = make_sampler(strategy, seed, self.enc, self.vset, others)
        self.seen: set[Position] = set()  # valid configurations measured or being measured

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.shared = SharedStudy(storage, study_name, sampler) if storage else None
        if self.shared:
            self.shared.join()
        self.study = (
            self.shared.study
            if self.shared
            else optuna.create_study(direction="minimize", sampler=sampler)
        )
        self.results: list[Evaluation] = []
        self.measured: dict[tuple, Evaluation] = {}
        self.claimed: set[tuple] = set()  # configs other live workers are measuring now

    def queue_first(self, initial: Iterable[Mapping[str, Any]]) -> None:
        """Queue what is measured first: the `initial` configurations that are valid, then,
        for a grid or a listed space no larger than the budget, every valid one."""
        vset = self.vset
        first = [dict(c) for c in initial if vset.contains(c)]
        if isinstance(vset, ListedSet) and (self.strategy == "grid" or vset.count <= self.n_trials):
            order = list(vset.configs)
            if self.strategy != "grid":  # exhaustive anyway; a seeded order finds good ones early
                random.Random(self.seed).shuffle(order)
            first += order
        # workers joining a shared study do not queue again what is queued, claimed or
        # measured; a config whose trial failed unmeasured (its worker was killed) is queued again
        queued = _in_study(self.study, self.enc) if self.shared else set()
        for c in first:
            if config_id(c) not in queued:
                queued.add(config_id(c))
                self.study.enqueue_trial(self.enc.encode(c))

    def spent(self) -> bool:
        """Whether the budget is spent (or every valid configuration measured), once the
        claims of other workers are measured: a claim released instead (its worker died)
        leaves budget that this worker spends."""
        while True:
            if self.shared:
                self.measured, self.claimed = self.shared.refresh(self.enc)
                # rebuilt each time: a dead worker's released claim is unmeasured again
                self.seen = set()
                for cid in (*self.measured, *self.claimed):
                    pos = self.vset.position(dict((k, v) for k, _, v in cid))
                    if pos is not None and self.vset.is_valid(pos):
                        self.seen.add(pos)
            spent = _distinct(self.measured) + len(self.claimed) >= self.budget
            if not (spent or len(self.seen) == self.vset.count):
                break
            if not self.claimed:
                _note_programs(self.results, self.vset, self.n_trials)
                return True
            time.sleep(0.5)
        return False

    def step(
        self,
        evaluate: Callable[[dict[str, Any]], Evaluation],
        upcoming: Callable[[list[dict[str, Any]]], None] | None,
        stopping: _Stopping,
    ) -> bool:
        """Ask the sampler for a configuration and, if it is fresh, measure it and tell the
        sampler; one that is not (invalid, measured, claimed) is told and replaced. False
        where the search cannot go on: no unmeasured valid configuration near a proposal."""
        study, enc, vset, shared = self.study, self.enc, self.vset, self.shared
        trial = study.ask(enc.distributions)
        config = enc.decode(trial.params)
        cid = config_id(config)
        pos = vset.position(config)
        admitted = pos is not None and vset.is_valid(pos)
        fresh = admitted and cid not in self.measured and cid not in self.claimed
        if (
            shared
            and fresh
            and (shared.taken(trial, cid, enc) or _over(shared, enc, self.budget, trial))
        ):
            # another worker claimed it at the same moment, or measured it since our refresh;
            # neither measures twice (see taken). Or others asked for what was left of the
            # budget before us (see _over). Queue it again after a
            # random pause, so two workers that both gave it up fall out of step (the one
            # that finds the other measuring it, or done, moves on).
            study.tell(trial, state=TrialState.FAIL)
            time.sleep(random.uniform(0.0, 0.5))
            study.enqueue_trial(enc.encode(config))
            return True
        if not fresh:
            # invalid: a bad region for the sampler (pruned: no timing); a repeat: already
            # known, not new evidence (failed: samplers ignore it)
            study.tell(trial, state=TrialState.FAIL if admitted else TrialState.PRUNED)
            near = None if pos is None else vset.nearest_unseen(pos, self.seen)
            if near is None:
                log.info("search: no unmeasured valid configuration found near a proposal")
                return False
            study.enqueue_trial(enc.encode(vset.config(near)))
            return True
        if upcoming is not None:
            upcoming(_queued(study, enc, vset, {cid}, self.measured, self.claimed))
        ev = self._measure(trial, config, evaluate)
        self.seen.add(pos)
        self.measured[cid] = ev
        self.results.append(ev)
        stopping.count(ev)
        return True

    def _measure(
        self,
        trial: optuna.Trial,
        config: dict[str, Any],
        evaluate: Callable[[dict[str, Any]], Evaluation],
    ) -> Evaluation:
        """`config` evaluated, and told to the study as `trial`."""
        study, shared = self.study, self.shared
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
        return ev

    def evaluations(self) -> list[Evaluation]:
        """What the search measured, in order; in a shared study, every worker's."""
        if self.shared:
            return _every_workers(self.shared, self.enc, self.budget)
        return self.results

    def leave(self) -> None:
        """An interrupted or failed worker no longer searches the study."""
        if self.shared:
            with contextlib.suppress(Exception):  # the cause is what is reported, not this
                self.shared.leave()


class _Stopping:
    """The rules that end a search before its budget: a time limit, `patience` measurements
    in a row that do not beat the best by more than `noise`, and `n_trials` duplicates in a
    row (see programs_note)."""

    def __init__(
        self,
        n_trials: int,
        time_limit_s: float | None,
        patience: int | None,
        noise: float,
        started: float,
    ) -> None:
        self.n_trials, self.time_limit_s = n_trials, time_limit_s
        self.patience, self.noise = patience, noise
        self.deadline = None if time_limit_s is None else started + time_limit_s
        self.best = np.inf
        self.since_best = 0
        self.repeats = 0  # duplicates in a row

    def count(self, ev: Evaluation) -> None:
        """One more evaluation measured (or found a duplicate)."""
        self.repeats = self.repeats + 1 if ev.status == "duplicate" else 0
        if self.repeats:  # nothing measured: no evidence for or against progress
            return
        if ev.value is None:
            self.since_best += 1
        else:
            self.since_best = (
                0
                if ev.value < self.best * (1 - self.noise) or self.best == np.inf
                else self.since_best + 1
            )
            self.best = min(self.best, ev.value)

    def ends(self, results: Sequence[Evaluation], vset: ValidSet) -> bool:
        """Whether a rule ends the search before its next trial (`results`: its evaluations
        so far, of the valid configurations `vset`)."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            log.info("search: wall-time limit of %.0f s reached", self.time_limit_s)
            return True
        if self.repeats >= self.n_trials:
            _note_programs(results, vset, self.n_trials)
            return True
        if self.patience is not None and self.since_best >= self.patience:
            log.info(
                "search: no improvement beyond %.1f%% in %d trials", self.noise * 100, self.patience
            )
            return True
        return False


def _over(shared: SharedStudy, enc: _Encoding, budget: int, trial: optuna.Trial) -> bool:
    """Whether the study's distinct programs measured, with the running trials asked for
    before `trial` and `trial` itself, are more than `budget`. Looked at once our claim is in:
    of two workers on the budget's last trial, the later to ask gives it up whichever looks
    first (the earlier's trial, asked for, is running already), and the default, asked for
    first, is kept. Both counts come from one read: read apart, a trial another worker
    finished between the two reads was in neither, and the budget was overrun by one."""
    measured, _, running = shared.snapshot(enc)
    return _distinct(measured) + sum(n < trial.number for n in running) + 1 > budget


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
