# HexGen-Flow gateway image. For now it carries the `hexflow` command line (simulator, tuner, benchmarks);
# the live gateway (`hexflow serve`) lands in the same image.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY workers ./workers
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 hexflow
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /app
COPY config ./config
ENV HEXFLOW_CONFIG_DIR=/app/config
USER hexflow
ENTRYPOINT ["hexflow"]
CMD ["--help"]
