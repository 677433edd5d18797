# trainingjob-operator's container image: the package and its locked runtime dependencies in a
# virtualenv, on the interpreter, standard library and shared libraries they load, and nothing else (no
# shell, no package manager, no pip); user 65532, ready for a read-only root filesystem.
#   docker build -t trainingjob-operator:0.1.0 .
# Checked without a container engine by tests/unit/test_manifests_dockerfile.py (hadolint and the
# project's rules); docs/security.md "Supply chain" says what is pinned and how to move the pins.

# The base, by digest: python:3.11.16-slim-bookworm, the multi-platform index (linux/amd64, linux/arm64,
# ...) published on 1 September 2026, as docker-library/repo-info recorded it for that tag. A digest
# names content, not a tag that moves: a rebuild of the tag upstream changes nothing here.
FROM python:3.11.16-slim-bookworm@sha256:c425d915a89a6dcd3183b1797ad9bd8878caff5a417f6371c8df93c8ea8b727f AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The runtime dependencies: exactly the lock's versions and files (make lock), wheels only, installed by
# the base image's pip from outside (--python) into a virtualenv that never holds pip or setuptools.
COPY requirements/runtime.txt requirements/runtime.txt
RUN python -m venv --without-pip /opt/venv \
    && python -m pip --python /opt/venv/bin/python install --no-cache-dir --require-hashes \
       --only-binary=:all: --requirement requirements/runtime.txt
COPY pyproject.toml setup.cfg ./
COPY controller ./controller
COPY builders ./builders
COPY crd ./crd
COPY trainingjob_client ./trainingjob_client
# The reference trainer: not the operator's code, but shipped in every job's ConfigMap.
COPY trainer ./trainer
# The package itself: a wheel built by the base image's setuptools (no build requirement is fetched),
# installed without dependencies; `pip check` fails the build when setup.cfg asks for a dependency the
# lock does not hold.
RUN python -m pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir dist . \
    && python -m pip --python /opt/venv/bin/python install --no-cache-dir --no-deps --no-index \
       --find-links dist trainingjob-operator \
    && python -m pip --python /opt/venv/bin/python check
# The runtime root: the virtualenv, the interpreter it points at, its standard library less what only
# development needs, the shared libraries all of them load (ldd), CA certificates, passwd and group;
# checked by importing every module of the operator inside it (image/runtime_root.py).
COPY image/runtime_root.py image/runtime_root.py
RUN python image/runtime_root.py /opt/venv /runtime --check controller,builders,crd,trainingjob_client

# Runtime stage: the runtime root only, one layer.
FROM scratch
COPY --from=build /runtime/ /
LABEL org.opencontainers.image.title="trainingjob-operator" \
      org.opencontainers.image.description="Kubernetes operator for distributed ML training jobs (TrainingJob, ml.example.com/v1)" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin \
    LANG=C.UTF-8 \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
# 8443: /metrics over HTTPS; 8081: the probes (/healthz, /readyz), plain HTTP.
EXPOSE 8443 8081
ENTRYPOINT ["trainingjob-operator"]
