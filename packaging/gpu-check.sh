#!/usr/bin/env bash
# The whole GPU check, on a machine with one NVIDIA GPU (sm_90+), CMake, nvcc, cuBLAS, cuDNN 9 and
# PyTorch, but no Debian packages and no network. Prepare .gpu-deps/ first, on the Debian machine,
# with packaging/gpu-carry.sh, and send it along with the working tree. Then, from the repo root:
#
#   packaging/gpu-check.sh [OUTDIR]     # logs and summary.txt go to OUTDIR (default build/gpu-check-out)
#
# Steps: unpack the carried packages into a private prefix; configure core + the CUDA plugin
# headless (-DTS_BUILD_UI=OFF, tests on); build the plugin, tst_gpu, trainstudio-cuda-bench and the
# CLI; run tst_gpu (if it dies, each function after the one that died runs on its own, so one
# crash does not hide the rest); train the seed's MLP and the small CNN on the GPU with TrainStudio
# and with PyTorch (same models, optimizer and batch sizes) and print samples/s side by side; train
# through trainstudio-cli on gpu:0; then, if time is left, tst_gpu's op tests under
# compute-sanitizer. Every step has a time limit inside TS_GPU_CHECK_BUDGET seconds (default 480),
# so the device call's own limit is never what stops it. Logs end up in OUTDIR/logs.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$PWD
out=$(mkdir -p "${1:-build/gpu-check-out}" && readlink -f "${1:-build/gpu-check-out}")
logs=$out/logs
mkdir -p "$logs"
deps=${TS_GPU_DEPS_ROOT:-/tmp/ts-gpu-deps}
build=build/gpu-check
jobs=$(nproc)
epochs=${TS_GPU_BENCH_EPOCHS:-5}
budget=${TS_GPU_CHECK_BUDGET:-480}
summary=$out/summary.txt
t0=$(date +%s)
: >"$summary"
say() { echo "gpu-check: $*" | tee -a "$summary"; }
elapsed_s() { echo $(( $(date +%s) - t0 )); }
elapsed() { echo "$(elapsed_s) s"; }
left() { echo $(( budget - $(elapsed_s) )); }
# limit WANTED: WANTED seconds, or what is left of the budget less a reserve for packing the logs.
limit() { local l=$(( $(left) - 15 )); (( l < $1 )) && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
pack() { tar -C "$out" -czf "$out/logs.tar.gz" logs 2>/dev/null; }
trap pack EXIT

[[ -d .gpu-deps/debs ]] || { say ".gpu-deps/debs missing: run packaging/gpu-carry.sh on the Debian machine and carry .gpu-deps"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader 2>&1 | sed 's/^/gpu-check: device /' | tee -a "$summary"
{ nvcc --version | tail -1; g++ --version | head -1; command -v dpkg || echo "no dpkg"; nproc
  python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version())'
  python3 -m pip list 2>/dev/null | grep -iE 'nvidia-(cudnn|nccl|cublas|cuda-cupti)'; cat /etc/os-release | head -2; } >"$logs/machine.txt" 2>&1
sed 's/^/gpu-check: machine /' "$logs/machine.txt" | tee -a "$summary"

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

if [[ ! -f $build/build.ninja ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTS_BUILD_UI=OFF -DTS_ENABLE_CUDA=ON \
    -DTS_BUILD_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90 "${GPU_CMAKE_ARGS[@]}" "${toolkit_args[@]}" \
    >"$logs/configure.log" 2>&1 || { tail -40 "$logs/configure.log"; say "configure FAILED (configure.log)"; exit 4; }
  say "configured ($(elapsed))"
fi
timeout "$(limit 300)" cmake --build "$build" -j "$jobs" --target trainstudio-cuda tst_gpu trainstudio-cuda-bench trainstudio-cli \
  >"$logs/build.log" 2>&1 || { grep -m 20 -B2 -A8 'error' "$logs/build.log"; tail -5 "$logs/build.log"; say "build FAILED (build.log)"; exit 5; }
say "built ($(elapsed))"

# tst_gpu, whole; if it died (a crash, qFatal, the time limit) every function after the last one
# that finished runs again on its own.
tst=$build/tests/tst_gpu
export QT_QPA_PLATFORM=offscreen OMP_WAIT_POLICY=passive
timeout -k 5 "$(limit 240)" "$tst" >"$logs/tst_gpu.txt" 2>&1
test_rc=$?
# Failures with their locations (the whole log is in logs.tar.gz).
awk '/^(FAIL!|QFATAL|XPASS)/ { print; getline; if ($0 ~ /Loc:/) print } /plugin: |^Totals/' "$logs/tst_gpu.txt" | cut -c1-400 | tail -60
say "tst_gpu rc=$test_rc $(grep -E '^Totals:' "$logs/tst_gpu.txt" | tail -1) ($(elapsed))"
if ! grep -q '^Totals:' "$logs/tst_gpu.txt"; then
  mapfile -t fns < <("$tst" -functions 2>/dev/null | sed 's/()$//')
  last=$(grep -oE '^(PASS|FAIL!|SKIP|XFAIL) *: TstGpu::[A-Za-z_0-9]+' "$logs/tst_gpu.txt" | tail -1 | sed 's/.*:://')
  # The one in flight printed nothing yet, or some of its rows: start again at the last one named.
  start=0
  for i in "${!fns[@]}"; do [[ ${fns[$i]} == "$last" ]] && start=$i; done
  say "tst_gpu died after '${last:-<none>}'; running it and the rest one by one"
  test_rc=1
  for (( i = start; i < ${#fns[@]}; ++i )); do
    (( $(left) > 150 )) || { say "  no time left for ${fns[$i]} and after"; break; }
    timeout -k 5 60 "$tst" "${fns[$i]}" >"$logs/tst_gpu.${fns[$i]}.txt" 2>&1
    rc=$?
    say "  ${fns[$i]}: rc=$rc $(grep -E '^(FAIL!|QFATAL)' "$logs/tst_gpu.${fns[$i]}.txt" | head -2 | cut -c1-300 | tr '\n' ' ')"
    grep -E '^ *Loc: ' "$logs/tst_gpu.${fns[$i]}.txt" | head -1
  done
fi

export FMNIST_DIR=$repo/.gpu-deps/fashion-mnist TRAINSTUDIO_FMNIST_DIR=$repo/.gpu-deps/fashion-mnist
json_field() { LD_LIBRARY_PATH=$orig_ld python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1]).get(sys.argv[1], ""))' "$1"; }
for model in mlp cnn; do
  (( $(left) > 60 )) || { say "bench $model skipped: no time left"; continue; }
  ts_json=$(timeout -k 5 "$(limit 75)" "$build/plugins/trainstudio-cuda-bench" --model "$model" --epochs "$epochs" --backend cuda \
            2>"$logs/bench-ts-$model.log" | tail -1)
  pt_json=$(LD_LIBRARY_PATH=$orig_ld timeout -k 5 "$(limit 75)" python3 packaging/gpu-torch-bench.py --bench .gpu-deps/bench --model "$model" --epochs "$epochs" \
            2>&1 | tee "$logs/bench-torch-$model.log" | tail -1)
  ts=$(echo "$ts_json" | json_field samples_per_sec 2>/dev/null)
  pt=$(echo "$pt_json" | json_field samples_per_sec 2>/dev/null)
  ratio=$(LD_LIBRARY_PATH=$orig_ld python3 -c "import sys; a,b=sys.argv[1:]; print(f'{float(a)/float(b):.2f}x' if a and b else 'n/a')" "$ts" "$pt" 2>/dev/null || echo n/a)
  say "bench $model fp32: trainstudio cuda ${ts:-FAILED} samples/s, pytorch ${pt:-FAILED} samples/s, ratio $ratio"
  [[ -n $ts ]] || tail -5 "$logs/bench-ts-$model.log"
  grep -E '^epoch' "$logs/bench-ts-$model.log" | tail -2
done

# The CLI picks the plugin up by itself when asked for a gpu device.
if (( $(left) > 60 )); then
  timeout -k 5 "$(limit 60)" "$build/app/cli/trainstudio-cli" train --devices gpu:0 --epochs 2 --limit 15000 \
    --no-record >"$logs/cli-train.log" 2>&1
  say "cli train on gpu:0: rc=$? $(tail -2 "$logs/cli-train.log" | tr '\n' ' ' | cut -c1-300)"
fi

# Bad memory accesses in the never-before-run kernels (Firecracker machines run compute-sanitizer).
if (( $(left) > 60 )) && command -v compute-sanitizer >/dev/null; then
  timeout -k 5 "$(limit 120)" compute-sanitizer --tool memcheck --print-limit 20 "$tst" gemm dense conv pool globalAvgPool \
    batchNorm activations softmax dropout elementwise concat loss argmaxMatches optimizers sumSquares \
    >"$logs/memcheck.txt" 2>&1
  say "memcheck rc=$? $(grep -E 'ERROR SUMMARY|^Totals' "$logs/memcheck.txt" | tr '\n' ' ')"
  grep -m 6 -A4 -E '^========= (Invalid|Program hit|Uninitialized)' "$logs/memcheck.txt" | cut -c1-200
fi
say "done in $(elapsed); logs in $out"
exit $test_rc
