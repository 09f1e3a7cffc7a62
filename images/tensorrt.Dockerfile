# TensorRT environment image. harness/docker_images.py passes every ARG from the
# environment spec (the venv provider's package list); defaults name the public base.
# Build context: a staged folder holding images/, harness/ and wheels/ (local wheels, maybe empty).
ARG BASE_IMAGE=nvcr.io/nvidia/tensorrt:24.12-py3
FROM ${BASE_IMAGE}

ARG PYTHON=3.11
ARG TORCH_VERSION=2.13.0
ARG COMPANION_PACKAGES="numpy==2.4.6 onnx==1.23.2 onnxscript==0.7.2"
ARG RUNTIME_PACKAGES="tensorrt==11.4.0.106"
ARG EXTRA_PACKAGES=""

# Bases differ in their default user (OpenVINO's is not root); installing needs root.
USER 0
# One layer for Python + packages: secrets, uv, wheels, scripts and uv's cache are mounts only.
RUN --mount=type=bind,source=images/scripts,target=/tmp/scripts \
    --mount=type=bind,source=tools,target=/tmp/tools \
    --mount=type=bind,source=wheels,target=/tmp/wheels \
    --mount=type=secret,id=ca \
    --mount=type=secret,id=index \
    --mount=type=cache,target=/root/.cache/uv \
    sh /tmp/scripts/install-env.sh "${PYTHON}" "torch==${TORCH_VERSION}" \
        ${COMPANION_PACKAGES} ${RUNTIME_PACKAGES} ${EXTRA_PACKAGES}

# Declared after the install: an ARG in scope is part of every later RUN's cache key, and a
# harness change must not reinstall torch.
ARG HARNESS_HASH=unknown
# The harness is not installed: like the venv provider, the worker finds it on PYTHONPATH.
COPY harness /opt/harness/harness
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/harness \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
LABEL org.opencontainers.image.title="torch-onnx-matrix tensorrt environment" \
      torch-onnx-matrix.family="tensorrt" \
      torch-onnx-matrix.torch="${TORCH_VERSION}" \
      torch-onnx-matrix.harness="${HARNESS_HASH}"
# Containers run as the invoking user's uid (files in the run directory stay theirs); nobody here.
USER 65534:65534
WORKDIR /tmp
CMD ["python", "-m", "harness.worker", "--help"]
