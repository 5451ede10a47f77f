# The two set-up commands the README documents:
#   make demo   install, then run the example TrainJob on this machine
#   make test   install, then lint, type-check and run the whole test suite (tests/suite.py: the
#               tiers unit, ray, k8s and node, provisioning in the background)
# Extras: make test-quick (lint, types and the unit tier: the inner loop), make docs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test test-quick install install-test test-tools lint typecheck docs soak clean

$(VENV)/.installed-demo: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[runtime,torch,gcs]'
	touch $@

$(VENV)/.installed-test: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[runtime,torch,jax,gcs,cluster,test,bench,docs]'
	touch $@ $(VENV)/.installed-demo

install: $(VENV)/.installed-demo
install-test: $(VENV)/.installed-test

# tmux: tests/test_run_terminal.py runs `trainjob run` in a tmux pane and reads the screen.
# prometheus, promtool (Debian's prometheus package): the metrics tests run a real Prometheus
# server and promtool (tests/support/prometheus.py); the package's own service is not started
# (policy-rc.d), and is stopped and disabled where it was.
# Installed with apt-get when missing and run as root; otherwise those tests are skipped.
test-tools:
	@command -v tmux >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing tmux (apt-get)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux; } \
	      >/dev/null || echo "could not install tmux: tests/test_run_terminal.py will be skipped"; \
	  else \
	    echo "tmux not found: tests/test_run_terminal.py will be skipped (install tmux to run it)"; \
	  fi; }
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing prometheus (apt-get)"; \
	    rcd=/usr/sbin/policy-rc.d; own=; \
	    [ -e $$rcd ] || { printf '#!/bin/sh\nexit 101\n' > $$rcd && chmod +x $$rcd && own=1; }; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends prometheus; } >/dev/null; ok=$$?; \
	    [ -z "$$own" ] || rm -f $$rcd; \
	    { systemctl disable --now prometheus || service prometheus stop; } >/dev/null 2>&1; \
	    [ $$ok = 0 ] || echo "could not install prometheus: the metrics tests will be skipped"; \
	  else \
	    echo "promtool not found: the metrics tests will be skipped (install Debian's prometheus package)"; \
	  fi; true; }

demo: install
	$(VENV)/bin/trainjob run examples/quickstart.yaml

lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install-test
	$(VENV)/bin/mypy

test: install-test test-tools
	$(PY) -m tests.suite

test-quick: install-test
	$(PY) -m tests.suite --quick

# A job on the real node with a production fault every 2-3 minutes for 15 (root, Debian
# bookworm, as the node tier; about 25 minutes): benchmarks/results/soak.json, written up in
# docs/benchmarks.md by `python benchmarks/run_all.py --render-only`.
soak: install-test
	$(PY) benchmarks/soak.py

# The docs site into site/, warnings as errors (broken links and anchors fail).
docs: install-test
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .test-logs
