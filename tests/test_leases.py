"""Leases: with MACHINA_LEASE_ENFORCE=1 a tool of tier > 0 needs a single-use,
time-limited lease for that tool, minted by an operator with the secret."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import machina_dispatch
import pytest
from conftest import LEASE_SECRET, TOOLHOST, base_env, lease_hint, ok_response, run_json, serve

WRITE = "AID.FILE.WRITE.v1"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "ws").mkdir()
    return {"MACHINA_LEASE_ENFORCE": "1", "MACHINA_LEASE_SECRET": LEASE_SECRET,
            "MACHINA_TOOLHOST_WORKSPACE": str(tmp_path / "ws"), "MACHINA_LEASE_LEDGER": str(tmp_path / "ledger")}


def write_req(token: str | None = None, content: str = "hi", **fields: Any) -> dict[str, Any]:
    req: dict[str, Any] = {"aid": WRITE, "input_json": json.dumps({"path": "out.txt", "content": content})}
    if token is not None:
        req["_lease_token"] = token
    req.update(fields)
    return req


def issue(aid: str = WRITE, ttl: float = 30, secret: str = LEASE_SECRET) -> str:
    return machina_dispatch.issue_lease(aid, ttl, secret=secret)


def rejected(reason: str) -> dict[str, Any]:
    return {"ok": False, "status": "TOOL_ERROR", "error": "lease_rejected", "code": "lease_rejected", "reason": reason}


REQUIRED = {"ok": False, "status": "TOOL_ERROR", "error": "lease_required", "code": "lease_required", "tier": 1,
            "aid": WRITE, "hint": lease_hint(WRITE, 1)}


def test_off_by_default(tmp_path: Path) -> None:
    r = serve([write_req()], env={"MACHINA_TOOLHOST_WORKSPACE": str(tmp_path)})
    assert r[0]["ok"] is True
    assert (tmp_path / "out.txt").read_text() == "hi"


def test_tier_gt_0_needs_a_lease_and_tier_0_does_not(env: dict[str, str], tmp_path: Path) -> None:
    r = serve([write_req(), {"aid": "AID.ECHO.v1", "input_json": "1"}], env=env)
    assert r == [REQUIRED, ok_response("1")]
    assert not (tmp_path / "ws" / "out.txt").exists()


def test_valid_lease_runs_once_and_replay_is_rejected(env: dict[str, str], tmp_path: Path) -> None:
    token = issue()
    r = serve([write_req(token, "one"), write_req(token, "two")], env=env)
    assert r[0]["ok"] is True
    assert r[1] == rejected("consumed")
    assert (tmp_path / "ws" / "out.txt").read_text() == "one"


def test_lease_is_bound_to_its_tool(env: dict[str, str], misbehaving: str) -> None:
    token = issue("AID.TEST.TIER2.v1")
    r = serve([write_req(token), {"aid": "AID.TEST.TIER2.v1"}, {"aid": "AID.TEST.TIER2.v1", "_lease_token": token}],
              "--plugin", str(machina_dispatch.builtin_plugin_path()), "--plugin", misbehaving, "--packs", "files",
              env=env)
    assert r[0] == rejected("wrong_tool")
    assert r[1] == {"ok": False, "status": "TOOL_ERROR", "error": "lease_required", "code": "lease_required", "tier": 2,
                    "aid": "AID.TEST.TIER2.v1", "hint": lease_hint("AID.TEST.TIER2.v1", 2)}
    assert r[2] == ok_response('{"system":true}')  # wrong_tool did not use the lease up


def test_expired(env: dict[str, str]) -> None:
    token = issue(ttl=0.05)
    time.sleep(0.1)
    assert serve([write_req(token)], env=env) == [rejected("expired")]


def test_bad_signature(env: dict[str, str]) -> None:
    forged = issue(secret="another-secret-of-enough-length")
    assert serve([write_req(forged)], env=env) == [rejected("bad_signature")]
    # Tampering with the expiry breaks the signature too.
    parts = issue().split(".")
    parts[2] = str(int(parts[2]) + 3_600_000)
    assert serve([write_req(".".join(parts))], env=env) == [rejected("bad_signature")]


def test_signature_is_hmac_sha256_over_the_token(env: dict[str, str]) -> None:
    # mlt1.<aid hex>.<expiry ms>.<nonce hex>.<HMAC-SHA256(secret, all before the last dot) hex>
    token = issue()
    payload, mac = token.rsplit(".", 1)
    assert mac == hmac.new(LEASE_SECRET.encode(), payload.encode(), hashlib.sha256).hexdigest()
    prefix, aid_hex, expiry, nonce = payload.split(".")
    assert (prefix, bytes.fromhex(aid_hex).decode(), len(nonce)) == ("mlt1", WRITE, 32)
    assert 0 < int(expiry) - time.time() * 1000 <= 30_000
    # A lease signed by hand the same way (what an operator's own tooling could do) is honoured.
    own = f"mlt1.{WRITE.encode().hex()}.{int(time.time() * 1000) + 60_000}.{'ab' * 16}"
    own += "." + hmac.new(LEASE_SECRET.encode(), own.encode(), hashlib.sha256).hexdigest()
    assert serve([write_req(own)], env=env)[0]["ok"] is True


@pytest.mark.parametrize("token", ["", "abc", "mlt1.zz.1.2.3", "mlt2." + "a" * 10,
                                   "mlt1.41.notanumber." + "a" * 32 + "." + "b" * 64])
def test_malformed(env: dict[str, str], token: str) -> None:
    assert serve([write_req(token)], env=env) == [rejected("malformed")]


def test_wrong_type_token_is_a_malformed_request(env: dict[str, str]) -> None:
    r = serve([dict(write_req(), _lease_token=42)], env=env)
    assert r[0]["code"] == "malformed_request"


def test_cli_issued_lease_works_for_run(env: dict[str, str], tmp_path: Path) -> None:
    proc = subprocess.run([TOOLHOST, "lease", "issue", "--aid", WRITE, "--ttl", "30"], capture_output=True,
                          env=base_env(env), timeout=30)
    token = proc.stdout.decode().strip()
    body = {"input_json": json.dumps({"path": "r.txt", "content": "run"}), "_lease_token": token}
    assert run_json(WRITE, body, env=env)["ok"] is True
    # Single use holds across processes through the ledger.
    assert run_json(WRITE, body, env=env) == rejected("consumed")
    assert (tmp_path / "ws" / "r.txt").read_text() == "run"


def test_single_use_across_serve_processes(env: dict[str, str]) -> None:
    token = issue()
    assert serve([write_req(token)], env=env)[0]["ok"] is True
    assert serve([write_req(token)], env=env) == [rejected("consumed")]


def test_key_file_secret(env: dict[str, str], tmp_path: Path) -> None:
    key = tmp_path / "lease.key"
    key.write_text(LEASE_SECRET + "\n")
    env = dict(env)
    del env["MACHINA_LEASE_SECRET"]
    env["MACHINA_LEASE_KEY_FILE"] = str(key)
    assert serve([write_req(issue())], env=env)[0]["ok"] is True


@pytest.mark.parametrize(("extra", "message"), [
    ({}, "no lease secret: set MACHINA_LEASE_SECRET or MACHINA_LEASE_KEY_FILE"),
    ({"MACHINA_LEASE_SECRET": "short"}, "the lease secret must be at least 16 bytes long"),
    ({"MACHINA_LEASE_KEY_FILE": "/nonexistent/key"}, "cannot read lease key file /nonexistent/key"),
])
def test_enforcement_without_usable_secret_refuses_to_start(extra: dict[str, str], message: str) -> None:
    proc = subprocess.run([TOOLHOST, "--serve"], input=b"", capture_output=True,
                          env=base_env({"MACHINA_LEASE_ENFORCE": "1", **extra}), timeout=30)
    assert proc.returncode == 2
    assert message in proc.stderr.decode()
    with pytest.MonkeyPatch.context() as mp:
        for k in ("MACHINA_LEASE_SECRET", "MACHINA_LEASE_KEY_FILE"):
            mp.delenv(k, raising=False)
        mp.setenv("MACHINA_LEASE_ENFORCE", "1")
        for k, v in extra.items():
            mp.setenv(k, v)
        with pytest.raises(machina_dispatch.HostError, match=message):
            machina_dispatch.Host()


def test_no_request_can_mint_or_extend_a_lease(env: dict[str, str]) -> None:
    # Fields that look like lease administration are unknown fields: ignored, and no
    # response ever carries a token.
    token = issue(ttl=0.05)
    time.sleep(0.1)
    reqs = [
        {"aid": WRITE, "lease": {"issue": WRITE}, "_lease_secret": LEASE_SECRET},
        write_req(token, _lease_ttl=3600, lease_extend=True),
        {"aid": "lease issue", "input_json": json.dumps({"aid": WRITE})},
    ]
    r = serve(reqs, env=env)
    assert r[0] == REQUIRED
    assert r[1] == rejected("expired")
    assert r[2]["code"] == "tool_not_found"
    assert "mlt1." not in json.dumps(r)


def test_ledger_must_be_private(env: dict[str, str], tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    proc = subprocess.run([TOOLHOST, "--serve"], input=b"", capture_output=True,
                          env=base_env({**env, "MACHINA_LEASE_LEDGER": str(shared)}), timeout=30)
    assert proc.returncode == 2
    assert b"must be owned by this user and not writable by group or others" in proc.stderr


def ledger_files(ledger: Path) -> list[Path]:
    return [p for p in ledger.rglob("*") if p.is_file()]


def test_replay_memory_is_bounded_by_expiry(env: dict[str, str]) -> None:
    # Many short leases: all used once, then expired ones are forgotten (they are
    # refused as expired anyway), so the ledger does not grow without bound. The ledger
    # files leases by 1-second window of expiry and removes a window two windows after it
    # began (see lease.hpp).
    ledger = Path(env["MACHINA_LEASE_LEDGER"])
    tokens = [issue(ttl=0.2) for _ in range(50)]
    assert all(x["ok"] for x in serve([write_req(t) for t in tokens], env=env))
    assert len(ledger_files(ledger)) == 50
    time.sleep(2.3)
    assert serve([write_req(issue())], env=env)[0]["ok"] is True
    assert len(ledger_files(ledger)) == 1


def test_unwritable_ledger_fails_closed(env: dict[str, str]) -> None:
    import shutil

    p = subprocess.Popen([TOOLHOST, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env=base_env(env))
    assert p.stdin and p.stdout

    def call(token: str) -> dict[str, Any]:
        assert p.stdin and p.stdout
        p.stdin.write(json.dumps(write_req(token)).encode() + b"\n")
        p.stdin.flush()
        return dict(json.loads(p.stdout.readline()))

    try:
        assert call(issue())["ok"] is True
        shutil.rmtree(env["MACHINA_LEASE_LEDGER"])
        # The ledger cannot record the use: the lease is refused, not used unrecorded.
        assert call(issue()) == rejected("ledger_unavailable")
    finally:
        p.stdin.close()
        p.wait(timeout=10)


def test_ledger_parent_is_checked_even_with_a_trailing_slash(env: dict[str, str], tmp_path: Path) -> None:
    shared = tmp_path / "open"
    shared.mkdir()
    shared.chmod(0o777)
    proc = subprocess.run([TOOLHOST, "--serve"], input=b"", capture_output=True,
                          env=base_env({**env, "MACHINA_LEASE_LEDGER": f"{shared}/ledger/"}), timeout=30)
    assert proc.returncode == 2
    assert b"its parent folder must belong to this user or root" in proc.stderr
