# The two commands a user needs (README): `make run` (main job on the bundled trace) and `make test`.
# Both do all set-up on a fresh machine: a virtualenv in .venv with every dependency.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test bench clean infra-deps

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/pip install -q --disable-pip-version-check -e '.[all]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/dynoplan simulate --trace examples/traces/azure_llm_conv_2023.csv --sla-ttft-ms 200 --sla-itl-ms 10 --compare planner planner:attainment_target=0.999 throughput-only static:auto hpa saturation --out out/

# Real components for the integration tests: Debian packages (prometheus, chromium),
# kube-apiserver/etcd/helm built from Go modules and the AIConfigurator venv, both into ~/.cache/dynoplan
# (see tools/README.md).
infra-deps:
	tools/install-system-deps.sh
	tools/build-k8s-bins.sh
	PY=$(PY) tools/build-aic-venv.sh

test: $(STAMP) infra-deps
	$(BIN)/lint-imports
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
