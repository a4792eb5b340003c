"""Variant groups: tuned, a group serves its fastest member; untuned, its first that can run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autotune
from autotune import TuningDB
from autotune.db.check import check_database
from autotune.device import current_device
from autotune.errors import KernelError
from autotune.kernels import attention_reference, attention_variants, matmul, matmul_variants

# big enough that interpret mode's grid loop shows; odd, so that every block is clamped or padded
X_SHAPE, Y_SHAPE = (200, 136), (136, 72)


def only_16_bit(x, y):
    """A member that refuses float32, as a 16-bit-only kernel does when traced."""
    if x.dtype == jnp.float32:
        raise NotImplementedError(f"only 16-bit inputs, got {x.dtype=}")
    return jnp.dot(x, y)


def test_a_tuned_group_of_matmul_and_xla_serves_xla_on_a_cpu(db_url, tmp_path):
    group = autotune.variants("matmul_or_dot", [matmul, jnp.dot])
    args = [jax.ShapeDtypeStruct(X_SHAPE, jnp.float32), jax.ShapeDtypeStruct(Y_SHAPE, jnp.float32)]
    result = autotune.tune(group, args, n_trials=2, db=db_url)

    # interpret mode loops over the grid; XLA's dot is one fused op: the honest answer
    assert result.winner == "dot" and [f.config["variant"] for f in result.finalists][0] == "dot"
    assert set(result.members) == {"matmul", "dot"} and result.members["dot"] is None
    # numpy's generator: jax.random compiles a program at each new shape
    x = jnp.asarray(np.random.default_rng(1).standard_normal(X_SHAPE, np.float32))
    y = jnp.asarray(np.random.default_rng(2).standard_normal(Y_SHAPE, np.float32))
    got = group.explain(x, y)
    assert (got["variant"], got["config"], got["source"]) == ("dot", {}, "db")
    with TuningDB(db_url) as db:
        entries = {r.key.kernel: r for r in db.query()}
    assert entries["matmul_or_dot"].config == {"variant": "dot"}
    assert entries["matmul"].config == result.members["matmul"].best_config  # beside it
    assert check_database(db_url)[0] == []  # the group's entry is one db check trusts

    want = np.asarray(x) @ np.asarray(y)
    np.testing.assert_allclose(jax.jit(group)(x, y), want, rtol=1e-4, atol=1e-4)
    grad = jax.grad(lambda x: group(x, y).sum())(x)
    np.testing.assert_allclose(grad, np.broadcast_to(np.asarray(y).sum(1), X_SHAPE), rtol=1e-4)
    forced = group.explain(x, y, variant="matmul")
    assert forced["variant"] == "matmul" and forced["source"] == "caller"

    autotune.configure(db=tmp_path / "elsewhere.db")  # a user without these entries
    assert group.explain(x, y)["variant"] == "matmul"  # untuned: the first member
    with autotune.overlay(result):  # the group's choice and its members' entries
        got = group.explain(x, y, variant="matmul")
        assert got["member"]["source"] == "overlay"
        assert got["config"] == result.members["matmul"].best_config
        assert group.explain(x, y)["variant"] == "dot"


def test_an_untuned_group_serves_its_first_member_that_can_run_under_jit_and_grad(caplog):
    def needs_hopper(device):
        return f"a Mosaic GPU kernel needs a Hopper GPU; this call runs on {device.platform}"

    group = autotune.variants(
        "guarded_dot",
        [
            autotune.Member(jnp.dot, name="mgpu", why_not=needs_hopper),
            only_16_bit,
            autotune.Member(lambda x, y: x @ y, name="xla"),
        ],
    )
    x, y = jnp.arange(15.0).reshape(3, 5), jnp.ones((5, 2))
    with caplog.at_level("WARNING", logger="autotune.runtime.state"):
        got = group.explain(x, y)
    assert (got["variant"], got["source"]) == ("xla", "default")
    # a member that raised is said once (perhaps a bug of its own); one that declined is not
    (warning,) = [r.getMessage() for r in caplog.records if "guarded_dot" in r.getMessage()]
    assert "member only_16_bit raised when traced (NotImplementedError: only 16-bit" in warning
    assert warning.endswith("; calling xla") and "mgpu" not in warning
    assert got["skipped"]["mgpu"] == needs_hopper(current_device())
    assert "NotImplementedError: only 16-bit inputs" in got["skipped"]["only_16_bit"]
    assert group.explain(x.astype(jnp.bfloat16), y.astype(jnp.bfloat16))["variant"] == "only_16_bit"

    def loss(x):
        return jnp.sum(group(x, y) ** 2)

    np.testing.assert_allclose(jax.jit(jax.grad(loss))(x), 2 * (x @ y) @ y.T, rtol=1e-6)


def test_a_chosen_member_that_cannot_run_here_gives_way_with_one_warning(caplog):
    group = autotune.variants("picky_dot", [only_16_bit, autotune.Member(jnp.dot, name="xla")])
    x, y = jnp.ones((4, 3)), jnp.ones((3, 2))
    entry = {**group.explain(x, y)["key"], "config": {"variant": "only_16_bit"}, "time_s": 1e-6}
    caplog.clear()  # untuned, the group said that its first member raised when traced
    with autotune.overlay([entry]), caplog.at_level("WARNING", logger="autotune.runtime.state"):
        got = group.explain(x, y)
        np.testing.assert_allclose(group(x, y), x @ y)
    assert (got["variant"], got["source"]) == ("xla", "default")
    (warning,) = [r.getMessage() for r in caplog.records if "picky_dot" in r.getMessage()]
    assert "the overlay entry chose only_16_bit, which cannot run here" in warning


def test_a_group_with_no_member_that_can_run_says_why_each_cannot():
    group = autotune.variants("sixteen_bit_only", [only_16_bit])
    with pytest.raises(KernelError, match="no member of variant group 'sixteen_bit_only'.*only 16"):
        group(jnp.ones((2, 2)), jnp.ones((2, 2)))


@pytest.mark.parametrize(
    "members, message",
    [
        ([jnp.dot, jnp.dot], "two members named 'dot'"),
        ([lambda x, y: x @ y], "no usable name"),
        ([], "has no members"),
    ],
)
def test_a_bad_group_is_refused_with_the_fix(members, message):
    with pytest.raises(KernelError, match=message):
        autotune.variants("bad_group", members)


def test_a_group_may_not_hide_a_kernel_of_its_name():
    with pytest.raises(KernelError, match="would hide the kernel of that name"):
        autotune.variants("matmul", [matmul, jnp.dot])
    assert autotune.registry.resolve("matmul") is matmul


def test_the_shipped_groups_skip_mosaic_gpu_and_cudnn_here_and_reconcile_layouts():
    q = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 17, 16), np.float32))
    # [B, H, S, D], odd S; numpy's generator: jax.random compiles a program at each new shape
    k, v = q[:, :, :13] * 0.5, q[:, :, :13] + 1.0
    got = attention_variants.explain(q, k, v, causal=True)
    assert got["variant"] == "flash_attention" and "Hopper" in got["skipped"]["attention_mgpu"]
    # cuDNN's attention is a member of its own (jax.nn's implementation="cudnn"), XLA's another
    assert list(attention_variants.members) == [
        "flash_attention",
        "attention_mgpu",
        "splash_attention",
        "triton_attention",
        "cudnn",
        "xla",
    ]
    assert got["skipped"]["cudnn"] == "cuDNN runs on NVIDIA GPUs; this call runs on cpu"
    # JAX's TPU and GPU attentions serve their own platforms (interpret mode is for checking)
    assert got["skipped"]["splash_attention"] == "a TPU kernel; this call runs on cpu"
    assert got["skipped"]["triton_attention"] == "a GPU kernel; this call runs on cpu"
    want = attention_reference(q, k, v, causal=True, sm_scale=0.3)
    out = attention_variants(q, k, v, causal=True, sm_scale=0.3, variant="xla")
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    x = jnp.ones((5, 7))
    assert "Hopper" in matmul_variants.explain(x, x.T)["skipped"]["matmul_mgpu"]
    np.testing.assert_allclose(matmul_variants(x, x.T, variant="xla"), x @ x.T)


def test_a_forced_group_task_tunes_its_members_afresh(tmp_path, db_url):
    from toy_kernels import scale

    from autotune.service.jobs import run_tasks
    from autotune.tuning.settings import TuneSettings
    from autotune.tuning.task import make_task

    autotune.variants("forced_scale", [scale, autotune.Member(lambda x: x * 2.0, name="xla")])
    task = make_task("forced_scale", "32x128", trials=2, strategy="grid")
    settings = TuneSettings(storage=f"sqlite:///{tmp_path / 'studies.db'}")
    with TuningDB(db_url) as db:
        (first,) = run_tasks([task], current_device(), db=db, settings=settings)
        (skipped,) = run_tasks([task], current_device(), db=db, settings=settings)
        (forced,) = run_tasks([task], current_device(), db=db, settings=settings, force=True)
    assert (first.status, skipped.status, forced.status) == ("tuned", "skipped", "tuned")
    # the member's own study was deleted with the group's: nothing of the first run resumed
    assert first.result.members["scale"].resumed == 0
    assert forced.result.members["scale"].resumed == 0
    assert len(forced.result.members["scale"].trials) == 2


def test_a_groups_tuning_tells_of_each_member_as_it_is_done(db_url):
    # what lets a script show each member's row before the group's side by side ends
    from autotune.tuning.context import TuneContext
    from autotune.tuning.settings import TuneSettings
    from autotune.tuning.task import bind, kernel_of, task_of_call
    from autotune.tuning.tune import tune_task

    group = autotune.variants("matmul_dot_or_16_bit", [matmul, jnp.dot, only_16_bit])
    args = [
        jax.ShapeDtypeStruct((40, 24), jnp.float32),
        jax.ShapeDtypeStruct((24, 16), jnp.float32),
    ]
    heard = []

    def member_done(name, result, why):
        heard.append((name, None if result is None else result.best_config, why))

    settings = TuneSettings().replace(n_trials=2, seed=0)
    task = task_of_call(group, args, {}, settings)
    bound = bind(task, current_device(), kernel_of(group), args)
    result = tune_task(bound, TuneContext(settings, db_url, member_done=member_done))
    assert [name for name, _, _ in heard] == ["matmul", "dot"]  # in order, before the end
    assert heard[0][1] == result.members["matmul"].best_config and heard[0][2] is None
    assert heard[1] == ("dot", None, None)  # a plain member: nothing to tune
    assert "only_16_bit" in result.skipped  # judged unable to run: never tuned, never heard
