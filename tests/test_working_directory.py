"""The working directory: kernels named 'module:function' are found there, but a module there
never shadows an installed one, in the CLI or in its device worker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import TuningDB

SHADOW = 'raise SystemExit("the working directory shadowed an installed module")\n'


@pytest.mark.slow
def test_a_jax_py_in_the_working_directory_is_never_imported(tmp_path, subprocess_env):
    (tmp_path / "jax.py").write_text(SHADOW)
    (tmp_path / "rich.py").write_text(SHADOW)
    (tmp_path / "mykernels.py").write_text("from toy_kernels import scale as k\n")
    autotune_cli = Path(sys.executable).parent / "autotune"
    db = tmp_path / "t.db"
    proc = subprocess.run(
        [autotune_cli, "tune", "mykernels:k", "--shape", "32x128", "--trials", "1"]
        + ["--finalists", "0", "--db", str(db)],
        cwd=tmp_path,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with TuningDB(db) as handle:
        assert [e.key.kernel for e in handle.query()] == ["scale"]


def test_a_program_is_found_in_the_working_directory_but_never_shadows_jax(
    tmp_path, subprocess_env
):
    (tmp_path / "jax.py").write_text(SHADOW)
    (tmp_path / "myprog.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "from toy_kernels import scale\n"
        "def factory():\n"
        "    return scale, (jax.ShapeDtypeStruct((32, 128), jnp.float32),)\n"
    )
    autotune_cli = Path(sys.executable).parent / "autotune"
    proc = subprocess.run(
        [autotune_cli, "calls", "myprog:factory", "--format", "json"],
        cwd=tmp_path,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [c["kernel"] for c in json.loads(proc.stdout)] == ["scale"]
