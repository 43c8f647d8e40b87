#!/usr/bin/env bash
# Runs every test: installs dependencies, builds, fetches the real models the
# end-to-end tests use, and runs CTest (GoogleTest suites + CLI checks).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/fetch_models.sh
cd build && ctest --output-on-failure -j "$(nproc)"
