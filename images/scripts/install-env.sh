#!/bin/sh
# Installs one environment into /opt/venv, the same package list the uv venv provider installs.
#   install-env.sh PYTHON REQUIREMENT...
# Runs inside `docker build` with BuildKit mounts only: the CA bundle and the index settings are
# secrets (/run/secrets/ca, /run/secrets/pipconf), local wheels a bind mount (/tmp/wheels) and
# pip's download cache a cache mount, so none of them lands in a layer.
set -eu
python="python$1"
shift

if ! command -v "$python" >/dev/null 2>&1 || ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
    # Bases without this Python (CUDA, TensorRT, OpenVINO are Ubuntu): take it from the distro.
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "base image has no $python and no apt-get to install it" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "$python" "$python-venv" ca-certificates
    rm -rf /var/lib/apt/lists/*
fi

"$python" -m venv /opt/venv
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore
if [ -s /run/secrets/pipconf ]; then export PIP_CONFIG_FILE=/run/secrets/pipconf; fi
if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi
if ls /tmp/wheels/*.whl >/dev/null 2>&1; then set -- --find-links /tmp/wheels "$@"; fi
/opt/venv/bin/python -m pip install "$@"
# What run.json reports as "installed" (pip freeze, as `uv pip freeze` does for venvs).
/opt/venv/bin/python -m pip freeze > /opt/venv/installed.txt
