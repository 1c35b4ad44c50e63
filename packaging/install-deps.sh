#!/usr/bin/env bash
# Installs every Debian 12 package that TrainStudio's build, tests, benchmarks and default data
# need. Idempotent: packages already present are skipped by apt. Run as root (or via sudo).
#   packaging/install-deps.sh            # build + test + run
#   packaging/install-deps.sh --minimal  # headless core only (no Qt, no gRPC)
set -euo pipefail

core_pkgs=(cmake ninja-build g++ pkg-config ccache
  libdnnl-dev ocl-icd-opencl-dev nlohmann-json3-dev libcli11-dev zlib1g-dev libsqlite3-dev
  dataset-fashion-mnist python3-numpy python3-torch libopenblas0-openmp
  libpng-dev libjpeg-dev libzip-dev)  # core/data: PNG/JPEG decoding, .npz (zip) archives
full_pkgs=(qt6-base-dev libqt6sql6-sqlite libqcustomplot-dev xvfb xauth fonts-dejavu-core
  libxkbcommon-dev libgloo-dev libgrpc++-dev libprotobuf-dev protobuf-compiler
  protobuf-compiler-grpc libssl-dev libpng-dev libjpeg-dev
  iproute2 util-linux)  # tests: tasks in separate network namespaces (ip, unshare, nsenter)

pkgs=("${core_pkgs[@]}")
[[ "${1:-}" == "--minimal" ]] || pkgs+=("${full_pkgs[@]}")

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages already installed"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
