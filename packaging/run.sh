#!/usr/bin/env bash
# Sets up everything and runs the main job: trainstudio-cli training the seed's model (Dense 256
# relu -> Dense 10 softmax, Adam, batch 256) on Fashion-MNIST on the CPU, Mirrored over the
# local cores. Extra arguments go to `trainstudio-cli train` (e.g. --epochs 3, --json).
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/install-deps.sh
cmake --preset release
cmake --build --preset release -j "$(nproc)" --target trainstudio-cli
exec build/release/app/cli/trainstudio-cli train --model mlp --strategy mirrored "$@"
