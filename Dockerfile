# trainingjob-operator's container image: the package and its runtime dependencies in a virtualenv on
# python:3.11-slim, running as the unprivileged user 65532, ready for a read-only root filesystem.
#   docker build -t trainingjob-operator:0.1.0 .
# Checked without a container engine by tests/unit/test_manifests.py (hadolint and the project's rules).

# Build stage: install the package into /opt/venv; sources and build leftovers stay behind.
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml setup.cfg ./
COPY controller ./controller
COPY builders ./builders
COPY crd ./crd
COPY trainingjob_client ./trainingjob_client
# The reference trainer: not the operator's code, but shipped in every job's ConfigMap.
COPY trainer ./trainer
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir .

# Runtime stage: the virtualenv only (bytecode compiled at install, so nothing is written at run time).
FROM python:3.11-slim
LABEL org.opencontainers.image.title="trainingjob-operator" \
      org.opencontainers.image.description="Kubernetes operator for distributed ML training jobs (TrainingJob, ml.example.com/v1)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
RUN groupadd --system --gid 65532 nonroot \
    && useradd --system --no-log-init --uid 65532 --gid 65532 --home-dir /nonexistent \
       --no-create-home --shell /usr/sbin/nologin nonroot
COPY --from=build /opt/venv /opt/venv
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["trainingjob-operator"]
