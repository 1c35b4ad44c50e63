#!/usr/bin/env bash
# Prepares .gpu-deps/ (git-ignored) for packaging/gpu-check.sh on a GPU machine that has CMake,
# nvcc, cuBLAS, cuDNN, NCCL and PyTorch but no Debian packages and no network. Run it here, on the
# Debian 12 development machine, then send .gpu-deps along with the working tree.
#
#   .gpu-deps/debs/           the Debian packages the headless build needs (core, tsremote, the Qt
#                             Test runtime for tst_gpu), as .deb files: unpacked they are ~190 MB,
#                             over the 64 MiB that may travel, so gpu-check.sh runs `dpkg -x` there
#   .gpu-deps/bench/          ../shared/bench's PyTorch reference (fmnist.py, models.py)
#   .gpu-deps/fashion-mnist/  the first 15000 training images and the 10000 test images, gzipped
#                             IDX (the whole training set alone would not fit beside the packages)
#
#   packaging/gpu-carry.sh                 # download and pack
#   packaging/gpu-carry.sh --check DIR     # also unpack into DIR and configure the headless build
#                                          # against those prefixes (a dry run of gpu-check.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-deps
# A device call carries the tracked files and .gpu-deps together, 64 MiB at most; keep 1 MiB spare.
tracked_kib=$(( $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) / 1024 ))
limit_kib=$(( 63 * 1024 - tracked_kib ))

pkgs=(
  # core: oneDNN (its CMake config needs OpenCL), JSON, CLI11, zlib, SQLite, PNG/JPEG, libzip
  libdnnl-dev libdnnl2 ocl-icd-opencl-dev ocl-icd-libopencl1 opencl-c-headers opencl-clhpp-headers
  nlohmann-json3-dev libcli11-dev zlib1g-dev libsqlite3-dev libsqlite3-0 libpng-dev libpng16-16
  libjpeg62-turbo-dev libjpeg62-turbo libzip-dev libzip4 pkgconf pkgconf-bin libpkgconf3
  # tsremote (the top-level configure requires it; the CLI and the tests link it): gRPC, protobuf, Gloo
  libgrpc++-dev libgrpc-dev libgrpc++1.51 libgrpc29 libprotobuf-dev libprotobuf32 libprotoc32
  protobuf-compiler protobuf-compiler-grpc libabsl-dev libabsl20220623 libre2-dev libre2-9
  libc-ares-dev libc-ares2 libssl-dev libssl3 libgloo-dev libgloo0 libibverbs-dev libibverbs1
  libhiredis-dev libhiredis0.14 libnl-3-200 libnl-route-3-200
  # Qt Test for tst_gpu: QtCore + QtTest, moc (qmake6: Qt6CoreTools checks its file exists), QtCore's runtime deps
  qt6-base-dev qt6-base-dev-tools qmake6 libqt6core6 libqt6test6 libicu72 libdouble-conversion3
  libpcre2-16-0 libb2-1 libglib2.0-0 libffi8
)

rm -rf "$out"
mkdir -p "$out/debs" "$out/bench" "$out/fashion-mnist"
(cd "$out/debs" && apt-get -o APT::Sandbox::User=root download "${pkgs[@]}" >/dev/null)

bench=../shared/bench
[[ -d $bench ]] || { echo "gpu-carry: $bench not found (the shared folder beside the checkout)" >&2; exit 1; }
cp "$bench/fmnist.py" "$bench/models.py" "$bench/torch_train.py" "$out/bench/"

fm=${TRAINSTUDIO_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
[[ -f $fm/train-images-idx3-ubyte.gz ]] || { echo "gpu-carry: no Fashion-MNIST in $fm (apt-get install dataset-fashion-mnist)" >&2; exit 1; }
cp "$fm/t10k-images-idx3-ubyte.gz" "$fm/t10k-labels-idx1-ubyte.gz" "$out/fashion-mnist/"
/usr/bin/python3 - "$fm" "$out/fashion-mnist" 15000 <<'PY'
import gzip, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name, rank in (("train-images-idx3-ubyte", 3), ("train-labels-idx1-ubyte", 1)):
    with gzip.open(f"{src}/{name}.gz", "rb") as f:
        magic = f.read(4)
        dims = list(struct.unpack(f">{rank}I", f.read(4 * rank)))
        per = 1
        for d in dims[1:]:
            per *= d
        body = f.read(n * per)
    dims[0] = n
    with gzip.open(f"{dst}/{name}.gz", "wb", compresslevel=9) as g:
        g.write(magic + struct.pack(f">{rank}I", *dims) + body)
PY

size_kib=$(du -sk "$out" | cut -f1)
echo "gpu-carry: $out holds ${#pkgs[@]} packages, the bench scripts and the data: $(( size_kib / 1024 )) MiB" \
     "(+ $(( tracked_kib / 1024 )) MiB of tracked files)"
if (( size_kib > limit_kib )); then
  echo "gpu-carry: over the $(( limit_kib / 1024 )) MiB left beside the tracked files; drop packages or data" >&2
  exit 1
fi

if [[ "${1:-}" == "--check" ]]; then
  root=$(readlink -f "${2:?--check needs a folder to unpack into}")
  # shellcheck source=packaging/gpu-deps-env.sh
  source packaging/gpu-deps-env.sh
  rm -rf "$root"
  gpu_deps_unpack "$out/debs" "$root"
  gpu_deps_env "$root"
  echo "gpu-carry: unpacked into $root ($(du -sh "$root" | cut -f1)); configuring build/gpu-carry-check"
  # CMAKE_FIND_ROOT_PATH ... ONLY would also hide the CUDA toolkit, so instead the configure log
  # is checked for packages found outside ROOT.
  mkdir -p build
  cmake -S . -B build/gpu-carry-check -G Ninja -DCMAKE_BUILD_TYPE=Release -DTS_BUILD_UI=OFF \
    -DTS_ENABLE_CUDA=ON -DTS_BUILD_TESTS=ON "${GPU_CMAKE_ARGS[@]}" | tee build/gpu-carry-check.configure.log
  grep -E '_DIR:PATH=|_LIBRARY:FILEPATH=|_INCLUDE_DIR:PATH=' build/gpu-carry-check/CMakeCache.txt |
    grep -v -e "$root" -e cuda -e NOTFOUND -e '/build/' || echo "gpu-carry: every package resolved under $root"
fi
