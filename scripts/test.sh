#!/usr/bin/env bash
# Runs every test: installs dependencies, builds, fetches the real models the
# end-to-end tests use, and runs CTest (GoogleTest suites + CLI checks).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
# The official `openai` Python client for the server's client test, in a private venv.
py_args=()
if [ -x .cache/venv/bin/python3 ] || python3 -m venv .cache/venv >/dev/null 2>&1; then
  if .cache/venv/bin/python3 -c "import openai" 2>/dev/null ||
     .cache/venv/bin/python3 -m pip install -q --disable-pip-version-check openai; then
    py_args=(-DPython3_EXECUTABLE="$PWD/.cache/venv/bin/python3")
  fi
fi
[ ${#py_args[@]} -gt 0 ] || echo "openai client unavailable: its test will be skipped" >&2
scripts/build.sh "${py_args[@]}"
scripts/fetch_models.sh
cd build && ctest --output-on-failure -j "$(nproc)"
