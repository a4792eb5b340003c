"""Every code block of README.md runs as written.

README's convention (its "Layout" section says it too): a ```python block runs in a fresh
Python process, after the blocks it continues (each marked `<!-- continues -->` on the line
above its fence, invisible once rendered); a block marked `<!-- not run: REASON -->` is skipped
with that reason; ```toml blocks are parsed; shell and plain blocks are not run (the CLI's own
tests run its commands). Where a block's sizes would take minutes on a CPU, the test runs it
smaller: SMALLER says where, and each of its texts must be in the README.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)  # in a list too
MARK = re.compile(r"<!-- (continues|not run: (.+?)) -->\s*\Z")

# (text in a block, what the test runs instead): the README's sizes, cut for a CPU; one trial
# still runs the whole path (oracle, verification, storing, serving) that the examples show
SMALLER = {
    "BATCH, SEQ, WIDTH = 4, 64, 128": "BATCH, SEQ, WIDTH = 4, 16, 32",
    "n_trials=20": "n_trials=1, finalists=0",
    "n_trials=4)  # on a CPU": "n_trials=1, finalists=0)  # on a CPU",
    "n_trials=8)": "n_trials=1, finalists=0)",
}
# the sharded step's mesh wants four devices; on a CPU, forced host devices
FORCED_DEVICES = "--xla_force_host_platform_device_count=4"


@dataclass
class Example:
    line: int  # of the first block's fence
    lang: str
    code: str  # the blocks it continues included, in order
    skip: str | None  # why it is not run


def examples() -> list[Example]:
    text = README.read_text()
    found: list[Example] = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        mark = MARK.search(text[: m.start()])
        if mark and mark.group(1) == "continues":
            previous = next(e for e in reversed(found) if e.lang == "python")
            previous.code += "\n" + textwrap.dedent(m.group(3))
            continue
        skip = mark.group(2) if mark else None
        found.append(Example(line, m.group(2) or "text", textwrap.dedent(m.group(3)), skip))
    return found


EXAMPLES = examples()


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"line{e.line}-{e.lang}" for e in EXAMPLES])
def test_a_readme_example_runs_as_written(example, tmp_path, subprocess_env):
    if example.skip:
        pytest.skip(example.skip)
    if example.lang == "toml":
        tomllib.loads(example.code)
        return
    if example.lang != "python":
        pytest.skip(f"{example.lang}: commands for a shell, not run here")
    code = example.code
    for text, smaller in SMALLER.items():
        code = code.replace(text, smaller)
    (tmp_path / "example.py").write_text(code)
    proc = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env={**subprocess_env, "XLA_FLAGS": FORCED_DEVICES},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"README.md line {example.line}:\n{proc.stderr[-3000:]}"


def test_every_smaller_size_is_the_readmes():
    code = "".join(e.code for e in EXAMPLES if e.lang == "python")
    assert [t for t in SMALLER if t not in code] == []
