"""The two JSON paths agree: RapidJSON's fast accept path and the nlohmann reference
parser must accept exactly the same texts and decode requests to the same fields, or the
host would answer the same line differently depending on which path took it.

Checked on the bad-input corpus, the protocol transcripts, generated JSON documents and
byte-level mutations of valid requests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TRANSCRIPTS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from machina_dispatch import _core
from test_bad_input import RUN_CASES, SERVE_CASES

try:
    from machina_dispatch import _testing
except ImportError as e:  # a build without the hooks (a plain `pip install .`, the wheel)
    raise ImportError("machina_dispatch._testing is missing: install with the test hooks "
                      "(scripts/install.sh test, or pip install -C cmake.define.MACHINA_TESTING_HOOKS=ON)") from e

CAP = 1024 * 1024  # larger corpus entries (the 12 MB line) are left to test_bad_input


def corpus() -> list[bytes]:
    texts = [c.request for c in (*SERVE_CASES, *RUN_CASES) if len(c.request) <= CAP]
    for path in sorted(Path(TRANSCRIPTS).glob("*.ndjson")):
        for raw in path.read_bytes().splitlines():
            if not raw.strip() or raw.lstrip().startswith(b"#"):
                continue
            entry = json.loads(raw)
            request = entry.get("request") if isinstance(entry, dict) else None
            if isinstance(request, str):
                texts.append(request.encode())
            elif isinstance(request, dict):
                texts.append(json.dumps(request).encode())
    return texts


CORPUS = corpus()


def agree(text: bytes) -> None:
    assert _testing.check_json(text, False) == _testing.check_json(text, True), text[:200]
    assert _testing.decode_request(text, False) == _testing.decode_request(text, True), text[:200]


def test_corpus_is_substantial() -> None:
    assert len(CORPUS) >= 150


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_paths_agree_on_the_corpus(text: bytes) -> None:
    agree(text)


def test_the_fast_path_really_decodes() -> None:
    """Not vacuous: a good request decodes, with its fields, through both paths."""
    text = (b'{"id":7,"aid":"AID.ECHO.v1","input_json":"[1]","idempotency_key":"k",'
            b'"ds_state":{"delta":true,"slots":{"DS2":{"type":"t","content_json":"3"}},'
            b'"removed_slots":["DS1"]}}')
    fast = _testing.decode_request(text, False)
    assert fast == _testing.decode_request(text, True)
    assert fast[:6] == (True, "AID.ECHO.v1", "[1]", "7", "k", None)
    assert fast[6].startswith("delta:") and '"DS2"' in fast[6] and '"DS1"' in fast[6]
    assert _testing.check_json(b"[1, {\"a\": null}]", False) is None
    assert _testing.check_json(b"[1,", False) is not None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_paths_agree_on_generated_documents(value: object) -> None:
    text = json.dumps(value).encode()
    assert _testing.check_json(text, False) is None
    agree(text)
    agree(json.dumps({"aid": "AID.ECHO.v1", "input_json": text.decode(), "x": value}).encode())


BASE_REQUEST = (b'{"id":"r1","aid":"AID.ECHO.v1","input_json":"{\\"a\\":[1,2.5e3,\\"\\\\u00e9\\"]}",'
                b'"ds_state":{"slots":{"DS0":{"type":"t","content_json":"{}","size_bytes":2}}}}')


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(BASE_REQUEST)), st.integers(0, 3), st.binary(min_size=1, max_size=3)),
                min_size=1, max_size=4))
def test_paths_agree_on_mutated_requests(edits: list[tuple[int, int, bytes]]) -> None:
    text = bytearray(BASE_REQUEST)
    for pos, mode, data in edits:
        pos = min(pos, len(text))
        if mode == 0:
            text[pos:pos] = data  # insert
        elif mode == 1:
            del text[pos:pos + len(data)]  # delete
        else:
            text[pos:pos + len(data)] = data  # overwrite
    agree(bytes(text))


# Raw bytes inside a string, of every length around the 8-byte words the UTF-8 check reads
# (its tail is settled by one overlapping word): ASCII, controls, and pieces of well- and
# ill-formed multi-byte sequences.
raw_string_bytes = st.lists(st.sampled_from([b"a", b"\x1f", b"\x7f", b"\xc3\xa9", b"\xc3", b"\xa9", b"\xe2\x82\xac",
                                             b"\xf0\x9f\x98\x80", b"\xed\xa0\x80", b"\xff", b"\\n", b"\\u00e9"]),
                            max_size=24).map(b"".join)


@settings(max_examples=800, deadline=None)
@given(raw_string_bytes, raw_string_bytes)
def test_paths_agree_on_raw_bytes_in_strings(key: bytes, value: bytes) -> None:
    agree(b'"' + value + b'"')
    agree(b'{"' + key + b'":"' + value + b'","aid":"AID.ECHO.v1"}')


def test_paths_agree_on_a_raw_control_byte_at_every_offset() -> None:
    # RapidJSON copies strings 16 bytes at a time and lets raw 0x1A..0x1F through there;
    # the UTF-8 check behind it must then refuse them wherever they sit, in the tail too.
    for control in (b"\x1a", b"\x1f", b"\x01"):
        for before in range(40):
            for after in range(9):
                agree(b'["' + b"a" * before + control + b"b" * after + b'"]')


EMPTY_HOST = _core.Host()  # no tools: every call is answered "tool not found: <aid>"

# Text that needs escaping in every way: quotes, backslashes, every control character,
# and long runs around them (the escaper copies plain runs eight bytes at a time and makes
# room for escapes as they come).
escapable_text = st.text(st.sampled_from(['"', "\\", "a", "é", "\U0001F600", *map(chr, range(0x20))]), max_size=300)


@settings(max_examples=500, deadline=None)
@given(escapable_text, st.integers(0, 40))
def test_json_strings_are_escaped_exactly(text: str, plain: int) -> None:
    value = "x" * plain + text + "y" * (plain // 3)
    line = _core.encode_request(1, "AID.ECHO.v1", value, value)
    assert line.endswith(b"\n")
    decoded = json.loads(line)
    assert decoded["input_json"] == value and decoded["idempotency_key"] == value
    # The host's side: an error message quotes the aid, escaped on the way out.
    aid = value or "-"
    response = json.loads(EMPTY_HOST.call_json(json.dumps({"aid": aid}), _core.Session()))
    assert response["error"] == f"tool not found: {aid}"


def test_a_string_of_control_characters_grows_sixfold() -> None:
    value = "\x01" * 100_000
    line = _core.encode_request(1, "AID.ECHO.v1", value)
    assert json.loads(line)["input_json"] == value
    assert line.count(b"\\u0001") == 100_000
