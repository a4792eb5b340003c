"""JAX's megablox gmm and splash attention, registered unedited: tuned on this CPU (interpret
mode), verified before anything is stored, served in a fresh process through their look-up
hooks; a tiling that skips a group is rejected; the group sizes they are tuned on."""

import functools
import importlib
import json
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import autotune
from autotune import TuningDB
from autotune.errors import SettingsError
from autotune.kernels import megablox_gmm, ragged_dot
from autotune.kernels.megablox import workloads
from autotune.measure.inputs import task_inputs

S = jax.ShapeDtypeStruct
GMM = [S((32, 128), "float32"), S((4, 128, 128), "float32"), S((4,), "int32")]
SPLASH = [S((1, 2, 256, 128), "float32")] * 3
megablox_module = importlib.import_module("autotune.kernels.megablox.megablox")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One database with megablox_gmm (skewed group sizes) and splash_attention tuned in it,
    at the smallest budgets."""
    url = str(tmp_path_factory.mktemp("tuned") / "tuning.db")
    quick = dict(db=url, n_trials=2, strategy="random", seed=0, finalists=0, warm_start=False)
    gmm = autotune.tune("megablox_gmm", GMM, workload="skewed", **quick)
    splash = autotune.tune("splash_attention", SPLASH, kwargs={"causal": True}, **quick)
    return url, gmm, splash


def test_tuned_entries_are_verified_and_record_their_workload(tuned):
    url, gmm, splash = tuned
    with TuningDB(url) as db:
        (entry,) = db.query(kernel="megablox_gmm")
        assert entry.config == gmm.best_config
        trials = db.trials(kernel="megablox_gmm")
        assert {t.workload for t in trials} == {"skewed"}
        assert {t.oracle for t in trials} == {"interpret"} and all(t.status == "ok" for t in trials)
        (entry,) = db.query(kernel="splash_attention")
        assert entry.config == splash.best_config
        assert {t.workload for t in db.trials(kernel="splash_attention")} == {None}


def test_a_fresh_process_serves_the_entries_and_the_look_up_hooks_return_them(
    tuned, subprocess_env
):
    url, gmm, splash = tuned
    program = textwrap.dedent(
        """
        import json, jax
        from autotune.kernels import megablox_gmm, splash_attention, TunedTiling
        from autotune.kernels import tuned_block_sizes
        S = jax.ShapeDtypeStruct
        gmm = [S((32, 128), "float32"), S((4, 128, 128), "float32"), S((4,), "int32")]
        qkv = [S((1, 2, 256, 128), "float32")] * 3
        blocks = tuned_block_sizes(1, 2, 256, 256, 128, "float32", causal=True)
        print(json.dumps({
            "gmm": megablox_gmm.explain(*gmm)["source"],
            "splash": splash_attention.explain(*qkv, causal=True)["source"],
            "tiling": TunedTiling(num_groups=4)(32, 128, 128),
            "blocks": [blocks.block_q, blocks.block_kv, blocks.block_kv_compute],
        }))
        """
    )
    env = {**subprocess_env, "PALLAS_AUTOTUNE_DB": url}
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    served = json.loads(done.stdout.strip().splitlines()[-1])
    assert served["gmm"] == served["splash"] == "db"
    best = gmm.best_config
    assert served["tiling"] == [best["tm"], best["tk"], best["tn"]]
    best = splash.best_config
    assert served["blocks"] == [best["block_q"], best["block_kv"], best["block_kv_compute"]]


def test_a_tiling_that_skips_a_group_is_rejected(monkeypatch, db_url):
    # JAX's gmm with a bug planted at tm=8: the rows of group 1 are never computed
    real = megablox_module._jax_gmm()

    class Planted:
        @staticmethod
        def gmm(lhs, rhs, group_sizes, *, tiling, **kwargs):
            out = real.gmm(lhs, rhs, group_sizes, tiling=tiling, **kwargs)
            if tiling[0] != 8:
                return out
            group = megablox_module.group_ids(group_sizes, lhs.shape[0])
            return jax.numpy.where((group == 1)[:, None], 0, out)

    monkeypatch.setattr(megablox_module, "_jax_gmm", lambda: Planted)
    args = [S((32, 16), "float32"), S((4, 16, 16), "float32"), S((4,), "int32")]
    result = autotune.tune(megablox_gmm, args, n_trials=3, strategy="grid", finalists=0)
    by_tm = {t.config["tm"]: t for t in result.trials}
    assert set(by_tm) == {8, 16, 32}
    assert by_tm[8].status == "rejected" and "max relative error" in by_tm[8].error
    assert by_tm[16].status == by_tm[32].status == "ok"
    (entry,) = TuningDB(db_url).query(kernel="megablox_gmm")
    assert entry.config["tm"] != 8 and entry.n_rejected == 1


def test_group_sizes_are_balanced_or_skewed_and_sum_to_at_most_m():
    rng = np.random.default_rng(0)
    even = workloads.balanced(30, 4, rng)
    assert even.tolist() == [8, 8, 7, 7]
    sizes = workloads.skewed(64, 8, rng)
    assert sizes.sum() <= 64 and sizes.max() >= 3 * np.median(sizes) and (sizes >= 0).all()
    made = task_inputs(megablox_gmm.spec, GMM, seed=1)
    assert made[2].dtype == np.int32 and made[2].tolist() == [8, 8, 8, 8]  # the default
    given = np.array([1, 2, 3, 4], np.int32)  # a caller's own group sizes are its workload
    assert task_inputs(megablox_gmm.spec, [*GMM[:2], given])[2].tolist() == [1, 2, 3, 4]


def test_an_unknown_workload_is_one_line_naming_the_kernels_own():
    with pytest.raises(
        SettingsError, match="'decode' is not a workload of megablox_gmm .*balanced, skewed"
    ):
        task_inputs(megablox_gmm.spec, GMM, workload="decode")


@pytest.mark.parametrize("workload", ["balanced", "skewed"])
def test_ragged_dot_gradient_matches_plain_jax_through_every_member_here(workload):
    lhs, rhs, sizes = task_inputs(ragged_dot.spec, GMM, seed=2, workload=workload)
    members, skipped = ragged_dot.runnable([lhs, rhs, sizes], {})
    assert [m.name for m in members] == ["megablox_gmm", "xla"]  # served on this CPU
    assert set(skipped) == {"ragged_dot_mgpu", "grouped_matmul"}  # GPU members
    # every member whose kernel runs here: the GPUs' Triton one in interpret mode too
    names = ["megablox_gmm", "grouped_matmul", "xla"]

    def loss(fn):
        return lambda a, b: (fn(a, b) ** 2).sum()

    plain = jax.grad(
        loss(lambda a, b: jax.lax.ragged_dot(a, b, sizes, precision="highest")), (0, 1)
    )
    expected = plain(lhs, rhs)
    for name in names:
        member = functools.partial(ragged_dot, group_sizes=sizes, variant=name)
        got = jax.grad(loss(member), (0, 1))(lhs, rhs)
        for g, e in zip(got, expected):
            assert float(np.abs(g - e).max() / np.abs(e).max()) <= 1e-5, name


def test_the_ragged_dot_group_is_tuned_on_the_workload_and_its_trials_say_which(db_url):
    args = [S((32, 16), "float32"), S((4, 16, 16), "float32"), S((4,), "int32")]
    autotune.tune(ragged_dot, args, workload="skewed", n_trials=1, finalists=0)
    with TuningDB(db_url) as db:
        assert {e.key.kernel for e in db.query()} == {"ragged_dot", "megablox_gmm"}
        for kernel in ("ragged_dot", "megablox_gmm"):
            assert {t.workload for t in db.trials(kernel=kernel)} == {"skewed"}, kernel


def test_the_tpu_constraints_admit_what_lowers_for_a_tpu():
    # JAX's tgmm swaps its lhs to [m, k]: a tm of 8 rows is a sublane block, as gmm's
    from autotune.kernels import megablox_tgmm
    from autotune.measure.lowering import check_space

    bf16 = "bfloat16"
    cases = {
        megablox_gmm: [S((2048, 1024), bf16), S((8, 1024, 512), bf16), S((8,), "int32")],
        megablox_tgmm: [S((1024, 2048), bf16), S((2048, 512), bf16), S((8,), "int32")],
    }
    for kernel, args in cases.items():
        rows = check_space(kernel, args, {}, "tpu", sample=6)
        accepted = [r for r in rows if r.accepted]
        assert 8 in {r.config["tm"] for r in accepted}
        assert [r.config for r in accepted if r.lowering_error] == []


def test_the_tiling_hook_follows_overlays_and_falls_back_like_a_call():
    from autotune.kernels import TunedTiling

    args = [S((32, 16), "float32"), S((4, 16, 16), "float32"), S((4,), "int32")]
    hook = TunedTiling(num_groups=4)
    default = megablox_gmm.explain(*args)
    assert default["source"] == "default"
    assert hook(32, 16, 16) == tuple(default["config"][f] for f in ("tm", "tk", "tn"))
    result = autotune.tune(megablox_gmm, args, n_trials=2, strategy="grid", store=False)
    best = tuple(result.best_config[f] for f in ("tm", "tk", "tn"))
    with autotune.overlay(result):
        assert hook(32, 16, 16) == best
        lhs = np.ones((32, 16), np.float32)
        rhs = np.ones((4, 16, 16), np.float32)
        sizes = np.array([8, 8, 8, 8], np.int32)
        gmm = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm").gmm
        out = gmm(lhs, rhs, sizes, tiling=hook, interpret=True)  # JAX's, served the overlay's
        assert np.array_equal(np.asarray(out), np.full((32, 16), 16.0))
