"""The working directory: kernels named 'module:function' are found there, but a module there
never shadows an installed one, and no module there runs unless named (JAX looks for libtpu and
jax_plugins on the path), in the CLI or in its device worker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import TuningDB

SHADOW = 'raise SystemExit("the working directory shadowed an installed module")\n'


def plant_modules_jax_looks_for(folder: Path) -> None:
    """What JAX imports from the path when it exists: each, if run, leaves a file named PWNED*."""
    (folder / "libtpu.py").write_text('open("PWNED-libtpu", "w").close()\nraise ImportError\n')
    (folder / "jax_plugins").mkdir()
    (folder / "jax_plugins" / "planted.py").write_text('open("PWNED-plugin", "w").close()\n')


def test_no_module_in_the_working_directory_runs_unless_named(tmp_path, subprocess_env):
    plant_modules_jax_looks_for(tmp_path)
    (tmp_path / "mykernels.py").write_text(  # starts JAX's backends after it was imported
        "import jax\nfrom toy_kernels import scale as k\njax.devices()\n"
    )
    (tmp_path / "helper.py").write_text("")
    (tmp_path / "needs_helper.py").write_text("import helper\n")
    env = {k: v for k, v in subprocess_env.items() if k != "JAX_PLATFORMS"}  # JAX probes a TPU
    autotune_cli = Path(sys.executable).parent / "autotune"

    def run(*args):
        return subprocess.run(
            [autotune_cli, *args], cwd=tmp_path, env=env, capture_output=True, text=True
        )

    listed = run("kernels")
    assert listed.returncode == 0, listed.stderr
    assert sorted(p.name for p in tmp_path.glob("PWNED*")) == []
    named = run("kernels", "--import", "mykernels")
    assert named.returncode == 0, named.stderr
    assert "scale" in named.stdout
    sibling = run("kernels", "--import", "needs_helper")
    assert sibling.returncode == 2
    assert "No module named 'helper'" in sibling.stderr and "PYTHONPATH" in sibling.stderr
    assert sorted(p.name for p in tmp_path.glob("PWNED*")) == []


@pytest.mark.slow
def test_a_jax_py_in_the_working_directory_is_never_imported(tmp_path, subprocess_env):
    (tmp_path / "jax.py").write_text(SHADOW)
    (tmp_path / "rich.py").write_text(SHADOW)
    (tmp_path / "mykernels.py").write_text("from toy_kernels import scale as k\n")
    plant_modules_jax_looks_for(tmp_path)
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
    assert sorted(p.name for p in tmp_path.glob("PWNED*")) == []  # nor in the worker child


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
    assert not Path(subprocess_env["PALLAS_AUTOTUNE_DB"]).exists()  # nor in a fresh home
