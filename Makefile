# Every target creates/uses .venv itself: a fresh clone needs only python3.11 and make.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DURATION ?= 30

.PHONY: venv native test lint typecheck pytest demo experiment experiment-pool experiment-quick experiment-ratelimit bench bench-headroom bench-routes clean system-deps \
	experiment-discovery experiment-canary experiment-chain experiment-anchors

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Debian tools some tests use (docker-compose validates the compose file). Installed
# when missing and we are root with apt; otherwise those tests skip and say why.
system-deps:
	@if ! command -v docker-compose >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
	    && [ "$$(id -u)" = 0 ]; then \
	  echo "installing docker-compose (Debian) for the compose-file test"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose) \
	    >/dev/null 2>&1 || echo "warning: could not install docker-compose; its test will skip"; \
	fi
	@if ! command -v etcd >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
	    && [ "$$(id -u)" = 0 ]; then \
	  echo "installing etcd-server (Debian) for the discovery tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server) \
	    >/dev/null 2>&1 || echo "warning: could not install etcd-server; discovery tests will fail"; \
	fi
	@if ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
	    && [ "$$(id -u)" = 0 ]; then \
	  echo "installing redis-server (Debian) for the rate-limit tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) \
	    >/dev/null 2>&1 || echo "warning: could not install redis-server; rate-limit tests fail"; \
	fi
	@for tool in nginx:nginx wrk:wrk haproxy:haproxy; do bin=$${tool%%:*}; pkg=$${tool##*:}; \
	  if ! command -v $$bin >/dev/null 2>&1 && ! test -x /usr/sbin/$$bin \
	      && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    echo "installing $$pkg (Debian) for make bench / bench-headroom and the peers of make experiment"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkg) \
	      >/dev/null 2>&1 || echo "warning: could not install $$pkg; the headroom table skips, peer tests fail"; \
	  fi; \
	done
	@if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
	    && [ "$$(id -u)" = 0 ]; then \
	  echo "installing chromium (Debian) for the dashboard browser test"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
	    >/dev/null 2>&1 || echo "warning: could not install chromium; the dashboard test fails"; \
	fi

# The hot pure modules compiled with mypyc (ADR 0021), when a C compiler is there and
# the build is missing or stale; otherwise the sources are used (same code, slower).
# BALLAST_NATIVE=0 make ... skips it (and turns the builds off at run time).
native: $(STAMP)
	-@$(PY) -m ballast_tools.native --if-stale

# The suite runs on what the gateway runs (the compiled modules when built), and the
# cores' and the proxy's tests once more on the sources, the reference.
pytest: $(STAMP) system-deps native
	$(PY) -m pytest -q
	@if $(PY) -c 'import sys; from ballast_asgi.core import native; sys.exit(not native.active())'; then \
	  echo "again on the sources (BALLAST_NATIVE=0): tests/core tests/proxy"; \
	  BALLAST_NATIVE=0 $(PY) -m pytest -q tests/core tests/proxy; \
	fi

test: lint typecheck pytest

demo: $(STAMP) native
	$(PY) -m experiments.demo --duration $(DURATION)

experiment: $(STAMP) system-deps native
	$(PY) -m experiments.sweep

experiment-pool: $(STAMP)
	$(PY) -m experiments.pool --out experiments/pool/out

experiment-quick: $(STAMP) system-deps
	$(PY) -m experiments.sweep --quick

experiment-canary: $(STAMP)
	$(PY) -m experiments.canary

bench: $(STAMP) system-deps native
	$(PY) -m experiments.bench

# Issue 31's headroom table alone (about 3 minutes): nginx proxy / return 429, uvicorn's
# constant-429 floor, bare aiohttp, the gateway proxied and shedding; docs/bench.md block.
bench-headroom: $(STAMP) system-deps native
	$(PY) -m experiments.bench.headroom --docs

# Issue 28's httpbin case on loopback: 10 clients on a 1 s endpoint + 10 on an
# instant one for 15 s, default gateway vs fixed-1000 (about 40 s).
bench-routes: $(STAMP)
	$(PY) -m experiments.routeprobe

# Rate limits across two gateways sharing Redis (docs/ratelimit.md); a few minutes.
experiment-ratelimit: $(STAMP) system-deps
	$(PY) -m experiments.ratelimit.run

# Discovery on etcd: two gateways, instances that come and go (docs/discovery.md).
experiment-discovery: $(STAMP) system-deps
	$(PY) -m experiments.discovery

# gateway -> A (FastAPI + install) -> B (simulator) under a capacity trigger, three
# configurations (docs/chain.md); about four minutes. PHASE_S=10 sets each phase's length.
PHASE_S ?= 10
experiment-chain: $(STAMP)
	$(PY) -m experiments.chain --phase-s $(PHASE_S)

# The field's published scenarios (Breakwater spike, Netflix bulk x12, 10 min steady
# overload, Envoy #7789) against gradient, fixed limits and HAProxy (docs/anchors.md);
# about 30 minutes. ANCHORS_ARGS=--quick for the CI-size smoke (about 3 minutes).
ANCHORS_ARGS ?=
experiment-anchors: $(STAMP) system-deps
	$(PY) -m experiments.anchors $(ANCHORS_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache ballast_asgi/.native ballast_asgi/.native.lock
