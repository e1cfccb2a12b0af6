#!/usr/bin/env bash
# Installs the Debian packages the build needs (CLI11, RapidJSON, toml++, xxHash and Boost.Beast headers, Nettle,
# libseccomp, SQLite, OpenSSL, the NATS C client, yaml-cpp, doctest for the C++ unit tests, and python3-venv where Python cannot make a
# virtual environment) if they are missing. Uses sudo when not run as root.
# With --clang, also clang and its sanitizer/fuzzer runtimes (scripts/sanitize-tests.sh,
# scripts/fuzz.sh); with --test, also podman and runc, which the container runner's tests run.
set -euo pipefail
need=()
if [ "${1:-}" = "--test" ]; then
  command -v podman >/dev/null || need+=(podman)
  command -v runc >/dev/null || need+=(runc)
fi
if [ "${1:-}" = "--clang" ]; then
  # Both runtimes come with libclang-rt; -print-file-name prints a bare name when absent.
  if ! command -v clang++ >/dev/null || [ ! -f "$(clang++ -print-file-name=libclang_rt.asan-x86_64.so)" ] \
     || [ ! -f "$(clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a)" ]; then
    need+=(clang libclang-rt-14-dev)
  fi
fi
[ -f /usr/include/CLI/CLI.hpp ] || need+=(libcli11-dev)
[ -f /usr/include/rapidjson/reader.h ] || need+=(rapidjson-dev)
[ -f /usr/include/nettle/hmac.h ] || need+=(nettle-dev)
[ -f /usr/include/seccomp.h ] || need+=(libseccomp-dev)
[ -f /usr/include/sqlite3.h ] || need+=(libsqlite3-dev)
[ -f /usr/include/toml++/toml.h ] || need+=(libtomlplusplus-dev)
[ -f /usr/include/xxhash.h ] || need+=(libxxhash-dev)
[ -f /usr/include/boost/beast/http/parser.hpp ] || need+=(libboost-dev)
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
[ -f /usr/include/nats/nats.h ] || need+=(libnats-dev)
[ -f /usr/include/yaml-cpp/yaml.h ] || need+=(libyaml-cpp-dev)
# The C++ unit tests (tests/unit), built by the test suite.
[ -f /usr/include/doctest/doctest.h ] || need+=(doctest-dev)
# The README's commands make a virtual environment (a system pip may refuse to install).
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install these development packages with your package manager: ${need[*]}" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
