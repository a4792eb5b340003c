"""Property-based tests (hypothesis) of everything that parses user or database text."""

from __future__ import annotations

import tempfile
from pathlib import Path

import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autotune.cli import main
from autotune.errors import SignatureError, SpaceError
from autotune.search.strategies import STRATEGIES
from autotune.signature import (
    _SHORT,
    ArgSpec,
    format_args,
    parse_args,
    parse_dtype,
    parse_static,
    short_dtype,
)
from autotune.space import load_space_file
from autotune.tuning.task import parse_dtypes, parse_shapes

FEW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = sorted(_SHORT)
shapes = st.lists(st.integers(0, 2**40), max_size=4).map(tuple)
argspecs = st.lists(st.builds(ArgSpec, shapes, st.sampled_from(DTYPES)), min_size=1, max_size=4)
statics = st.dictionaries(
    st.text(min_size=1, max_size=8),
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    max_size=4,
)


@FEW
@given(argspecs)
def test_signature_text_round_trips(args):
    assert parse_args(format_args(tuple(args))) == tuple(args)


@FEW
@given(argspecs, argspecs)
def test_different_signatures_never_share_a_key(a, b):
    if tuple(a) != tuple(b):
        assert format_args(tuple(a)) != format_args(tuple(b))


@FEW
@given(statics)
def test_static_arguments_round_trip(static):
    import json

    assert parse_static(json.dumps(static, sort_keys=True, separators=(",", ":"))) == static


@FEW
@given(st.text(max_size=40))
@example("f32[1,2],")
@example("f32[1,,2]")
@example("void[1]")
def test_signature_text_parses_or_says_why(text):
    try:
        args = parse_args(text)
    except SignatureError:
        return
    assert parse_args(format_args(args)) == args


# --------------------------------------------------------------------------- space files

toml_atoms = st.sampled_from(
    [
        "[common]", "[cpu]", "[tpu]", "[gpu]", "[other]", "[common.block]", "[[common]]",
        "block = ", "x = ", "kind = ", "= 1", "[", "]", "{", "}", ",", '"pow2"', '"range"',
        '"values"', '"bool"', "min = ", "max = ", "start = ", "stop = ", "step = ", "values = ",
        "0", "1", "-1", "3", "16", "1e400", "nan", "inf", "true", "false", '"a"', "1979-05-27",
        "9223372036854775807", "[1, 2]", "[1, 1]", "[1, 1.0]", "[]", "[[1]]", '[1, "a"]',
        "{kind = \"pow2\", min = 8, max = 4}", "{kind = \"range\", start = 0, stop = 99999}",
        "\n", " ", "#", "'''", "\\", "\x00", "\u00e9",
    ]
)  # fmt: skip
garbage = st.lists(toml_atoms | st.text(max_size=5), max_size=30).map("".join)


@FEW
@given(garbage | st.binary(max_size=60).map(lambda b: b.decode("latin-1")))
@example("x = " + "[" * 3000 + "]" * 3000)
@example("[common]\nb = {kind = 'pow2', min = 1, max = 9223372036854775807}")
def test_space_file_garbage_is_a_space_error_naming_the_file(text):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "garbage.toml"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            load_space_file(path)
        except SpaceError as e:
            assert str(path) in str(e)


# --------------------------------------------------------------------------- CLI parsing

shape_text = st.lists(
    st.sampled_from(["x", ",", "0", "1", "16", "128", "X", " ", "scalar", "()", "²", "-1", "a"]),
    max_size=10,
).map("".join)


@FEW
@given(shape_text | st.text(max_size=12))
def test_cli_shapes_parse_or_say_why(text):
    try:
        shapes = parse_shapes(text)
    except SignatureError as e:
        assert "--shape" in str(e)
        return
    assert all(isinstance(d, int) and d >= 0 for s in shapes for d in s)
    assert len(shapes) == text.count(",") + 1


@FEW
@given(st.lists(st.sampled_from([*DTYPES, *_SHORT.values()]) | st.text(max_size=6), max_size=3))
def test_cli_dtypes_parse_or_say_why(names):
    try:
        dtypes = parse_dtypes(",".join(names), 3)
    except SignatureError:
        return
    assert all(jnp.dtype(d).name == d for d in dtypes)
    assert all(short_dtype(parse_dtype(short_dtype(d))) == short_dtype(d) for d in dtypes)


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.sampled_from(["--shape", "--dtype", "--trials", "--static", "--strategy"]),
    st.text(min_size=1, max_size=10).filter(lambda t: not t.startswith("-")),
)
def test_every_cli_user_error_is_one_line_exit_2_nothing_written(scratch, capsys, flag, value):
    db = scratch / "never.db"
    base = {"--shape": "8x8,8x8", "--dtype": "float32", "--trials": "1", "--static": "a=1"}
    base["--strategy"] = "tpe"
    base[flag] = value
    if flag == "--shape":
        try:
            parse_shapes(value)
            return  # a valid shape would start tuning: not a user error
        except SignatureError:
            pass
    if flag == "--dtype":
        try:
            parse_dtypes(value, 2)
            return
        except SignatureError:
            pass
    number = value.strip()
    if flag == "--trials" and number.isascii() and number.isdigit() and int(number) > 0:
        return
    if flag == "--strategy" and value in STRATEGIES:
        return
    if flag == "--static" and "=" in value and value.partition("=")[0].isidentifier():
        return
    args = ["tune", "matmul", "--db", str(db)]
    for k, v in base.items():
        args += [k, v] if k != "--static" else [f"{k}={v}"]
    capsys.readouterr()
    rc = main(args)
    out, err = capsys.readouterr()
    assert rc == 2, (args, out, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("autotune: error: ")
    assert not db.exists()
