# tb-parity: the two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LOGDIR ?= demo_logs
PORT ?= 6006
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: install demo demo-logs lint test chromium node bench lock frontend bundle-check

# Installs the locked environment once; reinstalls when the lock or setup.py change.
$(VENV)/.installed: requirements.txt setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

install: $(VENV)/.installed

demo-logs: install
	rm -rf $(LOGDIR)
	$(BIN)/python -m demo.write_logs $(LOGDIR)

demo: demo-logs
	$(BIN)/tensorboard --logdir $(LOGDIR) --host 127.0.0.1 --port $(PORT)

# Browser tests drive Debian's chromium; Playwright cannot download browsers here.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The bundle check and tsc need Node; installed from Debian like chromium when missing.
node:
	@{ command -v node && command -v npm; } >/dev/null 2>&1 || { \
	  echo "installing Debian nodejs and npm for the dashboard's type check and bundle check"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }

# The dashboard's bundle is committed (TensorBoard serves it; users need no Node).
# `frontend` rebuilds it from frontend/ with the locked npm dependencies;
# `bundle-check` rebuilds into a temp dir and fails if the committed one is stale.
FRONTEND_DEPS := frontend/node_modules/.package-lock.json
BUNDLE := tb_parity_plugin/static/index.js

$(FRONTEND_DEPS): frontend/package.json frontend/package-lock.json | node
	cd frontend && npm ci --no-audit --no-fund --loglevel=error
	touch $@

TSC := cd frontend && npx tsc --strict --noEmit -p .

frontend: $(FRONTEND_DEPS)
	$(TSC) && node build.mjs

bundle-check: $(FRONTEND_DEPS)
	@tmp=$$(mktemp -d) && (cd frontend && node build.mjs $$tmp/index.js) && \
	  if cmp -s $$tmp/index.js $(BUNDLE); then echo "bundle up to date"; rm -rf $$tmp; else \
	  echo "$(BUNDLE) is stale: run 'make frontend' and commit it"; rm -rf $$tmp; exit 1; fi

# Static checks, also run first by `make test` so a new violation fails CI:
# ruff lint + format, mypy (config and strictness in pyproject.toml), tsc --strict.
PY_SOURCES := tb_parity_plugin tests benchmarks demo

lint: install $(FRONTEND_DEPS)
	$(BIN)/ruff check $(PY_SOURCES)
	$(BIN)/ruff format --check $(PY_SOURCES)
	$(BIN)/mypy
	$(TSC)

test: lint chromium bundle-check
	$(BIN)/python -m pytest -q tests

bench: install
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Re-locks requirements.txt from the current venv.
lock: install
	{ echo "# Locked environment for make demo / make test (pip freeze of a working .venv)."; \
	  echo "# Direct dependencies and their ranges are in setup.py; update this with 'make lock'."; \
	  $(BIN)/pip freeze | grep -v -i "tb.parity"; } > requirements.txt
