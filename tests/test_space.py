from pathlib import Path

import pytest

from autotune.errors import SpaceError
from autotune.signature import ArgSpec, Signature
from autotune.space import Space, load_space_file, parse_param, space_from_dict


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "k.toml"
    p.write_text(text)
    return p


def test_parameter_kinds_expand_to_their_candidates():
    assert parse_param("f", "a", [3, 1, 2]).values == (1, 2, 3)
    assert parse_param("f", "b", {"kind": "pow2", "min": 16, "max": 128}).values == (
        16,
        32,
        64,
        128,
    )
    assert parse_param("f", "c", {"kind": "range", "start": 8, "stop": 32, "step": 8}).values == (
        8,
        16,
        24,
        32,
    )
    assert parse_param("f", "d", {"kind": "bool"}).values == (False, True)
    assert parse_param("f", "e", {"kind": "values", "values": ["x", "y"]}).values == ("x", "y")


def test_platform_section_overrides_and_extends_common(tmp_path):
    path = write(
        tmp_path,
        "[common]\nblock = [8, 16]\n[gpu]\nblock = [32]\nnum_warps = [4, 8]\n",
    )
    spaces = load_space_file(path)
    assert [(p.name, p.values) for p in spaces["cpu"]] == [("block", (8, 16))]
    assert [(p.name, p.values) for p in spaces["gpu"]] == [("block", (32,)), ("num_warps", (4, 8))]


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            '[common]\nblock = { kind = "pow2", min = 3, max = 64 }\n',
            "[common] block: 'min' and 'max' must be powers of two",
        ),
        ("[common]\nblock = []\n", "[common] block: no candidate values"),
        (
            '[common]\nblock = { kind = "range", start = 1 }\n',
            "[common] block: missing key(s) stop",
        ),
        ('[tpu]\nblock = { kind = "cubes" }\n', "[tpu] block: unknown kind 'cubes'"),
        ('[common]\nblock = [1, "a"]\n', "[common] block: candidate values mix types"),
        ("[commn]\nblock = [1]\n", "unknown section(s) 'commn'"),
        ("[common\nblock = [1]\n", "not valid TOML"),
        ("[common]\nblock = [1, 1]\n", "[common] block: candidate values repeat"),
    ],
)
def test_malformed_file_names_file_parameter_and_problem(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(SpaceError) as err:
        load_space_file(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_constraints_filter_configs_and_stored_configs_are_revalidated():
    def divides(config, sig):
        return sig.shapes[0][0] % config["block"] == 0

    params = space_from_dict("test", {"block": [16, 24, 32], "flag": [True, False]})["cpu"]
    space = Space(params, (divides,))
    sig = Signature((ArgSpec((64,), "float32"),))
    assert sorted({c["block"] for c in space.valid_configs(sig)}) == [16, 32]
    assert space.violations({"block": 24, "flag": True}, sig) == ["divides"]
    assert space.check_stored({"block": 16, "flag": True}) is None
    assert "not a candidate" in space.check_stored({"block": 8, "flag": True})
    assert "not a candidate" in space.check_stored({"block": 16, "flag": 1})  # 1 is not True here
    assert "unknown parameter" in space.check_stored({"block": 16, "flag": True, "x": 1})
    assert "not an object" in space.check_stored([16])
