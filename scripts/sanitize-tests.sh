#!/usr/bin/env bash
# Runs the whole test suite against an AddressSanitizer + UndefinedBehaviorSanitizer build
# of the core, the CLI, _core and the plugins (clang, -DMACHINA_SANITIZE=ON), installed
# into a virtualenv of its own (build/sanitize-venv), with the sanitizer runtime preloaded
# into Python. Any report fails the run: UBSan halts on the first error, ASan aborts, and
# the hosts the tests start check for leaks at exit.
#   bash scripts/sanitize-tests.sh [pytest arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-system-deps.sh --clang

venv=build/sanitize-venv
[ -x "$venv/bin/pip" ] || { rm -rf "$venv"; python3 -m venv "$venv"; }
export CC=clang CXX=clang++  # (as the sanitize preset names them)
runtime="$(clang++ -print-file-name=libclang_rt.asan-x86_64.so)"
[ -f "$runtime" ] || { echo "no shared ASan runtime ($runtime): install libclang-rt-14-dev" >&2; exit 1; }
rtdir="$(dirname "$runtime")"
# One shared sanitizer runtime for everything (Python, _core, the executable, plugins).
san_flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -shared-libasan -fno-omit-frame-pointer"
# The sanitize preset's variables (CMakePresets.json), handed to the package build: pip's build
# reads no presets. Its unit tests are left to `cmake --workflow --preset sanitize`.
mapfile -t preset_defines < <(python3 - <<'PY'
import json
presets = {p["name"]: p for p in json.load(open("CMakePresets.json"))["configurePresets"]}
variables, name = {}, "sanitize"
while name:
    variables = {**presets[name].get("cacheVariables", {}), **variables}
    name = presets[name].get("inherits")
for key, value in variables.items():
    if key == "CMAKE_BUILD_TYPE":
        print("-C", f"cmake.build-type={value}", sep="\n")
    elif key not in ("MACHINA_BUILD_TESTS", "CMAKE_EXPORT_COMPILE_COMMANDS", "CMAKE_C_COMPILER", "CMAKE_CXX_COMPILER"):
        print("-C", f"cmake.define.{key}={value}", sep="\n")
PY
)
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q \
  -C build-dir=build/sanitize-package \
  "${preset_defines[@]}" \
  -C cmake.define.MACHINA_TESTING_HOOKS=ON \
  -C "cmake.define.CMAKE_SHARED_LINKER_FLAGS=-shared-libasan -Wl,-rpath,$rtdir" \
  -C "cmake.define.CMAKE_EXE_LINKER_FLAGS=-shared-libasan -Wl,-rpath,$rtdir" \
  -C "cmake.define.CMAKE_MODULE_LINKER_FLAGS=-shared-libasan -Wl,-rpath,$rtdir" \
  '.[test]'

export MACHINA_TEST_SANITIZED=1
# Wall-clock upper bounds left in the tests (conftest.scaled) stretch under the sanitizers.
export MACHINA_TEST_TIME_SCALE="${MACHINA_TEST_TIME_SCALE:-3}"
export MACHINA_TEST_SANITIZE_FLAGS="$san_flags -Wl,-rpath,$rtdir"
# Fatal signals are the tools' to send (crash tests expect SIGSEGV/SIGABRT as such);
# the quarantine is kept small so memory tests still mean something.
common="handle_segv=0:handle_abort=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:allow_user_segv_handler=1"
common="$common:abort_on_error=1:quarantine_size_mb=16:detect_stack_use_after_return=0"
export ASAN_OPTIONS="$common:detect_leaks=0"
export MACHINA_TEST_CHILD_ASAN_OPTIONS="$common:detect_leaks=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan-python.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LD_PRELOAD="$runtime"
"$venv/bin/python" -m pytest -p no:cacheprovider "$@"
