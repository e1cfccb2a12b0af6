#!/usr/bin/env bash
# Installs the Debian packages the build needs (CLI11 and RapidJSON headers, OpenSSL's
# libcrypto, libseccomp) if they are missing. Uses sudo when not run as root.
set -euo pipefail
need=()
[ -f /usr/include/CLI/CLI.hpp ] || need+=(libcli11-dev)
[ -f /usr/include/rapidjson/reader.h ] || need+=(rapidjson-dev)
[ -f /usr/include/openssl/hmac.h ] || need+=(libssl-dev)
[ -f /usr/include/seccomp.h ] || need+=(libseccomp-dev)
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
