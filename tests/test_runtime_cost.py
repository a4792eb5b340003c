"""What the decorator adds at run time: under jit, nothing but the kernel's own pallas_call;
eagerly, one jitted entry per kernel; on import, no tuner (Optuna)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

import autotune
from autotune import BestEntry, TuningDB
from autotune.device import current_device
from autotune.kernels import matmul

ROOT = Path(__file__).parent.parent


def store(db_url, kernel, args, config):
    device = current_device()
    key = kernel.spec.key(kernel.spec.signature(args, {}, device), device)
    with TuningDB(db_url) as db:
        db.put_best(key, BestEntry(config, time_s=1e-3, n_trials=1, run_id="r", strategy="grid"))
    autotune.configure()


def primitives(jaxpr):
    """Every primitive in a jaxpr, inner jaxprs included, except pallas_call's kernel body."""
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        if eqn.primitive.name != "pallas_call":
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                names += primitives(sub)
    return names


def test_jitted_call_holds_the_hand_configured_pallas_call_and_nothing_else(db_url):
    x, y = jnp.ones((128, 256)), jnp.ones((256, 128))
    tuned = {"block_m": 64, "block_n": 32, "block_k": 128}
    store(db_url, matmul, [x, y], tuned)
    assert matmul.explain(x, y)["source"] == "db"
    hand = jax.jit(
        functools.partial(matmul.spec.bound_function(tuned, interpret=False), interpret=True)
    )
    decorated = jax.make_jaxpr(lambda a, b: matmul(a, b))(x, y)
    by_hand = jax.make_jaxpr(lambda a, b: hand(a, b))(x, y)
    assert str(decorated) == str(by_hand)
    # no callback, no extra op: the kernel's custom VJP (its gradient) around its pallas_call
    assert primitives(decorated.jaxpr) == ["jit", "custom_vjp_call", "pallas_call"]
    assert "grid=(2, 4)" in str(decorated)  # 128/64 x 128/32
    np.testing.assert_allclose(jax.jit(lambda a, b: matmul(a, b))(x, y), x @ y, rtol=1e-5)


def test_import_and_runtime_path_do_not_load_the_tuner(subprocess_env):
    script = textwrap.dedent(
        """
        import sys
        import autotune
        assert "optuna" not in sys.modules and "autotune.tuning.tune" not in sys.modules
        import jax.numpy as jnp
        from autotune.kernels import vector_add
        x = jnp.ones(256)
        assert float(vector_add(x, x)[0]) == 2.0
        print(sorted(m for m in ("optuna", "autotune.tuning.tune", "autotune.tuning.kernel", "autotune.search") if m in sys.modules))
        """
    )
    env = dict(
        subprocess_env, PYTHONPATH=os.pathsep.join([str(ROOT), subprocess_env["PYTHONPATH"]])
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_eager_calls_serve_the_memo_and_respect_overrides(db_url):
    x, y = jnp.ones((64, 128)), jnp.ones((128, 64))
    store(db_url, matmul, [x, y], {"block_m": 32, "block_n": 32, "block_k": 64})
    np.testing.assert_allclose(matmul(x, y), x @ y, rtol=1e-5)  # resolves, fills the memo
    from autotune.runtime import state as runtime_state

    (key,) = [k for k in runtime_state.current().memo if k[0] is matmul]
    assert runtime_state.current().memo[key].config == {"block_m": 32, "block_n": 32, "block_k": 64}
    np.testing.assert_allclose(matmul(x, y), x @ y, rtol=1e-5)  # the hot path
    np.testing.assert_allclose(np.asarray(matmul(np.asarray(x), np.asarray(y))), x @ y, rtol=1e-5)
    memo = runtime_state.current().memo
    assert len([k for k in memo if k[0] is matmul]) == 1  # numpy: the same key
    text = str(jax.make_jaxpr(lambda a, b: matmul(a, b, block_m=64))(x, y))
    assert "grid=(1, 2)" in text  # caller's block_m=64 with the tuned block_n=32
