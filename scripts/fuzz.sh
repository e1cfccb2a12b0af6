#!/usr/bin/env bash
# Builds the libFuzzer targets (clang + ASan + UBSan) and runs each for SECONDS (default
# 30), seeded from the protocol transcripts and the bad-input corpus. Fails on any crash,
# leak or sanitizer report. Findings are kept in build/fuzz/findings/.
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(request ds_state response worker_frames tool_answer jsonrpc)

bash scripts/install-system-deps.sh --clang

build=build/fuzz  # the fuzz preset's folder (CMakePresets.json)
cmake --preset fuzz -DPython_EXECUTABLE="$(command -v python3)" > "$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build --preset fuzz --target $(printf 'fuzz_%s ' "${targets[@]}")

corpus="$build/seeds"
rm -rf "$corpus"
python3 fuzz/make_corpus.py "$corpus"
mkdir -p "$build/findings" "$build/corpus"
if [ "$seconds" -eq 0 ]; then  # build only (libFuzzer would take 0 as "no time limit")
  echo "built: $(printf "$build/fuzz_%s " "${targets[@]}")"
  exit 0
fi
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t" "$corpus/$t"
  echo "== fuzz_$t for ${seconds}s"
  "$build/fuzz_$t" -max_total_time="$seconds" -dict=fuzz/protocol.dict -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$build/findings/$t-" "$build/corpus/$t" "$corpus/$t" 2>&1 | tail -n 14
done
echo "fuzzing: no crash, no leak, no sanitizer report"
