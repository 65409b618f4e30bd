# syntax=docker/dockerfile:1
# HexGen-Flow: the live gateway (`hexflow serve`) and the whole `hexflow` command line in one image.
#
# Targets (multi-stage):
#   builder          python:3.11-slim; builds the project's wheel and installs it with its dependencies
#                    into the virtual environment /opt/venv. Never shipped.
#   base             python:3.11-slim + /opt/venv + config/ at /etc/hexflow; non-root uid 10001; no compilers,
#                    no pip cache, no pip/setuptools/wheel in the venv. ENTRYPOINT ["hexflow"].
#   worker-emulator  base + CMD `hexflow emulate ...`: one emulated vLLM worker (a TEST DOUBLE for a GPU)
#                    on port 8000, health-checked on /health. The same layers as the gateway; only CMD,
#                    EXPOSE and HEALTHCHECK differ.
#   gateway          (default, last stage) base + CMD `hexflow serve` on 0.0.0.0:8080, health-checked on /healthz.
#
#   docker build -t hexgen-flow:latest .                                   # the gateway
#   docker build --target worker-emulator -t hexgen-flow-emulator:latest .  # an emulated worker
#   docker run --rm -p 8080:8080 -v "$PWD/my-gateway.yaml:/etc/hexflow/gateway.yaml:ro" hexgen-flow:latest
#   docker run --rm hexgen-flow:latest bench --trace chess-bird --cluster paper-4gpu   # any other subcommand
#
# Configuration: config/ is copied to /etc/hexflow and HEXFLOW_CONFIG_DIR points there (GPU catalogue
# gpus.yaml, clusters/, tenants.yaml, gateway.yaml). Mount your own gateway.yaml / tenants.yaml over
# them (docker-compose.yml does, from deploy/compose/). The baked-in gateway.yaml expects emulated
# workers on 127.0.0.1:8001-8004, so on its own the image is useful with `--network host`.
#
# Expected size: about 375 MB uncompressed (~130 MB compressed): python:3.11-slim is ~130 MB and the
# runtime venv ~245 MB (numpy ~71, matplotlib ~36, fonttools ~30, pillow ~22, uvloop ~14, asyncpg ~12,
# aiohttp ~8, sqlglot ~8, pydantic ~10, the rest small); measured from the dependency closure of
# `hexgen-flow` in the development venv, without the dev tools (mypy, pytest, ruff, openai, pip).
# matplotlib/numpy are there for `hexflow bench --plot`; the gateway itself does not import them.

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Every dependency ships manylinux wheels for CPython 3.11 (amd64 and arm64), so the builder needs no
# compiler either; should one ever build from source, install build-essential HERE, never below.
RUN python -m venv /opt/venv
# The dependencies are exactly requirements-runtime.lock (pinned, hash-checked: the runtime subset of the
# lock `make setup` installs); then the project itself, without resolving anything again.
COPY requirements-runtime.lock ./
RUN /opt/venv/bin/pip install --require-hashes -r requirements-runtime.lock
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY workers ./workers
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/venv/bin/pip install --no-deps /wheels/*.whl \
 && /opt/venv/bin/pip uninstall --yes pip setuptools wheel \
 && rm -rf /wheels

# ---------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="hexgen-flow" \
      org.opencontainers.image.description="HexGen-Flow: a heterogeneity- and deadline-aware inference gateway for agentic Text-to-SQL on vLLM clusters" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HEXFLOW_CONFIG_DIR=/etc/hexflow
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin hexflow
COPY --from=builder /opt/venv /opt/venv
COPY config /etc/hexflow
WORKDIR /app
USER 10001
ENTRYPOINT ["hexflow"]
CMD ["--help"]

# ---------------------------------------------------------------------------------------------------
# One emulated vLLM worker (TEST DOUBLE). Override the GPU class per container, e.g.
#   docker run hexgen-flow-emulator emulate --gpu L40S --model llama-3.1-70b --host 0.0.0.0 --port 8000 --time-scale 0.05
# (the health check assumes port 8000).
FROM base AS worker-emulator
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"]
CMD ["emulate", "--gpu", "A100", "--model", "llama-3.1-70b", "--host", "0.0.0.0", "--port", "8000", "--time-scale", "0.05"]

# ---------------------------------------------------------------------------------------------------
# The live gateway (default target). The health check assumes port 8080 (the CMD's, the config's default).
FROM base AS gateway
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
CMD ["serve", "--config", "/etc/hexflow/gateway.yaml", "--host", "0.0.0.0"]
