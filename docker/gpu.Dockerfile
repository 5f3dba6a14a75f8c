# znni job server on the GPU (CUDA 13: CuPy 14, cuDNN through its frontend), plus Dask.
#   docker build -f docker/gpu.Dockerfile -t znni:gpu .
#   docker run --rm --gpus all -p 127.0.0.1:8000:8000 -v "$PWD/data:/data" \
#       -v "$PWD/models:/models:ro" -v znni-state:/state -e ZNNI_TOKEN=change-me znni:gpu
# Needs the NVIDIA Container Toolkit and a driver that runs CUDA 13 (nvidia-smi's header
# says "CUDA Version: 13.x"; R580 or newer). The gpu-cuda13 extra brings the CUDA
# libraries (cupy-cuda13x[ctk]) and cuDNN (nvidia-cudnn-cu13) as PyPI wheels, so the
# base image needs only the driver-facing parts: `base`, not `runtime` or `cudnn`.
# For a CUDA 12 driver: FROM nvidia/cuda:12.9.1-base-ubuntu24.04 and .[gpu-cuda12,dask].
FROM nvidia/cuda:13.0.0-base-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /opt/znni
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".[gpu-cuda13,dask]" \
    && useradd --create-home --uid 1001 znni \
    && mkdir -p /data /models /state \
    && chown znni:znni /data /state

USER znni
ENV ZNNI_HOST=0.0.0.0 \
    ZNNI_PORT=8000 \
    ZNNI_DATA_ROOT=/data \
    ZNNI_MODELS=/models \
    ZNNI_DB=/state/znni-jobs.sqlite
VOLUME ["/data", "/state"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"
STOPSIGNAL SIGTERM
CMD ["znni", "serve"]
