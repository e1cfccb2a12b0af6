"""The host's options are declared once (host_options.def): the command line's flags, Host()'s
keyword arguments, the typing stub and the docs' option list all agree with that table, and
both the command line and Python refuse a value out of its range."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import machina_dispatch as md
import pytest
from conftest import REPO, TOOLHOST, base_env
from machina_dispatch import _core

TABLE: list[dict[str, Any]] = _core.host_option_table()
RANGED = [row for row in TABLE if row["min"] is not None]
KEYWORDS = {row["name"]: row for row in TABLE if row["keyword"]}
FLAGS = {row["flag"]: row for row in TABLE if row["flag"]}


def gen_options() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_options", REPO / "scripts" / "gen_options.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLHOST, *args], capture_output=True, text=True, env=base_env(), timeout=30)


def test_the_docs_option_list_is_the_table() -> None:
    gen = gen_options()
    text = (REPO / "docs" / "protocol.md").read_text(encoding="utf-8")
    assert gen.current_block(text) == gen.render(TABLE), "run python scripts/gen_options.py"


def stub_keywords() -> dict[str, str]:
    tree = ast.parse((REPO / "python" / "machina_dispatch" / "_core.pyi").read_text(encoding="utf-8"))
    host = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Host")
    init = next(n for n in host.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return {a.arg: ast.unparse(a.annotation) for a in init.args.kwonlyargs if a.annotation is not None}


def test_the_stub_declares_every_keyword_with_its_type() -> None:
    stub = stub_keywords()
    assert set(stub) == set(KEYWORDS) == set(_core.host_options())
    for name, annotation in stub.items():
        assert annotation in (KEYWORDS[name]["type"], KEYWORDS[name]["type"] + " | None"), name


def test_every_flag_of_the_table_is_on_the_command_line() -> None:
    text = cli("--help").stdout
    for flag, row in FLAGS.items():
        assert flag in text, flag
        assert row["help"].split(" (")[0][:40] in text, flag


def powers(text: str) -> int:
    text = text.replace(" ", "")
    if "^" in text:
        base, exp = text.split("^")
        return int(int(base) ** int(exp))
    return int(text)


def test_ranges_and_defaults_written_in_the_docs_are_the_tables() -> None:
    # "`--flag` (MIN – MAX)" in the caps table; "`--flag N` (DEFAULT)" in the audit rows.
    seen = 0
    for doc in ("protocol.md", "tool-packs.md", "operations.md"):
        text = (REPO / "docs" / doc).read_text(encoding="utf-8")
        for flag, low, high in re.findall(r"`(--[a-z0-9-]+)` \(([0-9^ ]+) – ([0-9^ ]+)\)", text):
            if flag in FLAGS:
                seen += 1
                assert (powers(low), powers(high)) == (FLAGS[flag]["min"], FLAGS[flag]["max"]), f"{doc}: {flag}"
        for flag, value in re.findall(r"\| `(--[a-z0-9-]+) N` \(([0-9 ]+)\)", text):
            if flag in FLAGS:
                seen += 1
                assert int(value.replace(" ", "")) == FLAGS[flag]["default"], f"{doc}: {flag}"
    assert seen >= 12


@pytest.mark.parametrize("row", RANGED, ids=[row["name"] for row in RANGED])
def test_both_refuse_a_value_out_of_range(row: dict[str, Any]) -> None:
    low = row["min"] - 1 if row["kind"] != "limit" or row["min"] > 1 else None
    for bad in (low, row["max"] + 1):
        if bad is None or bad < 0:
            continue
        if row["flag"]:
            arg = f"AID.ECHO.v1={bad}" if row["kind"] == "timeouts" else str(bad)
            proc = cli("--list", row["flag"], arg)
            assert proc.returncode == 2, (row["flag"], bad, proc.stderr)
            assert row["flag"] in proc.stderr
        value: Any = {"AID.ECHO.v1": bad} if row["kind"] == "timeouts" else bad
        with pytest.raises(md.HostError, match=f"{row['name']}.* must be .*{row['min']} to {row['max']}, not {bad}"):
            _core.Host(**{row["name"]: value})


def test_the_request_cap_of_one_byte_is_refused_by_both() -> None:
    proc = cli("--list", "--max-request-bytes", "1")
    assert proc.returncode == 2 and "--max-request-bytes: Value 1 not in range" in proc.stderr
    with pytest.raises(md.HostError, match="max_request_bytes must be 2 to 1073741824, not 1"):
        _core.Host(max_request_bytes=1)
    assert _core.Host(max_request_bytes=2) is not None


def test_python_keywords_take_the_table_types() -> None:
    with pytest.raises(TypeError, match="'max_output_bytes' must be an int, not str"):
        _core.Host(max_output_bytes="10")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'no_network' must be a bool, not int"):
        _core.Host(no_network=1)  # type: ignore[arg-type]
    with pytest.raises(md.HostError, match="audit_required must be 'leased', 'all' or 'none', not 'some'"):
        _core.Host(audit_required="some")
    with pytest.raises(TypeError, match="unexpected keyword argument 'lease_enforce'"):
        _core.Host(lease_enforce=True)  # type: ignore[call-arg]


def test_the_audit_lines_cap_is_given_in_mib_from_python_too(tmp_path: Path) -> None:
    row = KEYWORDS["audit_jsonl_max_mb"]
    assert row["flag"] == "--audit-jsonl-max-mb" and row["default"] == 100
    host = _core.Host(audit_jsonl=str(tmp_path / "calls.jsonl"), audit_jsonl_max_mb=1)
    host.close()
    with pytest.raises(md.HostError, match="audit_jsonl_max_mb must be 1 to 1048576, not 0"):
        _core.Host(audit_jsonl_max_mb=0)


def test_defaults_come_from_the_core() -> None:
    assert KEYWORDS["max_request_bytes"]["default"] == 10 * 1024 * 1024
    assert KEYWORDS["isolation"]["default"] == "inline" and KEYWORDS["isolation"]["choices"] == ["inline", "process"]
    assert "--max-request-bytes UINT:UINT in [2 - 1073741824]=10485760" in cli("--help").stdout
