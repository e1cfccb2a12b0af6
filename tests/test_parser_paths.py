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
    assert _core._check_json(text, False) == _core._check_json(text, True), text[:200]
    assert _core._decode_request(text, False) == _core._decode_request(text, True), text[:200]


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
    fast = _core._decode_request(text, False)
    assert fast == _core._decode_request(text, True)
    assert fast[:6] == (True, "AID.ECHO.v1", "[1]", "7", "k", None)
    assert fast[6].startswith("delta:") and '"DS2"' in fast[6] and '"DS1"' in fast[6]
    assert _core._check_json(b"[1, {\"a\": null}]", False) is None
    assert _core._check_json(b"[1,", False) is not None


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
    assert _core._check_json(text, False) is None
    agree(text)
    agree(json.dumps({"aid": "AID.ECHO.v1", "input_json": text.decode(), "x": value}).encode())


SEED_REQUEST = (b'{"id":"r1","aid":"AID.ECHO.v1","input_json":"{\\"a\\":[1,2.5e3,\\"\\\\u00e9\\"]}",'
                b'"ds_state":{"slots":{"DS0":{"type":"t","content_json":"{}","size_bytes":2}}}}')


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(SEED_REQUEST)), st.integers(0, 3), st.binary(min_size=1, max_size=3)),
                min_size=1, max_size=4))
def test_paths_agree_on_mutated_requests(edits: list[tuple[int, int, bytes]]) -> None:
    text = bytearray(SEED_REQUEST)
    for pos, mode, data in edits:
        pos = min(pos, len(text))
        if mode == 0:
            text[pos:pos] = data  # insert
        elif mode == 1:
            del text[pos:pos + len(data)]  # delete
        else:
            text[pos:pos + len(data)] = data  # overwrite
    agree(bytes(text))
