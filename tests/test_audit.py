"""The audit store: every call through every front recorded in SQLite (and as JSON lines),
with a digest that keeps paths and commands and never contents, bounded by retention;
`machina-toolhost audit report` answers from it; no tool can reach it."""

from __future__ import annotations

import json
import os
import pwd
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import machina_dispatch as md
import pytest
from conftest import TOOLHOST, base_env, scaled
from test_services import start_http_host

SECRET = "the-content-no-audit-may-keep-3f9a"


def call_log(db: Path) -> list[dict[str, Any]]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM call_log ORDER BY id")]
    finally:
        con.close()


def serve(lines: list[dict[str, Any]], *args: str, cwd: Path | None = None,
          env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    text = "".join(json.dumps(x) + "\n" for x in lines)
    proc = subprocess.run([TOOLHOST, "--serve", *args], input=text.encode(), capture_output=True, timeout=60,
                          cwd=cwd, env=base_env(env))
    assert proc.returncode == 0, proc.stderr.decode()
    return [json.loads(x) for x in proc.stdout.decode().splitlines()]


def age(db: Path, call_ids: range, days: int) -> None:
    """Makes the calls `call_ids` (their ids in the view `calls`) older by `days`, in place:
    a call's time is its batch's base_ms plus its first number."""
    con = sqlite3.connect(db)
    for call_id in call_ids:
        n = con.execute("UPDATE batches SET calls = json_set(calls, '$[' || (?1 - first_call) || '][0]',"
                        " json_extract(calls, '$[' || (?1 - first_call) || '][0]') - ?2)"
                        " WHERE ?1 >= first_call AND ?1 < first_call + n", (call_id, days * 86_400_000)).rowcount
        assert n == 1, f"no call {call_id}"
    con.execute("UPDATE batches SET min_ms = base_ms + (SELECT min(json_extract(value, '$[0]')) FROM json_each(calls)),"
                " max_ms = base_ms + (SELECT max(json_extract(value, '$[0]')) FROM json_each(calls))")
    con.commit()
    con.close()


def report(db: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run([TOOLHOST, "audit", "report", "--db", str(db), "--format", "json", *args],
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@pytest.fixture
def store(tmp_path: Path) -> Path:
    (tmp_path / "audit").mkdir()
    return tmp_path / "audit" / "calls.db"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """The tools' workspace (the working directory of the hosts), apart from the store."""
    w = tmp_path / "ws"
    w.mkdir()
    (w / "notes.txt").write_text("hello\n")
    return w


def test_each_call_is_recorded_with_what_it_was(store: Path, ws: Path) -> None:
    jsonl = store.parent / "calls.jsonl"
    out = serve([
        {"aid": "AID.ECHO.v1", "input_json": json.dumps({"msg": SECRET, "n": 7}), "user": "alice"},
        {"aid": "tools.file.read", "input_json": json.dumps({"path": "notes.txt"}), "user": "alice"},
        {"aid": "readFile", "input_json": json.dumps({"path": "../outside.txt"}), "user": "bob"},
        {"aid": "AID.FILE.WRITE.v1", "input_json": json.dumps({"path": "new.txt", "content": SECRET})},
        {"aid": "AID.NOPE.v1", "input_json": "{}"},
        {"aid": "AID.TEXT.STATS.v1", "input_json": "[1, 2]"},
        {"aid": "AID.ECHO.v1", "input_json": "{}", "idempotency_key": "k"},
        {"aid": "AID.ECHO.v1", "input_json": "{}", "idempotency_key": "k"},
    ], "--audit-db", str(store), "--audit-jsonl", str(jsonl), cwd=ws)
    assert [r["ok"] for r in out] == [True, True, False, True, False, False, True, True]
    rows = call_log(store)
    assert [r["tool"] for r in rows] == ["AID.ECHO.v1", "tools.file.read", "readFile", "AID.FILE.WRITE.v1",
                                         "AID.NOPE.v1", "AID.TEXT.STATS.v1", "AID.ECHO.v1", "AID.ECHO.v1"]
    assert {r["front"] for r in rows} == {"serve"}
    # (a call that names no user is the OS user's: the front knows no other)
    assert [r["user"] for r in rows[:4]] == ["alice", "alice", "bob", pwd.getpwuid(os.geteuid()).pw_name]
    assert [r["code"] for r in rows] == ["ok", "ok", "access_denied", "ok", "tool_not_found", "schema_violation", "ok",
                                         "ok"]
    assert [r["status"] for r in rows[2:6]] == ["TOOL_ERROR", "OK", "INVALID_PICK", "INVALID_PICK"]
    assert [r["error_type"] for r in rows[2:6]] == ["AccessDenied", None, "NotFound", "InvalidInput"]
    assert [r["idempotent_hit"] for r in rows[6:]] == [0, 1]
    # Paths in full, contents never: sizes and kinds instead.
    assert [r["path"] for r in rows[1:4]] == ["notes.txt", "../outside.txt", "new.txt"]
    assert json.loads(rows[0]["args"]) == {"msg": f"<string, {len(SECRET)} bytes>", "n": "<number>"}
    assert json.loads(rows[3]["args"]) == {"path": "new.txt", "content": f"<string, {len(SECRET)} bytes>"}
    assert json.loads(rows[5]["args"]) == {"<input>": "<array, 6 bytes>"}
    assert rows[0]["input_bytes"] == len(json.dumps({"msg": SECRET, "n": 7}))
    assert rows[0]["output_bytes"] == len(out[0]["output_json"])
    assert all(r["duration_us"] >= 0 and r["time"].endswith("Z") for r in rows)
    assert abs(rows[0]["ts_ms"] / 1000 - time.time()) < 120
    # The JSON lines say the same, call for call.
    lines = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert [(x["tool"], x["front"], x["user"], x["code"], x["path"]) for x in lines] == [
        (r["tool"], r["front"], r["user"], r["code"], r["path"]) for r in rows]
    assert lines[3]["args"] == json.loads(rows[3]["args"])
    # Nothing of the contents anywhere in the store's files.
    for f in store.parent.iterdir():
        assert SECRET.encode() not in f.read_bytes(), f.name


def test_every_front_records_its_calls(store: Path, ws: Path, tmp_path: Path) -> None:
    flags = ["--audit-db", str(store)]
    env = {"MACHINA_TOOLHOST_WORKSPACE": str(ws)}
    # --run
    proc = subprocess.run([TOOLHOST, "--run", "AID.ECHO.v1", *flags], input=b'{"input_json": "{\\"a\\": 1}"}',
                          capture_output=True, timeout=30, env=base_env(env), cwd=ws)
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"]
    # --serve
    serve([{"aid": "AID.ECHO.v1", "input_json": "{}"}], *flags, cwd=ws, env=env)
    # --mcp and --skill: JSON-RPC lines
    for mode in ("--mcp", "--skill"):
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
                 {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                  "params": {"name": "AID.ECHO.v1", "arguments": {"via": mode}}}]
        proc = subprocess.run([TOOLHOST, mode, *flags], input="".join(json.dumps(x) + "\n" for x in lines).encode(),
                              capture_output=True, timeout=30, env=base_env(env), cwd=ws)
        assert proc.returncode == 0, proc.stderr.decode()
        answers = [json.loads(x) for x in proc.stdout.decode().splitlines()]
        assert any(a.get("id") == 2 and "result" in a for a in answers)
    # --http
    host = start_http_host(*flags, env=env)
    try:
        status, body = host.post("/run", {"protocol_version": 1, "tool_name": "AID.ECHO.v1", "payload": {"x": 1}})
        assert status == 200 and body["ok"]
    finally:
        host.proc.terminate()
        assert host.proc.wait(timeout=10) == 0
    # Python: in-process and a pool of --serve processes
    with md.InProcess(audit_db=str(store)) as inproc:
        assert inproc.call("AID.ECHO.v1", {"y": 1}).ok
    with md.Pool(2, args=flags, env=base_env(env)) as pool:
        assert all(r.ok for r in pool.call_many([("AID.ECHO.v1", {"i": i}) for i in range(10)]))
    fronts = [r["front"] for r in call_log(store)]
    assert fronts.count("run") == 1 and fronts.count("serve") == 11 and fronts.count("mcp") == 1
    assert fronts.count("skill") == 1 and fronts.count("http") == 1 and fronts.count("python") == 1
    assert len(fronts) == 16


def test_a_caller_of_the_binding_names_its_own_front(store: Path) -> None:
    """A program that serves calls through _core.Host.call_json labels them with its own front's
    name; a network peer (local_caller=False) is not taken for the OS user."""
    host = md.Host(audit_db=str(store))
    line = json.dumps({"aid": "AID.ECHO.v1", "input_json": "{}"})
    assert json.loads(host.call_json(line, md.Session(), front="grpc-gateway", local_caller=False))["ok"]
    assert json.loads(host.call_json(line, md.Session(), front="agent_1"))["ok"]
    for bad in ("", "two words", "x" * 33, "naïve"):
        with pytest.raises(md.HostError, match="letters, digits, '-' or '_'"):
            host.call_json(line, md.Session(), front=bad)
    host.close()
    rows = call_log(store)
    assert [(r["front"], r["user"]) for r in rows] == [("grpc-gateway", None),
                                                      ("agent_1", pwd.getpwuid(os.geteuid()).pw_name)]


def test_a_call_answered_by_the_deadline_is_recorded_when_answered(store: Path, ws: Path, misbehaving: str) -> None:
    # An inline tool that never returns: the host answers `timeout` through the overrun sink and
    # exits with the tool still stuck; the record is written before the exit.
    t0 = time.monotonic()
    out = serve([{"aid": "AID.TEST.HANG.v1", "input_json": "{}", "timeout_ms": 200},
                 {"aid": "AID.TEST.SLOW.v1", "input_json": '{"ms": 30}'}],
                "--plugin", misbehaving, "--audit-db", str(store), cwd=ws)
    assert [r.get("code") for r in out] == ["timeout", None]
    assert time.monotonic() - t0 < scaled(20)
    rows = call_log(store)
    assert [(r["tool"], r["code"], r["error_type"]) for r in rows] == [
        ("AID.TEST.HANG.v1", "timeout", "Timeout"), ("AID.TEST.SLOW.v1", "ok", None)]
    assert 150_000 <= rows[0]["duration_us"] < 10_000_000  # about its 200 ms deadline
    assert rows[1]["duration_us"] >= 30_000


def test_the_report_answers_the_services_audit_questions(store: Path, ws: Path, misbehaving: str) -> None:
    lines = []
    for i in range(20):
        lines.append({"aid": "AID.TEST.SLOW.v1", "input_json": json.dumps({"ms": 1 + (i % 5)})})
    for _ in range(6):
        lines.append({"aid": "tools.file.read", "input_json": json.dumps({"path": "notes.txt"})})
    lines.append({"aid": "tools.file.read", "input_json": json.dumps({"path": "missing.txt"})})
    lines.append({"aid": "tools.file.read", "input_json": json.dumps({"path": "/etc/passwd"}), "user": "mallory"})
    lines += [{"aid": "AID.TEST.FAIL.v1", "input_json": "{}"}] * 3
    serve(lines, "--plugin", misbehaving, "--plugin", str(md.builtin_plugin_path()), "--packs", "files",
          "--audit-db", str(store), cwd=ws)
    r = report(store)
    assert r["calls"] == 31 and r["errors"] == 5
    assert [t["tool"] for t in r["most_used_tools"][:3]] == ["AID.TEST.SLOW.v1", "tools.file.read", "AID.TEST.FAIL.v1"]
    assert r["most_accessed_paths"][0] == {"path": "notes.txt", "calls": 6, "tools": ["tools.file.read"]}
    assert {p["path"] for p in r["most_accessed_paths"]} == {"notes.txt", "missing.txt", "/etc/passwd"}
    by_tool = {t["tool"]: t for t in r["tools"]}
    slow = by_tool["AID.TEST.SLOW.v1"]
    assert slow["calls"] == 20 and slow["errors"] == 0
    lat = slow["latency_us"]
    assert 1000 <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert lat["p50"] >= 3000  # the median sleep is 3 ms
    assert by_tool["AID.TEST.FAIL.v1"]["error_rate"] == 1.0
    assert by_tool["AID.TEST.FAIL.v1"]["errors_by_type"] == {"SystemError": 3}
    assert by_tool["tools.file.read"]["errors_by_type"] == {"NotFound": 1, "AccessDenied": 1}
    assert r["users"] == [{"user": pwd.getpwuid(os.geteuid()).pw_name, "calls": 30}, {"user": "mallory", "calls": 1}]
    assert r["fronts"] == {"serve": 31}
    # The text form says the same things.
    text = subprocess.run([TOOLHOST, "audit", "report", "--db", str(store)], capture_output=True, text=True,
                          timeout=30).stdout
    assert "Most used tools" in text and "notes.txt" in text and "AccessDenied 1" in text
    assert "31 calls" in text and "5 failed" in text


def test_the_report_takes_a_time_range(store: Path, ws: Path) -> None:
    serve([{"aid": "AID.ECHO.v1", "input_json": "{}"}] * 3, "--audit-db", str(store), cwd=ws)
    age(store, range(1, 2), days=3)  # one call three days ago
    assert report(store)["calls"] == 3
    assert report(store, "--since", "24h")["calls"] == 2
    assert report(store, "--until", "2d")["calls"] == 1
    assert report(store, "--since", "2000-01-01", "--until", "2000-01-02")["calls"] == 0
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert report(store, "--since", today)["calls"] == 2
    bad = subprocess.run([TOOLHOST, "audit", "report", "--db", str(store), "--since", "yesterday"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "'yesterday' is not a time" in bad.stderr


def test_retention_keeps_the_store_bounded(store: Path, ws: Path) -> None:
    serve([{"aid": "AID.ECHO.v1", "input_json": json.dumps({"path": f"f{i}"})} for i in range(30)],
          "--audit-db", str(store), cwd=ws)
    age(store, range(1, 6), days=10)  # five calls ten days old
    # A host starting on the store applies its bounds: older than 7 days, and past the newest 20.
    serve([{"aid": "AID.ECHO.v1", "input_json": "{}"}], "--audit-db", str(store), "--audit-retention-days", "7",
          "--audit-max-rows", "20", cwd=ws)
    rows = call_log(store)
    assert len(rows) <= 20 and rows[-1]["args"] == "{}"
    assert all(r["ts_ms"] > (time.time() - 7 * 86400) * 1000 for r in rows)
    # Digests no call refers to any more are gone too.
    con = sqlite3.connect(store)
    (args_rows,) = con.execute("SELECT count(*) FROM args").fetchone()
    con.close()
    assert args_rows == len({r["args"] for r in rows})


def test_the_json_lines_file_is_rotated_at_its_bound(store: Path, ws: Path) -> None:
    jsonl = store.parent / "calls.jsonl"
    big = {"aid": "AID.ECHO.v1", "input_json": json.dumps({"path": "p" * 1000})}  # ~1.3 KB a line
    for _ in range(2):
        serve([big] * 500, "--audit-jsonl", str(jsonl), "--audit-jsonl-max-mb", "1", cwd=ws)
    old = Path(str(jsonl) + ".1")
    assert old.exists() and jsonl.exists()
    assert old.stat().st_size <= 1 << 20 and jsonl.stat().st_size <= 1 << 20
    assert len(old.read_text().splitlines()) + len(jsonl.read_text().splitlines()) >= 500


def test_no_tool_can_reach_the_store(tmp_path: Path, ws: Path) -> None:
    inside = ws / "calls.db"
    proc = subprocess.run([TOOLHOST, "--serve", "--audit-db", str(inside)], input=b"", capture_output=True,
                          timeout=30, cwd=ws)
    assert proc.returncode == 2 and "lies inside the tools' root" in proc.stderr.decode()
    # Outside the roots the file tools cannot name it (absolute or climbing), nor list it.
    store = tmp_path / "audit" / "calls.db"
    store.parent.mkdir()
    out = serve([{"aid": "AID.FILE.READ.v1", "input_json": json.dumps({"path": str(store)})},
                 {"aid": "AID.FILE.READ.v1", "input_json": json.dumps({"path": "../audit/calls.db"})},
                 {"aid": "AID.FILE.WRITE.v1", "input_json": json.dumps({"path": str(store), "content": "x"})},
                 {"aid": "AID.FILE.DELETE.v1", "input_json": json.dumps({"path": "../audit/calls.db-wal"})}],
                "--audit-db", str(store), cwd=ws)
    assert [r["code"] for r in out] == ["access_denied"] * 4
    assert len(call_log(store)) == 4  # and each refusal is itself recorded


def test_bad_settings_are_refused_clearly(tmp_path: Path, ws: Path) -> None:
    def start(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([TOOLHOST, "--serve", *args], input="", capture_output=True, text=True, timeout=30,
                              cwd=ws)

    p = start("--audit-db", str(tmp_path / "no" / "such" / "dir" / "a.db"))
    assert p.returncode == 2 and "audit store" in p.stderr and "cannot open" in p.stderr
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("INSERT INTO meta VALUES('schema', 'something else 9')")
    con.commit()
    con.close()
    p = start("--audit-db", str(other))
    assert p.returncode == 2 and "something else 9" in p.stderr
    p = start("--audit-db", str(tmp_path / "a.db"), "--audit-retention-days", "0")
    assert p.returncode == 2 and "audit-retention-days" in p.stderr
    p = start("--audit-jsonl", str(tmp_path / "no" / "dir" / "a.jsonl"))
    assert p.returncode == 2 and "cannot be opened" in p.stderr
    r = subprocess.run([TOOLHOST, "audit", "report", "--db", str(tmp_path / "missing.db")], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "no audit store at" in r.stderr
    # (without a store named, the report reads the default one: with none, it asks for one)
    r = subprocess.run([TOOLHOST, "audit", "report"], capture_output=True, text=True, timeout=30,
                       env=base_env({"MACHINA_TOOLHOST_AUDIT": "0"}))
    assert r.returncode == 2 and "--db" in r.stderr
    with pytest.raises(md.HostError, match="audit store"):
        md.InProcess(audit_db=str(tmp_path / "no" / "such" / "x.db"))


def test_the_environment_names_the_store(store: Path, ws: Path) -> None:
    serve([{"aid": "AID.ECHO.v1", "input_json": "{}"}], cwd=ws, env={"MACHINA_TOOLHOST_AUDIT_DB": str(store)})
    assert len(call_log(store)) == 1
    r = subprocess.run([TOOLHOST, "audit", "report", "--format", "json"], capture_output=True, text=True, timeout=30,
                       env=base_env({"MACHINA_TOOLHOST_AUDIT_DB": str(store)}))
    assert r.returncode == 0 and json.loads(r.stdout)["calls"] == 1


def test_many_processes_share_one_store(store: Path, ws: Path) -> None:
    procs = [subprocess.Popen([TOOLHOST, "--serve", "--audit-db", str(store)], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ws, env=base_env())
             for _ in range(4)]
    text = "".join(json.dumps({"aid": "AID.ECHO.v1", "input_json": json.dumps({"i": i})}) + "\n" for i in range(2000))
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(text.encode())
        p.stdin.close()
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr.read().decode() if p.stderr else ""
    assert len(call_log(store)) == 8000


def test_a_stopped_store_writes_everything_recorded(store: Path, ws: Path) -> None:
    # 50 000 calls in one stream: the host's buffers absorb them, the writer catches up, and
    # the host ends only once every call is in the store.
    n = 50_000
    text = "".join(json.dumps({"aid": "AID.ECHO.v1", "input_json": json.dumps({"i": i})}) + "\n" for i in range(n))
    proc = subprocess.run([TOOLHOST, "--serve", "--audit-db", str(store)], input=text.encode(),
                          capture_output=True, timeout=120, cwd=ws, env=base_env())
    assert proc.returncode == 0 and proc.stdout.count(b"\n") == n
    con = sqlite3.connect(store)
    (count,) = con.execute("SELECT count(*) FROM calls").fetchone()
    con.close()
    assert count == n
    assert os.path.getsize(store) > 0
