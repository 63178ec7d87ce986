#!/bin/sh
# Host packages the emulated testbed needs (Debian 12). Idempotent: installs only what is missing.
#   iproute2      ip (namespaces, veths, bridges, routes, rules), tc (tbf rate limits)
#   nftables      nft (random-drop loss faults inside namespaces)
#   iputils-ping  ping, for people poking at a fabric by hand (the tests use testbed.probe)
#   util-linux    setpriv (a test drops root to check the "needs root" error)
set -eu
PACKAGES="iproute2 nftables iputils-ping util-linux"
missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup-host.sh: need root to install:$missing" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing
fi
echo "testbed host packages present: $PACKAGES"
