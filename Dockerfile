# syntax=docker/dockerfile:1
#
# Two images from one Dockerfile:
#
#   docker build --target operator -t trainjob-operator:0.1.0 .
#       The operator (kopf; `trainjob operator`): the core package only, no Ray, torch or jax.
#       It is what charts/trainjob-operator deploys (values: image.repository/tag).
#
#   docker build --target runtime -t trainjob-runtime:0.1.0 .
#   docker build --target runtime --build-arg JAX=cpu -t trainjob-runtime:0.1.0-jax .
#       The in-pod image of a TrainJob's head, worker, validation and driver pods
#       (spec.image): trainer_runtime + Ray + google-cloud-storage + torch (CPU wheels by
#       default), optionally jax. Build your own training image FROM it and copy your code
#       into /workspace (on PYTHONPATH), e.g. `COPY mypkg /workspace/mypkg`.
#
# Both run as the non-root user 1000 (uid and gid), as the chart and the rendered pods require
# (runAsNonRoot, runAsUser 1000).
#
# BASE_IMAGE: any Debian-like image with Python 3.11 as `python` (and its venv module),
# groupadd and useradd; the official Python image by default. Pin it by digest for
# reproducible, tamper-evident builds: --build-arg BASE_IMAGE=python:3.11-slim@sha256:<digest>. The real-node tests build on a
# debootstrapped Debian bookworm instead, with packages from a wheelhouse
# (scripts/build-images.sh).

ARG BASE_IMAGE=python:3.11-slim

# --------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --gid 1000 trainjob \
    && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/trainjob \
        --shell /bin/sh trainjob

# --------------------------------------------------------------------------------------------
# The dependency lists, read from pyproject.toml's [project] table. The install steps below copy
# only these files, so their layers (Ray and torch: minutes) are rebuilt when a requirement
# changes, not when the code, the README or another part of pyproject.toml does.
FROM base AS requirements
WORKDIR /src
COPY pyproject.toml ./
RUN python -c 'import tomllib; \
p = tomllib.load(open("pyproject.toml", "rb"))["project"]; x = p["optional-dependencies"]; \
w = lambda name, reqs: open(name, "w").write("\n".join(reqs) + "\n"); \
w("requirements-operator.txt", p["dependencies"]); \
w("requirements-runtime.txt", p["dependencies"] + x["runtime"] + x["gcs"] + x["torch"]); \
w("requirements-jax.txt", x["jax"])'

# --------------------------------------------------------------------------------------------
# The project's sources, shared by both builds (only what the package needs: see .dockerignore).
FROM base AS source
WORKDIR /src
COPY pyproject.toml README.md ./
COPY trainjob_operator ./trainjob_operator
COPY trainer_runtime ./trainer_runtime

# --------------------------------------------------------------------------------------------
FROM base AS operator-build
# The core install (no extras): pydantic, pyyaml, kopf, prometheus-client, aiohttp; then the
# package itself.
COPY --from=requirements /src/requirements-operator.txt /tmp/requirements.txt
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -r /tmp/requirements.txt
COPY --from=source /src /tmp/src
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps /tmp/src \
    && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM base AS operator
COPY --from=operator-build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp
WORKDIR /tmp
USER 1000:1000
# 8080: kopf liveness (/healthz); 9090: Prometheus metrics.
EXPOSE 8080 9090
ENTRYPOINT ["trainjob", "operator"]

# --------------------------------------------------------------------------------------------
# The runtime's dependencies (the extras runtime, gcs and torch; jax on request), in layers of
# their own that the runtime image is built on: a change of the code adds a small layer on top.
FROM base AS runtime-deps
# torch comes from PyTorch's CPU-only wheel index (no CUDA libraries, a few hundred MB instead
# of several GB). For GPU images pass e.g.
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Pinned versions of what the image installs beyond the package's own ranges, so that a rebuild
# installs the same ones: google-cloud-storage, and below jax (jax[tpu] with its libtpu).
# scripts/build-images.sh reads both, and its offline wheelhouse holds these versions.
ARG GCS_VERSION=3.17.1
COPY --from=requirements /src/requirements-runtime.txt /tmp/requirements-runtime.txt
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --extra-index-url "${TORCH_INDEX_URL}" \
        -r /tmp/requirements-runtime.txt "google-cloud-storage==${GCS_VERSION}"
# jax: none (default), cpu (jax + jaxlib), or tpu (jax[tpu], with libtpu, for TPU node pools).
# Declared after the install above, in a step of its own, so that the JAX variants reuse the
# cached layer of the plain runtime build (Ray and torch) and only add jax.
ARG JAX=none
ARG JAX_VERSION=0.10.2
COPY --from=requirements /src/requirements-jax.txt /tmp/requirements-jax.txt
RUN case "${JAX}" in \
        none) ;; \
        cpu) /opt/venv/bin/pip install --no-cache-dir -r /tmp/requirements-jax.txt "jax==${JAX_VERSION}" ;; \
        tpu) /opt/venv/bin/pip install --no-cache-dir -r /tmp/requirements-jax.txt "jax[tpu]==${JAX_VERSION}" ;; \
        *) echo "JAX must be none, cpu or tpu, not ${JAX}" >&2; exit 1 ;; \
    esac

FROM runtime-deps AS runtime
COPY --from=source /src /tmp/src
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps /tmp/src \
    && rm -rf /tmp/src \
    && install -d -o 1000 -g 1000 /workspace
# `ray` (ray start/health-check in the pods' commands) and `python` come from the venv.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/workspace \
    RAY_USAGE_STATS_ENABLED=0
WORKDIR /workspace
USER 1000:1000
CMD ["python", "-c", "import trainer_runtime, ray; print('trainer_runtime', ray.__version__)"]
