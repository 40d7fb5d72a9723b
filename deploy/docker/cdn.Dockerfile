# syntax=docker/dockerfile:1
# The model CDN: `tandem cdn serve` (manifests, blobs, assignments, the rollout controller;
# replicas on one PostgreSQL registry elect one rollout leader).
#
#   docker build -f deploy/docker/cdn.Dockerfile -t tandem-cdn:0.1.0 .
#
# Settings come from the environment (TANDEM_REGISTRY, TANDEM_STORE, TANDEM_BROKER,
# TANDEM_CDN_ADMIN_TOKEN, TANDEM_SIGN_KEY; AWS_* for an s3:// store), as
# deploy/k8s sets them.

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
# the CDN and the CLI; no torch (publishing with a torch export happens off the cluster)
RUN pip install "/src[cdn]" "typer>=0.12" "rich>=13"

FROM python:${PYTHON}-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin tandem
COPY --from=build /opt/tandem /opt/tandem
ENV PATH=/opt/tandem/bin:$PATH PYTHONUNBUFFERED=1
USER 10001
EXPOSE 8700
ENTRYPOINT ["tandem", "cdn", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8700"]
