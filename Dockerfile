# syntax=docker/dockerfile:1
# The kvcap-exporter sidecar image. From the repository root:
#   docker build -t ghcr.io/kvcap/kvcap-exporter:0.1.0 .
# It runs as UID/GID 65532 with a read-only root filesystem and no capabilities; the only
# place it writes is the handshake socket's folder /run/kvcap (an emptyDir in the pod).
# It also carries kvcap's vLLM plugin for vLLM pods whose image lacks it: /opt/kvcap-plugin
# is the wheel installed with --target (the pure-Python package and its .dist-info, whose
# entry_points.txt registers vllm.general_plugins = kvcap), which an init container copies
# into a volume on vLLM's PYTHONPATH (docs/plugin.md).
# tests/deploy/test_container.py runs the RUN steps below and starts the installed daemon
# the way the pod does.

ARG PYTHON_IMAGE=python:3.11-slim

# Builds the kvcap-exporter wheel, nothing else.
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
COPY pyproject.toml README.md /src/
COPY exporter /src/exporter
RUN python -m pip wheel --no-deps --wheel-dir /dist /src

FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="kvcap-exporter" \
      org.opencontainers.image.description="Prometheus exporter for group-aware vLLM KV cache capacity, per engine (a vLLM sidecar)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="kvcap developers" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
ENV VIRTUAL_ENV=/opt/kvcap \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Only the wheel and its dependencies go into the venv; no pip, no build tools. The base
# image's pip installs into it, and compiles the bytecode now: the root filesystem is
# read-only at run time. The plugin folder gets the wheel alone (vLLM has msgspec and
# pyzmq), no scripts, and no bytecode: vLLM's Python may be another version.
RUN --mount=type=bind,from=builder,source=/dist,target=/dist \
    python -m venv --without-pip "$VIRTUAL_ENV" \
    && python -m pip --python "$VIRTUAL_ENV/bin/python" install --no-cache-dir /dist/*.whl \
    && python -m pip install --no-cache-dir --no-deps --no-compile --target /opt/kvcap-plugin /dist/*.whl \
    && rm -rf /opt/kvcap-plugin/bin
RUN install -d -o 65532 -g 65532 -m 0700 /run/kvcap
# HOME and TMPDIR point at the one writable folder; nothing is expected to use them.
ENV PATH=/opt/kvcap/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/run/kvcap \
    TMPDIR=/run/kvcap \
    KVCAP_HANDSHAKE_LISTEN=ipc:///run/kvcap/handshake.sock
USER 65532:65532
EXPOSE 9470
ENTRYPOINT ["kvcap-exporter", "serve"]
