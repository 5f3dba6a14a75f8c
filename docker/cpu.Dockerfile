# znni job server, CPU only (numpy + pyFFTW), with Dask for the optional cluster services.
#   docker build -f docker/cpu.Dockerfile -t znni:cpu .
#   docker run --rm -p 127.0.0.1:8000:8000 -v "$PWD/data:/data" -v "$PWD/models:/models:ro" \
#       -v znni-state:/state -e ZNNI_TOKEN=change-me znni:cpu
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/znni
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".[dask]" \
    && useradd --create-home --uid 1000 znni \
    && mkdir -p /data /models /state \
    && chown znni:znni /data /state

USER znni
# Inside the container the server must listen on all interfaces to be reachable through a
# published port; publish it on 127.0.0.1 of the host (as compose.yaml does) unless you mean
# to expose it, and then set ZNNI_TOKEN.
ENV ZNNI_HOST=0.0.0.0 \
    ZNNI_PORT=8000 \
    ZNNI_DATA_ROOT=/data \
    ZNNI_MODELS=/models \
    ZNNI_DB=/state/znni-jobs.sqlite
VOLUME ["/data", "/state"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"
# `docker stop` sends SIGTERM: running jobs stop after their current block and resume on restart.
STOPSIGNAL SIGTERM
CMD ["znni", "serve"]
