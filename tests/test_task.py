"""A Task is the one value every source of tuning work builds: the same task from each source
(command-line flags, a job file, a recorded miss, a program's call) is the same value."""

import jax
import jax.numpy as jnp
import pytest

from autotune.cli.common import parse_static
from autotune.db import TuningDB
from autotune.device import current_device
from autotune.errors import SignatureError
from autotune.registry import resolve
from autotune.service.jobfile import load_job
from autotune.service.pending import pending_tasks
from autotune.tuning.task import make_task, task_of_call

JOB = """
[[task]]
kernel = "rms_norm"
shapes = ["8x128,128"]
static = { eps = 1e-5 }
"""


def test_every_source_builds_the_same_task(tmp_path):
    rms_norm = resolve("rms_norm")
    x, w = jnp.ones((8, 128)), jnp.ones((128,))
    from_call = task_of_call(rms_norm, [x, w], {"eps": 1e-5})
    structs = [jax.ShapeDtypeStruct((8, 128), jnp.float32), jax.ShapeDtypeStruct((128,), "f4")]
    from_structs = task_of_call("rms_norm", structs, {"eps": 1e-5})
    from_flags = make_task("rms_norm", "8x128,128", "f32", parse_static(["eps=1e-5"]))
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    (from_job,) = load_job(job)
    device = current_device()
    spec = rms_norm.spec
    key = spec.key(spec.signature([x, w], {"eps": 1e-5}, device), device)
    with TuningDB(tmp_path / "tuning.db") as db:
        db.record_miss(key)
        (from_miss,), unknown = pending_tasks(db, device)
    assert unknown == {}
    assert from_call == from_structs == from_flags == from_job == from_miss
    assert from_call.label == 'rms_norm f32[8,128],f32[128] {"eps": 1e-05}'
    assert len({from_call, from_flags, from_miss}) == 1  # hashable: misses group by task


def test_a_call_with_a_non_array_argument_is_refused():
    with pytest.raises(SignatureError, match="pass static arguments in kwargs="):
        task_of_call("rms_norm", [jnp.ones((8, 128)), 1e-5])
