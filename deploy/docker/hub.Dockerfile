# syntax=docker/dockerfile:1
# The hub: `tandem hub` (MQTT and HTTP ingress processes, one executor per model instance).
#
#   docker build -f deploy/docker/hub.Dockerfile -t tandem-hub:0.1.0 .
#
# CPU by default: torch 2.13.0 from PyTorch's CPU wheel index (no CUDA libraries, ~10x
# smaller). The CUDA variant takes torch from a CUDA index and ONNX Runtime's GPU build;
# it needs the NVIDIA driver on the node (the container toolkit mounts it):
#
#   docker build -f deploy/docker/hub.Dockerfile -t tandem-hub:0.1.0-cuda \
#       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#       --build-arg ONNXRUNTIME=onnxruntime-gpu .

ARG PYTHON=3.11

FROM python:${PYTHON}-slim AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG ONNXRUNTIME=onnxruntime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/tandem
ENV PATH=/opt/tandem/bin:$PATH
# torch first, from the chosen index, so that `.[hub]` finds it satisfied
RUN pip install --index-url "${TORCH_INDEX}" torch==2.13.0
COPY pyproject.toml README.md /src/
COPY shared /src/shared
COPY edge_agent /src/edge_agent
COPY cloud_hub /src/cloud_hub
COPY model_cdn /src/model_cdn
COPY tandem /src/tandem
RUN pip install "/src[hub,cli]" \
 && if [ "${ONNXRUNTIME}" != "onnxruntime" ]; then \
      pip uninstall -y onnxruntime && pip install "${ONNXRUNTIME}"; \
    fi

FROM python:${PYTHON}-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin tandem
COPY --from=build /opt/tandem /opt/tandem
ENV PATH=/opt/tandem/bin:$PATH PYTHONUNBUFFERED=1
USER 10001
EXPOSE 8000
# SIGTERM drains: ingress processes unsubscribe and finish what they hold, then executors.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tandem", "hub"]
CMD ["--repo", "/models", "--broker", "mqtt://mqtt:1883", "--http-host", "0.0.0.0", "--http-port", "8000"]
