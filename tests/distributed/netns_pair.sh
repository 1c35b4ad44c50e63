#!/bin/bash
# Two multi-worker tasks in two network namespaces joined by a veth pair (chief 10.77.0.1,
# worker 10.77.0.2), so their traffic crosses a real (virtual) link instead of loopback. Run it
# inside a fresh user + network namespace, which needs no privileges where the kernel allows
# unprivileged user namespaces:
#   unshare -rn bash netns_pair.sh MODE CLI OUTDIR TRAIN-ARGS...
# MODE train: both tasks run to the end. MODE cut: once the chief has reported epoch 2 the link
# goes down (no reset, packets simply vanish), as when a machine is cut off.
# Writes OUTDIR/{chief,worker}.log, {chief,worker}.rc, {chief,worker}.safetensors and cut_at.
set -u
mode=$1 cli=$2 out=$3
shift 3
ip link set lo up
# The worker's namespace lives as long as this holder process.
unshare -n sleep 600 &
holder=$!
for _ in $(seq 200); do
    [ "$(readlink /proc/$holder/ns/net)" != "$(readlink /proc/self/ns/net)" ] && break
    sleep 0.05
done
[ "$(readlink /proc/$holder/ns/net)" != "$(readlink /proc/self/ns/net)" ] || { echo "no network namespace for the worker"; exit 95; }
ip link add va type veth peer name vb || exit 90
ip link set vb netns "$holder" || exit 91
ip addr add 10.77.0.1/24 dev va
ip link set va up
nsenter -t "$holder" -n sh -c 'ip link set lo up && ip addr add 10.77.0.2/24 dev vb && ip link set vb up' || exit 92
export TF_CONFIG='{"cluster": {"chief": ["10.77.0.1:23456"], "worker": ["10.77.0.2:23457"]}}'
nsenter -t "$holder" -n "$cli" "$@" --task worker:0 --save-weights "$out/worker.safetensors" >"$out/worker.log" 2>&1 &
worker=$!
"$cli" "$@" --task chief:0 --save-weights "$out/chief.safetensors" >"$out/chief.log" 2>&1 &
chief=$!
if [ "$mode" = cut ]; then
    for _ in $(seq 1200); do
        grep -q '"epoch":2' "$out/chief.log" && break
        kill -0 "$chief" 2>/dev/null || break
        sleep 0.05
    done
    date +%s.%N >"$out/cut_at"
    ip link set va down
fi
wait "$chief"
echo $? >"$out/chief.rc"
date +%s.%N >"$out/chief_end"
# Cut off, the worker cannot reach its chief either: it fails on its own timeout.
wait "$worker"
echo $? >"$out/worker.rc"
kill "$holder" 2>/dev/null
exit 0
