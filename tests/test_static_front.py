"""The two builds of machina-toolhost: the fully static one on PATH, with the built-in
tools linked in, and the dynamically linked one in the package's libexec/ that loads
plugin libraries. The static one hands over to it whenever plugins are needed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import machina_dispatch
import pytest
from conftest import SANITIZED, STATIC_FRONT, TOOLHOST, base_env, elf_interpreter, ok_response

LOADER = Path(machina_dispatch._core.__file__).parent / "libexec" / "machina-toolhost"
ECHO = json.dumps({"input_json": json.dumps({"msg": "hi"})}).encode()

static_only = pytest.mark.skipif(not STATIC_FRONT, reason="this build has one dynamically linked executable")


@pytest.mark.skipif(SANITIZED, reason="sanitized programs cannot be linked statically")
def test_the_executable_on_path_is_static_and_the_loader_dynamic() -> None:
    assert elf_interpreter(TOOLHOST) is None
    assert LOADER.is_file()
    assert elf_interpreter(LOADER) is not None


@static_only
def test_static_build_runs_builtin_tools_with_nothing_beside_it(tmp_path: Path) -> None:
    lone = tmp_path / "machina-toolhost"
    shutil.copy(TOOLHOST, lone)
    proc = subprocess.run([str(lone), "--run", "AID.ECHO.v1"], input=ECHO, capture_output=True,
                          env=base_env(), timeout=30)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert (answer["ok"], answer["output_json"]) == (True, json.dumps({"msg": "hi"}))
    listing = json.loads(subprocess.run([str(lone), "--list"], capture_output=True, env=base_env(),
                                        timeout=30, check=True).stdout)
    # The built-in plugin, linked in, and the host's own tool packs.
    assert {t["plugin"] for t in listing["tools"]} == {"built-in", "pack:files", "pack:shell", "pack:code",
                                                    "pack:python"}


@static_only
@pytest.mark.parametrize("args", [["--run", "PLUGIN", "AID.ECHO.v1"], ["--plugin", "PLUGIN", "--list"],
                                  ["--serve", "PLUGIN"]])
def test_plugins_without_the_loader_are_a_clear_error(tmp_path: Path, args: list[str]) -> None:
    lone = tmp_path / "machina-toolhost"
    shutil.copy(TOOLHOST, lone)
    plugin = str(machina_dispatch.builtin_plugin_path())
    proc = subprocess.run([str(lone), *[plugin if a == "PLUGIN" else a for a in args]], input=ECHO,
                          capture_output=True, env=base_env(), timeout=30)
    assert proc.returncode == 2
    assert proc.stdout == b""
    err = proc.stderr.decode()
    assert err.startswith("machina-toolhost: cannot load plugins: the plugin-loading build of machina-toolhost "
                          "not found; looked for:\n"), err
    assert f"  {tmp_path}/libexec/machina-toolhost\n" in err
    assert err.endswith("it is installed with the machina_dispatch package; reinstall it\n")


@static_only
def test_named_plugins_are_loaded_by_the_loader(test_plugins: dict[str, str]) -> None:
    proc = subprocess.run([TOOLHOST, "--plugin", test_plugins["c_tools"], "--list"], capture_output=True,
                          env=base_env(), timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert {t["plugin"] for t in json.loads(proc.stdout)["tools"]} == {test_plugins["c_tools"]}


@static_only
def test_plugin_dir_override_loads_the_pack_from_there(tmp_path: Path) -> None:
    shutil.copy(machina_dispatch.builtin_plugin_path(), tmp_path)
    proc = subprocess.run([TOOLHOST, "--run", "AID.ECHO.v1"], input=ECHO, capture_output=True,
                          env=base_env({"MACHINA_TOOLHOST_PLUGIN_DIR": str(tmp_path)}), timeout=30)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([TOOLHOST, "--list"], capture_output=True,
                          env=base_env({"MACHINA_TOOLHOST_PLUGIN_DIR": str(tmp_path)}), timeout=30)
    plugins = {t["plugin"] for t in json.loads(proc.stdout)["tools"]}
    assert plugins == {str(tmp_path / "machina_builtin_tools.so"), "pack:files", "pack:shell", "pack:code",
                       "pack:python"}


def test_isolated_workers_register_the_same_builtin_tools() -> None:
    # The static build's workers are the static build too: they register the linked tools.
    reqs = b"".join(json.dumps({"id": i, "aid": "AID.ECHO.v1", "input_json": str(i)}).encode() + b"\n"
                    for i in range(20))
    proc = subprocess.run([TOOLHOST, "--serve", "--isolation", "process", "--isolation-workers", "2"], input=reqs,
                          capture_output=True, env=base_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    answers = {r["id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert answers == {i: {**ok_response(str(i)), "id": i} for i in range(20)}


def test_linked_tools_flag_is_refused_by_the_loader() -> None:
    exe = LOADER if STATIC_FRONT else Path(TOOLHOST)
    proc = subprocess.run([str(exe), "--isolation-worker", "--linked-tools"], capture_output=True, env=base_env(),
                          stdin=subprocess.DEVNULL, timeout=30)
    assert proc.returncode != 0
    assert b"--linked-tools: this build of machina-toolhost has no linked tools" in proc.stderr


@static_only
def test_python_transports_that_name_plugins_start_the_loader_directly(test_plugins: dict[str, str]) -> None:
    # Spawning the static executable would only cost a hand-over to the loader.
    assert machina_dispatch.Spawn(plugins=[test_plugins["c_tools"]]).executable == str(LOADER.resolve())
    assert machina_dispatch.Spawn().executable == TOOLHOST
    r = machina_dispatch.run_machina_toolhost("AID.C.UPPER.v1", '"a"', plugins=[test_plugins["c_tools"]])
    assert r == '"A"'  # the output string, as the dispatch function returns it
