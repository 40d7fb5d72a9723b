# syntax=docker/dockerfile:1
# The edge SDK for containerised devices (gateways, industrial PCs, Jetson-class boxes):
# `pip install .[edge]` only (numpy, zstandard, onnxruntime, paho-mqtt, cryptography),
# never torch, FastAPI or the hub. A base image for the device's own program:
#
#   docker build -f deploy/docker/edge.Dockerfile -t tandem-edge:0.1.0 .
#
#   FROM tandem-edge:0.1.0
#   COPY app.py /app/app.py
#   CMD ["/app/app.py"]          # runs with the entrypoint, python
#
# ModelUpdater keeps its verified models under /var/lib/tandem (mount a volume there so
# an update survives a restart).

ARG PYTHON=3.11

FROM python:${PYTHON}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/tandem
ENV PATH=/opt/tandem/bin:$PATH
COPY pyproject.toml README.md /src/
COPY shared /src/shared
COPY edge_agent /src/edge_agent
COPY cloud_hub /src/cloud_hub
COPY model_cdn /src/model_cdn
COPY tandem /src/tandem
RUN pip install "/src[edge]"

FROM python:${PYTHON}-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin tandem \
 && mkdir -p /var/lib/tandem && chown 10001:10001 /var/lib/tandem
COPY --from=build /opt/tandem /opt/tandem
ENV PATH=/opt/tandem/bin:$PATH PYTHONUNBUFFERED=1
USER 10001
WORKDIR /var/lib/tandem
ENTRYPOINT ["python"]
CMD ["-c", "import edge_agent; print('tandem edge SDK', edge_agent.__name__, 'ready')"]
