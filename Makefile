# Every target does its own set-up on a fresh machine: the virtualenv, Python packages and the local
# control plane's binaries (built once from Go modules and cached under the home directory).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
VENV_PY := $(VENV)/bin/python
# Three installs into the same virtualenv: the operator's runtime dependencies; those and torch (the
# `train` extra, about 5 GB: what make demo needs, its trainer image is built from it); and the dev
# tools, the testbed (testbed/pyproject.toml, with its harness's dependencies) and the frameworks'
# extras for the tests: `train`, `tensorflow` (tensorflow-cpu), `jax` (jax with its CPU jaxlib), `xgboost`
# (xgboost-cpu) and `paddle` (paddlepaddle's CPU wheel), and
# `tracking` (MLflow's client, which the torch trainer image takes along); then the `pipelines` extra
# (Kubeflow Pipelines' SDK) by uv, whose overrides (requirements/pipelines-overrides.txt) let kfp's pins
# (kubernetes<31 among them) give way to what is installed, which pip cannot do.
# Each is a superset of the one before, so the dev install satisfies the other two stamps too.
RUNTIME_STAMP := $(VENV)/.installed-runtime
DEMO_STAMP := $(VENV)/.installed-demo
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# make test runs the suite in TEST_WORKERS processes, each with a cluster of its own; the real node's
# tests in one of them (tests/sessions.py). TEST_WORKERS=0 runs it in one process, on one cluster.
TEST_WORKERS ?= 3
PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

# The demo: everything on a fresh machine, then a TrainingJob trained to Completed
# (testbed/harness/demo.py). Its settings reach hack/preflight.sh and the demo through the environment.
# The testbed's programs run as modules from the repository (python -m testbed.<program>).
DEV_DIR := $(or $(TJ_DEV_DIR),.dev)
DEMO_NAMESPACE ?= demo
DEMO_METRICS_PORT ?= 8080
DEMO_HEALTH_PORT ?= 8081
DEMO_TIMEOUT ?= 300
DEMO_STEP_SECONDS ?= 0.1
export DEMO_NAMESPACE DEMO_METRICS_PORT DEMO_HEALTH_PORT DEMO_TIMEOUT DEMO_STEP_SECONDS

.PHONY: demo
# It installs and builds only what its job runs: .venv with the runtime dependencies and torch (not the
# dev tools, TensorFlow or JAX), and of the real node's images its own and the torch trainer's.
demo: ## start here: local cluster with a real node, operator, and a TrainingJob trained to Completed in containers
	@PYTHON=$(PYTHON) hack/preflight.sh
	@$(MAKE) --no-print-directory demo-venv node-tools
	TJ_TRAINER_VENV=$(abspath $(VENV)) hack/dev-cluster.sh up --with real-node --images trainer-torch
	@KUBECONFIG=$(DEV_DIR)/kubeconfig $(MAKE) --no-print-directory install KUBECTL=$(DEV_DIR)/bin/kubectl
	$(VENV_PY) -m testbed.harness.demo

.PHONY: demo-down
demo-down: ## stop the demo's operator, then the real node (drained, the machine restored) and the local cluster
	hack/dev-cluster.sh down

# A virtualenv that could not be created completely is removed, so the next run starts clean.
define make_venv
	@test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }
	$(VENV_PY) -m pip install --quiet --upgrade pip
endef

$(RUNTIME_STAMP): setup.cfg pyproject.toml
	$(make_venv)
	$(VENV_PY) -m pip install --quiet -e .
	@touch $@

$(DEMO_STAMP): setup.cfg pyproject.toml
	$(make_venv)
	$(VENV_PY) -m pip install --quiet -e '.[train]'
	@touch $@ $(RUNTIME_STAMP)

$(STAMP): setup.cfg pyproject.toml testbed/pyproject.toml requirements/pipelines-overrides.txt
	$(make_venv)
	$(VENV_PY) -m pip install --quiet -e '.[dev,train,tensorflow,jax,xgboost,paddle,tracking]' -e './testbed[harness]'
	$(VENV)/bin/uv pip install --quiet --python $(VENV_PY) --override requirements/pipelines-overrides.txt -e '.[pipelines]'
	@touch $@ $(DEMO_STAMP) $(RUNTIME_STAMP)

.PHONY: venv
venv: $(STAMP) ## create .venv with the operator and its dev tools

.PHONY: runtime-venv
runtime-venv: $(RUNTIME_STAMP) ## create .venv with the operator's runtime dependencies only (no torch)

.PHONY: demo-venv
demo-venv: $(DEMO_STAMP) ## create .venv with the operator's runtime dependencies and torch (what make demo needs)

.PHONY: dev-cluster
dev-cluster: ## start the local control plane (first run builds it from Go modules)
	hack/dev-cluster.sh up

.PHONY: dev-cluster-down
dev-cluster-down: ## stop every process of the local control plane
	hack/dev-cluster.sh down

.PHONY: test
test: $(STAMP) promtool node-tools ## run the whole test suite (starts and stops the local control plane if none runs)
	@# The control plane, the real node's binaries and, meanwhile, the images its first tests use
	@# (`--images first`: base, operator, trainer-torch) are built before the tests (minutes the first
	@# time, with progress), not inside the first test that needs them; a machine that cannot run the
	@# node says why here. The optional components and the other images the tests need build in the
	@# background as the tests run, and the tests that need one run last (conftest.py).
	@if [ "$$(id -u)" != 0 ]; then echo "not root: the real node's tests will be skipped (testbed/node/README.md)"; \
	elif [ ! -e "$${TJ_CGROUP_FS:-/sys/fs/cgroup}/memory/cgroup.procs" ]; then echo "no cgroup v1 (this machine has \
	cgroup v2 only): the real node's tests will be skipped (README.md, \"Quick start\")"; \
	else hack/dev-cluster.sh build real-node --images first; fi
	$(VENV_PY) -m pytest -m 'not long' $(PARALLEL) $(PYTEST_ARGS)

# The tests that each run for minutes and prove what shorter tests of the same path prove too
# (marked `long`): TensorFlow's ParameterServerStrategy and its gang restart (make test trains
# TensorFlow with MultiWorkerMirroredStrategy and an evaluator), and a job preempted by Kueue on the
# real node resuming at the step where the signal came (make test resumes an evicted rank there, and
# Kueue's preemption runs on kwok). Kept out of make test for CI time.
.PHONY: test-long
test-long: $(STAMP) promtool node-tools ## run the tests marked long (minutes each), left out of make test
	@if [ "$$(id -u)" = 0 ] && [ -e "$${TJ_CGROUP_FS:-/sys/fs/cgroup}/memory/cgroup.procs" ]; then \
		hack/dev-cluster.sh build real-node; fi
	$(VENV_PY) -m pytest -m long $(PYTEST_ARGS)

.PHONY: unit
unit: $(STAMP) promtool ## run the tests that need no cluster and no optional component
	$(VENV_PY) -m pytest -m 'not cluster and not components' $(PYTEST_ARGS)

# The long fuzz run (docs/fuzz.md): FUZZ_EXAMPLES generated manifests from FUZZ_SEED against the real
# operator; every kind of violation is shrunk (for up to FUZZ_SHRINK_SECONDS) and written to
# tests/fuzz/findings/. `make test` runs a fixed-seed sample of the same test.
FUZZ_EXAMPLES ?= 1700
FUZZ_SEED ?= 15
FUZZ_SHRINK_SECONDS ?= 1200

.PHONY: fuzz
fuzz: $(STAMP) ## fuzz the operator with generated bad TrainingJobs on the local cluster (docs/fuzz.md)
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_SEED=$(FUZZ_SEED) FUZZ_SHRINK_SECONDS=$(FUZZ_SHRINK_SECONDS) \
		$(VENV_PY) -m pytest tests/fuzz/test_fuzz.py -s -p no:cacheprovider $(PYTEST_ARGS)

# The chaos suite (docs/chaos.md): CHAOS_JOBS TrainingJobs, two operator replicas, CHAOS_LEADER_KILLS
# kill -9 of the leader, CHAOS_APISERVER_RESTARTS API server restarts, node losses, injected faults; an
# audit of the invariants and one summary line. `make test` runs a short variant (testbed/tests/test_chaos.py).
CHAOS_JOBS ?= 60
CHAOS_LEADER_KILLS ?= 20
CHAOS_APISERVER_RESTARTS ?= 3
CHAOS_SEED ?= 15

.PHONY: chaos
chaos: $(STAMP) ## kill the leader, restart the API server, lose nodes, fault jobs; audit the accounting (docs/chaos.md)
	CHAOS_JOBS=$(CHAOS_JOBS) CHAOS_LEADER_KILLS=$(CHAOS_LEADER_KILLS) CHAOS_APISERVER_RESTARTS=$(CHAOS_APISERVER_RESTARTS) \
		CHAOS_SEED=$(CHAOS_SEED) $(VENV_PY) -m testbed.harness.chaos

# The soak (docs/soak.md): SOAK_JOBS TrainingJobs kept in flight for SOAK_SECONDS, created, failed,
# restarted, completed and deleted; the operator's RSS and CPU over time, and whether RSS levelled off.
SOAK_JOBS ?= 200
SOAK_SECONDS ?= 900

.PHONY: soak
soak: $(STAMP) ## keep jobs churning for a bounded time; the operator's RSS and CPU over time (docs/soak.md)
	SOAK_JOBS=$(SOAK_JOBS) SOAK_SECONDS=$(SOAK_SECONDS) $(VENV_PY) -m testbed.harness.soak

.PHONY: lint
lint: $(STAMP) ## ruff and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

KUBECTL ?= $(if $(wildcard $(DEV_DIR)/bin/kubectl),$(DEV_DIR)/bin/kubectl,kubectl)
# `make run` serves /metrics in plain HTTP (--metrics-secure=false: the local cluster only) and the probes.
METRICS_BIND_ADDRESS ?= 127.0.0.1:8080
HEALTH_PROBE_BIND_ADDRESS ?= 127.0.0.1:8081
RUN_ARGS ?=

# crd/kube_schemas.json (the core/v1 schemas the spec embeds) comes from the API server's OpenAPI, so it is
# regenerated only when the local cluster runs (docs/schema.md).
.PHONY: generate
generate: $(STAMP) generate-monitoring ## regenerate the CRD YAML (and the Helm chart's copy) and docs/api.md from crd/ (and crd/kube_schemas.json from the local cluster), and the PrometheusRule
	@if hack/dev-cluster.sh status >/dev/null 2>&1; then \
		$(VENV_PY) -m crd kube-schemas --kubectl $(DEV_DIR)/bin/kubectl --kubeconfig $(DEV_DIR)/kubeconfig; \
	else \
		echo "crd/kube_schemas.json kept as committed: it is generated from a running API server (make dev-cluster, then make generate)"; \
	fi
	$(VENV_PY) -m crd write

.PHONY: install
install: ## apply crd/ (the CRD and the admission policies) to the cluster of $KUBECONFIG; wait until Established
	@command -v $(KUBECTL) >/dev/null || { echo "kubectl not found: 'make dev-cluster' builds one, or install kubectl" >&2; exit 1; }
	$(KUBECTL) apply --server-side --force-conflicts -k crd/
	$(KUBECTL) wait --for=condition=Established --timeout=60s crd/trainingjobs.ml.example.com

.PHONY: run
run: $(STAMP) ## run the operator against $KUBECONFIG (plain-HTTP metrics on 127.0.0.1:8080, probes on 127.0.0.1:8081)
	$(VENV_PY) -m controller --metrics-bind-address=$(METRICS_BIND_ADDRESS) --metrics-secure=false \
		--health-probe-bind-address=$(HEALTH_PROBE_BIND_ADDRESS) $(RUN_ARGS)

# BENCH_JOBS, BENCH_REPLICAS, BENCH_MEMORY_JOBS, BENCH_WINDOW, ... are read from the environment
# (docs/bench.md); BENCH_ARGS are the script's own flags, then `-- <operator flags>`.
BENCH_ARGS ?=

.PHONY: bench
bench: $(STAMP) ## benchmark the operator on a throwaway cluster (.dev/bench); prints JSON (docs/bench.md)
	$(VENV_PY) -m testbed.harness.bench $(BENCH_ARGS)

# This operator and Kubeflow's training-operator (built on first use) side by side, alternating runs,
# each on a fresh bench cluster (docs/bench.md); BENCH_ARGS as for bench, plus --sequence, --sizes, ...
.PHONY: bench-peer
bench-peer: $(STAMP) ## this operator against Kubeflow's training-operator, each run on a fresh bench cluster (docs/bench.md)
	$(VENV_PY) -m testbed.harness.bench.peer $(BENCH_ARGS)

# What one status write costs the API server with the CRD's CEL rules, without its transition rules
# and without any (docs/bench.md); BENCH_ARGS: --jobs, --writes, --rounds, --spec-from.
.PHONY: bench-status
bench-status: $(STAMP) ## the API server's CPU per TrainingJob status write, with and without the CRD's rules (docs/bench.md)
	$(VENV_PY) -m testbed.harness.bench.statuscost $(BENCH_ARGS)

# Recovery: gang restarts timed on the real node (a rank failing, a rank evicted) and their cost at
# scale on kwok (docs/bench.md, "Recovery"); RECOVERY_* variables or BENCH_ARGS (--failures, --sizes, ...).
.PHONY: bench-recovery
bench-recovery: $(STAMP) ## gang restarts timed on the real node and counted on kwok (docs/bench.md)
	$(VENV_PY) -m testbed.harness.bench.recovery $(BENCH_ARGS)

# MultiKueue: a job's submission to Running through a manager and a worker cluster against the same job
# submitted to the worker directly, on two throwaway kwok clusters with Kueue.
.PHONY: bench-multikueue
bench-multikueue: $(STAMP) ## submission to Running through MultiKueue against a direct submission (docs/bench.md)
	$(VENV_PY) -m testbed.harness.bench.multikueue $(BENCH_ARGS)

# The curve: bench-peer at each of BENCH_SIZES job counts, then its plots against the job count in
# docs/bench/ (docs/bench.md). The 5,000-job runs take about an hour of a quiet machine's time.
BENCH_SIZES ?= 500,2000,5000
BENCH_CURVE_RESULT ?= $(DEV_DIR)/bench/curve-result.json

.PHONY: bench-curve
bench-curve: $(STAMP) ## bench-peer at BENCH_SIZES job counts and its plots in docs/bench/ (docs/bench.md)
	@mkdir -p $(dir $(BENCH_CURVE_RESULT))
	$(VENV_PY) -m testbed.harness.bench.peer --sizes $(BENCH_SIZES) $(BENCH_ARGS) > $(BENCH_CURVE_RESULT)
	$(VENV_PY) -m testbed.harness.bench.plot $(BENCH_CURVE_RESULT)

# promtool checks and unit-tests monitoring/alerts.yaml (tests/unit/test_manifests_monitoring.py). Debian ships it
# in the package prometheus, installed here when promtool is missing (as root, else through sudo).
# Note: on a host run by systemd the package also enables and starts a Prometheus server.
.PHONY: promtool
promtool: ## install promtool (Debian package prometheus) when it is missing
	@command -v promtool >/dev/null 2>&1 || { \
		echo "promtool not found: installing the Debian package prometheus"; \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; \
	}
	@promtool --version 2>&1 | head -n 1

# The real node (`hack/dev-cluster.sh up --with real-node`, testbed/node/README.md) and its
# container images (testbed/images): built on this machine from Go modules, Debian packages and the
# project's own files, cached under ~/.cache/trainingjob-operator. The Debian packages they use are
# installed when missing (as root, else through sudo), as promtool's is: runc, the CNI plugins,
# iptables and nftables (the NetworkPolicy enforcer's) for the node, apache2-utils (htpasswd, for the
# registry's bcrypt entries), debootstrap, buildah and busybox for the images. IMAGES names some images.
NODE_PACKAGES := runc containernetworking-plugins iptables nftables apache2-utils debootstrap buildah busybox-static gcc libc6-dev
IMAGES ?=

.PHONY: node-tools
node-tools: ## install the Debian packages the real node and its images need when missing
	@missing=$$(for package in $(NODE_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$package 2>/dev/null | grep -q ' installed$$' || echo $$package; done); \
	if [ -n "$$missing" ]; then \
		echo "installing the Debian packages the real node and its images need:" $$missing; \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

.PHONY: images
images: node-tools $(STAMP) ## build the real node's container images (testbed/images; IMAGES="operator ..." for some)
	TJ_TRAINER_VENV=$(abspath $(VENV)) $(PYTHON) -m testbed.images ensure $(IMAGES)

# The image's runtime dependencies, locked with their hashes (requirements/runtime.txt, installed by the
# Dockerfile with pip --require-hashes): uv resolves setup.cfg's install_requires for Python 3.11 on
# Linux x86_64 and arm64, keeping the pins that still satisfy it; LOCK_UPGRADE=1 moves every pin to the
# newest allowed. tests/unit/test_lockfile.py fails when setup.cfg changed and the lock did not.
LOCK_UPGRADE ?=

.PHONY: lock
lock: $(STAMP) ## regenerate the image's lock of runtime dependencies from setup.cfg (requirements/runtime.txt)
	$(VENV_PY) -m image.lockfile write $(if $(LOCK_UPGRADE),--upgrade)

# The real node's base image stands in for the Dockerfile's FROM; its Debian package versions are pinned
# in testbed/images/base-packages.txt (testbed/images/README.md). This records what the mirror serves now.
.PHONY: pin-base-image
pin-base-image: node-tools ## record the Debian package versions the real node's base image is built from
	$(PYTHON) -m testbed.images pin-base

.PHONY: generate-monitoring
generate-monitoring: $(STAMP) ## regenerate the PrometheusRule (kustomize) and the Helm chart's copy of the rules from monitoring/alerts.yaml
	$(VENV_PY) -m monitoring.generate

# The operator's image, as kubebuilder's Makefiles name it: `make docker-build docker-push deploy
# IMG=<registry>/trainingjob-operator:<tag>` builds it, pushes it and deploys it (deploy/README.md).
# These machines have no Docker engine, so with CONTAINER_TOOL=testbed (the default) docker-build
# builds the image with the testbed's image builder (buildah on the base image, testbed/images) and
# tags that build IMG, and docker-push pushes it with the testbed's pusher: HTTPS with the
# credentials a docker config file holds for IMG's registry ($REGISTRY_AUTH_FILE, else
# ~/.docker/config.json; for the local cluster's registry, $REGISTRY, its own and its CA), Basic
# authentication only (testbed/images/push.py says why). CONTAINER_TOOL=docker (or podman) runs
# `build -t IMG .` and `push IMG` with that tool instead, as kubebuilder's Makefile does (not run
# here: no engine). Without IMG, docker-build builds the image under its own names and deploy keeps
# deploy/'s image; IMAGE, the earlier name of IMG, still works for deploy.
IMG ?=
CONTAINER_TOOL ?= testbed

.PHONY: docker-build
docker-build: $(if $(filter testbed,$(CONTAINER_TOOL)),node-tools) ## build the operator's image and tag it IMG (the testbed's builder; CONTAINER_TOOL=docker: docker build)
ifeq ($(CONTAINER_TOOL),testbed)
	$(PYTHON) -m testbed.images $(if $(IMG),tag operator $(IMG),ensure operator)
else
	$(CONTAINER_TOOL) build -t $(or $(IMG),trainingjob-operator:latest) .
endif

.PHONY: docker-push
docker-push: ## push the image tagged IMG to IMG's registry (the testbed's pusher; CONTAINER_TOOL=docker: docker push)
	@test -n "$(IMG)" || { echo "docker-push: IMG=<registry>/trainingjob-operator:<tag> says where to push" >&2; exit 2; }
ifeq ($(CONTAINER_TOOL),testbed)
	$(PYTHON) -m testbed.images push $(IMG)
else
	$(CONTAINER_TOOL) push $(IMG)
endif

OVERLAY ?=
IMAGE ?=
NODE_SELECTOR ?=
TOLERATE ?=
IMAGE_PULL_SECRETS ?=
DEPLOY_VARIABLES = OVERLAY="$(OVERLAY)" IMG="$(IMG)" IMAGE="$(IMAGE)" NODE_SELECTOR="$(NODE_SELECTOR)" TOLERATE="$(TOLERATE)" \
	IMAGE_PULL_SECRETS="$(IMAGE_PULL_SECRETS)" KUBECTL="$(KUBECTL)"

.PHONY: deploy
deploy: ## install the operator into $KUBECONFIG's cluster (IMG=ref, IMAGE_PULL_SECRETS=name,... OVERLAY=monitoring|network-policy|single-namespace, NODE_SELECTOR=key=value,... TOLERATE=key=value:Effect,...)
	$(DEPLOY_VARIABLES) hack/deploy.sh apply

.PHONY: undeploy
undeploy: ## remove the operator (the CRD and jobs stay unless DELETE_CRD=1)
	$(DEPLOY_VARIABLES) hack/deploy.sh delete
