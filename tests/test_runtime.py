"""The @autotuned lookup: stored config, nearest shape, defaults; inside and outside jit."""

import contextlib
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from toy_kernels import make_input, rows_divide, scale

import autotune
from autotune import BestEntry, TuningDB
from autotune.device import current_device
from autotune.errors import AutotuneError
from autotune.measure.timing import TimingPolicy
from autotune.runtime import state as runtime_state
from autotune.runtime.nearest import ShapeIndex
from autotune.signature import parse_args, shape_distance

QUICK = TimingPolicy(warmup=1, min_reps=2, max_reps=3, max_time_s=0.05)


def by_row_blocks(body, x, block_rows, interpret):
    """A pallas_call of `body` over blocks of `block_rows` whole rows of x."""
    rows, cols = x.shape
    spec = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // block_rows,),
        in_specs=[spec],
        out_specs=spec,
        interpret=interpret,
    )(x)


@autotune.autotuned(name="runtime_shift", space={"block_rows": [8, 16]}, constraints=[rows_divide])
def shift(x, amount=0.0, *, offset=None, scale_by=1.0, block_rows=8, interpret=False):
    """x * scale_by + amount (Python constants of the kernel body), plus an optional array."""

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * scale_by + amount

    out = by_row_blocks(body, x, block_rows, interpret)
    return out if offset is None else out + offset


@autotune.autotuned(
    name="runtime_tagged", space={"block_rows": [8, 16, 32]}, constraints=[rows_divide]
)
def tagged(x, *, plus=0, block_rows=8, interpret=False):
    """Every element is block_rows + plus: the output says which configuration a call ran with."""

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 0.0 + block_rows + plus

    return by_row_blocks(body, x, block_rows, interpret)


def ran_with(out):
    """The block_rows a call of `tagged` ran with."""
    return int(np.asarray(out)[0, 0])


def store(db_url, x, block_rows, kernel=scale):
    """Store a best entry for `kernel` at x's shape, as a tuning run would."""
    sig = kernel.spec.signature([x], {}, current_device())
    key = kernel.spec.key(sig, current_device())
    with TuningDB(db_url) as db:
        entry = BestEntry(
            {"block_rows": block_rows}, time_s=1e-3, n_trials=1, run_id="test", strategy="grid"
        )
        db.put_best(key, entry)
    autotune.configure()


def test_miss_falls_back_to_defaults_and_is_recorded(db_url):
    x = make_input(rows=64)
    info = scale.explain(x)
    assert info["source"] == "default" and info["config"] == {"block_rows": 8}
    np.testing.assert_allclose(scale(x), x * 2)
    (miss,) = TuningDB(db_url).misses(kernel="scale")
    assert miss["signature"] == "f32[64,128]"


def test_explain_is_a_question_and_records_no_miss(db_url):
    x = make_input(rows=64)
    for _ in range(3):
        assert scale.explain(x)["source"] == "default"
    assert TuningDB(db_url).misses() == []
    scale(x)  # a call is what model code asked for: counted once
    assert [m["count"] for m in TuningDB(db_url).misses()] == [1]


def test_explain_says_what_calls_run_when_another_process_stored_an_entry(db_url):
    x = make_input(rows=64)
    np.testing.assert_allclose(scale(x), x * 2)  # the default, remembered
    with TuningDB(db_url) as db:  # another process tunes it meanwhile
        key = scale.spec.key(scale.spec.signature([x], {}, current_device()), current_device())
        db.put_best(key, BestEntry({"block_rows": 16}, 1e-3, 1, run_id="r", strategy="grid"))
    info = scale.explain(x)
    assert (info["source"], info["config"]) == ("default", {"block_rows": 8})
    assert "a lookup now gives {'block_rows': 16} (db)" in info["detail"]
    autotune.configure()
    assert scale.explain(x)["source"] == "db"


def test_stored_config_is_used_outside_and_inside_jit(db_url):
    x = make_input(rows=64)
    store(db_url, x, 16)
    info = scale.explain(x)
    assert info["source"] == "db" and info["config"] == {"block_rows": 16}
    assert info["key"]["signature"] == "f32[64,128]"
    np.testing.assert_allclose(scale(x), x * 2)
    jaxpr = jax.make_jaxpr(lambda a: scale(a) + 1)(x)
    text = str(jaxpr)
    assert "pallas_call" in text and "grid=(4,)" in text.replace(" ", "")  # 64 rows / 16
    np.testing.assert_allclose(jax.jit(lambda a: scale(a) + 1)(x), x * 2 + 1)


def test_caller_keyword_wins_over_the_tuned_value(db_url):
    x = make_input(rows=64)
    store(db_url, x, 16)
    assert scale.explain(x, block_rows=32)["config"] == {"block_rows": 32}
    assert "grid=(2,)" in str(jax.make_jaxpr(lambda a: scale(a, block_rows=32))(x)).replace(" ", "")
    store(db_url, x, 16, kernel=tagged)
    assert ran_with(tagged(x, block_rows=32)) == 32  # eager
    assert ran_with(tagged(x)) == 16


def test_eager_calls_run_with_the_stored_config(db_url):
    x = make_input(rows=64)
    assert [ran_with(tagged(x)) for _ in range(2)] == [8, 8]  # a miss: the defaults
    store(db_url, x, 16, kernel=tagged)
    assert [ran_with(tagged(x)) for _ in range(2)] == [16, 16]
    assert ran_with(jax.jit(tagged)(x)) == 16
    # a keyword option is static and part of the key: these keys were not tuned
    assert [ran_with(tagged(x, plus=p)) for p in (100, 200, 100)] == [108, 208, 108]


def test_nearest_tuned_shape_is_used_when_its_config_fits(db_url):
    store(db_url, make_input(rows=128), 32)
    store(db_url, make_input(rows=512), 16)
    near = scale.explain(make_input(rows=80))  # 32 does not divide 80; the next nearest is 512's 16
    assert near["source"] == "nearest" and near["config"] == {"block_rows": 16}
    assert scale.explain(make_input(rows=160))["config"] == {"block_rows": 32}  # 160 % 32 == 0


def test_the_nearest_shapes_are_read_once_and_again_after_another_process_writes(
    db_url, subprocess_env
):
    store(db_url, make_input(rows=128), 32)
    assert scale.explain(make_input(rows=160))["config"] == {"block_rows": 32}
    (index,) = runtime_state.current().shapes.values()
    assert scale.explain(make_input(rows=96))["config"] == {"block_rows": 32}
    assert list(runtime_state.current().shapes.values()) == [index]  # not read again
    # another process replaces 128 rows' entry and adds 64 rows'
    keys = [scale.spec.key(scale.spec.signature([make_input(rows=r)], {}, current_device()),
                           current_device()).as_dict() for r in (128, 64)]  # fmt: skip
    write = (
        "import json, sys\n"
        "from autotune import BestEntry, TuningDB\n"
        "from autotune.signature import TuningKey\n"
        "with TuningDB(sys.argv[1]) as db:\n"
        "    for key, rows in zip(json.loads(sys.argv[2]), (8, 16)):\n"
        "        entry = BestEntry({'block_rows': rows}, 1e-3, 1, 'other', 'grid')\n"
        "        db.put_best(TuningKey(**key), entry)\n"
    )
    subprocess.run(
        [sys.executable, "-c", write, db_url, json.dumps(keys)], env=subprocess_env, check=True
    )
    assert scale.explain(make_input(rows=256))["config"] == {"block_rows": 8}  # 128's, replaced
    assert scale.explain(make_input(rows=48))["config"] == {"block_rows": 16}  # 64's, added


def test_the_shape_index_ranks_entries_as_shape_distance_does():
    signatures = [f"f32[{r},{c}]" for r in (8, 12, 16, 24, 48, 64) for c in (64, 128, 256)]
    signatures += ["f32[8,128],f32[8]", "bf16[20,100]", "f32[16]", "f32[8, 128]", "f32[0,128]"]
    entries = [(s, "v1", json.dumps({"i": i})) for i, s in enumerate(signatures)]
    index = ShapeIndex.of([*entries, ("f32[16,128]", "v0", "{}")], "v1")
    call = parse_args("f32[20,100]")
    expected = []
    for i, s in enumerate(signatures):
        with contextlib.suppress(AutotuneError):
            if (d := shape_distance(parse_args(s), call)) is not None:
                expected.append((round(d, 9), s, {"i": i}))
    assert list(index.nearest(call)) == sorted(expected, key=lambda t: t[:2])
    assert len(expected) == 19 and index.stale == {"f32[16,128]": "v0"}


def test_strict_mode_raises_on_a_miss(db_url, monkeypatch):
    monkeypatch.setenv("PALLAS_AUTOTUNE_STRICT", "1")
    autotune.configure()
    for _ in range(2):  # a failed lookup is not cached: the next call raises too
        with pytest.raises(AutotuneError, match="no tuned configuration for scale f32\\[64,128\\]"):
            scale(make_input(rows=64))
    x = make_input(rows=32)
    store(db_url, x, 16, kernel=tagged)
    autotune.configure(strict=True)
    assert ran_with(tagged(x)) == 16


def test_misses_are_recorded_once_per_new_key(db_url):
    x = make_input(rows=64)
    for _ in range(3):
        np.testing.assert_allclose(scale(x), x * 2)
    np.testing.assert_allclose(jax.jit(lambda a: scale(a))(x), x * 2)
    for _ in range(2):
        scale(make_input(rows=32))
    misses = TuningDB(db_url).misses(kernel="scale")
    assert sorted((m["signature"], m["count"]) for m in misses) == [
        ("f32[32,128]", 1),
        ("f32[64,128]", 1),
    ]


def test_tuning_in_this_process_changes_what_the_next_eager_call_uses(db_url):
    x = make_input(rows=64)
    store(db_url, x, 32, kernel=tagged)
    assert ran_with(tagged(x)) == 32
    # one trial: the default (8), stored over the 32 because it was measured and 32 was not
    result = autotune.tune(tagged, [x], n_trials=1, strategy="grid", warm_start=False, policy=QUICK)
    assert result.best_config == {"block_rows": 8}
    assert ran_with(tagged(x)) == 8
    assert tagged.explain(x)["source"] == "db"


def test_configure_points_the_next_eager_call_at_the_new_database(db_url, tmp_path):
    x = make_input(rows=64)
    store(db_url, x, 32, kernel=tagged)
    assert ran_with(tagged(x)) == 32
    other = str(tmp_path / "other.db")
    store(other, x, 16, kernel=tagged)
    autotune.configure(db=other)
    assert ran_with(tagged(x)) == 16


def test_an_array_for_a_keyword_only_option_is_refused_as_jit_refuses_it(db_url):
    # tagged's signature is arrays and keyword-only options: its calls go to jit unchecked
    with pytest.raises(ValueError, match="static"):
        tagged(make_input(rows=32), plus=jnp.ones(()))


def test_static_arguments_key_the_call_positionally_or_by_keyword(db_url):
    # shift's signature has a positional argument with a default: each call is checked
    x = make_input(rows=32)
    calls = [  # (positional, keyword, expected)
        ((), {"scale_by": 3.0}, x * 3),
        ((), {"scale_by": 4.0}, x * 4),
        ((1.0,), {}, x + 1),  # a positional Python scalar is static, as a keyword one is
        ((2.0,), {}, x + 2),
        ((), {"offset": x}, x * 2),  # an array by keyword is an array
        ((), {"scale_by": 5.0}, x * 5),
    ]
    for args, kwargs, expected in calls + calls:
        np.testing.assert_allclose(shift(x, *args, **kwargs), expected, rtol=1e-6)
    # under jit the same arguments resolve alike (and find the keys recorded above)
    np.testing.assert_allclose(jax.jit(lambda a: shift(a, 2.0))(x), x + 2, rtol=1e-6)
    misses = TuningDB(db_url).misses(kernel="runtime_shift")
    one = "f32[32,128]"
    assert sorted((m["signature"], m["static"], m["count"]) for m in misses) == [
        (one, '{"amount":0.0,"offset":null,"scale_by":3.0}', 1),
        (one, '{"amount":0.0,"offset":null,"scale_by":4.0}', 1),
        (one, '{"amount":0.0,"offset":null,"scale_by":5.0}', 1),
        (one, '{"amount":1.0,"offset":null,"scale_by":1.0}', 1),
        (one, '{"amount":2.0,"offset":null,"scale_by":1.0}', 1),
        (f"{one},{one}", '{"amount":0.0,"scale_by":1.0}', 1),  # offset=x: an array argument
    ]
