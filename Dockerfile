# syntax=docker/dockerfile:1
# extproc service image: `pip install .[tracing]` (no demo/dev extras: no Envoy binary, no plotting) into a
# venv, copied into a clean runtime stage that runs as a non-root user. `--build-arg EXTRAS=` leaves tracing out.
#
#   docker build -t extproc:0.1.0 .
#   docker run --rm -p 9002:9002 -p 9003:9003 -v "$PWD/policy.yaml:/etc/extproc/policy.yaml:ro" extproc:0.1.0
# (in a container the policy needs service.grpc_host/admin_host: 0.0.0.0)

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=tracing
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Every runtime dependency ships wheels for this Python, so no compiler is installed.
RUN python -m venv /opt/extproc
WORKDIR /src
# Metadata first: the dependency layer is reused while only the code changes. xds-protos ships older copies of
# opentelemetry-proto's modules (same paths; the last installed wins): opentelemetry-proto's are put back.
COPY pyproject.toml README.md ./
RUN mkdir extproc && touch extproc/__init__.py \
    && /opt/extproc/bin/pip install ".${EXTRAS:+[$EXTRAS]}" \
    && if /opt/extproc/bin/pip show -q opentelemetry-proto 2>/dev/null; then \
         /opt/extproc/bin/pip install --force-reinstall --no-deps "opentelemetry-proto==$(/opt/extproc/bin/python \
           -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"; fi \
    && /opt/extproc/bin/pip uninstall -y extproc
COPY extproc ./extproc
RUN /opt/extproc/bin/pip install --no-deps . \
    && /opt/extproc/bin/extproc --help >/dev/null

FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
RUN groupadd --system --gid "${UID}" extproc \
    && useradd --system --uid "${UID}" --gid extproc --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin extproc
COPY --from=build /opt/extproc /opt/extproc
ENV PATH=/opt/extproc/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The Helm chart mounts the policy ConfigMap here.
WORKDIR /etc/extproc
# Numeric user, so Kubernetes can verify runAsNonRoot.
USER ${UID}:${UID}
# 9002: ext_proc gRPC + grpc.health.v1; 9003: admin HTTP (/metrics, /healthz, /readyz).
EXPOSE 9002 9003
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9003/healthz', timeout=2)"]
ENTRYPOINT ["extproc"]
CMD ["serve", "--config", "/etc/extproc/policy.yaml"]
