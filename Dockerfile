FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --create-home --uid 10001 kairos

WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
RUN pip install . && rm -rf /src

USER kairos
WORKDIR /home/kairos
ENTRYPOINT ["kairos"]
