#!/usr/bin/env bash
# Open MPI's remote launcher for the namespace hosts (--mca plm_rsh_agent this-script): called as
# `launcher.sh HOST word...` like ssh, it runs the words through a shell (Open MPI quotes them
# for a remote shell) on HOST: in its network namespace, under its own hostname.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=netns.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns.sh"
host=$1
shift
mn_exec "$host" /bin/sh -c "$*"
