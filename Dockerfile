# kvstore sidecar image. Build: docker build -t kvstore .
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY kvstore ./kvstore
COPY policies ./policies
COPY connectors ./connectors
# Group kvcache (gid 10000) is the primary group of this image's user and of the vLLM
# image's (deploy/docker/vllm-cpu.Dockerfile): with dram.segment_mode = "0660" the
# connector next to the sidecar maps its shared memory (README, "Shared memory").
RUN pip install . && groupadd --system --gid 10000 kvcache \
    && useradd --system --uid 10001 --gid kvcache kvstore && mkdir -p /data \
    && chown kvstore:kvcache /data
USER kvstore
VOLUME ["/data"]
# gRPC, Prometheus /metrics, KV events (ZMQ PUB), event replay (ZMQ ROUTER)
EXPOSE 50051 9100 5557 5558
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["kvstore", "stats", "--address", "127.0.0.1:50051", "--timeout", "2"]
ENTRYPOINT ["kvstore", "serve"]
# On every interface: refused at start without credentials ([auth] tenants, mutual TLS, or
# KVSTORE_AUTH__ALLOW_UNAUTHENTICATED=true); docker-compose.yml configures a token.
CMD ["--listen", "0.0.0.0:50051", "--data-dir", "/data"]
