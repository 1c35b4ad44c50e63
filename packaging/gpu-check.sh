#!/usr/bin/env bash
# The whole GPU check, on a machine with one NVIDIA GPU (sm_90+), CMake, nvcc, cuBLAS, cuDNN 9 and
# PyTorch, but no Debian packages and no network. Prepare .gpu-deps/ first, on the Debian machine,
# with packaging/gpu-carry.sh, and send it along with the working tree. Then, from the repo root:
#
#   packaging/gpu-check.sh [OUTDIR]     # logs and summary.txt go to OUTDIR (default build/gpu-check-out)
#
# Steps: unpack the carried packages into a private prefix; configure core + the CUDA plugin
# headless (-DTS_BUILD_UI=OFF, tests on); build the plugin, tst_gpu and trainstudio-cuda-bench;
# run the `gpu`-labelled tests; train the seed's MLP and the small CNN on the GPU with TrainStudio
# and with PyTorch (same models, optimizer and batch sizes) and print samples/s side by side.
# Budget: about 3-4 minutes of building on 16 cores plus about 2 minutes of tests and benchmarks.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
out=$(mkdir -p "${1:-build/gpu-check-out}" && readlink -f "${1:-build/gpu-check-out}")
deps=${TS_GPU_DEPS_ROOT:-/tmp/ts-gpu-deps}
build=build/gpu-check
jobs=$(nproc)
epochs=${TS_GPU_BENCH_EPOCHS:-5}
summary=$out/summary.txt
t0=$(date +%s)
: >"$summary"
say() { echo "gpu-check: $*" | tee -a "$summary"; }
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }

[[ -d .gpu-deps/debs ]] || { say ".gpu-deps/debs missing: run packaging/gpu-carry.sh on the Debian machine and carry .gpu-deps"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu-check: device /' | tee -a "$summary"

# PyTorch runs with the machine's own libraries, not the carried Debian ones (libssl, libffi...).
orig_ld=${LD_LIBRARY_PATH:-}
# shellcheck source=packaging/gpu-deps-env.sh
source packaging/gpu-deps-env.sh
if [[ ! -f $deps/.unpacked ]]; then
  gpu_deps_unpack .gpu-deps/debs "$deps" && touch "$deps/.unpacked"
fi
gpu_deps_env "$deps"
say "packages unpacked into $deps ($(elapsed))"

# cuDNN and NCCL: the toolkit's, else the pip wheels PyTorch uses (nvidia-cudnn, nvidia-nccl;
# their libraries are libcudnn.so.9 and libnccl.so.2 only). Appends the CMake cache entries to
# toolkit_args and the wheel's lib folder to LD_LIBRARY_PATH.
toolkit_args=()
find_toolkit_lib() {  # NAME (cudnn|nccl) CMAKEVAR (CUDNN|NCCL) LABEL
  local name=$1 var=$2 label=$3 wheel lib
  [[ -f /usr/local/cuda/include/$name.h ]] && return 0
  wheel=$(LD_LIBRARY_PATH=$orig_ld python3 -c "import nvidia.$name, os; m = nvidia.$name; print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])" 2>/dev/null)
  if [[ -n $wheel && -f $wheel/include/$name.h ]]; then
    lib=$(find "$wheel/lib" -name "lib$name.so*" | sort | head -1)
    toolkit_args+=("-DTS_${var}_INCLUDE_DIR=$wheel/include" "-DTS_${var}_LIBRARY=$lib")
    export LD_LIBRARY_PATH="$wheel/lib:$LD_LIBRARY_PATH"
    say "$label from the pip wheel in $wheel"
  else
    say "no $label found (neither /usr/local/cuda/include/$name.h nor the nvidia-$name wheel)"; exit 3
  fi
}
find_toolkit_lib cudnn CUDNN cuDNN
find_toolkit_lib nccl NCCL NCCL

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTS_BUILD_UI=OFF -DTS_ENABLE_CUDA=ON \
  -DTS_BUILD_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90 "${GPU_CMAKE_ARGS[@]}" "${toolkit_args[@]}" \
  >"$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; say "configure FAILED (configure.log)"; exit 4; }
say "configured ($(elapsed))"
cmake --build "$build" -j "$jobs" --target trainstudio-cuda tst_gpu trainstudio-cuda-bench \
  >"$out/build.log" 2>&1 || { grep -m 20 -B2 -A8 'error' "$out/build.log"; say "build FAILED (build.log)"; exit 5; }
say "built ($(elapsed))"

# -V keeps every test function's PASS/FAIL/SKIP line (and QtTest's Totals) in the log.
(cd "$build" && ctest -L gpu -V --timeout 300) >"$out/tests.log" 2>&1
test_rc=$?
grep -E 'FAIL!|SKIP|Totals|tests passed|tests failed' "$out/tests.log" | sed -E 's/^[0-9]+: //' | tail -40
say "gpu tests: $(grep -E 'tests passed|tests failed' "$out/tests.log" | tail -1) ($(elapsed))"
say "tst_gpu $(grep -E 'Totals:' "$out/tests.log" | sed -E 's/^[0-9]+: //' | tail -1)"

export FMNIST_DIR=$repo/.gpu-deps/fashion-mnist TRAINSTUDIO_FMNIST_DIR=$repo/.gpu-deps/fashion-mnist
json_field() { LD_LIBRARY_PATH=$orig_ld python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1]).get(sys.argv[1], ""))' "$1"; }
for model in mlp cnn; do
  ts_json=$("$build/plugins/trainstudio-cuda-bench" --model "$model" --epochs "$epochs" --backend cuda \
            2>"$out/bench-ts-$model.log" | tail -1)
  pt_json=$(LD_LIBRARY_PATH=$orig_ld python3 packaging/gpu-torch-bench.py --bench .gpu-deps/bench --model "$model" --epochs "$epochs" \
            2>&1 | tee "$out/bench-torch-$model.log" | tail -1)
  ts=$(echo "$ts_json" | json_field samples_per_sec 2>/dev/null)
  pt=$(echo "$pt_json" | json_field samples_per_sec 2>/dev/null)
  ratio=$(LD_LIBRARY_PATH=$orig_ld python3 -c "import sys; a,b=sys.argv[1:]; print(f'{float(a)/float(b):.2f}x' if a and b else 'n/a')" "$ts" "$pt" 2>/dev/null || echo n/a)
  say "bench $model fp32: trainstudio cuda ${ts:-FAILED} samples/s, pytorch ${pt:-FAILED} samples/s, ratio $ratio"
  [[ -n $ts ]] || tail -5 "$out/bench-ts-$model.log"
done
say "done in $(elapsed); logs in $out"
exit $test_rc
