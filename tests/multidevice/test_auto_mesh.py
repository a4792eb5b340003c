"""Kernels under `jax.jit` on a mesh whose axes are Auto (`jax.sharding.Mesh(devices, names)`, as
most model code builds it) of four host devices: XLA's partitioner runs each device's part, told
how by the kernel's `Split`, looked up at its local shape; where the batch-like axes are split
nothing is gathered, and a call that must gather says so once, and `calls_in` says which."""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import autotune
from autotune import Split, TuningDB
from autotune import kernels as K
from autotune.runtime.partitioned import sharding_rule

MESH = Mesh(np.array(jax.devices()), ("h",))


def _put(shape, spec, seed=0):
    # numpy's generator: jax.random compiles a program at each new shape, a second or more here
    x = np.random.default_rng(seed).standard_normal(shape, np.float32)
    return jax.device_put(x, NamedSharding(MESH, spec))


def _compiled(jitted, *args):
    """The program jit compiles for `args`, and how many all-gathers it holds."""
    compiled = jitted.lower(*args).compile()
    text = compiled.as_text()
    return compiled, text.count(" all-gather(") + text.count(" all-gather-start(")


def _split_as(array, spec):
    return array.sharding.is_equivalent_to(NamedSharding(MESH, spec), array.ndim)


def _misses(db_url):
    return {(m["kernel"], m["signature"]) for m in TuningDB(db_url).misses()}


def test_row_sharded_softmax_and_matmul_keep_their_rows_with_no_all_gather(db_url):
    # 256 rows: more than one block, so Pallas's interpreter runs a loop that XLA's partitioner
    # cannot split, and gathers where it is not told how (a device's kernel gathers always)
    x, w = _put((256, 32), P("h")), _put((32, 16), P(), seed=1)
    assert K.matmul.explain(x, w)["signature"] == "f32[64,32],f32[32,16]"
    for kernel, args, want in (
        (K.softmax, (x,), jax.nn.softmax(np.asarray(x), axis=-1)),
        (K.matmul, (x, w), np.asarray(x) @ np.asarray(w)),
    ):
        compiled, all_gathers = _compiled(jax.jit(kernel), *args)
        assert all_gathers == 0, kernel
        out = compiled(*args)
        assert _split_as(out, P("h"))
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    # looked up (and missed) at each device's shape, never at the global one
    assert _misses(db_url) == {("softmax", "f32[64,32]"), ("matmul", "f32[64,32],f32[32,16]")}


def _loss(ops, x, g, w):
    norm, matmul, softmax = ops
    return jnp.mean(softmax(matmul(norm(x, g), w)) ** 2)


LOCAL = {  # each device's 64 of the 256 rows: the forward's and the backward's calls
    ("rms_norm", "f32[64,32],f32[32]"),
    ("matmul", "f32[64,32],f32[32,16]"),
    ("softmax", "f32[64,16]"),
    ("softmax_bwd", "f32[64,16],f32[64,16]"),
    ("matmul", "f32[64,16],f32[16,32]"),  # dx = g w^T
    ("matmul", "f32[32,64],f32[64,16]"),  # this device's part of dw = x^T g, summed over h
    ("rms_norm_bwd", "f32[64,32],f32[32],f32[64,32]"),
}


def test_a_steps_gradients_are_plain_jaxs_and_calls_in_lists_each_devices_calls(db_url):
    x, g, w = _put((256, 32), P("h")), _put((32,), P(), seed=1), _put((32, 16), P(), seed=2)
    kernels = (K.rms_norm, K.matmul, K.softmax)
    step = jax.jit(jax.value_and_grad(functools.partial(_loss, kernels), argnums=(0, 1, 2)))

    # listed first (compiled, nothing run): each device's calls, and no miss counted, neither
    # by the listing nor against the step's real call after it
    calls = autotune.calls_in(step, (x, g, w))
    assert {(c.kernel, c.signature) for c in calls} == LOCAL
    assert {(tuple(c.mesh_axes.items()), c.gathered, c.count) for c in calls} == {
        ((("h", 4),), (), 1)  # each made once: the backward's recomputed forward is dead code
    }
    compiled, all_gathers = _compiled(step, x, g, w)
    value, grads = compiled(x, g, w)
    assert _misses(db_url) == LOCAL
    assert all_gathers == 0
    assert [_split_as(a, spec) for a, spec in zip(grads, (P("h"), P(), P()))] == [True] * 3
    reference = (K.rms_norm_reference, K.matmul_reference, lambda a: jax.nn.softmax(a, axis=-1))
    plain = jax.tree.map(np.asarray, (x, g, w))
    # under jit: one compile, not one for each operation of the step and its gradient
    plain_step = jax.jit(jax.value_and_grad(functools.partial(_loss, reference), argnums=(0, 1, 2)))
    want_value, want_grads = plain_step(*plain)
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    for got, want in zip(grads, want_grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def test_a_contracted_axis_sharded_is_gathered_with_one_warning_and_listed_so(caplog):
    x, y = _put((16, 64), P(None, "h")), _put((64, 8), P("h"), seed=1)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        outs = [jax.jit(K.matmul)(x, y) for _ in range(2)]
        K.matmul(x, y)  # eager: the same call, warned already
    for out in outs:
        np.testing.assert_allclose(out, np.asarray(x) @ np.asarray(y), rtol=1e-5, atol=1e-5)
    warned = [r.getMessage() for r in caplog.records if "gathered" in r.getMessage()]
    assert len(warned) == 2, warned  # x's axis 1 and y's axis 0, each once
    assert (
        "matmul: x's axis 1 (over mesh axis 'h') is gathered first on the mesh (h=4)" in (warned[0])
    )
    [call] = autotune.calls_in(K.matmul, (x, y))
    assert (call.signature, call.mesh_axes) == ("f32[16,64],f32[64,8]", {"h": 4})
    assert call.gathered == ("x's axis 1 (over mesh axis 'h')", "y's axis 0 (over mesh axis 'h')")


def test_under_vmap_a_call_runs_whole_as_before_and_says_so(caplog):
    x = _put((4, 16, 32), P("h"))
    with caplog.at_level(logging.WARNING, logger="autotune"):
        out = jax.jit(jax.vmap(K.softmax))(x)
    np.testing.assert_allclose(out, jax.nn.softmax(np.asarray(x), axis=-1), rtol=1e-5, atol=1e-6)
    assert any("under jax.vmap" in r.getMessage() for r in caplog.records)


def test_a_splits_sharding_rule_keeps_its_batch_like_factors_and_the_rest_whole_in_order():
    """Shardy refuses need_replication factors out of the order they first appear in."""
    attention = Split("bhsd,bhtd,bhtd->bhsd", along="bh")
    assert sharding_rule(attention, [4, 4, 4], [4]) == (
        "b h s d, b h t d, b h t d -> b h s d",
        {"need_replication_factors": ("s", "d", "t")},
    )
    rows = Split("...c,c->...c", along="...")
    assert sharding_rule(rows, [3, 1], [3]) == (
        "e1 e0 c, c -> e1 e0 c",
        {"need_replication_factors": ("c",)},
    )
    assert sharding_rule(None, [2], [1]) == (
        "i0d0 i0d1 -> o0d0",
        {"need_replication_factors": ("i0d0", "i0d1", "o0d0")},
    )


def test_on_an_auto_mesh_of_devices_this_host_lacks_calls_in_lists_the_global_call_and_why():
    mesh = jax.sharding.AbstractMesh((4,), ("h",), (jax.sharding.AxisType.Auto,))
    x = jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=NamedSharding(mesh, P("h")))
    w = jax.ShapeDtypeStruct((32, 16), jnp.float32, sharding=NamedSharding(mesh, P()))
    [call] = autotune.calls_in(jax.jit(K.matmul), (x, w))
    assert (call.signature, call.mesh_axes, call.source) == ("f32[64,32],f32[32,16]", {}, "default")
    assert "XLA splits it only when it compiles the program" in call.detail
