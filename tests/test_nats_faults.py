"""machina-toolhost --nats hosts sharing one idempotency store (--nats-idempotency kv), one
of them killed with SIGKILL mid-load: every call gets exactly one answer, no key runs its
tool twice, and "outcome unknown" comes back only for calls the dead host had begun."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import machina_dispatch as md
import pytest
from conftest import TOOLHOST
from machina_dispatch.nats_client import Nats
from nats_support import Front, nats_server, write_kv_key
from python_support import python_tool, write_pack

WORKERS = 16


def has_shared_store() -> bool:
    return "--nats-idempotency" in subprocess.run([TOOLHOST, "--help"], capture_output=True, text=True).stdout


pytestmark = pytest.mark.skipif(not has_shared_store(), reason="needs machina-toolhost --nats-idempotency kv")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with nats_server() as u:
        yield u


def runs(marks: Path, key: str) -> int:
    path = marks / key
    return path.read_text().count("ran\n") if path.exists() else 0


def test_three_hosts_one_killed_under_load(url: str, tmp_path: Path) -> None:
    """3 native hosts in one queue group and one shared store, 2 000 calls with idempotency
    keys; one host is killed with SIGKILL mid-load, and a caller that hears nothing retries
    with the same key. Every call ends with exactly one final answer, no key runs twice, and
    only calls the dead host had taken (at most its --workers) end `tool_crashed`."""
    prefix = "faults"
    pack = write_pack(tmp_path / "pack", [python_tool("AID.PY.MARK.v1", "tools.sample_tool:sleep")])
    marks = tmp_path / "marks"
    marks.mkdir()
    key = write_kv_key(tmp_path / "kv.key")
    args = ["--nats-prefix", prefix, "--tools", str(pack), "--packs", "none", "--workers", str(WORKERS),
            "--nats-idempotency", "kv", "--kv-key-file", str(key), "--nats-kv-bucket", "faults_idem",
            "--nats-claim-grace-ms", "1000"]
    fronts = [Front(url, args, log_dir=tmp_path, native=True) for _ in range(3)]
    total = 2000
    try:
        with Nats(url, prefix=prefix, timeout=30) as warm:  # every host's Python workers started
            warm.call_many([("AID.PY.MARK.v1", {"s": 0.05}) for _ in range(6 * WORKERS)])
        with Nats(url, prefix=prefix, timeout=3) as t:
            async def one(i: int, answered: list[int]) -> tuple[md.ToolResult, int]:
                payload = {"s": 0.002, "mark": str(marks / f"k{i}")}
                tries = 0
                while True:
                    tries += 1
                    r = await t.acall("AID.PY.MARK.v1", payload, idempotency_key=f"k{i}", check=False)
                    if r.kind != "service_unavailable" or tries == 10:
                        answered.append(i)
                        return r, tries

            async def load() -> list[tuple[md.ToolResult, int]]:
                answered: list[int] = []
                tasks = [asyncio.ensure_future(one(i, answered)) for i in range(total)]
                while len(answered) < total // 4:
                    await asyncio.sleep(0.01)
                fronts[0].kill()  # SIGKILL, calls in flight on it
                return list(await asyncio.gather(*tasks))
            outcomes = asyncio.run(load())
    finally:
        for f in fronts[1:]:
            assert f.stop() == 0, f.stderr()
    assert len(outcomes) == total
    kinds: dict[str | None, int] = {}
    for i, (r, _) in enumerate(outcomes):
        kinds[r.code] = kinds.get(r.code, 0) + 1
        n = runs(marks, f"k{i}")
        assert n <= 1, f"k{i} ran {n} times"
        if r.ok:
            assert n == 1, f"k{i} answered without a run"
        else:
            # The only failure: the dead host had taken the key and died before storing its answer.
            assert r.code == "tool_crashed" and "unknown" in r.error, (r.code, r.error)
    assert kinds.get("tool_crashed", 0) <= WORKERS, kinds  # no more than the dead host could have begun
    retried = sum(1 for _, tries in outcomes if tries > 1)
    assert retried > 0, "the killed host held no call in flight: the test did not test anything"
