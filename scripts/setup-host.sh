#!/bin/sh
# Debian packages Lockstep's commands and tests need. Idempotent: installs only what is missing.
#   iproute2         ip (namespaces, veths, bridges, routes, rules), tc (tbf rate limits): testbed
#   nftables         nft (random-drop loss faults inside namespaces): testbed
#   iputils-ping     ping, for poking at an emulated fabric by hand
#   util-linux       setpriv (a test drops root to check the "needs root" errors)
#   curl             the one-line installer is fetched with it
#   the shellcheck package lints the installer script in a test
#   chromium, chromium-driver   headless browser tests of the console pages
#   chrony           the clock-sync benchmark runs chronyd (measurement only, -x) beside Lockstep in namespaces
#   gcc, make, libc6-dev   `make native`: the probe mesh's helper (agent/probemesh/native/)
#   libpango-1.0-0, libpangoft2-1.0-0   WeasyPrint renders the audit reports as PDF with them
# Without root it only reports what is missing; the tests that need a missing part skip and say so.
set -eu
PACKAGES="iproute2 nftables iputils-ping util-linux curl shellcheck chromium chromium-driver chrony gcc make libc6-dev libpango-1.0-0 libpangoft2-1.0-0"
missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "setup-host: all host packages present"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "setup-host: not root, cannot install:$missing (tests needing them will skip)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=300 update -qq
# shellcheck disable=SC2086
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends $missing
echo "setup-host: installed$missing"
