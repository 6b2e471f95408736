# One image for every Sentinel process (web, worker, beat, mock provider); docker-compose.yml picks
# the command. Production shape: external PostgreSQL (pgvector) and Redis/Valkey via the environment.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False HF_HUB_OFFLINE=1
WORKDIR /app
COPY requirements.txt .
# The runtime lock only (tests and benchmarks have their own). It pins torch's CPU build by its hash,
# a file PyPI does not carry: the builder names where it lies, e.g.
# `docker build --build-arg PIP_EXTRA_INDEX_URL=<PyTorch's CPU index>` (docs/operations.md).
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
RUN pip install --no-cache-dir --require-hashes -r requirements.txt
COPY . .
# collectstatic reaches no storage, so it needs no URLs; the key keeps a generated secret out of the image.
RUN SENTINEL_SECRET_KEY=build python manage.py collectstatic --noinput \
    && useradd --system --uid 10001 --home-dir /app sentinel
USER sentinel
EXPOSE 8000
CMD ["python", "-m", "sentinel.web", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
