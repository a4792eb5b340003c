import pytest

from autotune.errors import SignatureError
from autotune.signature import ArgSpec, format_args, parse_args, parse_dtype, shape_distance


def test_signature_text_round_trips():
    args = (ArgSpec((1024, 512), "float32"), ArgSpec((512,), "bfloat16"), ArgSpec((), "int32"))
    text = format_args(args)
    assert text == "f32[1024,512],bf16[512],s32[]"
    assert parse_args(text) == args


def test_dtype_names_short_and_long_agree():
    assert parse_dtype("bf16") == parse_dtype("bfloat16") == "bfloat16"
    with pytest.raises(SignatureError, match="unknown dtype 'floaty'"):
        parse_dtype("floaty")


def test_shape_distance_compares_only_like_signatures():
    a = parse_args("f32[256,256]")
    assert shape_distance(a, parse_args("f32[512,256]")) == 1.0
    assert shape_distance(a, parse_args("bf16[256,256]")) is None
    assert shape_distance(a, parse_args("f32[256]")) is None


@pytest.mark.parametrize("bad", ["", "f32[1,2", "f32[1,a]", "f32[1]x", "F32[1]"])
def test_malformed_signature_text_is_rejected(bad):
    with pytest.raises(SignatureError):
        parse_args(bad)
