#!/usr/bin/env bash
# One test stream: run a command in namespaces of its own, so that two streams can run side
# by side on one machine (make test) without one seeing the other's files, processes
# or ports.
#
#   tests/stream.sh NAME COMMAND...   run COMMAND; its lines are printed prefixed "[NAME] "
#   tests/stream.sh --check           exit 0 when this machine can make such a stream
#
# The suite's checks look at machine-wide places: what is new in /tmp and /dev/shm (the
# leftover check, weight files written outside the work directory, the engines' shared
# memory), which processes run (the node agents), and ports are
# chosen free at one moment and bound later. A stream gets its own of each: a private /tmp
# (a directory under .streams/NAME, on disk), a fresh tmpfs on /dev/shm, its own HOME, its own
# process table (PID 1 is this script: when it exits, whatever the stream left running ends
# with it) and its own loopback network. The checkout stays at its path (re-exposed when it
# lives under /tmp), so the environments' absolute paths hold. It needs root, or user
# namespaces; where neither is there, --check says so (and make test runs one stream after the other).
set -euo pipefail

if [ "${1:-}" = "--check" ]; then
    exec unshare --mount --pid --fork --net --mount-proc true 2>/dev/null
fi
if [ "${1:-}" = "--inside" ]; then  # the namespaces' PID 1: set them up, run the command
    shift
    name=$1 root=$2 private=$3
    shift 3
    ip link set lo up
    mount -t tmpfs -o mode=1777 tmpfs /dev/shm
    case "$root/" in
        /tmp/*)  # the checkout lives under /tmp: keep it reachable at its own path
            keep=/run/rsl-stream-$name-$$
            mkdir -p "$keep"
            mount --bind /tmp "$keep"
            mount --bind "$private/tmp" /tmp
            mkdir -p "$root"
            mount --bind "$keep/${root#/tmp/}" "$root"
            ;;
        *) mount --bind "$private/tmp" /tmp ;;
    esac
    # the other streams' private directories sit beside this one's, in the checkout (which
    # is under /tmp when the checkout is): hidden under an empty .streams, this one bound back
    own=/run/rsl-stream-own-$name-$$
    mkdir -p "$own"
    mount --bind "$private" "$own"
    mount -t tmpfs -o mode=755 tmpfs "$root/.streams"
    mkdir -p "$private"
    mount --bind "$own" "$private"
    export HOME=$private/home TMPDIR=/tmp
    cd "$root"
    "$@" &
    child=$!
    # PID 1 of the namespace: orphaned processes come here; wait reaps them, the command's
    # own status is the stream's
    status=0
    wait "$child" || status=$?
    exit "$status"
fi

name=$1
shift
root=$(pwd -P)
private=$root/.streams/$name
rm -rf "$private"
mkdir -p "$private/tmp" "$private/home"
# (and the empty mount points the stream made under /run)
trap 'rm -rf "$private"; rmdir /run/rsl-stream-"$name"-* /run/rsl-stream-own-"$name"-* 2>/dev/null || true' EXIT
exec 3> >(sed -u "s/^/[$name] /")
printer=$!
# --kill-child: when unshare ends the stream's PID 1 gets SIGKILL, and with it every process
# of the stream; a signal that stops this script (make interrupted, a CI timeout) ends it so
unshare --mount --propagation private --pid --fork --kill-child --net --mount-proc \
    "$0" --inside "$name" "$root" "$private" "$@" >&3 2>&3 &
child=$!
exec 3>&-
trap 'kill -KILL "$child" 2>/dev/null' TERM INT HUP  # unshare ignores TERM and INT
status=0
wait "$child" || status=$?
while kill -0 "$child" 2>/dev/null; do wait "$child" || status=$?; done
wait "$printer" 2>/dev/null || true
exit "$status"
