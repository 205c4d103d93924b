# mmfeed — `make help` lists the targets. A fresh machine needs only `make demo` or `make test`:
# each builds what is missing (Rust tokenizers library, Go binary, Python venv) and reuses the rest.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO      ?= go
CACHE   ?= $(HOME)/.cache/mmfeed
BUILD   := build
LIBTOK  := $(BUILD)/lib/libtokenizers.a
BIN     := bin/mmfeed
# The virtualenv lives in the machine cache, one per requirements.txt content, and .venv links to it,
# so a fresh clone (CI) on a machine that built it before starts at once.
REQ_HASH := $(shell sha256sum requirements.txt | cut -c1-12)
VENV_DIR := $(CACHE)/venv-$(REQ_HASH)
VENV     := .venv
PY       := $(CURDIR)/$(VENV)/bin/python
export MMFEED_PYTHON := $(PY)
export MMFEED_TOKENIZER_DIR := $(CURDIR)/$(BUILD)/tokenizers
# The trainer is used from the checkout (no install into the shared virtualenv).
export PYTHONPATH := $(CURDIR)/trainer$(if $(PYTHONPATH),:$(PYTHONPATH))

# JPEG decoding, best first: libjpeg-turbo 3.x (the generation in Pillow's wheels) built from
# source by `deps` (scripts/build-libjpeg-turbo.sh, cached in $(CACHE); build tag turbojpeg3),
# else Debian's libturbojpeg0-dev (2.1.x; tag turbojpeg), else the pure-Go decoder.
# Both libjpeg-turbo builds give Pillow's output bit for bit; 3.x is faster.
LIBJPEG := $(BUILD)/libjpeg-turbo/lib/libturbojpeg.a
TURBO_H := /usr/include/turbojpeg.h
export GOFLAGS = $(shell if [ -f $(LIBJPEG) ]; then echo -tags=turbojpeg3; elif [ -f $(TURBO_H) ]; then echo -tags=turbojpeg; fi)

GO_SOURCES := $(shell find . -name '*.go' -not -path './build/*' 2>/dev/null) go.mod go.sum

.PHONY: help build deps test race test-cluster scale soak demo bench bench-e2e quality lint fuzz venv clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: deps $(BIN) ## build the Rust tokenizers library (cached) and bin/mmfeed

deps: ## build libjpeg-turbo 3.x (cached) and install what it needs, or libturbojpeg0-dev; chromium for the browser tests
	@missing=$$(for p in nasm:nasm cmake:cmake chromium:chromium $(TURBO_H):libturbojpeg0-dev; do \
	  f=$${p%%:*}; if [ "$${f#/}" = "$$f" ]; then command -v $$f >/dev/null || echo $${p#*:}; \
	  else [ -f $$f ] || echo $${p#*:}; fi; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing" $$missing; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	      || echo "warning: could not install" $$missing; \
	  else echo "note: not installed:" $$missing; fi; \
	fi
	@scripts/build-libjpeg-turbo.sh $(BUILD) $(CACHE) \
	  || echo "warning: libjpeg-turbo 3.x not built; JPEG decoding uses $(if $(wildcard $(TURBO_H)),Debian's libturbojpeg,the pure-Go decoder)"

$(LIBTOK): scripts/build-tokenizers.sh scripts/tokenizers/Cargo.lock scripts/tokenizers/mmfeed_batch.rs go.mod
	scripts/build-tokenizers.sh $(BUILD) $(CACHE)
	@touch $@

# `mmfeed version` prints these; a commit alone does not rebuild the binary.
VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  := $(shell git rev-parse --short=12 HEAD 2>/dev/null)
$(BIN): $(LIBTOK) $(GO_SOURCES) $(wildcard $(TURBO_H) $(LIBJPEG))
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o $(BIN) ./cmd/mmfeed

venv: $(VENV)/.ok ## create the Python environment from requirements.txt (cached per content)

# flock: checkouts that build at the same time (worktrees, CI beside a developer) share one
# environment; the second waits for the first instead of deleting it mid-install.
$(VENV)/.ok: requirements.txt
	@mkdir -p $(CACHE) && exec 9>$(VENV_DIR).lock && flock 9 && \
	if [ ! -f $(VENV_DIR)/.ok ]; then \
	  echo "creating Python environment $(VENV_DIR)"; \
	  rm -rf $(VENV_DIR) && python3 -m venv $(VENV_DIR) && \
	  $(VENV_DIR)/bin/pip install -q --upgrade pip && \
	  $(VENV_DIR)/bin/pip install -q -r requirements.txt && touch $(VENV_DIR)/.ok; \
	fi
	@ln -sfn $(VENV_DIR) $(VENV)
	@test -f $(VENV)/.ok

# Tests get a feature cache of their own, empty at each run, so that no run reads what an
# earlier one (or the user's own jobs) left in ~/.cache/mmfeed/features.
test: build venv ## run every test: Go (with the Python peers required) and the trainer's pytest
	@rm -rf $(BUILD)/test-feature-cache
	MMFEED_FEATURE_CACHE=$(CURDIR)/$(BUILD)/test-feature-cache MMFEED_REQUIRE_PEERS=1 $(GO) test -count=1 -timeout 30m ./...
	@if [ -d trainer/tests ]; then MMFEED_FEATURE_CACHE=$(CURDIR)/$(BUILD)/test-feature-cache $(PY) -m pytest -q --durations=15 trainer/tests; fi

RACE_PKGS ?= ./proto/ ./balancer/ ./pipeline/serve/ ./pipeline/serve/natsenv/ ./pipeline/serve/control/ ./pipeline/serve/deliver/ ./pipeline/serve/produce/
race: build venv ## the concurrent packages' tests under the race detector (RACE_PKGS; serve alone takes 15-30 min on 2 cores)
	@rm -rf $(BUILD)/test-feature-cache
	MMFEED_FEATURE_CACHE=$(CURDIR)/$(BUILD)/test-feature-cache $(GO) test -race -count=1 -timeout 90m $(RACE_PKGS)

test-cluster: build venv ## the long scale-out tests: 3 NATS servers, leader + standby (role all; planner + workers), trainers, kills
	MMFEED_CLUSTER_LONG=1 $(PY) -m pytest -q trainer/tests/test_cluster.py trainer/tests/test_cluster_roles.py

scale: build ## control plane at 64/256/1,024 simulated ranks (real binary, nats-server, planner failover); scale_* keys in bench/results.json
	$(GO) run ./bench/scale $(SCALE_ARGS)

soak: build venv ## faults at random for SOAK_SECONDS (600) over SOAK_EPOCHS (40): kill -9 of trainer, serve, a worker; disconnects, pauses; SOAK_ROLE all or planner (both)
	MMFEED_SOAK_SECONDS=$(or $(SOAK_SECONDS),600) MMFEED_SOAK_EPOCHS=$(or $(SOAK_EPOCHS),40) $(if $(SOAK_ROLE),MMFEED_SOAK_ROLE=$(SOAK_ROLE)) \
	  $(PY) -m pytest -q -s trainer/tests/test_soak.py

demo: build venv ## end to end: synth corpus, serve over embedded NATS, 4-rank CPU trainer, balance report
	scripts/demo.sh

bench: build venv ## side-by-side benchmarks against the peers; writes bench/results.json
	scripts/bench.sh $(BENCH_ARGS)

bench-e2e: build venv ## measured step time of the bundled trainer under each strategy (also in bench)
	scripts/bench.sh -sections e2e

quality: build venv ## accuracy study: tiny model under each strategy, held-out recall (also in bench)
	scripts/bench.sh -sections quality

lint: $(LIBTOK) ## go vet + gofmt check
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

FUZZTIME ?= 20s
fuzz: $(LIBTOK) ## run each fuzz target for FUZZTIME (default 20s)
	@for pkg in $$($(GO) list ./...); do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; done

clean: ## remove build outputs (keeps the machine cache)
	rm -rf $(BUILD) bin $(VENV)
