# One image for both services (and the chaos runner); docker-compose.yml picks the
# command. Build: docker compose build   (or: docker build -t outbox-relay .)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# Unprivileged runtime user; /data holds the SQLite files (sink.db or source.db plus
# their -wal and -shm companions) and is owned by that user, so a fresh named volume
# mounted there inherits the ownership.
RUN groupadd --system --gid 10001 outbox \
    && useradd --system --uid 10001 --gid outbox --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin outbox \
    && mkdir -p /data \
    && chown 10001:10001 /data

# Install the package from pyproject.toml (as root, into the system site-packages),
# then drop the source tree: the services run from the installed copy.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared/ shared/
COPY plumbing/ plumbing/
COPY sqlite_tx/ sqlite_tx/
COPY pg_tx/ pg_tx/
COPY publisher/ publisher/
COPY sink/ sink/
COPY chaos/ chaos/
RUN pip install --no-cache-dir . \
    && cd / \
    && rm -rf /src

# /data as the working directory: writable by the service user, and no source tree
# on sys.path that could shadow the installed packages.
WORKDIR /data
USER 10001:10001

# publisher intake API, sink API
EXPOSE 8000 8080

# Harmless default: compose sets the real command for each service. The package's
# commands (outbox-publisher, outbox-sink) are on PATH, the same as `python -m publisher`
# and `python -m sink`.
CMD ["outbox-publisher", "--help"]
