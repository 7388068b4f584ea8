#!/usr/bin/env bash
# Hosts for multi-node tests on one machine: one Linux network namespace per "host" and one
# for the "switch" (a bridge), joined by veth pairs, on a private subnet that exists only inside
# these namespaces. The root namespace is not touched (its /etc/hosts, routes and interfaces
# stay as they are); only names that start with $MN_PREFIX are made, and only those are removed.
#
# Sourced by run.sh; functions:
#   mn_setup N        make hosts node0..node{N-1} (removing leftovers of a killed run first)
#   mn_teardown       end every process in the namespaces, then delete them
#   mn_exec H cmd...  run cmd on host H (its namespace, its own hostname)
#   mn_rx_bytes H     bytes received by host H's eth0
#
# Facts this relies on (found on Debian 12 with Open MPI 4.1.4):
# - `ip netns exec NS` bind-mounts /etc/netns/NS/hosts over /etc/hosts, so names resolve per host.
# - Open MPI names its shared-memory segments in /dev/shm after the hostname, and /dev/shm is
#   shared by all namespaces: every host needs its own hostname (unshare --uts), or ranks on
#   two hosts map the same segment and crash.
# - A namespace outlives `ip netns del` while a process runs in it: teardown kills them first.

MN_PREFIX=${MN_PREFIX:-shardmn}
MN_SUBNET=${MN_SUBNET:-10.213.47}  # /24, inside the namespaces only

mn_ns() { echo "${MN_PREFIX}-$1"; }
mn_addr() { echo "${MN_SUBNET}.$((10 + ${1#node}))"; }

# Whether this machine can make the hosts; prints the reason when it cannot.
mn_can_run() {
  if [ "$(id -u)" != 0 ]; then echo "needs root (network namespaces)"; return 1; fi
  if ! command -v ip >/dev/null; then echo "needs ip (iproute2)"; return 1; fi
  if ! command -v unshare >/dev/null; then echo "needs unshare (util-linux)"; return 1; fi
  if ! ip netns add "${MN_PREFIX}-probe" 2>/dev/null; then echo "cannot create network namespaces here"; return 1; fi
  ip netns del "${MN_PREFIX}-probe"
}

# Ends the processes in one of our namespaces and deletes it.
mn_remove_ns() {
  local ns=$1 pids
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086  # one PID per word
    kill -9 $pids 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(ip netns pids "$ns" 2>/dev/null || true)" ] && break
      sleep 0.02
    done
  fi
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "/etc/netns/$ns"
}

mn_teardown() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${MN_PREFIX}-" || true); do
    mn_remove_ns "$ns"
    # Open MPI's shared-memory segments of that host (named after its hostname), which jobs
    # that were killed leave behind.
    rm -f "/dev/shm/vader_segment.${ns#"${MN_PREFIX}"-}."*
  done
}

mn_setup() {
  local n=$1 i ns sw
  mn_teardown  # what a killed run left behind
  sw=$(mn_ns switch)
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < n; i++)); do
    ns=$(mn_ns "node$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # The host's end is made inside the switch namespace, then moved and renamed eth0.
    ip -n "$sw" link add "p$i" type veth peer name "h$i"
    ip -n "$sw" link set "h$i" netns "$ns"
    ip -n "$ns" link set "h$i" name eth0
    ip -n "$ns" addr add "$(mn_addr "node$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$sw" link set "p$i" master br0
    ip -n "$sw" link set "p$i" up
  done
  for ((i = 0; i < n; i++)); do
    ns=$(mn_ns "node$i")
    mkdir -p "/etc/netns/$ns"
    {
      echo "127.0.0.1 localhost"
      local j
      for ((j = 0; j < n; j++)); do echo "$(mn_addr "node$j") node$j"; done
    } > "/etc/netns/$ns/hosts"
  done
}

# mn_exec HOST cmd...: cmd on HOST, with HOST as its hostname (a UTS namespace of its own),
# ended after MN_TIMEOUT seconds (default 600) so that nothing run here can hang a test.
mn_exec() {
  local host=$1
  shift
  # shellcheck disable=SC2016  # $0 and $@ are for the inner shell
  timeout --kill-after=5 "${MN_TIMEOUT:-600}" \
    ip netns exec "$(mn_ns "$host")" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}

mn_rx_bytes() {
  ip -n "$(mn_ns "$1")" -s -j link show eth0 |
    sed -n 's/.*"rx":{"bytes":\([0-9]*\).*/\1/p'
}
