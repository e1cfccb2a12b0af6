"""The container runner: Python tools (tool protocol v1) run in a container image through
Debian's podman, one container per call, with an image made locally (container_support.py).
Declared in a tool manifest ([[tool]] runner = "container") or by a namel3ss pack's binding.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import machina_dispatch as md
import pytest
from conftest import TOOLHOST, base_env, serve
from container_support import containers_conf, make_image, our_containers, podman, runtime_env
from python_support import call

EXAMPLE_PACK = Path(__file__).parent / "packs" / "example.greeting"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str], str]]:
    """(podman, the environment it needs here, the test image)."""
    program = podman()
    env = runtime_env(containers_conf(tmp_path_factory.mktemp("podman")))
    yield from ((program, env, image) for image in make_image(program, env))


def host_env(runtime: tuple[str, dict[str, str], str], **extra: str) -> dict[str, str]:
    return {"CONTAINERS_CONF": runtime[1]["CONTAINERS_CONF"], "MACHINA_TOOLHOST_CONTAINER_RUNTIME": "podman", **extra}


def manifest(tmp_path: Path, image: str, aid: str, entry: str, extra: str = "") -> Path:
    path = tmp_path / "tools.toml"
    with path.open("a") as f:
        f.write(f'[[tool]]\naid = "{aid}"\nname = "{aid.lower()}"\nrunner = "container"\n'
                f'image = "{image}"\nentry = "{entry}"\n{extra}\n')
    return path


def test_a_container_tool_answers_and_its_trace_names_the_container(tmp_path: Path, runtime: Any) -> None:
    tools = manifest(tmp_path, runtime[2], "AID.BOX.GREET.v1", "tools.probe:greet")
    [answer] = serve([call("AID.BOX.GREET.v1", {"name": "Ada"})], "--tools", str(tools), env=host_env(runtime))
    assert answer["ok"] is True, answer
    assert json.loads(answer["output_json"]) == {"message": "Hello Ada", "in_container": True}
    trace = answer["trace"]
    assert trace["runner"] == "container" and trace["container_runtime"] == "podman"
    assert trace["image"] == runtime[2] and trace["command"] == "python -m namel3ss_tools.runner"
    assert trace["container_enforcement"] == "verified" and trace["enforcement_level"] == "none"
    assert trace["protocol_version"] == 1 and trace["resolved_source"] == "binding"
    assert "python_env" in trace and trace["entry"] == "tools.probe:greet"
    assert trace["exit_code"] == 0 and trace["container_name"].startswith("machina-call-")
    assert our_containers(runtime[0], runtime[1]) == []


def test_required_guarantees_are_the_containers_flags(tmp_path: Path, runtime: Any) -> None:
    guarded = "[tool.guarantees]\nno_network = true\nno_filesystem_write = true\nno_subprocess = true\n"
    tools = manifest(tmp_path, runtime[2], "AID.BOX.OPEN.v1", "tools.probe:attempts",
                     'container_env = { PACK_GREETING = "hi" }')
    manifest(tmp_path, runtime[2], "AID.BOX.SHUT.v1", "tools.probe:attempts", guarded)
    open_answer, shut_answer = serve([call("AID.BOX.OPEN.v1", {}), call("AID.BOX.SHUT.v1", {})],
                                     "--tools", str(tools), env=host_env(runtime, HOST_SECRET="s3"))
    assert open_answer["ok"] is True and shut_answer["ok"] is True, (open_answer, shut_answer)
    opened, shut = json.loads(open_answer["output_json"]), json.loads(shut_answer["output_json"])
    # Without guarantees the tool writes and starts processes; no host variable enters either way.
    assert opened["write"] == "ok" and opened["subprocess"] == 0, opened
    assert opened["env"] == {"PACK_GREETING": "hi"}
    assert shut["write"] == "OSError" and shut["subprocess"] == "BlockingIOError", shut
    assert shut["interfaces"] == ["lo"] and shut["network"] != "ok" and shut["env"] == {}
    trace = shut_answer["trace"]
    assert trace["enforcement_level"] == "enforced" and trace["container_enforcement"] == "verified"
    assert trace["enforcement"] == {"no_filesystem_write": "a read-only root, no writable folder",
                                    "no_network": "no network but loopback (network none)",
                                    "no_subprocess": "one process at most (pids limit 1)"}


def test_a_tool_error_with_a_check_reason_answers_its_reason_code(tmp_path: Path, runtime: Any) -> None:
    tools = manifest(tmp_path, runtime[2], "AID.BOX.REFUSE.v1", "tools.probe:refuse")
    [answer] = serve([call("AID.BOX.REFUSE.v1", {})], "--tools", str(tools), env=host_env(runtime))
    assert answer["ok"] is False and answer["status"] == "TOOL_ERROR", answer
    assert answer["error"] == "PermissionError: the tool may not reach the network"
    assert answer["trace"]["reason_code"] == "network_blocked"


def test_a_container_past_its_deadline_is_killed_and_removed(tmp_path: Path, runtime: Any) -> None:
    manifest(tmp_path, runtime[2], "AID.BOX.SLEEP.v1", "tools.probe:sleep", "timeout_ms = 2000")
    tools = manifest(tmp_path, runtime[2], "AID.BOX.GREET.v1", "tools.probe:greet")
    [answer, after] = serve([call("AID.BOX.SLEEP.v1", {"seconds": 60}), call("AID.BOX.GREET.v1", {})],
                            "--tools", str(tools), env=host_env(runtime), timeout=90)
    assert answer["ok"] is False and answer["code"] == "timeout", answer
    assert after["ok"] is True, after  # the host serves on
    assert our_containers(runtime[0], runtime[1]) == []


def test_an_answer_over_the_cap_ends_the_container(tmp_path: Path, runtime: Any) -> None:
    """The flooding tool stays after writing: only the runner's removal ends its container
    before its deadline (which would answer timeout instead)."""
    manifest(tmp_path, runtime[2], "AID.BOX.FLOOD.v1", "tools.probe:flood", "timeout_ms = 30000")
    tools = manifest(tmp_path, runtime[2], "AID.BOX.SHOUT.v1", "tools.probe:shout")
    [big, small] = serve([call("AID.BOX.FLOOD.v1", {"n": 3_000_000}), call("AID.BOX.SHOUT.v1", {"n": 5})],
                         "--tools", str(tools), "--max-output-bytes", "1000", env=host_env(runtime), timeout=90)
    assert big["ok"] is False and "larger than" in big["error"], big
    assert big["trace"]["duration_ms"] < 25_000
    assert small["ok"] is True and json.loads(small["output_json"]) == "xxxxx"
    assert our_containers(runtime[0], runtime[1]) == []


def test_an_image_the_runtime_does_not_have_is_a_clear_error(tmp_path: Path, runtime: Any) -> None:
    tools = manifest(tmp_path, "localhost/machina-no-such-image:1", "AID.BOX.NONE.v1", "tools.probe:greet")
    [answer] = serve([call("AID.BOX.NONE.v1", {})], "--tools", str(tools), env=host_env(runtime))
    assert answer["ok"] is False, answer
    assert "podman exited with status 125 without an answer" in answer["error"]
    assert "machina-no-such-image" in answer["error"]


@pytest.mark.parametrize(("binding", "expected"), [
    ('    image: "--privileged"\n', r"tools\.yaml:6: tool 'compose greeting': field 'image': .* starts with '-'"),
    ('    image: "--network=host"\n', r"tools\.yaml:6: tool 'compose greeting': field 'image': .* starts with '-'"),
    ('    image: "img 1"\n', r"tools\.yaml:6: tool 'compose greeting': field 'image': must not hold white space"),
    ('    image: "oci-archive:/etc/img.tar"\n', r"tools\.yaml:6: .*field 'image': .* names the transport oci-archive:"),
    ('    image: "i"\n    env:\n      "*": "x"\n',
     r"tools\.yaml:8: tool 'compose greeting': field 'env': '\*' is not a variable name"),
    ('    image: "i"\n    env:\n      "HOME\\0x": "x"\n',
     r"tools\.yaml:8: tool 'compose greeting': field 'env': 'HOME\?x' is not a variable name"),
    ('    image: "i"\n    env:\n      HOME:\n',
     r"tools\.yaml:\d+: tool 'compose greeting': field 'env': 'HOME' must have a text value"),
])
def test_what_a_pack_could_slip_onto_the_runtimes_command_line_is_refused(tmp_path: Path, binding: str,
                                                                          expected: str) -> None:
    """A pack's binding is not the operator's word: an image like `--network=host` would undo
    the guarantees' flags, a local transport would read a host path, and a variable name like
    `*` (or one cut short by a NUL) would have the runtime copy the host's variables. Refused
    when the pack loads, before any runtime is looked for (no podman needed: PATH is empty)."""
    pack = pack_with(tmp_path, "unused", f'    entry: "tools.probe:greet"\n    runner: "container"\n{binding}')
    proc = subprocess.run([TOOLHOST, "--tools", str(pack), "--list"], capture_output=True, text=True,
                          env=base_env({"PATH": "/nowhere"}), timeout=60)
    assert proc.returncode != 0, proc.stdout
    assert re.search(expected, proc.stderr), proc.stderr


def test_a_packs_secrets_are_the_only_host_variables_its_container_gets(tmp_path: Path, runtime: Any) -> None:
    pack = pack_with(tmp_path, runtime[2], f'    entry: "tools.probe:attempts"\n    runner: "container"\n'
                                           f'    image: "{runtime[2]}"\n')
    (pack / "capabilities.yaml").write_text(
        'capabilities:\n  "compose greeting":\n    filesystem: none\n    network: none\n    env: none\n'
        '    subprocess: none\n    secrets:\n      - PACK_SECRET\n')
    [answer] = serve([call(PACK_AID, {})], "--tools", str(pack),
                     env=host_env(runtime, PACK_SECRET="s3", PACK_OTHER="no", HOST_SECRET="no"))
    assert answer["ok"] is True, answer
    assert json.loads(answer["output_json"])["env"] == {"PACK_SECRET": "s3"}
    assert "no_env_read" not in answer["trace"]["enforcement"]


def test_closing_the_host_removes_the_containers_of_calls_under_way(tmp_path: Path, runtime: Any) -> None:
    tools = manifest(tmp_path, runtime[2], "AID.BOX.SLEEP.v1", "tools.probe:sleep", "timeout_ms = 60000")
    os.environ["CONTAINERS_CONF"], saved = runtime[1]["CONTAINERS_CONF"], os.environ.get("CONTAINERS_CONF")
    try:
        host = md.InProcess(tools=[str(tools)], container_runtime="podman")
        answers: list[Any] = []
        caller = threading.Thread(target=lambda: answers.append(
            host.call("AID.BOX.SLEEP.v1", {"seconds": 60}, check=False)))
        t0 = time.monotonic()
        caller.start()
        while not our_containers(runtime[0], runtime[1]) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        assert our_containers(runtime[0], runtime[1]), "the call's container never started"
        host.close()
        caller.join(30)
        assert not caller.is_alive() and time.monotonic() - t0 < 40
        assert our_containers(runtime[0], runtime[1]) == []
        assert answers and not answers[0].ok
    finally:
        if saved is None:
            del os.environ["CONTAINERS_CONF"]
        else:
            os.environ["CONTAINERS_CONF"] = saved


def pack_with(tmp_path: Path, image: str, binding: str, pack_extra: str = "") -> Path:
    pack = tmp_path / "example.greeting"
    shutil.copytree(EXAMPLE_PACK, pack)
    (pack / "tools.yaml").write_text(f'tools:\n  "compose greeting":\n    kind: "python"\n{binding}')
    with (pack / "pack.yaml").open("a") as f:
        f.write(pack_extra.replace("IMAGE", image))
    return pack


PACK_AID = "AID.PACK.EXAMPLE_GREETING.COMPOSE_GREETING.v1"


@pytest.mark.parametrize(("binding", "pack_extra"), [
    ('    entry: "tools.probe:greet"\n    runner: "container"\n    image: "IMAGE"\n', ""),
    ('    entry: "tools.probe:greet"\n', 'runners:\n  default: "container"\ncontainer:\n  image: "IMAGE"\n'),
])
def test_a_packs_container_binding_runs_in_the_container(tmp_path: Path, runtime: Any, binding: str,
                                                         pack_extra: str) -> None:
    pack = pack_with(tmp_path, runtime[2], binding.replace("IMAGE", runtime[2]), pack_extra)
    [answer] = serve([call(PACK_AID, {"name": "Lin"})], "--tools", str(pack), env=host_env(runtime))
    assert answer["ok"] is True, answer
    assert json.loads(answer["output_json"])["message"] == "Hello Lin"
    trace = answer["trace"]
    assert trace["runner"] == "container" and trace["resolved_source"] == "installed_pack"
    assert (trace["pack_id"], trace["pack_version"]) == ("example.greeting", "stable")
    # capabilities.yaml says none of everything: the container's flags enforce it.
    assert trace["enforcement_level"] == "enforced"
    assert set(trace["enforcement"]) == {"no_network", "no_filesystem_write", "no_filesystem_read",
                                         "no_subprocess", "no_env_read"}


@pytest.mark.parametrize(("extra", "env", "expected"), [
    ('container_runtime = "lxc"', {}, r"field 'container_runtime': must be \"podman\" or \"docker\", not 'lxc'"),
    ("", {"MACHINA_TOOLHOST_CONTAINER_RUNTIME": "docker", "PATH": "/nowhere"},
     r"field 'container_runtime': docker is not on PATH"),
    ("", {"PATH": "/nowhere"}, r"field 'container_runtime': neither docker nor podman is on PATH"),
    ('command = []', {}, r"field 'command': must name a program"),
    ('container_env = { "A=B" = "1" }', {}, r"field 'container_env': 'A=B' is not a variable name"),
    ('container_env = { A = 1 }', {}, r"field 'container_env': 'A' must be a string"),
])
def test_a_bad_container_tool_is_refused_at_load(tmp_path: Path, extra: str, env: dict[str, str],
                                                  expected: str) -> None:
    tools = manifest(tmp_path, "localhost/any:1", "AID.BOX.BAD.v1", "tools.probe:greet", extra)
    proc = subprocess.run([TOOLHOST, "--tools", str(tools), "--list"], capture_output=True, text=True,
                          env=base_env(env), timeout=60)
    assert proc.returncode != 0, proc.stdout
    assert re.search(expected, proc.stderr), proc.stderr
