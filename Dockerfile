# The Kairos image: the four services (`kairos serve state|queue|placement|binder`), the GPU agent
# (`python -m services.gpu_agent`) and the simulated API server (`python -m tools.kubesim`, with KAI's
# CRDs under /opt/kairos/deploy/crds). Runtime dependencies only, no development tools; runs as uid 10001
# and works on a read-only root filesystem (bytecode is compiled at install time).
#   docker build -t kairos:dev .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# /shared: where the simulated API server writes its kubeconfig for the other containers (docker compose
# copies the owner into a new named volume mounted there).
RUN groupadd --gid 10001 kairos \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin kairos \
    && mkdir /shared \
    && chown 10001:10001 /shared

WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY tools ./tools
RUN pip install . && rm -rf /src

COPY deploy/crds /opt/kairos/deploy/crds

USER 10001:10001
WORKDIR /opt/kairos
# The health endpoints (/healthz, /readyz) when KAIROS_HEALTH_PORT=8080, as the manifests set it.
EXPOSE 8080
ENTRYPOINT ["kairos"]
CMD ["--help"]
