# The two commands a user needs (README): `make run` (main job on the bundled trace) and `make test`.
# Both do all set-up on a fresh machine: a virtualenv in .venv with every dependency.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test check bench clean infra-deps e2e

# The install compiles the simulator's hot modules with mypyc (setup.py; docs/architecture.md "Compiled modules";
# DYNOPLAN_PURE_PYTHON=1 make ... for none). $(BUILT) rebuilds them in place when one of their sources changed
# since (otherwise mocker/__init__.py would run the sources, with a warning); not when mocker.COMPILED says the
# extensions match their sources (right after the install, which compiled them).
COMPILED_SRC := $(shell sed -n 's/^    "\(mocker\/[a-z_\/]*\.py\)",$$/\1/p' setup.py)
BUILT := $(VENV)/.compiled

$(STAMP): pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --upgrade pip "setuptools>=77" wheel
	$(BIN)/pip install -q --disable-pip-version-check -e '.[all]'
	touch $(STAMP)

$(BUILT): $(STAMP) $(COMPILED_SRC)
	$(BIN)/python -W ignore -c 'import mocker, sys; sys.exit(not mocker.COMPILED)' \
	  || $(BIN)/python setup.py -q build_ext --inplace
	touch $(BUILT)

setup: $(BUILT)

run: $(BUILT)
	$(BIN)/dynoplan simulate --trace examples/traces/azure_llm_conv_2023.csv --sla-ttft-ms 200 --sla-itl-ms 10 --compare planner planner:attainment_target=0.999 throughput-only static:auto hpa saturation --out out/

# Real components for the integration tests: Debian packages (prometheus, chromium, containerd, buildah...),
# the Kubernetes binaries, etcd, CoreDNS and helm built from Go modules, the local cluster's images
# (debootstrap + buildah) and the AIConfigurator venv, all into ~/.cache/dynoplan (see tools/README.md). It makes
# the .venv first (tools/cluster.py runs in it).
# The image builds and the AIConfigurator venv are mostly downloads: they run next to the Go builds
# (CPU-bound), and the Prometheus image, which needs the Go-built prometheus, after them.
INFRA_LOG ?= /tmp/dynoplan-infra-deps.$(shell id -u)
infra-deps: $(STAMP)
	tools/install-system-deps.sh
	@tools/build-images.sh base pause dynoplan >$(INFRA_LOG).images 2>&1 & img=$$!; \
	 PY=$(PY) tools/build-aic-venv.sh >$(INFRA_LOG).aic 2>&1 & aic=$$!; \
	 tools/build-k8s-bins.sh; go=$$?; \
	 wait $$img; i=$$?; cat $(INFRA_LOG).images; wait $$aic; a=$$?; cat $(INFRA_LOG).aic; \
	 [ $$go -eq 0 ] && [ $$i -eq 0 ] && [ $$a -eq 0 ] || { echo "infra-deps failed: go builds $$go, images $$i, aic venv $$a" >&2; exit 1; }
	tools/build-images.sh prometheus

# The Kubernetes walkthrough (docs/kubernetes.md) on a real one-node cluster (tools/cluster.py), alone.
e2e: $(STAMP) infra-deps
	$(BIN)/python -m pytest tests/e2e -p no:cacheprovider

# The code checks first (seconds), then the tests: import-linter's layer contracts, ruff (lint and format),
# mypy (strict on planner.core, mocker.engine, mocker.kv and dynoplan; pyproject.toml [tool.mypy]).
CHECKED := dynoplan mocker planner tests bench tools setup.py
test: $(BUILT) infra-deps check
	$(BIN)/python -m pytest

check: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check $(CHECKED)
	$(BIN)/ruff format --check $(CHECKED)
	$(BIN)/mypy

# Speed and fidelity against the reference simulator, then the behaviour-identity digests (bench/README.md).
bench: $(BUILT)
	$(BIN)/python bench/bench_replay.py --cases a,b,a1,d --repeat 3
	$(BIN)/python bench/bench_sglang.py --cases s,ds --repeat 3
	$(BIN)/python bench/identity.py --check bench/results/identity-40c91e9.json

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis build *.so mocker/_compiled_sources.json
	find mocker -name '*.so' -delete
