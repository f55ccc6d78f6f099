# mlserver-like: an Open Inference Protocol (KServe V2) model server.
#
#   docker build -t mlserver-like .                       # small: no torch
#   docker build -t mlserver-like:torch --build-arg WITH_TORCH=true .
#   docker run -p 8080:8080 -p 8081:8081 -p 8082:8082 -v $PWD/models:/mnt/models mlserver-like
#
# Models are read from /mnt/models (KServe's model folder): model-settings.json files, or, with
# none there, the one model the MLSERVER_MODEL_* variables describe. See docs/deploy.md.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ARG WITH_TORCH=false
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runtime ./runtime
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --upgrade pip \
    && if [ "$WITH_TORCH" = "true" ]; then \
         /opt/venv/bin/pip install --extra-index-url "$TORCH_INDEX_URL" ".[torch,tracing]"; \
       else \
         /opt/venv/bin/pip install ".[tracing]"; \
       fi

FROM python:${PYTHON_VERSION}-slim
COPY --from=build /opt/venv /opt/venv
RUN useradd --system --uid 1000 --create-home --home-dir /home/mlserver mlserver \
    && mkdir -p /mnt/models \
    && chown mlserver /mnt/models
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 1000
WORKDIR /home/mlserver
# REST, gRPC, Prometheus metrics (the settings' defaults: http_port, grpc_port, metrics_port)
EXPOSE 8080 8081 8082
ENTRYPOINT ["mlserver-like"]
# listening on every interface is the image's choice; the server's own default is 127.0.0.1
CMD ["start", "/mnt/models", "--host", "0.0.0.0"]
