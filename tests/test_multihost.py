"""Every process of a multi-host job picks the same configuration for the same call: exact hits
and the nearest-shape fallback are deterministic, ties broken by the signature text."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from toy_kernels import make_input, scale

import autotune
from autotune import BestEntry, TuningDB
from autotune.device import current_device

READER = textwrap.dedent(
    """
    import json
    from toy_kernels import make_input, scale
    out = {}
    for rows in (16, 64, 80):
        info = scale.explain(make_input(rows=rows))
        out[rows] = [info["source"], info["config"], info["detail"]]
    print(json.dumps(out))
    """
)


def store(path, rows, block_rows):
    x = make_input(rows=rows)
    key = scale.spec.key(scale.spec.signature([x], {}, current_device()), current_device())
    entry = BestEntry(
        {"block_rows": block_rows}, time_s=1e-3, n_trials=1, run_id="r", strategy="grid"
    )
    with TuningDB(path) as db:
        db.put_best(key, entry)


def test_two_processes_choose_the_same_config_including_a_tie(tmp_path, subprocess_env):
    path = tmp_path / "shared.db"
    # 64 rows lie exactly between 32 and 128 (one doubling each way): a tie
    for rows, block in ((32, 16), (128, 32), (16, 8)):
        store(path, rows, block)
    env = dict(subprocess_env, PALLAS_AUTOTUNE_DB=str(path))
    hosts = [
        subprocess.Popen([sys.executable, "-c", READER], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [json.loads(h.communicate(timeout=120)[0]) for h in hosts]
    assert outs[0] == outs[1]
    choice = outs[0]
    assert choice["16"] == ["db", {"block_rows": 8}, ""]
    # the tie goes to the smaller signature text: "f32[128,128]" < "f32[32,128]"
    assert choice["64"] == ["nearest", {"block_rows": 32}, "tuned for f32[128,128]"]

    # the same answer from a database filled in the opposite order
    other = tmp_path / "reversed.db"
    for rows, block in ((16, 8), (128, 32), (32, 16)):
        store(other, rows, block)
    autotune.configure(db=other)
    for rows in (16, 64, 80):
        info = scale.explain(make_input(rows=rows))
        assert [info["source"], info["config"], info["detail"]] == choice[str(rows)]
