#!/bin/sh
# Installs one environment into /opt/venv with uv, the installer the venv provider uses, and the
# same package list:   install-env.sh PYTHON REQUIREMENT...
# Runs inside `docker build` with BuildKit mounts only: uv (this machine's binary, /tmp/tools),
# the CA bundle and the index settings (secrets in /run/secrets), local wheels (/tmp/wheels) and
# uv's download cache (shared by every image build) never land in a layer.
set -eu
python="python$1"
shift

if ! command -v "$python" >/dev/null 2>&1; then
    # Bases without this Python (CUDA, TensorRT, OpenVINO are Ubuntu): take it from the distro.
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "base image has no $python and no apt-get to install it" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "$python" ca-certificates
    rm -rf /var/lib/apt/lists/*
fi

# The cache is another mount than /opt/venv: uv copies (its default hard links would fail).
export UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1
if [ -s /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca; fi
# shellcheck disable=SC1091  # UV_INDEX_URL / UV_EXTRA_INDEX_URL, written by the harness
if [ -s /run/secrets/index ]; then . /run/secrets/index; fi
if ls /tmp/wheels/*.whl >/dev/null 2>&1; then set -- --find-links /tmp/wheels "$@"; fi
uv=/tmp/tools/uv
"$uv" venv --python "$python" /opt/venv
# Bytecode compiled here: containers run as nobody with PYTHONDONTWRITEBYTECODE, so a worker
# would otherwise compile torch's sources again at every start.
"$uv" pip install --compile-bytecode --python /opt/venv/bin/python "$@"
# What run.json reports as "installed", produced as for venvs (uv pip freeze).
"$uv" pip freeze --python /opt/venv/bin/python > /opt/venv/installed.txt
