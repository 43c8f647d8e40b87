#!/usr/bin/env bash
# Installs kiln's build and test dependencies from Debian (12 "bookworm" or newer).
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
PKGS=(build-essential cmake ninja-build pkg-config git python3 python3-pip python3-venv unzip
      libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
      libre2-dev libutf8proc-dev libsentencepiece-dev libcpp-httplib-dev
      nginx-light flatbuffers-compiler libflatbuffers-dev)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
