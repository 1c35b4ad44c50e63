#!/usr/bin/env bash
# Sets up everything and runs the main job.
#  - With a display (DISPLAY or WAYLAND_DISPLAY set): builds and opens the studio with the seed's
#    MLP loaded and Fashion-MNIST selected on the Train tab, ready to train Mirrored over the local
#    CPU devices. Extra arguments go to `trainstudio` (e.g. --train to start at once).
#  - Headless (no display, or --headless first): trainstudio-cli trains the seed's model (Dense
#    256 relu -> Dense 10 softmax, Adam, batch 256) on Fashion-MNIST on the CPU, Mirrored over the
#    local cores, recorded in the run history. Extra arguments go to `trainstudio-cli train`
#    (e.g. --epochs 3, --json).
set -euo pipefail
cd "$(dirname "$0")/.."
headless=0
if [[ "${1:-}" == "--headless" ]]; then
  headless=1
  shift
elif [[ -z "${DISPLAY:-}" && -z "${WAYLAND_DISPLAY:-}" ]]; then
  headless=1
fi
packaging/install-deps.sh
cmake --preset release
if ((headless)); then
  cmake --build --preset release -j "$(nproc)" --target trainstudio-cli
  exec build/release/app/cli/trainstudio-cli train --model mlp --strategy mirrored "$@"
fi
cmake --build --preset release -j "$(nproc)" --target trainstudio
exec build/release/app/studio/trainstudio --tab train "$@"
