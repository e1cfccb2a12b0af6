"""Bad-input corpus: malformed, hostile or unusual requests and the exact response each
one must get.

Every `--serve` case is sent as one line followed by a good echo line: the bad line must
get exactly its expected response (or none, for a blank line) and the good line must be
answered normally afterwards, i.e. the host keeps serving. The `--run` cases send the
bytes as the whole stdin of `machina-toolhost --run AID` and expect exactly one response
line and exit code 0.

Cases marked ``xfail(strict=True, reason="BUG: ...")`` expect what the protocol should
answer; the current binary answers something else (see the reason).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import LIST_HINT, near_hint, ok_response, plain_error, run, serve_raw, status_error

Response = dict[str, Any]

ECHO = "AID.ECHO.v1"
STATS = "AID.TEXT.STATS.v1"
POINTER = "AID.JSON.POINTER.v1"
WRITE = "AID.FILE.WRITE.v1"
CAP = 10 * 1024 * 1024  # the default --max-request-bytes
BIG = 12 * 1024 * 1024
RUN_STATE: dict[str, Any] = {"slots": {}}  # --run answers with the full (here empty) state

# The good line sent after every bad one, and its answer.
GOOD_LINE = b'{"id":"after","aid":"AID.ECHO.v1","input_json":"{\\"after\\":true}"}'
GOOD_RESPONSE = ok_response('{"after":true}', id="after")


# --- expected-response builders ---------------------------------------------------------


def malformed(why: str, **extra: Any) -> Response:
    return plain_error("malformed_request", "malformed request: " + why, **extra)


def bad_json(byte: int, why: str, **extra: Any) -> Response:
    return malformed(f"invalid JSON at byte {byte}: {why}", **extra)


def bad_ds(why: str, **extra: Any) -> Response:
    return plain_error("invalid_ds_state", "invalid ds_state: " + why, **extra)


def invalid_input(why: str, ds_state: Any = None, **extra: Any) -> Response:
    return status_error("INVALID_PICK", "invalid_input", "input_json is not valid JSON: " + why,
                        ds_state, **extra)


def schema_violation(aid: str, why: str, ds_state: Any = None, **extra: Any) -> Response:
    return status_error("INVALID_PICK", "schema_violation",
                        f"input_json does not match the input schema of {aid}: {why}",
                        ds_state, **extra)


def not_found(aid_text: str, hint: str = LIST_HINT, **extra: Any) -> Response:
    return plain_error("tool_not_found", "tool not found: " + aid_text, hint=hint, **extra)


TOO_LARGE = plain_error("request_too_large", f"request exceeds the {CAP}-byte cap")
NOT_AN_OBJECT = malformed("expected a JSON object")
MISSING_AID = malformed("missing field 'aid'")
ECHO_EMPTY = ok_response("{}")


# --- request builders ---------------------------------------------------------------------


def line(**fields: Any) -> bytes:
    """A compact request line with the fields in the given order."""
    return json.dumps(fields, separators=(",", ":")).encode()


def echo_with(field: str, raw_value: str) -> bytes:
    """An echo request whose `field` holds the raw JSON text `raw_value`."""
    return b'{"aid":"AID.ECHO.v1","' + field.encode() + b'":' + raw_value.encode() + b"}"


def with_ds(ds_state: Any, **fields: Any) -> bytes:
    return line(id=1, aid=ECHO, ds_state=ds_state, **fields)


def artifact(content_json: Any = "1", **extra: Any) -> dict[str, Any]:
    return {"type": "t", "content_json": content_json, **extra}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def padded(request: bytes, size: int) -> bytes:
    """`request` followed by spaces up to `size` bytes: still one valid JSON text."""
    return request + b" " * (size - len(request))


BIG_LINE = padded(line(id="big", aid=ECHO, input_json="1"), BIG)


# --- the corpus -------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    request: bytes
    expected: Response | None  # None: no response at all (blank line)
    bug: str | None = None
    aid: str = ECHO  # --run only: the aid on the command line

    def param(self, *values: Any) -> Any:
        marks = [pytest.mark.xfail(strict=True, reason="BUG: " + self.bug)] if self.bug else []
        return pytest.param(*values, id=self.id, marks=marks)


WRONG_TYPES: Sequence[tuple[str, str, str]] = (
    # (case suffix, raw JSON value, how the host names its type)
    ("null", "null", "null"),
    ("bool", "true", "a boolean"),
    ("float", "1.5", "a number"),
    ("object", '{"a":1}', "an object"),
    ("array", "[1]", "an array"),
)

FIELD_RULES = {
    "aid": "must be a string",
    "input_json": "must be a string holding JSON text",
    "idempotency_key": "must be a string",
    "_lease_token": "must be a string",
    "id": "must be a string or an integer",
}


def wrong_type_cases() -> list[Case]:
    cases: list[Case] = []
    for field, rule in FIELD_RULES.items():
        kinds = list(WRONG_TYPES)
        if field != "id":  # an integer is a valid id
            kinds.append(("int", "7", "a number"))
        for suffix, raw, name in kinds:
            request = (b'{"aid":' + raw.encode() + b"}") if field == "aid" else echo_with(field, raw)
            if suffix == "null" and field != "aid":
                # null stands for an absent optional field
                cases.append(Case(f"type-{field}-{suffix}", request, ECHO_EMPTY))
                continue
            cases.append(Case(f"type-{field}-{suffix}", request,
                              malformed(f"field '{field}' {rule}, not {name}")))
    for suffix, raw in (("string", '"{}"'), ("number", "3"), ("bool", "false"), ("array", "[]")):
        cases.append(Case(f"type-ds_state-{suffix}", echo_with("ds_state", raw),
                          bad_ds("must be an object")))
    cases.append(Case("type-ds_state-null", echo_with("ds_state", "null"), ECHO_EMPTY))
    return cases


SERVE_CASES: list[Case] = [
    # Invalid JSON of several kinds.
    Case("json-truncated-object", b'{"aid":"AID.ECHO.v1"',
         bad_json(21, "syntax error while parsing object - unexpected end of input; expected '}'")),
    Case("json-missing-colon", b'{"aid" 1}',
         bad_json(8, "syntax error while parsing object separator - unexpected number literal; "
                     "expected ':'")),
    Case("json-trailing-comma", b'{"aid":"AID.ECHO.v1",}',
         bad_json(22, "syntax error while parsing object key - unexpected '}'; "
                      "expected string literal")),
    Case("json-single-quotes", b"{'aid':'AID.ECHO.v1'}",
         bad_json(2, "syntax error while parsing object key - invalid literal")),
    Case("json-bad-escape", b'{"aid":"AID\\q"}',
         bad_json(13, "syntax error while parsing value - invalid string: "
                      "forbidden character after backslash")),
    Case("json-unterminated-string", b'{"aid":"AID.ECHO.v1}',
         bad_json(21, "syntax error while parsing value - invalid string: missing closing quote")),
    Case("json-raw-tab-in-string", b'{"aid":"AID.ECHO\tv1"}',
         bad_json(17, "syntax error while parsing value - invalid string: control character "
                      "U+0009 (HT) must be escaped to \\u0009 or \\t")),
    Case("json-bare-literal", b"tru",
         bad_json(4, "syntax error while parsing value - invalid literal")),
    Case("json-nan", b'{"aid":"AID.ECHO.v1","x":NaN}',
         bad_json(26, "syntax error while parsing value - invalid literal")),
    Case("json-form-feed-only", b"\x0c",
         bad_json(1, "syntax error while parsing value - invalid literal")),
    # Not an object at the top.
    Case("top-array", b'[{"aid":"AID.ECHO.v1"}]', NOT_AN_OBJECT),
    Case("top-string", b'"AID.ECHO.v1"', NOT_AN_OBJECT),
    Case("top-number", b"42", NOT_AN_OBJECT),
    Case("top-negative-float", b"-1.5e3", NOT_AN_OBJECT),
    Case("top-null", b"null", NOT_AN_OBJECT),
    Case("top-bool", b"false", NOT_AN_OBJECT),
    Case("empty-object", b"{}", MISSING_AID),
    Case("only-unknown-fields-with-id", b'{"x":1,"id":4}', malformed("missing field 'aid'", id=4)),
    # Every envelope field with every wrong type.
    *wrong_type_cases(),
    # Duplicate fields.
    Case("dup-aid", b'{"aid":"AID.ECHO.v1","aid":"AID.ECHO.v1"}', malformed("duplicate field 'aid'")),
    Case("dup-input_json", b'{"aid":"AID.ECHO.v1","input_json":"1","input_json":"2"}',
         malformed("duplicate field 'input_json'")),
    Case("dup-ds_state", b'{"id":2,"aid":"AID.ECHO.v1","ds_state":{},"ds_state":{}}',
         malformed("duplicate field 'ds_state'", id=2)),
    Case("dup-id-echoes-first", b'{"id":1,"aid":"AID.ECHO.v1","id":2}',
         malformed("duplicate field 'id'", id=1)),
    Case("dup-unknown-field-ignored", b'{"aid":"AID.ECHO.v1","x":1,"x":2}', ECHO_EMPTY),
    # Not UTF-8, inside and outside strings.
    Case("utf8-invalid-byte-in-aid", b'{"aid":"AID.\xff.v1"}',
         bad_json(13, "syntax error while parsing value - invalid string: ill-formed UTF-8 byte")),
    Case("utf8-truncated-seq-in-unknown", b'{"aid":"AID.ECHO.v1","x":"\xc3("}',
         bad_json(28, "syntax error while parsing value - invalid string: ill-formed UTF-8 byte")),
    Case("utf8-encoded-surrogate", b'{"aid":"AID.ECHO.v1","x":"\xed\xa0\x80"}',
         bad_json(28, "syntax error while parsing value - invalid string: ill-formed UTF-8 byte")),
    Case("utf8-overlong", b'{"aid":"AID.ECHO.v1","x":"\xc0\xaf"}',
         bad_json(27, "syntax error while parsing value - invalid string: ill-formed UTF-8 byte")),
    Case("utf8-byte-before-object", b'\xff{"aid":"AID.ECHO.v1"}',
         bad_json(1, "syntax error while parsing value - invalid literal")),
    Case("utf8-byte-between-members", b'{"aid":"AID.ECHO.v1",\xfe"x":1}',
         bad_json(22, "syntax error while parsing object key - invalid literal")),
    Case("utf8-byte-after-object", b'{"aid":"AID.ECHO.v1"}\xff',
         bad_json(22, "syntax error while parsing value - invalid literal")),
    Case("escaped-lone-high-surrogate", b'{"aid":"AID.ECHO.v1","x":"\\ud800"}',
         bad_json(33, "syntax error while parsing value - invalid string: "
                      "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF")),
    Case("escaped-lone-low-surrogate", b'{"aid":"AID.ECHO.v1","x":"\\udc00"}',
         bad_json(32, "syntax error while parsing value - invalid string: "
                      "surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF")),
    Case("escaped-non-ascii-accepted", b'{"aid":"AID.ECHO.v1","x":"\\u00e9\\ud83d\\ude00"}',
         ECHO_EMPTY),
    # NUL bytes.
    Case("nul-raw-in-string", b'{"aid":"AID.E\x00CHO.v1"}', bad_json(14, "NUL byte")),
    Case("nul-escaped-in-aid", b'{"aid":"AID.ECHO.v1\\u0000"}', not_found("AID.ECHO.v1\x00", near_hint("AID.ECHO.v1"))),
    Case("nul-after-object", b'{"aid":"AID.ECHO.v1"}\x00', bad_json(22, "NUL byte")),
    Case("nul-hides-second-object", b'{"aid":"AID.ECHO.v1"}\x00{"aid":"AID.FILE.WRITE.v1"}',
         bad_json(22, "NUL byte")),
    Case("nul-inside-object", b'{"aid":"AID.ECHO.v1"\x00,"id":5}', bad_json(21, "NUL byte")),
    Case("nul-only", b"\x00", bad_json(1, "NUL byte")),
    Case("nul-escaped-in-input_json", line(aid=ECHO, input_json='{"a":1}\x00garbage'),
         invalid_input("invalid JSON at byte 8: NUL byte")),
    Case("nul-escaped-in-content_json", with_ds({"slots": {"DS0": artifact("1\x00x")}}),
         bad_ds("slot DS0: content_json is not JSON (invalid JSON at byte 2: NUL byte)", id=1)),
    Case("bom-in-input_json", line(aid=ECHO, input_json="\ufeff1"),
         invalid_input("invalid JSON at byte 1: byte order mark")),
    Case("number-overflow-in-input_json", line(aid=ECHO, input_json="[1e400]"),
         invalid_input("invalid JSON at byte 6: number overflow parsing '1e400'")),
    Case("number-underflow-accepted", line(aid=ECHO, input_json="[1e-400]"), ok_response("[1e-400]")),
    Case("big-integer-accepted", line(aid=ECHO, input_json="[123456789012345678901234567890]"),
         ok_response("[123456789012345678901234567890]")),
    Case("lone-low-surrogate-in-input_json", line(aid=ECHO, input_json='"\\udc00"'),
         invalid_input("invalid JSON at byte 7: syntax error while parsing value - invalid string: "
                       "surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF")),
    # Deep nesting.
    Case("deep-100000-in-unknown-field", echo_with("x", nested(100_000)),
         malformed("nesting deeper than 512")),
    Case("deep-100000-objects-in-unknown-field",
         b'{"aid":"AID.ECHO.v1","x":' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}",
         malformed("nesting deeper than 512")),
    Case("deep-511-in-unknown-field-ok", echo_with("x", nested(511)), ECHO_EMPTY),
    Case("deep-512-in-unknown-field", echo_with("x", nested(512)),
         malformed("nesting deeper than 512")),
    Case("deep-100000-in-input_json", line(aid=ECHO, input_json=nested(100_000)),
         invalid_input("nesting deeper than 512")),
    Case("deep-513-in-input_json", line(aid=ECHO, input_json=nested(513)),
         invalid_input("nesting deeper than 512")),
    Case("deep-512-in-input_json-ok", line(aid=ECHO, input_json=nested(512)),
         ok_response(nested(512))),
    # Trailing garbage and several objects on one line.
    Case("trailing-garbage", b'{"aid":"AID.ECHO.v1"} x',
         bad_json(23, "syntax error while parsing value - invalid literal")),
    Case("trailing-brace", b'{"aid":"AID.ECHO.v1"}}',
         bad_json(22, "syntax error while parsing value - unexpected '}'; expected end of input")),
    Case("two-objects", b'{"aid":"AID.ECHO.v1"}{"aid":"AID.ECHO.v1"}',
         bad_json(22, "syntax error while parsing value - unexpected '{'; expected end of input")),
    Case("two-objects-spaced", b'{"aid":"AID.ECHO.v1"} {"aid":"AID.ECHO.v1"}',
         bad_json(23, "syntax error while parsing value - unexpected '{'; expected end of input")),
    Case("trailing-whitespace-ok", b'{"aid":"AID.ECHO.v1","id":"ws"} \t ',
         ok_response("{}", id="ws")),
    # Unknown or odd aids.
    Case("unknown-aid", b'{"aid":"AID.NOPE.v1"}', not_found("AID.NOPE.v1")),
    Case("unknown-aid-with-id", b'{"id":"u1","aid":"AID.NOPE.v1"}', not_found("AID.NOPE.v1", id="u1")),
    Case("aid-wrong-case", b'{"aid":"aid.echo.v1"}', not_found("aid.echo.v1", near_hint("AID.ECHO.v1"))),
    Case("aid-leading-space", b'{"aid":" AID.ECHO.v1"}', not_found(" AID.ECHO.v1", near_hint("AID.ECHO.v1"))),
    Case("aid-empty", b'{"aid":""}', malformed("field 'aid' must not be empty")),
    # input_json that is not JSON, or does not match the tool's schema.
    Case("input-not-json", line(id=3, aid=ECHO, input_json="{"),
         invalid_input("invalid JSON at byte 2: syntax error while parsing object key - "
                       "unexpected end of input; expected string literal", id=3)),
    Case("input-empty-string", line(aid=ECHO, input_json=""),
         invalid_input("invalid JSON at byte 1: attempting to parse an empty input; check that "
                       "your input string or stream contains the expected JSON")),
    Case("input-two-values", line(aid=ECHO, input_json="1 2"),
         invalid_input("invalid JSON at byte 3: syntax error while parsing value - unexpected "
                       "number literal; expected end of input")),
    Case("input-python-literal", line(aid=ECHO, input_json="None"),
         invalid_input("invalid JSON at byte 1: syntax error while parsing value - "
                       "invalid literal")),
    Case("schema-missing-required", line(aid=STATS, input_json="{}"),
         schema_violation(STATS, "at /: missing required property 'text'")),
    Case("schema-wrong-type", line(aid=STATS, input_json='{"text":5}'),
         schema_violation(STATS, "at /text: expected string, got number")),
    Case("schema-extra-property", line(aid=STATS, input_json='{"text":"a","extra":1}'),
         schema_violation(STATS, "at /: property 'extra' is not allowed")),
    Case("schema-above-maximum", line(aid=STATS, input_json='{"text":"a","top":101}'),
         schema_violation(STATS, "at /top: must be <= 100")),
    Case("schema-not-an-object", line(id=9, aid=STATS, input_json="[]"),
         schema_violation(STATS, "at /: expected object, got array", id=9)),
    Case("pointer-array-index-overflow",
         line(aid=POINTER, input_json='{"document":[1],"pointer":"/99999999999999999999999"}'),
         ok_response('{"found":false}')),
    # ds_state shapes.
    Case("ds-unknown-slot", with_ds({"slots": {"DS8": artifact()}}),
         bad_ds("unknown slot 'DS8' (slots are DS0..DS7, or 0..7)", id=1)),
    Case("ds-slot-lowercase", with_ds({"slots": {"ds0": artifact()}}),
         bad_ds("unknown slot 'ds0' (slots are DS0..DS7, or 0..7)", id=1)),
    Case("ds-slot-number", with_ds({"slots": {"DS0": 5}}),
         bad_ds("slot DS0 must be an artifact object", id=1)),
    Case("ds-slot-null", with_ds({"slots": {"DS0": None}}),
         bad_ds("slot DS0 must be an artifact object", id=1)),
    Case("ds-slot-array", with_ds({"slots": {"DS0": []}}),
         bad_ds("slot DS0 must be an artifact object", id=1)),
    Case("ds-missing-content_json", with_ds({"slots": {"DS0": {"type": "t"}}}),
         bad_ds("slot DS0: 'type' and 'content_json' are required", id=1)),
    Case("ds-missing-type", with_ds({"slots": {"DS3": {"content_json": "1"}}}),
         bad_ds("slot DS3: 'type' and 'content_json' are required", id=1)),
    Case("ds-content_json-not-json", with_ds({"slots": {"DS0": artifact("{")}}),
         bad_ds("slot DS0: content_json is not JSON (invalid JSON at byte 2: syntax error while "
                "parsing object key - unexpected end of input; expected string literal)", id=1)),
    Case("ds-content_json-not-string", with_ds({"slots": {"DS0": artifact(1)}}),
         bad_ds("slot DS0: 'content_json' must be a string", id=1)),
    Case("ds-type-not-string", with_ds({"slots": {"DS0": {"type": 1, "content_json": "1"}}}),
         bad_ds("slot DS0: 'type' must be a string", id=1)),
    Case("ds-provenance-null", with_ds({"slots": {"DS0": artifact(provenance=None)}}),
         bad_ds("slot DS0: 'provenance' must be a string", id=1)),
    Case("ds-size_bytes-negative", with_ds({"slots": {"DS0": artifact(size_bytes=-1)}}),
         bad_ds("slot DS0: 'size_bytes' must be a non-negative integer", id=1)),
    Case("ds-size_bytes-string", with_ds({"slots": {"DS0": artifact(size_bytes="1")}}),
         bad_ds("slot DS0: 'size_bytes' must be a non-negative integer", id=1)),
    Case("ds-size_bytes-float", with_ds({"slots": {"DS0": artifact(size_bytes=1.5)}}),
         bad_ds("slot DS0: 'size_bytes' must be a non-negative integer", id=1)),
    Case("ds-artifact-unknown-field", with_ds({"slots": {"DS0": artifact(extra=1)}}),
         bad_ds("slot DS0: unknown field 'extra'", id=1)),
    Case("ds-removed_slots-without-delta", with_ds({"removed_slots": ["DS0"]}),
         bad_ds("'removed_slots' needs \"delta\": true", id=1)),
    Case("ds-removed_slots-delta-false", with_ds({"delta": False, "removed_slots": ["DS0"]}),
         bad_ds("'removed_slots' needs \"delta\": true", id=1)),
    Case("ds-removed_slots-unknown-slot", with_ds({"delta": True, "removed_slots": ["DS9"]}),
         bad_ds("unknown slot 'DS9' in removed_slots (slots are DS0..DS7, or 0..7)", id=1)),
    Case("ds-removed_slots-not-array", with_ds({"delta": True, "removed_slots": "DS0"}),
         bad_ds("'removed_slots' must be an array of slot names (DS0..DS7) or numbers (0..7)", id=1)),
    Case("ds-removed_slots-fraction", with_ds({"delta": True, "removed_slots": [0.5]}),
         bad_ds("'removed_slots' must be an array of slot names (DS0..DS7) or numbers (0..7)", id=1)),
    Case("ds-set-and-removed",
         with_ds({"delta": True, "slots": {"DS0": artifact()}, "removed_slots": ["DS0"]}),
         bad_ds("a slot is both set and removed", id=1)),
    Case("ds-unknown-field", with_ds({"foo": 1}), bad_ds("unknown field 'foo'", id=1)),
    Case("ds-delta-not-bool", with_ds({"delta": "true"}), bad_ds("'delta' must be a boolean", id=1)),
    Case("ds-slots-not-object", with_ds({"slots": []}),
         bad_ds("'slots' must be an object mapping slot names to artifacts", id=1)),
    Case("ds-duplicate-slot",
         b'{"id":1,"aid":"AID.ECHO.v1","ds_state":{"slots":{"DS0":{"type":"t","content_json":"1"},'
         b'"DS0":{"type":"t","content_json":"1"}}}}',
         bad_ds("duplicate slot DS0", id=1)),
    Case("ds-duplicate-artifact-field",
         b'{"id":1,"aid":"AID.ECHO.v1","ds_state":{"slots":{"DS0":{"type":"t","type":"u",'
         b'"content_json":"1"}}}}',
         bad_ds("slot DS0: duplicate field 'type'", id=1)),
    Case("ds-duplicate-delta", b'{"id":1,"aid":"AID.ECHO.v1","ds_state":{"delta":true,"delta":true}}',
         bad_ds("duplicate field 'delta'", id=1)),
    # Size, blank lines and line endings.
    Case("too-large-12MB", BIG_LINE, TOO_LARGE),
    Case("blank-empty", b"", None),
    Case("blank-spaces", b"     ", None),
    Case("blank-tabs-and-cr", b"\t \r", None),
    Case("crlf-accepted", b'{"id":"crlf","aid":"AID.ECHO.v1","input_json":"[1]"}\r',
         ok_response("[1]", id="crlf")),
    # Ids: which are echoed, and on which errors.
    Case("id-negative", b'{"aid":"AID.ECHO.v1","id":-3}', ok_response("{}", id=-3)),
    Case("id-max-u64", b'{"aid":"AID.ECHO.v1","id":18446744073709551615}',
         ok_response("{}", id=18446744073709551615)),
    Case("id-empty-string", b'{"aid":"AID.ECHO.v1","id":""}', ok_response("{}", id="")),
    Case("id-escapes", b'{"aid":"AID.ECHO.v1","id":"a\\"b\\u00e9\\n\\u0000"}',
         ok_response("{}", id='a"b\u00e9\n\x00')),
    Case("id-echoed-on-type-error", b'{"id":"c1","aid":5}',
         malformed("field 'aid' must be a string, not a number", id="c1")),
    Case("id-echoed-on-ds-error", with_ds("x"), bad_ds("must be an object", id=1)),
    # An id is only echoed from valid JSON: from a broken request it may be cut short.
    Case("id-not-echoed-on-json-error", b'{"id":77,"aid":"AID.ECHO.v1",',
         bad_json(30, "syntax error while parsing object key - unexpected end of input; "
                      "expected string literal")),
    Case("id-not-echoed-after-error", b'{"aid":5,"id":"late"}',
         malformed("field 'aid' must be a string, not a number")),
    Case("id-malformed-number-not-echoed", b'{"aid":"AID.ECHO.v1","id":01}',
         bad_json(28, "syntax error while parsing object - unexpected number literal; "
                      "expected '}'")),
]


RUN_CASES: list[Case] = [
    Case("run-empty-stdin", b"", malformed("no request on stdin (--run reads one JSON object)")),
    Case("run-whitespace-stdin", b" \n\t\r\n ", malformed("no request on stdin (--run reads one JSON object)")),
    Case("run-empty-object", b"{}", ok_response("{}", RUN_STATE)),
    Case("run-input", b'{"input_json":"{\\"q\\":[1,2]}"}', ok_response('{"q":[1,2]}', RUN_STATE)),
    Case("run-body-aid-same", b'{"aid":"AID.ECHO.v1","input_json":"2"}', ok_response("2", RUN_STATE)),
    Case("run-body-aid-differs", b'{"aid":"AID.TEXT.STATS.v1","input_json":"2"}',
         malformed("the body names aid 'AID.TEXT.STATS.v1' but the command line names "
                   "'AID.ECHO.v1'")),
    Case("run-body-aid-differs-with-id", b'{"id":9,"aid":"X"}',
         malformed("the body names aid 'X' but the command line names 'AID.ECHO.v1'", id=9)),
    Case("run-crlf", b'{"id":"r","input_json":"[]"}\r\n', ok_response("[]", RUN_STATE, id="r")),
    Case("run-invalid-json", b"{",
         bad_json(2, "syntax error while parsing object key - unexpected end of input; "
                     "expected string literal")),
    Case("run-top-array", b"[]", NOT_AN_OBJECT),
    Case("run-top-null", b"null", NOT_AN_OBJECT),
    Case("run-two-objects", b'{"input_json":"{\\"a\\":1}"}\n{"input_json":"2"}\n',
         bad_json(28, "syntax error while parsing value - unexpected '{'; expected end of input")),
    Case("run-input_json-not-string", b'{"id":9,"input_json":5}',
         malformed("field 'input_json' must be a string holding JSON text, not a number", id=9)),
    Case("run-input_json-not-json", b'{"input_json":"{"}',
         invalid_input("invalid JSON at byte 2: syntax error while parsing object key - "
                       "unexpected end of input; expected string literal", RUN_STATE)),
    Case("run-not-utf8", b'{"input_json":"\xff"}',
         bad_json(16, "syntax error while parsing value - invalid string: ill-formed UTF-8 byte")),
    Case("run-deep-nesting", b'{"x":' + nested(100_000).encode() + b"}",
         malformed("nesting deeper than 512")),
    Case("run-bad-ds_state", b'{"id":"d","ds_state":{"slots":{"DS8":{}}}}',
         bad_ds("unknown slot 'DS8' (slots are DS0..DS7, or 0..7)", id="d")),
    Case("run-full-ds_state-echoed",
         b'{"ds_state":{"slots":{"DS1":{"type":"t","content_json":"2"}}}}',
         ok_response("{}", {"slots": {"DS1": {"type": "t", "content_json": "2",
                                              "provenance": "", "size_bytes": 1}}})),
    Case("run-delta-ds_state",
         b'{"ds_state":{"delta":true,"slots":{"DS7":{"type":"t","content_json":"[]",'
         b'"provenance":"p","size_bytes":9}},"removed_slots":["DS0"]}}',
         ok_response("{}", {"slots": {"DS7": {"type": "t", "content_json": "[]",
                                              "provenance": "p", "size_bytes": 9}}})),
    Case("run-schema-violation", b'{"input_json":"{}"}',
         schema_violation(STATS, "at /: missing required property 'text'", RUN_STATE), aid=STATS),
    Case("run-unknown-aid", b"{}", not_found("AID.NOPE.v1"), aid="AID.NOPE.v1"),
    Case("run-too-large-12MB", padded(b'{"input_json":"1"}', BIG), TOO_LARGE),
    Case("run-too-large-whitespace", b" " * BIG, TOO_LARGE),
    Case("run-nul-after-object", b'{"input_json":"1"}\x00garbage', bad_json(19, "NUL byte")),
    Case("run-nul-escaped-in-input_json", b'{"input_json":"1\\u0000x"}',
         invalid_input("invalid JSON at byte 2: NUL byte", RUN_STATE)),
]


# --- helpers ------------------------------------------------------------------------------


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys in a response: {keys}"
    return dict(pairs)


def _no_constants(name: str) -> Any:
    raise AssertionError(f"non-JSON constant {name} in a response")


def parse_response_lines(stdout: bytes) -> list[Response]:
    """Each stdout line as a response: strict UTF-8, strict JSON, one object per line."""
    if not stdout:
        return []
    assert stdout.endswith(b"\n"), "the last response line is not terminated"
    out: list[Response] = []
    for raw in stdout.split(b"\n")[:-1]:
        text = raw.decode("utf-8")  # raises on invalid UTF-8
        value = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
        assert isinstance(value, dict), raw[:200]
        out.append(value)
    return out


# --- tests --------------------------------------------------------------------------------


def test_corpus_is_large_enough() -> None:
    assert len(SERVE_CASES) >= 35
    assert len(RUN_CASES) >= 10
    ids = [c.id for c in SERVE_CASES + RUN_CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    assert all(b"\n" not in c.request for c in SERVE_CASES), "a --serve case is one line"


@pytest.mark.parametrize(("request_line", "expected"),
                         [c.param(c.request, c.expected) for c in SERVE_CASES])
def test_serve_bad_line_then_good_line(request_line: bytes, expected: Response | None) -> None:
    proc = serve_raw(request_line + b"\n" + GOOD_LINE + b"\n")
    assert proc.returncode == 0, proc.stderr
    want = ([] if expected is None else [expected]) + [GOOD_RESPONSE]
    assert parse_response_lines(proc.stdout) == want


def test_serve_whole_corpus_in_one_stream() -> None:
    """The corpus (without the known bugs) pipelined through one process: one response
    per non-blank line, in order, each the expected one."""
    cases = [c for c in SERVE_CASES if c.bug is None]
    data = b"".join(c.request + b"\n" + GOOD_LINE + b"\n" for c in cases)
    proc = serve_raw(data)
    assert proc.returncode == 0, proc.stderr
    want: list[tuple[str, Response]] = []
    for c in cases:
        if c.expected is not None:
            want.append((c.id, c.expected))
        want.append((c.id + " (good line after)", GOOD_RESPONSE))
    got = parse_response_lines(proc.stdout)
    assert len(got) == len(want)
    for response, (label, expected) in zip(got, want, strict=True):
        assert response == expected, label


@pytest.mark.parametrize(("aid", "stdin", "expected"),
                         [c.param(c.aid, c.request, c.expected) for c in RUN_CASES])
def test_run_bad_input(aid: str, stdin: bytes, expected: Response) -> None:
    proc = run(aid, stdin)
    assert proc.returncode == 0, proc.stderr
    assert parse_response_lines(proc.stdout) == [expected]


def _write_request(path: str, **fields: Any) -> bytes:
    return line(aid=WRITE, input_json=json.dumps({"path": path, "content": "x"}), **fields)


def test_serve_too_large_line_runs_nothing(tmp_path: Path) -> None:
    env = {"MACHINA_TOOLHOST_WORKSPACE": str(tmp_path)}
    big = padded(_write_request("big.txt", id="big"), BIG)
    small = _write_request("small.txt", id="small")
    proc = serve_raw(big + b"\n" + small + b"\n", env=env)
    assert proc.returncode == 0, proc.stderr
    assert parse_response_lines(proc.stdout) == [
        TOO_LARGE,
        ok_response('{"append":false,"bytes_written":1,"path":"small.txt"}', id="small"),
    ]
    assert not (tmp_path / "big.txt").exists()
    assert (tmp_path / "small.txt").read_text() == "x"


def test_run_too_large_stdin_runs_nothing(tmp_path: Path) -> None:
    proc = run(WRITE, padded(_write_request("big.txt"), BIG),
               env={"MACHINA_TOOLHOST_WORKSPACE": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert parse_response_lines(proc.stdout) == [TOO_LARGE]
    assert not (tmp_path / "big.txt").exists()


@pytest.mark.parametrize("cap", [64, 1000])
def test_request_cap_is_inclusive(cap: int) -> None:
    request = line(id="cap", aid=ECHO)
    at_cap, over_cap = padded(request, cap), padded(request, cap + 1)
    small_cap = plain_error("request_too_large", f"request exceeds the {cap}-byte cap")
    proc = serve_raw(at_cap + b"\n" + over_cap + b"\n", "--max-request-bytes", str(cap))
    assert proc.returncode == 0, proc.stderr
    assert parse_response_lines(proc.stdout) == [ok_response("{}", id="cap"), small_cap]
    for body, want in ((at_cap, ok_response("{}", RUN_STATE, id="cap")), (over_cap, small_cap)):
        done = run(ECHO, body, "--max-request-bytes", str(cap))
        assert done.returncode == 0, done.stderr
        assert parse_response_lines(done.stdout) == [want]


def test_error_messages_quote_at_most_200_characters_of_client_text() -> None:
    # A 1 MB aid, field name or slot name comes back cut to its first 200 characters
    # (code points, never a split UTF-8 sequence) and its size; short ones come back whole.
    huge_aid = "é" * 500_000
    lines = [
        json.dumps({"id": 1, "aid": huge_aid}),
        json.dumps({"id": 2, "aid": "AID.ECHO.v1", "ds_state": {"slots": {"x" * 300: {}}}}),
        json.dumps({"id": 3, "aid": "AID.ECHO.v1", "ds_state": {"q" * 1000: 1}}),
        json.dumps({"id": 4, "aid": "AID." + "n" * 196}),
    ]
    out = {r["id"]: r for r in parse_response_lines(serve_raw("\n".join(lines).encode() + b"\n").stdout)}
    assert out[1] == not_found("é" * 200 + "… (1000000 bytes)", id=1)
    assert out[2]["error"] == ("invalid ds_state: unknown slot '" + "x" * 200 + "… (300 bytes)' "
                               "(slots are DS0..DS7, or 0..7)")
    assert out[3]["error"] == "invalid ds_state: unknown field '" + "q" * 200 + "… (1000 bytes)'"
    assert out[4]["error"] == "tool not found: AID." + "n" * 196  # 200 characters: whole
