#!/bin/bash
# Worker daemons, each in its own network namespace, and a coordinator in the namespace that
# holds them, all joined by a bridge (the coordinator 10.77.0.1, the daemons 10.77.0.2, .3, ...),
# so every connection crosses a link with its own addresses, as between machines: the
# coordinator's control calls, the workers' pulls and pushes to the ps tasks, the rendezvous and
# Gloo's pairs. Run it inside a fresh user + network namespace, which needs no privileges where
# the kernel allows unprivileged user namespaces:
#   unshare -rn bash netns_cluster.sh DAEMON CLI OUTDIR ROLE... -- TRAIN-ARGS...
# ROLE: chief, worker, ps or evaluator, in the cluster's order (a daemon each, listening on 7070 with
# --allow-remote). The coordinator runs `CLI train --cluster OUTDIR/cluster.json TRAIN-ARGS`.
# Writes OUTDIR/cluster.json, coordinator.out (stdout), coordinator.err, coordinator.rc and
# <role><index>.log for each daemon.
# With TS_CUT_AFTER=TEXT: once the coordinator's stdout holds TEXT, its address goes away (packets
# to and from it vanish, nobody sends a reset, as when its machine is cut off) while the daemons
# still reach each other; then each daemon has 60 s to end its task (its log says the run was
# cancelled or failed: a worker whose ps task went first fails), and OUTDIR/<name>.noticed holds
# the seconds it took (or "never").
set -u
daemon=$1 cli=$2 out=$3
shift 3
roles=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do roles+=("$1"); shift; done
[ $# -gt 0 ] && shift
ip link set lo up
ip link add ts-br type bridge || exit 90
ip addr add 10.77.0.1/24 dev ts-br
ip link set ts-br up
holders=() daemons=()
declare -A lists counts
host=2
for role in "${roles[@]}"; do
    index=${counts[$role]:-0}
    counts[$role]=$((index + 1))
    name=$role$index
    # The daemon's namespace lives as long as this holder process.
    unshare -n sleep 600 &
    holder=$!
    holders+=("$holder")
    for _ in $(seq 200); do
        [ "$(readlink /proc/$holder/ns/net)" != "$(readlink /proc/self/ns/net)" ] && break
        sleep 0.05
    done
    [ "$(readlink /proc/$holder/ns/net)" != "$(readlink /proc/self/ns/net)" ] || { echo "no network namespace for $name"; exit 95; }
    ip link add "ts-v$host" type veth peer name "ts-p$host" || exit 91
    ip link set "ts-p$host" netns "$holder" || exit 91
    ip link set "ts-v$host" master ts-br
    ip link set "ts-v$host" up
    nsenter -t "$holder" -n sh -c "ip link set lo up && ip addr add 10.77.0.$host/24 dev ts-p$host && ip link set ts-p$host up" || exit 92
    nsenter -t "$holder" -n "$daemon" --listen "10.77.0.$host:7070" --allow-remote --name "$name" --port-file "$out/$name.port" \
        >"$out/$name.log" 2>&1 &
    daemons+=("$!")
    lists[$role]="${lists[$role]:+${lists[$role]}, }\"10.77.0.$host:7070\""
    host=$((host + 1))
done
cluster=""
for role in "${!lists[@]}"; do cluster="${cluster:+$cluster, }\"$role\": [${lists[$role]}]"; done
echo "{\"cluster\": {$cluster}}" >"$out/cluster.json"
# Every daemon listens before the coordinator starts.
for f in "$out"/*.log; do
    port="${f%.log}.port"
    for _ in $(seq 400); do [ -s "$port" ] && break; sleep 0.05; done
    [ -s "$port" ] || { echo "no port file $port"; cat "$f"; exit 93; }
done
# ... and is reachable from here over its link (a TCP connect from the coordinator's namespace):
# a failure later is then the coordinator's, not the test network's.
for ((h = 2; h < host; ++h)); do
    for try in $(seq 200); do
        (exec 3<>"/dev/tcp/10.77.0.$h/7070") 2>/dev/null && break
        sleep 0.05
    done
    echo "10.77.0.$h reachable at try $try" >>"$out/reach.txt"
    (exec 3<>"/dev/tcp/10.77.0.$h/7070") 2>/dev/null || { echo "10.77.0.$h:7070 is not reachable"; ip addr; ip link; exit 94; }
done
if [ -z "${TS_CUT_AFTER:-}" ]; then
    "$cli" train --cluster "$out/cluster.json" "$@" >"$out/coordinator.out" 2>"$out/coordinator.err"
    echo $? >"$out/coordinator.rc"
else
    "$cli" train --cluster "$out/cluster.json" "$@" >"$out/coordinator.out" 2>"$out/coordinator.err" &
    coordinator=$!
    for _ in $(seq 1200); do
        grep -qF "$TS_CUT_AFTER" "$out/coordinator.out" && break
        kill -0 "$coordinator" 2>/dev/null || break
        sleep 0.05
    done
    cut=$(date +%s.%N)
    ip addr del 10.77.0.1/24 dev ts-br
    for f in "$out"/*.log; do echo never >"${f%.log}.noticed"; done
    for _ in $(seq 600); do
        pending=0
        for f in "$out"/*.log; do
            noticed="${f%.log}.noticed"
            if [ "$(cat "$noticed")" = never ]; then
                if grep -qE "run [^ ]+ (cancelled|failed)" "$f"; then
                    awk "BEGIN { print $(date +%s.%N) - $cut }" >"$noticed"
                else
                    pending=1
                fi
            fi
        done
        [ $pending = 0 ] && break
        sleep 0.1
    done
    wait "$coordinator"
    echo $? >"$out/coordinator.rc"
fi
kill "${daemons[@]}" 2>/dev/null
wait "${daemons[@]}" 2>/dev/null
kill "${holders[@]}" 2>/dev/null
exit 0
