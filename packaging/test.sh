#!/usr/bin/env bash
# Sets up everything (Debian packages), builds with the `dev` preset and runs every test.
#   packaging/test.sh                 # all tests
#   packaging/test.sh -L core         # extra arguments go to ctest (e.g. a label)
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/install-deps.sh
# ccache hits across checkouts in different folders (CI clones elsewhere).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake --preset dev
cmake --build --preset dev -j "$(nproc)"
# Tests run one at a time: two OpenMP programs on 2 cores slow each other down badly.
ctest --preset dev "$@"
