#!/bin/sh
# Installs Node.js + npm from the distribution and the npm packages of ort-node / ort-web into
# /opt/venv/node/<package>-<version>, as harness/runtimes/node_host.py does in a venv (npm ci
# from the kept lockfile, install scripts off, the `.installed` marker holding the lockfile's
# digest), so a worker in the image finds them installed and never needs the npm registry.
#   install-node-packages.sh LOCKS_DIR PACKAGE-VERSION...
set -eu
locks="$1"
shift
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends nodejs npm ca-certificates
    rm -rf /var/lib/apt/lists/*
fi
node --version
for spec in "$@"; do
    target="/opt/venv/node/$spec"
    mkdir -p "$target"
    cp "$locks/$spec/package.json" "$locks/$spec/package-lock.json" "$target/"
    (cd "$target" && npm ci --prefer-offline --ignore-scripts --no-audit --no-fund --loglevel=error)
    sha256sum "$target/package-lock.json" | cut -c1-16 | tr -d '\n' > "$target/.installed"
done
chmod -R a+rX /opt/venv/node
