"""namel3ss packs (pack.yaml, tools.yaml, capabilities.yaml) loaded with `--tools DIR`.

The fixture tests/packs/example.greeting is namel3ss 0.1.0a24's example pack
(namel3ss/examples/capability_pack/packs/capability/example.greeting, MIT), copied as written.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import machina_dispatch as md
import pytest
from conftest import TOOLHOST, base_env, serve
from python_support import call

EXAMPLE = Path(__file__).parent / "packs" / "example.greeting"
AID = "AID.PACK.EXAMPLE_GREETING.COMPOSE_GREETING.v1"


def example(tmp_path: Path) -> Path:
    pack = tmp_path / "example.greeting"
    shutil.copytree(EXAMPLE, pack)
    return pack


def listed(pack: Path) -> dict[str, dict[str, Any]]:
    proc = subprocess.run([TOOLHOST, "--tools", str(pack), "--list"], capture_output=True, text=True,
                          env=base_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return {t["aid"]: t for t in json.loads(proc.stdout)["tools"]}


def refusal(pack: Path) -> str:
    proc = subprocess.run([TOOLHOST, "--tools", str(pack), "--list"], capture_output=True, text=True,
                          env=base_env(), timeout=60)
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def test_the_example_pack_lists_its_tool(tmp_path: Path) -> None:
    tools = listed(example(tmp_path))
    tool = tools[AID]
    assert tool["name"] == "compose greeting" and tool["runner"] == "python"
    assert "AID.ECHO.v1" in tools  # beside the built-in tools
    assert tool["timeout_ms"] == 10000


def test_a_call_answers_as_namel3ss_and_the_trace_names_the_pack(tmp_path: Path) -> None:
    pack = example(tmp_path)
    first, second = serve([call(AID, {"name": "Ada"}), call(AID, {})], "--tools", str(pack))
    assert first["ok"] is True, first
    assert json.loads(first["output_json"]) == {"message": "Hello Ada"}
    assert json.loads(second["output_json"]) == {"message": "Hello there"}
    trace = first["trace"]
    assert trace["resolved_source"] == "installed_pack"
    assert (trace["pack_id"], trace["pack_name"], trace["pack_version"]) == (
        "example.greeting", "Greeting Tools", "stable")
    assert trace["deps_source"] == "none"
    assert trace["tool"] == "compose greeting" and trace["entry"] == "tools.greet:run"
    assert trace["runner"] == "local" and trace["protocol_version"] == 1
    # capabilities.yaml: filesystem, network, env and subprocess "none", enforced
    assert set(trace["enforcement"]) >= {"no_network", "no_subprocess", "no_filesystem_write",
                                         "no_filesystem_read", "no_env_read"}
    assert trace["enforcement_level"] == "enforced"


def test_the_python_package_loads_a_pack_too(tmp_path: Path) -> None:
    with md.InProcess(tools=[str(example(tmp_path))]) as host:
        result = host.call(AID, {"name": "Lin"})
    assert result.output == {"message": "Hello Lin"}
    assert result.trace is not None and result.trace["pack_id"] == "example.greeting"


def test_deps_source_names_the_packs_requirements(tmp_path: Path) -> None:
    pack = example(tmp_path)
    (pack / "requirements.txt").write_text("")
    [answer] = serve([call(AID, {"name": "B"})], "--tools", str(pack))
    assert answer["ok"] is True, answer
    assert answer["trace"]["deps_source"] == "requirements"


def test_capabilities_map_onto_the_hosts_guarantees(tmp_path: Path) -> None:
    pack = example(tmp_path)
    (pack / "capabilities.yaml").write_text(
        'capabilities:\n  "compose greeting":\n    filesystem: read\n    network: outbound\n'
        '    env: read\n    subprocess: none\n    secrets: []\n')
    [answer] = serve([call(AID, {"name": "C"})], "--tools", str(pack))
    assert answer["ok"] is True, answer
    assert set(answer["trace"]["enforcement"]) == {"no_subprocess", "no_filesystem_write"}


def add_tool(pack: Path, name: str, entry: str, capabilities: str = "") -> None:
    _edit(pack, "pack.yaml", '  - "compose greeting"\n', f'  - "compose greeting"\n  - "{name}"\n')
    with (pack / "tools.yaml").open("a") as f:
        f.write(f'  "{name}":\n    kind: "python"\n    entry: "{entry}"\n')
    if capabilities:
        with (pack / "capabilities.yaml").open("a") as f:
            f.write(f'  "{name}":\n{capabilities}')


def test_secrets_are_the_variables_a_tool_gets(tmp_path: Path) -> None:
    pack = example(tmp_path)
    (pack / "tools" / "probe.py").write_text(
        "import os\n\ndef run(payload):\n    return {k: os.environ.get(k) for k in ('PACK_SECRET', 'OTHER_SECRET')}\n")
    add_tool(pack, "read secret", "tools.probe:run",
             "    filesystem: none\n    network: none\n    env: none\n    subprocess: none\n"
             "    secrets:\n      - PACK_SECRET\n")
    [answer] = serve([call("AID.PACK.EXAMPLE_GREETING.READ_SECRET.v1", {})], "--tools", str(pack),
                     env={"PACK_SECRET": "s3", "OTHER_SECRET": "no"})
    assert answer["ok"] is True, answer
    assert json.loads(answer["output_json"]) == {"PACK_SECRET": "s3", "OTHER_SECRET": None}


def test_a_pack_binding_its_tools_in_pack_yaml_loads_without_tools_yaml(tmp_path: Path) -> None:
    """The layout namel3ss's `n3 packs init` writes for Python tools: pack.yaml's entrypoints."""
    pack = example(tmp_path)
    (pack / "tools.yaml").unlink()
    with (pack / "pack.yaml").open("a") as f:
        f.write('entrypoints:\n  "compose greeting":\n    kind: "python"\n    entry: "tools.greet:run"\n'
                '    purity: "pure"\n')
    [answer] = serve([call(AID, {"name": "Eve"})], "--tools", str(pack))
    assert answer["ok"] is True, answer
    assert json.loads(answer["output_json"]) == {"message": "Hello Eve"}
    assert answer["trace"]["runner"] == "local" and answer["trace"]["pack_id"] == "example.greeting"
    assert listed(pack)[AID]["deterministic"] is True  # purity: pure
    (pack / "pack.yaml").write_text((pack / "pack.yaml").read_text().replace("tools.greet:run", "tools.greet"))
    assert re.search(r"pack\.yaml:\d+: tool 'compose greeting': field 'entry': must be 'module:function'",
                     refusal(pack)), refusal(pack)


def _edit(pack: Path, name: str, old: str, new: str) -> None:
    text = (pack / name).read_text()
    assert old in text
    (pack / name).write_text(text.replace(old, new))


def _edit_all(pack: Path, edits: list[tuple[str, str, str]]) -> None:
    for name, old, new in edits:
        _edit(pack, name, old, new)


@pytest.mark.parametrize(("change", "expected"), [
    (lambda p: (p / "tools.yaml").unlink(),
     r"example\.greeting: no tools\.yaml in the pack and no entrypoints in its pack\.yaml"),
    (lambda p: (p / "pack.yaml").unlink(), r"example\.greeting: no pack\.yaml in the pack"),
    (lambda p: (p / "pack.yaml").write_text("# padding\n" * 120_000),
     r"pack\.yaml: larger than 1048576 bytes"),
    (lambda p: (p / "tools.yaml").write_text("tools: " + "[" * 5000),
     r"tools\.yaml:1: not valid YAML: nested too deep \(\d+ levels\)"),
    (lambda p: _edit(p, "pack.yaml", '  - "compose greeting"', '  - "compose greeting"\n  - "wave"'),
     r"pack\.yaml:9: the tool 'wave' has no binding in tools\.yaml"),
    (lambda p: _edit(p, "tools.yaml", 'kind: "python"', 'kind: "node"'),
     r"tools\.yaml:3: tool 'compose greeting': field 'kind': must be \"python\", not 'node'"),
    (lambda p: _edit(p, "tools.yaml", 'kind: "python"', 'kind: "python": x'),
     r"tools\.yaml:3: not valid YAML: "),
    (lambda p: _edit(p, "pack.yaml", 'name: "Greeting Tools"\n', ""),
     r"pack\.yaml: field 'name': is required"),
    (lambda p: _edit(p, "capabilities.yaml", "network: none", "network: everywhere"),
     r"capabilities\.yaml:\d+: tool 'compose greeting': field 'network': must be one of none, outbound"),
    (lambda p: _edit(p, "tools.yaml", 'entry: "tools.greet:run"', 'entry: "tools.greet:missing"'),
     r"tools\.yaml:\d+: tool 'compose greeting': field 'entry': "),
    (lambda p: _edit(p, "tools.yaml", 'kind: "python"', 'kind: "python"\n    runner: "service"'),
     r"tools\.yaml:3: tool 'compose greeting': the service runner needs a URL: set url here or service_url in "
     r"pack\.yaml"),
    (lambda p: _edit(p, "tools.yaml", 'kind: "python"', 'kind: "python"\n    runner: "container"'),
     r"tools\.yaml:3: tool 'compose greeting': the container runner needs an image: set image here or "
     r"container: image in pack\.yaml"),
    (lambda p: _edit(p, "tools.yaml", 'kind: "python"', 'kind: "python"\n    runner: "node"'),
     r"tools\.yaml:4: tool 'compose greeting': field 'runner': must be one of local, service, container, not "
     r"'node'"),
    (lambda p: _edit(p, "tools.yaml", 'kind: "python"', 'kind: "python"\n    url: "http://127.0.0.1:9/run"'),
     r"tools\.yaml:4: tool 'compose greeting': field 'url': is for the service runner; this tool's runner is "
     r"local"),
    (lambda p: _edit(p, "tools.yaml", 'kind: "python"', 'kind: "python"\n    runner: "service"\n'
                                                        '    url: "ftp://x"'),
     r"tools\.yaml:5: tool 'compose greeting': field 'url': must start with http:// or https://"),
    (lambda p: _edit(p, "pack.yaml", 'license: "MIT"\n', 'license: "MIT"\nrunners:\n  default: "cloud"\n'),
     r"pack\.yaml:8: runners: field 'default': must be one of local, service, container, not 'cloud'"),
    (lambda p: _edit_all(p, [("tools.yaml", 'kind: "python"',
                              'kind: "python"\n    runner: "service"\n    url: "http://127.0.0.1:9/run"'),
                             ("capabilities.yaml", "secrets: []", "secrets: [PACK_SECRET]")]),
     r"tools\.yaml:\d+: tool 'compose greeting': field 'secrets': capabilities\.yaml gives it secrets, which "
     r"reach local and container tools only"),
    (lambda p: (p / "tools.yaml").write_text("{}\n"),
     r"tools\.yaml:1: 'tools' must be a mapping of tool names to bindings"),
    (lambda p: _edit(p, "tools.yaml", 'kind: "python"', 'kind: "python"\n    runner: "container"\n'
                                                        '    image: "i"\n    enforcement: "trusted"'),
     r"tools\.yaml:6: tool 'compose greeting': field 'enforcement': must be declared or verified"),
    (lambda p: _edit(p, "tools.yaml", 'kind: "python"', 'kind: "python"\n    colour: "red"'),
     r"tools\.yaml:4: tool 'compose greeting': unknown field 'colour'"),
    (lambda p: (p / "tools.yaml").write_text((p / "tools.yaml").read_text() + '  "wave":\n    kind: "python"\n'),
     r"tools\.yaml:5: tool 'wave': is not one of the tools pack\.yaml lists"),
    (lambda p: add_tool(p, "compose-greeting", "tools.greet:run"),
     r"tool 'compose-greeting': its aid AID\.PACK\.EXAMPLE_GREETING\.COMPOSE_GREETING\.v1 is another tool's"),
])
def test_a_bad_pack_is_refused_with_a_clear_error(tmp_path: Path, change: Any, expected: str) -> None:
    pack = example(tmp_path)
    change(pack)
    assert re.search(expected, refusal(pack)), refusal(pack)
