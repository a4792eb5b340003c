"""Search behaviour on small synthetic landscapes (real files, the real search loop)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import optuna
import pytest
from toy_kernels import make_input, scale

import autotune
from autotune import BestEntry, TuningDB, cli
from autotune.errors import SpaceError
from autotune.search import gp
from autotune.search.landscapes import load_landscape, replay
from autotune.search.loop import LOOKAHEAD, _Encoding, make_sampler, programs_note, run_search
from autotune.search.samplers.base import CandidateSampler
from autotune.search.samplers.gp import (
    GP_EXPLOIT_EVERY,
    GP_EXPLOIT_FROM,
    GP_LATE_FROM,
    GP_MIN_GAIN,
    compress_slow,
)
from autotune.search.strategies import STARTUP_TRIALS, STRATEGIES
from autotune.search.valid_set import ListedSet
from autotune.space import Param, Space
from autotune.trial import Evaluation, TrialRecord

SHARED = Path(__file__).resolve().parents[2] / "shared" / "landscapes"


def bowl(bx: int, by: int) -> float:
    """A smooth landscape over powers of two, fastest at bx=32, by=4."""
    return 1.0 + ((bx.bit_length() - 6) ** 2 + (by.bit_length() - 3) ** 2) * 0.5


def write_landscape(path: Path, fail=lambda bx, by: False, absent=lambda bx, by: False) -> Path:
    lines = ["bx,by,unroll,time_ms,status"]
    for bx in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
        for by in (1, 2, 4, 8, 16, 32, 64, 128):
            for unroll in (0, 1):
                if absent(bx, by):
                    continue
                t = bowl(bx, by) + 0.1 * unroll
                lines.append(
                    f"{bx},{by},{unroll},,compile_error"
                    if fail(bx, by)
                    else f"{bx},{by},{unroll},{t},ok"
                )
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


@pytest.fixture
def landscape(tmp_path) -> Path:
    # a quarter of the grid is outside the space, large tiles fail
    return write_landscape(
        tmp_path / "bowl.csv.gz",
        fail=lambda bx, by: bx * by >= 4096,
        absent=lambda bx, by: (bx + by) % 3 == 0,
    )


def test_replay_evaluates_distinct_valid_configs_and_reports_failures(landscape):
    land = load_landscape(landscape)
    in_file = {tuple(sorted(c.items())): t for c, t in zip(land.configs, land.times)}
    found = replay(landscape, 60, seed=0)
    keys = [tuple(sorted(f["config"].items())) for f in found]
    assert len(found) == 60 and len(set(keys)) == 60
    assert all(k in in_file and in_file[k] == f["time_ms"] for k, f in zip(keys, found))
    assert any(f["time_ms"] is None for f in found) or all(in_file[k] is not None for k in keys)


def test_replay_never_looks_up_a_time_it_did_not_evaluate(landscape):
    land = load_landscape(landscape)

    class Watched(list):
        read: set[int] = set()

        def __getitem__(self, i):
            Watched.read.add(i)
            return list.__getitem__(self, i)

    watched = type(land)(land.space, land.configs, Watched(land.times), land.statuses)
    found = replay(watched, 30, seed=1)
    evaluated = {land.configs.index(f["config"]) for f in found}
    assert Watched.read == evaluated


@pytest.mark.parametrize("strategy", ["tpe", "gp", "random", "cmaes"])
def test_seeded_runs_repeat_and_a_small_budget_is_a_prefix_of_a_larger(landscape, strategy):
    if strategy == "cmaes":
        pytest.importorskip("cmaes")
    a = replay(landscape, 20, seed=3, strategy=strategy)
    b = replay(landscape, 20, seed=3, strategy=strategy)
    assert a == b
    assert replay(landscape, 35, seed=3, strategy=strategy)[:20] == a


def test_model_based_search_beats_random_sampling_on_a_smooth_landscape(tmp_path):
    # 160 configs, large tiles fail; one optimum, and its twin with unroll 1 is 10% slower
    land = load_landscape(
        write_landscape(tmp_path / "bowl.csv.gz", fail=lambda bx, by: bx * by >= 4096)
    )

    def near(strategy: str, seeds: int = 8) -> int:
        """Seeds (of 8) whose first 30 trials come within 10% of the optimum."""
        hits = 0
        for seed in range(seeds):
            found = replay(land, 30, seed=seed, strategy=strategy)
            hits += (
                min(f["time_ms"] for f in found if f["time_ms"] is not None) <= land.best_ms * 1.1
            )
        return hits

    assert near("random") <= 4  # a random 30 of 160 holds one of the two 1 time in 3
    # the GP, whose runs cost a hundred times TPE's, on 4 seeds: every one finds what random
    # sampling finds on fewer than half
    assert near("tpe") == 8 and near("gp", seeds=4) == 4


def test_failures_steer_the_search_away(tmp_path):
    # a quarter of the space fails (by >= 64, away from the optimum): a model that learns it
    # measures far fewer failures than random sampling does
    path = write_landscape(tmp_path / "f.csv.gz", fail=lambda bx, by: by >= 64)

    def failures(strategy: str, seeds: int = 4) -> float:
        """The failures a run of 40 trials measures, on average over its seeds."""
        runs = [replay(path, 40, s, strategy) for s in range(seeds)]
        return sum(f["time_ms"] is None for run in runs for f in run) / seeds

    random = failures("random")
    assert failures("tpe") < 0.6 * random
    assert failures("gp", seeds=2) < 0.6 * random  # the GP's runs cost a hundred times TPE's


def test_exhaustive_when_the_space_fits_the_budget(landscape):
    land = load_landscape(landscape)
    for strategy in STRATEGIES:
        if strategy == "cmaes" and pytest.importorskip("cmaes") is None:
            continue
        found = replay(land, len(land.configs) + 5, seed=0, strategy=strategy)
        assert sorted(map(str, (f["config"] for f in found))) == sorted(map(str, land.configs))


def test_patience_stops_after_trials_without_improvement(tmp_path):
    path = tmp_path / "flat.csv"
    path.write_text(
        "b,time_ms,status\n" + "".join(f"{b},{5.0 if b else 1.0},ok\n" for b in range(50))
    )
    found = replay(path, 40, seed=0, strategy="random", patience=5, initial=[{"b": 0}])
    assert len(found) == 6 and found[0] == {"config": {"b": 0}, "time_ms": 1.0}


def test_a_wall_time_limit_stops_the_search(landscape):
    assert replay(landscape, 50, seed=0, time_limit_s=1e-9) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b\n1,2\n", "header"),
        ("a,time_ms,status\n", "no configurations"),
        ("a,time_ms,status\n1,x,ok\n", "not a number"),
    ],
)
def test_bad_landscape_files_are_named(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(SpaceError, match=message):
        load_landscape(path)


def test_unknown_strategy_is_refused(landscape):
    with pytest.raises(SpaceError, match="unknown strategy 'annealing'"):
        replay(landscape, 5, seed=0, strategy="annealing")


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"recorded landscapes not found at {SHARED}")
def test_a_recorded_gpu_landscape_replays():
    path = SHARED / "pnpoly_RTX_3090.csv.gz"
    found = replay(path, 25, seed=0)
    assert len(found) == 25 and len({str(f["config"]) for f in found}) == 25


def test_warm_start_measures_the_best_config_stored_at_the_nearest_shape(db_url):
    near = autotune.tune(scale, [make_input(rows=32)], n_trials=1, db=db_url, strategy="random")
    far = autotune.tune(scale, [make_input(rows=256)], n_trials=1, db=db_url, strategy="random")
    with TuningDB(db_url) as db:  # pretend earlier runs found 16 best at 32 rows, 32 at 256
        for result, block in ((near, 16), (far, 32)):
            entry = BestEntry(
                {"block_rows": block}, time_s=1e-3, n_trials=1, run_id="r", strategy="grid"
            )
            db.put_best(result.key, entry)
    result = autotune.tune(scale, [make_input(rows=64)], n_trials=3, db=db_url, seed=0)
    first = [t.config["block_rows"] for t in result.trials]
    assert first == [8, 16, 32]  # the default, then the nearest shape's best, then the next
    cold = autotune.tune(
        scale, [make_input(rows=64)], n_trials=3, store=False, warm_start=False, seed=0
    )
    assert cold.trials[0].config == {"block_rows": 8}


def test_exported_landscape_replays_the_tuning_run(tmp_path, db_url, capsys):
    result = autotune.tune(scale, [make_input(rows=48)], n_trials=10, db=db_url, strategy="grid")
    out = tmp_path / "scale.csv.gz"
    assert (
        cli.main(
            [
                "db",
                "landscape",
                "--kernel",
                "scale",
                "--signature",
                "f32[48,128]",
                "-o",
                str(out),
                "--db",
                db_url,
            ]
        )
        == 0
    )
    land = load_landscape(out)
    measured = {t.config["block_rows"]: t.time_s * 1e3 for t in result.trials}
    found = replay(out, 10, seed=0)
    assert {f["config"]["block_rows"]: f["time_ms"] for f in found} == pytest.approx(measured)
    assert len(land.configs) == len(measured) == 4
    assert (
        cli.main(
            ["db", "landscape", "--kernel", "scale", "--signature", "f32[8,8]", "--db", db_url]
        )
        == 2
    )
    assert "no trials of scale" in capsys.readouterr().err


def test_upcoming_is_told_the_queued_configs_in_the_order_they_are_measured():
    space = Space((Param("b", tuple(range(30))),))
    valid = [{"b": b} for b in range(30) if b % 3]
    seen: list[list[dict]] = []

    def evaluate(config):
        return Evaluation.of(config, float(config["b"]))

    warm = [{"b": 4}, {"b": 4}, {"b": 3}, {"b": 7}]  # a repeat, an invalid one
    found = run_search(
        space,
        None,
        evaluate,
        n_trials=len(valid),
        strategy="grid",
        valid=valid,
        initial=warm,
        upcoming=seen.append,
    )
    order = [ev.config for ev in found]
    assert order[:2] == [{"b": 4}, {"b": 7}] and len(order) == len(valid)
    # before each measurement: the ones after it, as many as LOOKAHEAD
    assert seen == [order[i + 1 : i + 1 + LOOKAHEAD] for i in range(len(order))]


def test_upcoming_changes_nothing_a_seeded_model_based_search_measures(landscape):
    land = load_landscape(landscape)
    seen: list[list[dict]] = []

    def run(**extra):
        def evaluate(config):
            i = land.configs.index(config)
            return Evaluation.of(config, land.times[i], land.statuses[i])

        initial = land.configs[:3]
        found = run_search(
            land.space,
            None,
            evaluate,
            n_trials=15,
            seed=0,
            valid=land.configs,
            initial=initial,
            **extra,
        )
        return [ev.config for ev in found]

    assert run(upcoming=seen.append) == run()
    # the warm starts are known ahead; the model's proposals are not
    assert seen[0] == land.configs[1:3] and seen[1] == land.configs[2:3] and seen[2:] == [[]] * 13


def test_the_gp_sees_which_block_sizes_are_powers_of_two_once_it_has_timings():
    space = Space(
        (
            Param("block", (16, 32, 48, 64, 96, 128)),  # mixed: a late feature
            Param("stages", (1, 2, 4)),  # all powers of two: none
            Param("unroll", (True, False)),
        )
    )
    enc = _Encoding(space)
    valid = ListedSet(space, list(space.all_configs()))

    def late(config):
        return valid.late_features(np.array([valid.position(config)])).tolist()

    assert late({"block": 48, "stages": 2, "unroll": True}) == [[0.0]]
    assert late({"block": 64, "stages": 1, "unroll": False}) == [[1.0]]
    sampler = make_sampler("gp", 0, enc, valid)
    assert isinstance(sampler, CandidateSampler)
    study = optuna.create_study(sampler=sampler)
    widths = []
    for _ in range(GP_LATE_FROM + 1):
        trial = study.ask(enc.distributions)
        config = enc.decode(trial.params)
        study.tell(trial, config["block"] / (1 + config["stages"]))
        widths.append(None if sampler._gp is None else sampler._gp.x.shape[1])
    base = valid.features(valid.rows[:1]).shape[1]
    # no model for the start-up trials; then the base features, and one more from GP_LATE_FROM
    assert set(widths[4:GP_LATE_FROM]) == {base} and widths[GP_LATE_FROM] == base + 1


def test_the_gp_proposes_its_fastest_prediction_every_few_trials_once_it_has_enough():
    powers = tuple(2**k for k in range(10))  # 100 candidates: more than the trials below
    space = Space((Param("bx", powers), Param("by", powers)))
    enc = _Encoding(space)
    valid = list(space.all_configs())
    vset = ListedSet(space, valid)
    sampler = make_sampler("gp", 0, enc, vset)
    study = optuna.create_study(sampler=sampler)
    chosen = []  # per proposal after GP_EXPLOIT_FROM: (is the fastest prediction, is the best EI)
    for n in range(GP_EXPLOIT_FROM + 4 * GP_EXPLOIT_EVERY):
        trial = study.ask(enc.distributions)
        config = enc.decode(trial.params)
        if n >= GP_EXPLOIT_FROM:
            measured = [enc.decode(t.params) for t in study.trials[:-1]]
            unseen = [c for c in valid if c not in measured]
            pos = np.array([vset.position(c) for c in unseen])
            xs = np.hstack([vset.features(pos), vset.late_features(pos)])
            mean = gp.posterior(sampler._gp, xs)[0]
            ei = gp.log_expected_improvement(sampler._gp, xs, GP_MIN_GAIN)
            i = unseen.index(config)
            chosen.append((mean[i] == mean.min(), ei[i] == ei.max()))
        # a bumpy landscape, so that the largest expected improvement is not always where the
        # GP predicts the fastest time (here they differ on 3 of the 4 exploitation steps)
        bx, by = config["bx"].bit_length(), config["by"].bit_length()
        study.tell(trial, 1.0 + (bx - 5) ** 2 + (by - 3) ** 2 + 6.0 * ((bx + by) % 3 == 0))
    exploit = [k % GP_EXPLOIT_EVERY == 0 for k in range(len(chosen))]
    assert all(fastest for (fastest, _), e in zip(chosen, exploit) if e)
    assert all(best_ei for (_, best_ei), e in zip(chosen, exploit) if not e)
    assert any(not best_ei for (_, best_ei), e in zip(chosen, exploit) if e)  # they differ


@pytest.mark.parametrize("strategy", ["tpe", "gp"])
def test_start_up_proposals_are_as_far_as_possible_from_those_measured(strategy):
    space = Space((Param("bx", (8, 16, 32, 64, 128)), Param("by", (1, 2, 4, 8))))
    enc = _Encoding(space)
    valid = list(space.all_configs())
    vset = ListedSet(space, valid)
    study = optuna.create_study(sampler=make_sampler(strategy, 0, enc, vset))
    measured = []
    for _ in range(STARTUP_TRIALS):
        trial = study.ask(enc.distributions)
        measured.append(enc.decode(trial.params))
        study.tell(trial, 1.0)

    def gap(config, others):
        def features(c):
            return vset.features(np.array([vset.position(c)]))[0]

        return min(((features(config) - features(o)) ** 2).sum() for o in others)

    for k in range(1, STARTUP_TRIALS):
        rest = [c for c in valid if c not in measured[:k]]
        assert gap(measured[k], measured[:k]) == max(gap(c, measured[:k]) for c in rest)
    assert measured[1]["bx"] != measured[0]["bx"] and measured[1]["by"] != measured[0]["by"]


def test_duplicates_spend_no_budget_and_as_many_in_a_row_as_the_budget_end_the_search():
    space = Space((Param("b", tuple(range(40))),))
    valid = [{"b": b} for b in range(40)]

    def evaluate(config):  # b clamps to 8 at most: b >= 8 compile to one program, measured once
        if config["b"] > 8:
            return Evaluation(TrialRecord(config, "duplicate"), 1.0)  # b=8's figure
        return Evaluation.of(config, 10.0 - config["b"])

    statuses = lambda found: [ev.status for ev in found]  # noqa: E731
    # a budget of 9: the grid's first nine, all distinct, spend it
    found = run_search(space, None, evaluate, n_trials=9, strategy="grid", valid=valid)
    assert statuses(found) == ["ok"] * 9
    # a budget of 12: 9 distinct, then 12 duplicates in a row end the search, said so
    found = run_search(space, None, evaluate, n_trials=12, strategy="grid", valid=valid)
    assert statuses(found) == ["ok"] * 9 + ["duplicate"] * 12
    assert programs_note(statuses(found), 40, 12) == (
        "the last 12 configurations tried compiled to programs measured already: "
        "9 distinct programs found"
    )
    # a space with fewer distinct programs than the budget ends once every config was tried
    small = [{"b": b} for b in range(12)]
    found = run_search(space, None, evaluate, n_trials=20, strategy="gp", seed=0, valid=small)
    assert sorted(ev.config["b"] for ev in found) == list(range(12))
    assert programs_note(statuses(found), 12, 20) == (
        "the 12 valid configurations compile to 9 distinct programs, every one measured"
    )


def test_the_gp_models_log_times_above_their_median_compressed_in_order():
    y = np.log([1.0, 1.02, 1.1, 2.0, 10.0, 100.0, 1000.0])
    z = compress_slow(y)
    m = np.median(y)
    assert np.array_equal(z[y <= m], y[y <= m])  # the fast half as it is: EI's margin holds
    assert np.all(np.diff(z) > 0)  # order kept: a slower time stays slower
    assert z[-1] - m < 0.5 * (y[-1] - m)  # 1000x the median weighs less than its log
