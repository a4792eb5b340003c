"""The tests that need several devices (tests/multidevice/), run in a child process given four
host CPU devices: XLA_FLAGS must be set before jax starts, and this process has started it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import FORCED_DEVICES

HERE = Path(__file__).parent


def test_the_multidevice_tests_pass_on_four_forced_host_devices(tmp_path, subprocess_env):
    env = {**subprocess_env, "XLA_FLAGS": FORCED_DEVICES}
    # a hang shows every thread's stack after 5 minutes, before the timeout ends the child
    # in the child's own process (-n 0): it is one worker of the suite already
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider"]
    cmd += ["-o", "faulthandler_timeout=300"]
    cmd += [f"--basetemp={tmp_path / 'child'}", str(HERE / "multidevice")]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    report = result.stdout[-8000:] + result.stderr[-4000:]
    assert result.returncode == 0, report
    assert " passed" in result.stdout and " skipped" not in result.stdout, report
