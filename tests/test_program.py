"""What a program calls (autotune.calls_in), tuning all of it (autotune.tune_program, `autotune
tune --program`), and a user's own differentiable kernel under @autotuned."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from kernel_checks import close, rand
from test_db_tools import cli

import autotune
from autotune import autotuned
from autotune.errors import AutotuneError

BENCHMARKS = str(Path(__file__).resolve().parent.parent / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)
import train_step  # noqa: E402  (the training-step benchmark's transformer block)

S = jax.ShapeDtypeStruct
# the attention half of the block: layer_norm, QKV matmul, causal flash attention, out matmul
FORWARD = ["layer_norm", "matmul", "flash_attention", "matmul"]
BACKWARD = {"layer_norm_bwd", "flash_attention_dq", "flash_attention_dkv", "matmul"}


def test_a_training_step_is_listed_tuned_and_then_served_from_the_database(capsys):
    step, abstract = train_step.tiny()
    calls = autotune.calls_in(step, abstract)  # ShapeDtypeStructs only: nothing runs
    assert [c.kernel for c in calls[:4]] == FORWARD
    assert {c.kernel for c in calls[4:]} == BACKWARD
    assert len({(c.kernel, c.signature, c.static) for c in calls}) == len(calls)
    assert {c.source for c in calls} == {"default"}
    dq = next(c for c in calls if c.kernel == "flash_attention_dq")
    assert (
        dq.signature
        == "f32[1,2,12,8],f32[1,2,12,8],f32[1,2,12,8],f32[1,2,12,8],f32[1,2,12],f32[1,2,12]"
    )
    assert json.loads(dq.static)["causal"] is True

    capsys.readouterr()
    # in this process, first-pass figures: serving what was tuned is the subject, not isolation;
    # one trial a call, beside its default, stores an entry for each as more would
    outcomes = autotune.tune_program(step, abstract, n_trials=1, isolate=False, finalists=0)
    assert [o.status for o in outcomes] == ["tuned"] * len(calls), [o.detail for o in outcomes]
    assert all("speedup" in o.detail for o in outcomes)
    shown = capsys.readouterr().err  # as `autotune tune --program` shows it, one line a trial
    n = len(calls)
    assert f"call 1/{n} trial 1/1" in shown and f"call {n}/{n} tuned " in shown and "eta " in shown

    # run the step: every call served from the database, the loss and gradients plain JAX's
    params = train_step.init_params(16, jnp.float32, mlp=False)
    x = rand((1, 12, 16), seed=3)
    jitted = jax.jit(step)
    loss, grads = jitted(params, x)
    ref_loss, ref_grads = train_step.step(2, train_step.jax_ops())(params, x)
    close(loss, ref_loss, jnp.float32)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        close(g, r, jnp.float32)
    # the jitted step is in jit's cache now: its calls are found all the same
    after = autotune.calls_in(jitted, abstract)
    assert [(c.kernel, c.signature) for c in after] == [(c.kernel, c.signature) for c in calls]
    assert {c.source for c in after} == {"db"}
    capsys.readouterr()
    again = autotune.tune_program(jitted, abstract, n_trials=1, show=False)
    assert {o.status for o in again} == {"skipped"}
    assert capsys.readouterr() == ("", "")  # silenced


def test_a_listing_counts_no_miss_and_creates_no_database(db_url):
    from toy_kernels import make_input, scale

    from autotune import TuningDB

    x = S((40, 128), jnp.float32)
    assert [c.source for c in autotune.calls_in(lambda a: scale(a) + 1, (x,))] == ["default"]
    assert not Path(db_url).exists()
    TuningDB(db_url).close()
    assert [c.source for c in autotune.calls_in(lambda a: scale(a) * 2, (x,))] == ["default"]
    assert TuningDB(db_url).misses() == []
    scale(make_input(rows=40))  # a call counts its miss, though listings traced it before
    assert [m["count"] for m in TuningDB(db_url).misses()] == [1]


def test_a_function_the_caller_jitted_counts_its_miss_when_called_after_a_listing(db_url):
    from toy_kernels import make_input, scale

    from autotune import TuningDB

    step = jax.jit(lambda a: scale(a) + 1)
    x = make_input(rows=40)
    assert [c.source for c in autotune.calls_in(step, (x,))] == ["default"]
    step(x)  # traced again: the listing's trace is its own, and counted nothing
    assert [m["count"] for m in TuningDB(db_url).misses()] == [1]


def test_a_listing_with_the_default_database_creates_not_even_its_folder(tmp_path, monkeypatch):
    from toy_kernels import scale

    monkeypatch.delenv("PALLAS_AUTOTUNE_DB")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # a fresh home's
    autotune.configure()
    calls = autotune.calls_in(scale, (S((40, 128), jnp.float32),))
    assert [c.source for c in calls] == ["default"]
    assert not (tmp_path / "cache").exists()


def test_calls_in_refuses_what_cannot_be_traced_with_one_line():
    with pytest.raises(AutotuneError, match="calls_in: tracing 'broken' failed"):

        def broken(x):
            return x.reshape(7)

        autotune.calls_in(broken, (S((4,), jnp.float32),))


def test_the_cli_lists_and_tunes_a_programs_calls_by_shard(capsys, monkeypatch, db_url):
    monkeypatch.syspath_prepend(BENCHMARKS)
    rc, out, _ = cli(capsys, "calls", "train_step:tiny", "--format", "json")
    assert rc == 0
    rows = json.loads(out)
    assert [r["kernel"] for r in rows[:4]] == FORWARD
    assert {r["source"] for r in rows} == {"default"}
    assert not Path(db_url).exists()  # a listing creates no database
    rc, out, _ = cli(capsys, "tune", "--program", "train_step:tiny", "--no-isolate",
                     "--trials", "1", "--shard", "1/4", "--db", db_url)  # fmt: skip
    assert rc == 0, out
    n_shard = len(rows[1::4])
    assert f"{n_shard} tuned, 0 skipped, 0 failed" in out
    rc, out, _ = cli(capsys, "calls", "train_step:tiny", "--format", "json")
    served = [r["source"] for r in json.loads(out)]
    assert [i for i, source in enumerate(served) if source == "db"] == list(range(1, len(rows), 4))
    rc, _, err = cli(capsys, "calls", "train_step:nothing")
    assert rc == 2 and "has no function 'nothing'" in err and len(err.splitlines()) == 1
    rc, _, err = cli(capsys, "calls", "train_step:__doc__")
    assert rc == 2 and "train_step.__doc__ is not a function" in err and err.count("\n") == 1


def test_a_job_file_task_may_name_a_program(tmp_path, monkeypatch):
    from autotune.errors import JobError
    from autotune.service.jobfile import load_job

    monkeypatch.syspath_prepend(BENCHMARKS)
    job = tmp_path / "job.toml"
    job.write_text(
        '[defaults]\ntrials = 3\n[[task]]\nprogram = "train_step:tiny"\n'
        '[[task]]\nkernel = "softmax"\nshapes = ["8x8"]\n'
    )
    tasks = load_job(job)
    calls = autotune.calls_in(*train_step.tiny())
    assert [t.kernel for t in tasks] == [c.kernel for c in calls] + ["softmax"]
    assert {t.trials for t in tasks} == {3}
    job.write_text('[[task]]\nprogram = "train_step:tiny"\nshapes = ["8x8"]\n')
    with pytest.raises(JobError, match="task 1: a program task names program = .* and no shapes"):
        load_job(job)


# A user's own differentiable kernel: x * x over row blocks, the block size a static argument of
# its custom_vjp, the backward a Pallas kernel of the same block size.
SEEN: list[tuple[str, int]] = []


def _rows_call(body, block_rows: int, interpret: bool, *arrays: jax.Array) -> jax.Array:
    spec = pl.BlockSpec((block_rows, arrays[0].shape[1]), lambda i: (i, 0))
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(arrays[0].shape, arrays[0].dtype),
        grid=(pl.cdiv(arrays[0].shape[0], block_rows),),
        in_specs=[spec] * len(arrays),
        out_specs=spec,
        interpret=interpret,
    )(*arrays)


def _square_body(x_ref, o_ref):
    o_ref[...] = x_ref[...] * x_ref[...]


def _square_grad_body(x_ref, g_ref, o_ref):
    o_ref[...] = 2 * x_ref[...] * g_ref[...]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _square(x, block_rows, interpret):
    SEEN.append(("forward", block_rows))
    return _rows_call(_square_body, block_rows, interpret, x)


def _square_fwd(x, block_rows, interpret):
    return _square(x, block_rows, interpret), x


def _square_bwd(block_rows, interpret, x, g):
    SEEN.append(("backward", block_rows))
    return (_rows_call(_square_grad_body, block_rows, interpret, x, g),)


_square.defvjp(_square_fwd, _square_bwd)


@autotuned(name="test_program_square", space={"block_rows": [8, 16]})
def square(x: jax.Array, *, block_rows: int = 16, interpret: bool = False) -> jax.Array:
    return _square(x, block_rows, interpret)


def test_a_users_custom_vjp_kernel_gets_its_tuned_block_in_forward_and_backward(db_url):
    x = rand((24, 16), seed=5)
    [call] = autotune.calls_in(jax.grad(lambda x: square(x).sum()), (S(x.shape, x.dtype),))
    assert (call.kernel, call.source, call.config) == (
        "test_program_square",
        "default",
        {"block_rows": 16},
    )
    outcomes = autotune.tune_program(jax.grad(lambda x: square(x).sum()), (x,), n_trials=2)
    assert [o.status for o in outcomes] == ["tuned"]
    SEEN.clear()
    tuned = autotune.calls_in(jax.grad(lambda x: square(x).sum()), (x,))[0]
    assert tuned.source == "db"
    # the trace that served the tuned configuration ran both with it (and nothing else)
    assert set(SEEN) == {
        ("forward", tuned.config["block_rows"]),
        ("backward", tuned.config["block_rows"]),
    }
    close(jax.grad(lambda x: square(x).sum())(x), 2 * x, jnp.float32)


def test_a_call_on_the_general_path_is_listed_too():
    @autotuned(name="biased_rows_listed", space={"block_rows": [8]})
    def biased_rows(x, *, bias=None, block_rows=8, interpret=False):
        return x if bias is None else x + bias

    assert not biased_rows._direct  # an array given for `bias` takes the general path
    x, b = jax.ShapeDtypeStruct((8, 128), jnp.float32), jax.ShapeDtypeStruct((8, 128), jnp.float32)
    calls = autotune.calls_in(lambda x, b: biased_rows(x, bias=b), (x, b))
    assert [(c.kernel, c.signature) for c in calls] == [
        ("biased_rows_listed", "f32[8,128],f32[8,128]")
    ]


def test_a_program_that_calls_no_autotuned_kernel_is_said(tmp_path, capsys, monkeypatch, caplog):
    import logging

    (tmp_path / "plain_step.py").write_text(
        "import jax.numpy as jnp\n\ndef factory():\n    return (lambda x: x + 1), (jnp.ones(4),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    db = str(tmp_path / "t.db")
    rc, out, err = cli(capsys, "tune", "--program", "plain_step:factory", "--db", db)
    assert rc == 2 and "makes no @autotuned call: nothing to tune" in err and err.count("\n") == 1
    with caplog.at_level(logging.WARNING, logger="autotune.service.program"):
        assert autotune.tune_program(lambda x: x + 1, (jnp.ones(4),), db=db) == []
    assert "makes no @autotuned call" in caplog.text
    with pytest.raises(AutotuneError, match=r"args is an array: give the arguments as a tuple"):
        autotune.calls_in(lambda x: x + 1, jnp.ones((64, 8)))


def test_a_programs_tasks_label_their_static_arguments_by_one_rule(monkeypatch):
    from autotune.service.program import program_tasks
    from autotune.tuning.settings import TuneSettings

    monkeypatch.syspath_prepend(BENCHMARKS)
    calls = autotune.calls_in(*train_step.tiny())
    # the forward matmuls leave `precision` out; the backward's pass its default
    assert {c.kwargs.get("precision", "left out") for c in calls if c.kernel == "matmul"} == {
        "left out",
        None,
    }
    labels = [t.label for t in program_tasks(calls, TuneSettings()) if t.kernel == "matmul"]
    assert len(labels) == 5 and all(label.endswith('{"precision": null}') for label in labels)
