"""A transformer block's training step: every call tuned, every call at its default, plain JAX.

    python benchmarks/train_step.py [--batch 4 --seq 2048 --d-model 1024 --heads 16]
                                    [--dtype bfloat16] [--trials 12] [--time-limit S]
                                    [--rounds 20] [--budget-s S]
    python benchmarks/train_step.py --smoke     # tiny shapes on this host (interpret mode on a CPU)

The block is pre-norm attention and MLP: layer_norm, the QKV matmul, causal flash_attention,
the output matmul, rms_norm, two MLP matmuls (GELU between); the step is
jax.jit(jax.value_and_grad(loss)) over the block's weights. The script lists the step's
@autotuned calls from jax.ShapeDtypeStructs (autotune.calls_in: forward and backward kernels),
tunes them one after another (autotune.tune, `--trials` each within `--time-limit` seconds each,
into a throw-away database; each call's outcome printed as it is done), checks that
each call is then served from it, and times the step three ways in interleaved rounds (median
wall time of a synchronised call): every call at its default configuration (an empty
database), every call tuned, and the same block in plain JAX (jnp.dot, XLA's layer norm,
jax.nn.dot_product_attention, which XLA or cuDNN serves). It prints a table; the loss and
gradients of the three are compared first (autotune.measure.verify's tolerance). It exits 1 if a call
failed to tune, is not served from the database afterwards, or the step differs from plain JAX.

With `--budget-s` (the hardware check gives its step's share) the whole script keeps to it:
the timing at the end is set aside `TIMING_S`, and each call is given an equal part of what is
left when its turn comes (at most `--time-limit`); the calls no time is left for stay at their
defaults, each listed "not tuned: budget", and are no failure.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp


def init_params(d_model: int, dtype: Any, seed: int = 0, mlp: bool = True) -> dict[str, jax.Array]:
    keys = jax.random.split(jax.random.key(seed), 4)

    def dense(key: Any, n_in: int, n_out: int) -> jax.Array:
        return (jax.random.normal(key, (n_in, n_out), jnp.float32) / n_in**0.5).astype(dtype)

    ones, zeros = jnp.ones((d_model,), dtype), jnp.zeros((d_model,), dtype)
    params = {
        "ln_w": ones,
        "ln_b": zeros,
        "w_qkv": dense(keys[0], d_model, 3 * d_model),
        "w_o": dense(keys[1], d_model, d_model),
    }
    if mlp:
        params["rms_w"] = ones
        params["w_up"] = dense(keys[2], d_model, 4 * d_model)
        params["w_down"] = dense(keys[3], 4 * d_model, d_model)
    return params


def pallas_ops() -> dict[str, Any]:
    from autotune.kernels import flash_attention, layer_norm, matmul, rms_norm

    return {
        "layer_norm": layer_norm,
        "rms_norm": rms_norm,
        "matmul": matmul,
        "attention": functools.partial(flash_attention, causal=True),
    }


def jax_ops() -> dict[str, Any]:
    from autotune.kernels import layer_norm_reference, rms_norm_reference

    def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        # jax.nn's layout is [B, S, H, D]; XLA's or cuDNN's implementation, as JAX picks
        t = functools.partial(jnp.swapaxes, axis1=1, axis2=2)
        return t(jax.nn.dot_product_attention(t(q), t(k), t(v), is_causal=True))

    return {
        "layer_norm": layer_norm_reference,
        "rms_norm": rms_norm_reference,
        "matmul": lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype),
        "attention": attention,
    }


def block(params: dict[str, jax.Array], x: jax.Array, heads: int, ops: dict[str, Any]):
    """x [B, S, D] -> [B, S, D]: x + attention(layer_norm(x)), then + MLP(rms_norm(.)) where
    the weights have an MLP."""
    b, s, d = x.shape
    mm = ops["matmul"]
    h = ops["layer_norm"](x, params["ln_w"], params["ln_b"]).reshape(b * s, d)
    qkv = mm(h, params["w_qkv"]).reshape(b, s, 3, heads, d // heads)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # [B, H, S, D/H]
    a = ops["attention"](q, k, v).transpose(0, 2, 1, 3).reshape(b * s, d)
    x = x + mm(a, params["w_o"]).reshape(b, s, d)
    if "w_up" not in params:
        return x
    h = ops["rms_norm"](x, params["rms_w"]).reshape(b * s, d)
    return x + mm(jax.nn.gelu(mm(h, params["w_up"])), params["w_down"]).reshape(b, s, d)


def loss(params: dict[str, jax.Array], x: jax.Array, heads: int, ops: dict[str, Any]):
    return jnp.mean(block(params, x, heads, ops).astype(jnp.float32) ** 2)


def step(heads: int, ops: dict[str, Any]):
    """The training step's value and gradients: (loss, d loss / d params)."""
    return jax.value_and_grad(functools.partial(loss, heads=heads, ops=ops))


def program(
    batch: int, seq: int, d_model: int, heads: int, dtype: Any = jnp.float32, mlp: bool = True
):
    """(step, (params, x)) as jax.ShapeDtypeStructs: what autotune.calls_in reads."""
    params = jax.eval_shape(functools.partial(init_params, d_model, dtype, mlp=mlp))
    return step(heads, pallas_ops()), (params, jax.ShapeDtypeStruct((batch, seq, d_model), dtype))


def tiny():
    """A factory for `autotune calls` and `autotune tune --program`: the attention half of the
    block at small, odd sizes."""
    return program(batch=1, seq=12, d_model=16, heads=2, mlp=False)


# What the end of the script needs (seconds), set aside from --budget-s: three steps compiled
# (forward and backward; a guess on an accelerator: 15 s) and timed, the comparison.
TIMING_S = {"cpu": 15.0, "accelerator": 30.0}
CALL_OVERHEAD_S = 2.0  # a call's tuning besides its search: the oracle, storing (a guess)
MIN_SEARCH_S = 3.0  # less measures no candidate where a compile takes 1-2 s


def call_limit(left_s: float, calls_left: int, time_limit: float | None) -> float | None:
    """The search time of the next call when `left_s` seconds are left for the calls still to
    tune: an equal part, less what a call costs besides its search, at most `time_limit`, at
    least `MIN_SEARCH_S` (the calls first in the step are tuned then, the last may find no
    time); None where not even that is left."""
    if left_s < MIN_SEARCH_S + CALL_OVERHEAD_S:
        return None
    share = max(MIN_SEARCH_S, left_s / calls_left - CALL_OVERHEAD_S)
    return share if time_limit is None else min(share, time_limit)


def median_ms(fns: dict[str, Any], args: tuple, rounds: int) -> dict[str, float]:
    """Each function's median wall time per synchronised call, in interleaved rounds."""
    for fn in fns.values():
        jax.block_until_ready(fn(*args))  # compiled and warm
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        names = list(fns)[r % len(fns) :] + list(fns)[: r % len(fns)]
        for name in names:
            start = time.perf_counter()
            jax.block_until_ready(fns[name](*args))
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--trials", type=int, default=12, help="configurations measured per call")
    p.add_argument("--time-limit", type=float, help="seconds of search per call (default: none)")
    p.add_argument("--rounds", type=int, default=20, help="timed rounds of the three steps")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, 2 trials, 3 rounds")
    p.add_argument("--budget-s", type=float, help="the whole script's seconds (default: none)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    if args.smoke:
        args.batch, args.seq, args.d_model, args.heads = 1, 24, 32, 2
        args.dtype, args.trials, args.rounds = "float32", 2, 3
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # workers share the GPU
    import autotune
    from autotune.measure.verify import compare

    dtype = jnp.dtype(args.dtype)
    shape = (args.batch, args.seq, args.d_model)
    pallas_step, abstract = program(*shape, args.heads, dtype)
    with tempfile.TemporaryDirectory() as tmp:
        tuned_db, empty_db = os.path.join(tmp, "tuned.db"), os.path.join(tmp, "empty.db")
        autotune.configure(db=tuned_db)
        calls = autotune.calls_in(pallas_step, abstract)
        print(f"{len(calls)} @autotuned calls in the step at {shape} {args.dtype}:", flush=True)
        for c in calls:
            print(f"  {c.kernel:20s} {c.signature} {c.static}")
        tune_start = time.perf_counter()
        todo = [c for c in calls if c.source != "caller"]  # a caller's own blocks: not tuned
        platform = "cpu" if jax.default_backend() == "cpu" else "accelerator"
        failed, untuned = 0, set()
        for i, c in enumerate(todo):
            limit = args.time_limit
            if args.budget_s is not None:
                elapsed = time.perf_counter() - start
                limit = call_limit(
                    args.budget_s - elapsed - TIMING_S[platform], len(todo) - i, limit
                )
                if limit is None:
                    untuned.add((c.kernel, c.signature, c.static))
                    print(f"  not tuned: budget  {c.kernel} {c.signature} {c.static}", flush=True)
                    continue
            try:  # each call's row as it is done: a step stopped later keeps them
                r = autotune.tune(c.kernel, list(c.args), kwargs=c.kwargs, db=tuned_db,
                                  n_trials=args.trials, time_limit_s=limit, seed=0)  # fmt: skip
                speedup = f"{r.speedup:.2f}x" if r.speedup else "-"
                print(f"  tuned    {c.kernel} {c.signature} {c.static}: {r.best_time_s * 1e3:.4f} "
                      f"ms, {speedup} of the default, {len(r.trials)} trials, {r.wall_s:.1f} s",
                      flush=True)  # fmt: skip
            except autotune.AutotuneError as e:
                failed += 1
                print(f"  failed   {c.kernel} {c.signature} {c.static}: {e}"[:200], flush=True)
        tune_s = time.perf_counter() - tune_start
        after = autotune.calls_in(pallas_step, abstract)
        served = {c.source for c in after if (c.kernel, c.signature, c.static) not in untuned}
        print(f"tuned in {tune_s:.0f} s; afterwards the calls are served from: {sorted(served)}"
              + (f" ({len(untuned)} left at their defaults: budget)" if untuned else ""))  # fmt: skip

        params = init_params(args.d_model, dtype)
        x = jax.random.normal(jax.random.key(1), shape, jnp.float32).astype(dtype)
        tuned = jax.jit(step(args.heads, pallas_ops()))
        jax.block_until_ready(tuned(params, x))  # traced while the tuned database is served
        autotune.configure(db=empty_db)
        default = jax.jit(step(args.heads, pallas_ops()))
        jax.block_until_ready(default(params, x))
        plain = jax.jit(step(args.heads, jax_ops()))
        ref_loss, ref_grads = plain(params, x)
        ok = served <= {"db"} and not failed
        for name, fn in (("tuned", tuned), ("default", default)):
            value, grads = fn(params, x)
            # the project's tolerance (autotune.measure.verify), as a candidate is judged
            verdict = compare((value, grads), (ref_loss, ref_grads))
            ok = ok and verdict.ok
            print(f"{name}: loss {float(value):.6f} (plain JAX {float(ref_loss):.6f}), "
                  f"largest error {verdict.max_error:.2e} of {verdict.tolerance:.0e} allowed"
                  f"{'' if verdict.ok else ': DIFFERS ' + verdict.message}")  # fmt: skip
        times = median_ms({"tuned": tuned, "default": default, "plain JAX": plain}, (params, x),
                          args.rounds)  # fmt: skip
    device = jax.devices()[0].device_kind
    print(f"\ntraining step (forward + backward) on {device}, {shape} {args.dtype}, "
          f"heads {args.heads}, median of {args.rounds} rounds")  # fmt: skip
    print(f"| {'step':10s} | {'ms':>10s} | {'vs default':>10s} |")
    print(f"|{'-' * 12}|{'-' * 12}|{'-' * 12}|")
    for name, ms in times.items():
        print(f"| {name:10s} | {ms:10.3f} | {times['default'] / ms:9.2f}x |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
