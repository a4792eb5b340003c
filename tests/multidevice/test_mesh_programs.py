"""Programs on a mesh of four host devices: `calls_in`, `tune_program` and `autotune calls` /
`tune --program` list and tune the local shapes each device's kernel runs, say the mesh axes
each call is mapped over, and the runtime then serves those keys."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import autotune
from autotune.cli import main
from autotune.kernels import matmul, rms_norm

F32 = jnp.float32
S = jax.ShapeDtypeStruct
MESH = jax.make_mesh((4,), ("d",))
ROWS = NamedSharding(MESH, P("d"))
SAME = NamedSharding(MESH, P())


def _loss(x, g, w):
    return jnp.mean(matmul(rms_norm(x, g), w) ** 2)


def sharded_jit_step():
    """A factory for the CLI: the step under jit, its x's rows sharded over the devices."""
    args = (S((64, 32), F32, sharding=ROWS), S((32,), F32, sharding=SAME))
    return jax.jit(jax.grad(_loss, argnums=(0, 1, 2))), (*args, S((32, 16), F32, sharding=SAME))


def _shard_map_step():
    """The same step under `jax.shard_map` (check_vma on): each device's loss averaged."""

    def local(x, g, w):
        return jax.lax.pmean(_loss(x, g, w), "d")

    mapped = jax.shard_map(
        jax.grad(local, argnums=(0, 1, 2)),
        mesh=MESH,
        in_specs=(P("d"), P(), P()),
        out_specs=(P("d"), P(), P()),
    )
    return jax.jit(mapped)


LOCAL = {  # each device's 16 of the 64 rows: the forward's and the backward's calls
    ("rms_norm", "f32[16,32],f32[32]"),
    ("matmul", "f32[16,32],f32[32,16]"),
    ("matmul", "f32[16,16],f32[16,32]"),  # dx = g w^T
    ("matmul", "f32[32,16],f32[16,16]"),  # this device's part of dw = x^T g
    ("rms_norm_bwd", "f32[16,32],f32[32],f32[16,32]"),
}


def test_a_step_on_a_mesh_lists_tunes_and_is_then_served_its_local_calls():
    step, args = sharded_jit_step()
    with jax.set_mesh(MESH):
        for program in (step, _shard_map_step()):
            calls = autotune.calls_in(program, args)
            assert {(c.kernel, c.signature) for c in calls} == LOCAL
            assert {json.dumps(c.mesh_axes) for c in calls} == {'{"d": 4}'}
            assert {c.source for c in calls} == {"default"}

        outcomes = autotune.tune_program(step, args, n_trials=1, finalists=0)
        assert [o.status for o in outcomes] == ["tuned"] * len(LOCAL), [o.detail for o in outcomes]
        for program in (step, _shard_map_step()):
            assert {c.source for c in autotune.calls_in(program, args)} == {"db"}

        # the step runs served from the database: the gradients plain JAX's
        arrays = [  # numpy's generator: jax.random compiles a program at each new shape
            jax.device_put(
                np.random.default_rng(i).standard_normal(a.shape, np.float32), a.sharding
            )
            for i, a in enumerate(args)
        ]
        grads = step(*arrays)
    assert grads[0].sharding.spec == P("d", None)
    plain = [np.asarray(a) for a in arrays]
    ref = jax.jit(  # one compile, not one for each operation of the step and its gradient
        jax.grad(
            lambda x, g, w: jnp.mean((autotune.kernels.rms_norm_reference(x, g) @ w) ** 2),
            argnums=(0, 1, 2),
        )
    )(*plain)
    for got, want in zip(grads, ref):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_the_cli_lists_and_tunes_a_sharded_step_at_each_devices_shape(capsys, db_url):
    program = f"{__name__}:sharded_jit_step"
    assert main(["calls", program, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["kernel"], r["signature"]) for r in rows} == LOCAL
    assert {json.dumps(r["mesh_axes"]) for r in rows} == {'{"d": 4}'}
    assert main(["calls", program]) == 0
    table = capsys.readouterr().out
    assert "mesh_axes" in table and "d=4" in table

    tune = ["tune", "--program", program, "--no-isolate", "--trials", "1", "--db", db_url]
    assert main([*tune, "--shard", "0/5"]) == 0, capsys.readouterr()
    assert "1 tuned, 0 skipped, 0 failed" in capsys.readouterr().out
    assert main(["calls", program, "--format", "json"]) == 0
    served = [r["source"] for r in json.loads(capsys.readouterr().out)]
    assert served == ["db"] + ["default"] * (len(LOCAL) - 1)
