#!/usr/bin/env bash
# Set up Compute Exchange on a Debian/Ubuntu machine (as root) and run something.
#   ./quickstart.sh demo   set up, then run the main demo (cx testnet: node processes over libp2p)
#   ./quickstart.sh test   set up, then run lint, types, layer contracts and the whole test suite
#   ./quickstart.sh setup  only set up
# Idempotent: apt runs only when a package is missing; pip only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")"

# System packages the product and its tests use (OCI runtimes, image tools, TPM simulator,
# and for the tests a real OCI registry, skopeo to push to it, htpasswd for its logins,
# Prometheus to scrape a node, headless Chromium and its driver to look at the dashboard,
# and for `cx testnet --netns` namespaces, NAT and sysctl).
APT_PACKAGES=(python3 python3-venv python3-dev gcc pkg-config libgmp-dev libtss2-dev git
              crun runc umoci busybox-static swtpm swtpm-tools tpm2-tools libc6-dev podman
              docker-registry skopeo apache2-utils prometheus chromium chromium-driver
              e2fsprogs iproute2 iptables procps util-linux)

need_apt=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "quickstart: installing ${need_apt[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

# Prefer a python3.11+ already on PATH (pyenv, deadsnakes); Debian 12's python3 is 3.11.
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "quickstart: $PYTHON is older than 3.11; set PYTHON=/path/to/python3.11" >&2; exit 1; }

stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -e "$stamp" ]; then
    echo "quickstart: creating .venv" >&2
    [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[test,tpm]'
    rm -f .venv/.installed-* && touch "$stamp"
fi

case "${1:-demo}" in
    setup) ;;
    demo)  shift || true; exec .venv/bin/cx testnet "$@" ;;
    test)
        shift || true
        .venv/bin/ruff check .
        .venv/bin/ruff format --check .
        .venv/bin/mypy
        .venv/bin/lint-imports
        exec .venv/bin/pytest "$@" ;;
    *) echo "usage: $0 [demo|test|setup]" >&2; exit 2 ;;
esac
