# Switchboard: `make run` runs the product on the embedded stack, `make test` proves it.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# The local stack (services/stack): `stack up|down|status|env|destroy|restart|crash|rotate`.
STACK       := $(or $(CARGO_TARGET_DIR),target)/debug/stack
RUN_PORTS   := 14222 15432
TEST_PORTS  := 24222 25432
CARGO       ?= cargo
PID_FILE    := .stack/switchboard.pid

# With SB_NATS_URL and SB_DATABASE_URL set, those servers are used and no stack is started.
EXTERNAL := $(and $(SB_NATS_URL),$(SB_DATABASE_URL))

# A connection URL on stdin, printed without its secret, as the product logs it:
# nats://user:***@host, and nats://***@host for a token (the user name is the secret there).
REDACT_URL := sed -E -e 's|(://[^:/@]*):[^@/]*@|\1:***@|g' -e t -e 's|://[^:@/]*@|://***@|g'

.PHONY: help run stop test check build clean-stack stack-tool sqlx-prepare sqlx-check

help:
	@echo "make run    - start NATS + Postgres (embedded), build, run everything (switchboard up)"
	@echo "make stop   - stop what make run started"
	@echo "make test   - start a separate test stack, install the pinned OpenClaw, run every test, stop it"
	@echo "make check  - cargo fmt --check, clippy -D warnings, no unused dependency (cargo-machete),"
	@echo "              and .sqlx/ current (make sqlx-check)"
	@echo "make sqlx-prepare - write .sqlx/ (the compile-checked SQL's data) from the migrations"
	@echo "make migration-baseline - after adding a migration: record the previous version's queries"

build:
	$(CARGO) build --workspace --bins

# The stack tool alone (a few seconds when it is up to date), for the targets that start or stop
# a stack before (or without) building the workspace. `build` makes it too.
stack-tool:
	@$(CARGO) build --quiet -p switchboard-stack --bin stack

run: build
	@if [ -z "$(EXTERNAL)" ]; then \
	  eval "$$($(if $(CLUSTER),SB_STACK_NATS_CLUSTER=$(CLUSTER) )$(STACK) up run $(RUN_PORTS))"; \
	  echo 'the stack takes only its own credentials (.stack/run/credentials/); for other commands'; \
	  echo '(people import, dlq, api-keys, migrate) in another shell: eval "$$($(STACK) env run)"'; \
	else \
	  echo "using SB_NATS_URL=$$(printf '%s' "$$SB_NATS_URL" | $(REDACT_URL)) and SB_DATABASE_URL (no embedded stack)"; \
	fi; \
	echo "switchboard is starting; in another terminal try:"; \
	echo "  target/debug/switchboard sms send --from +14155550100 --text 'Hello Reggie'"; \
	echo "  the chat widget: http://127.0.0.1:8080/demo/widget   the ops console: http://127.0.0.1:8081/console"; \
	echo $$$$ > $(PID_FILE); \
	exec target/debug/switchboard up

stop: stack-tool
	@if [ -f $(PID_FILE) ]; then \
	  pid=$$(cat $(PID_FILE)); \
	  if kill -0 $$pid 2>/dev/null; then kill -TERM $$pid; echo "stopped switchboard (pid $$pid)"; fi; \
	  rm -f $(PID_FILE); \
	fi
	@$(STACK) down run

# Incremental caches are off for the test build: a one-off build (CI) gains nothing from them
# and they cost gigabytes on a shared disk (a CI run once failed with the disk full).
test: stack-tool
	@if [ -z "$(EXTERNAL)" ]; then \
	  $(STACK) destroy test >/dev/null 2>&1 || true; \
	  eval "$$(SB_STACK_FAST=1 $(STACK) up test $(TEST_PORTS))"; \
	  trap '$(STACK) down test' EXIT; \
	  export SB_TEST_EMBEDDED_STACK=1; \
	fi; \
	deploy/local/openclaw.sh install >/dev/null; \
	deploy/local/browser.sh install; \
	export CARGO_INCREMENTAL=0; \
	$(CARGO) build --workspace --bins --tests; \
	if $(CARGO) nextest --version >/dev/null 2>&1; then \
	  $(CARGO) nextest run --workspace --no-fail-fast; \
	else \
	  $(CARGO) test --workspace --no-fail-fast; \
	fi
	@# A short, bounded libFuzzer run of every fuzz target (no sanitizer: builds in ~6 min cold).
	$(MAKE) --no-print-directory fuzz-smoke FUZZ_SANITIZER=none FUZZ_SECONDS=5

# cargo-machete finds a dependency no source of its crate names; built once into the stack's
# cache (about two minutes), pinned so every machine checks with the same rules.
MACHETE_VERSION := 0.9.2
MACHETE         := .stack/bin-cache/cargo-machete-$(MACHETE_VERSION)/bin/cargo-machete

$(MACHETE):
	$(CARGO) install cargo-machete --locked --version $(MACHETE_VERSION) \
	  --root .stack/bin-cache/cargo-machete-$(MACHETE_VERSION)

check: $(MACHETE)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(MACHETE) --with-metadata
	$(MAKE) --no-print-directory sqlx-check

# The compile-checked SQL (sqlx::query!, query_as!, query_scalar!) is built from .sqlx/, never
# from a database (.cargo/config.toml sets SQLX_OFFLINE=true), so the build needs no server and
# no sqlx-cli. After changing a statement or a migration, `make sqlx-prepare` writes .sqlx/ again
# (commit it); `make sqlx-check` (in `make check`) fails while it is not what that would write.
# Both describe the statements to a fresh stack instance of their own (ports 12222/13432) with
# migrations/ applied, or to SQLX_DATA_DATABASE_URL: deploy/local/sqlx-data.sh.
sqlx-prepare: stack-tool
	CARGO="$(CARGO)" STACK="$(STACK)" deploy/local/sqlx-data.sh prepare

sqlx-check: stack-tool
	CARGO="$(CARGO)" STACK="$(STACK)" deploy/local/sqlx-data.sh check

# `make image`: localhost/switchboard:latest with podman from a Debian base made here by
# mmdebstrap (no registry; root, podman and mmdebstrap needed; deploy/image/build-local.sh).
# `make image-check`: that image's gateway, workers and runner answer an SMS against a stack of
# their own (22222/23432; deploy/image/check-local.sh). Neither is part of `make test`: a fresh
# machine has no podman.
.PHONY: image image-check
image:
	CARGO="$(CARGO)" deploy/image/build-local.sh

image-check: stack-tool
	STACK="$(STACK)" deploy/image/check-local.sh

# After adding a migration: record the previous version's queries (from git: the code before
# that migration) in migrations/compat/previous-queries.json, which `make test` describes
# against today's schema (tests/tests/migration_compat.rs: expand now, contract later).
.PHONY: migration-baseline
migration-baseline:
	python3 migrations/compat/baseline.py

clean-stack: stack-tool
	$(STACK) destroy run || true
	$(STACK) destroy test || true

# ---- benchmarks and chaos runs (tests/load: bench, chaos, memory_bench) -----------------------------
# Each brings up its own stack instance (bench: 16222/17432, chaos: 18222/19432; every port below
# Linux's ephemeral range, 32768+) and stops it. Never run the two at once: both are CPU-bound.
# Results, plots and worker logs go to bench-results/<timestamp>/ (git-ignored). The load tools
# run the stack tool built beside them (target/release/stack, from the same --workspace --bins
# build).
BENCH_ARGS ?=
CHAOS_ARGS ?=

.PHONY: bench chaos

# `make bench`: the pipeline (target/release/bench), then recall and search at 1,000,000 stored
# vectors (memory_bench, docs/bench-memory.md: its own stack, 16322/17532, destroyed after; tens
# of minutes on 2 cores; MEMORY_BENCH_ARGS, e.g. --vectors 100000 for a quick try). The embedding figure comes last: our default embedder (ONNX
# Runtime) beside PyTorch + sentence-transformers, in bench-results/embed-<timestamp>/, ending in
# a PASS/FAIL line. All run; the target fails when any misses its target.
MEMORY_BENCH_ARGS ?=
bench:
	$(CARGO) build --release --workspace --bins --example embed_speed
	status=0; target/release/bench $(BENCH_ARGS) || status=1; \
	  target/release/memory_bench $(MEMORY_BENCH_ARGS) || status=1; \
	  tests/embed_bench/run.sh bench-results/embed-$$(date -u +%Y%m%dT%H%M%SZ) $(EMBED_BENCH_ARGS) || status=1; \
	  exit $$status

# The embedding figure alone (docs/embedding-runtime.md): texts, threads, "batch sizes". The
# peer's venv is made once under .stack/bin-cache; ONNX Runtime and the graph are the stack's
# (`make test` or `make run` fetches them).
EMBED_BENCH_ARGS ?= 500 2 "1 16"
.PHONY: bench-embed
bench-embed:
	$(CARGO) build --release --workspace --example embed_speed
	tests/embed_bench/run.sh bench-results/embed-$$(date -u +%Y%m%dT%H%M%SZ) $(EMBED_BENCH_ARGS)

# `make chaos`: 20,000 turns from 2,000 people over seven channels (Twilio, TextMagic, chat, API,
# Telegram, Slack, WhatsApp) while workers, NATS and Postgres are SIGKILLed and the runner goes
# down, then every message accounted for (docs/measurements.md, tests/load/src/chaos_check/).
# `make chaos CLUSTER=3`: the same run on a three-node JetStream cluster (streams at R3), its
# nodes SIGKILLed one at a time (the work stream's leader twice) instead of the one NATS crash.
# NATS_SYNC=always: NATS fsyncs every JetStream write (sync_interval: always).
chaos:
	$(CARGO) build --release --workspace --bins
	target/release/chaos $(if $(CLUSTER),--cluster $(CLUSTER)) \
	  $(if $(filter always,$(NATS_SYNC)),--nats-sync-always) $(CHAOS_ARGS)

# `make upgrade-drill`: a rolling upgrade under a steady load (60 msg/s, every channel): each
# worker process replaced in turn by SIGTERM (drained), then the chaos verdict with no kill to
# excuse a loss, a double or a re-run; prints the overhead p50/p99 (tests/load/src/rolling.rs).
.PHONY: upgrade-drill
upgrade-drill:
	$(CARGO) build --release --workspace --bins
	target/release/chaos --rolling-upgrade $(CHAOS_ARGS)

# ---- fuzzing (tests/fuzz; see tests/fuzz/README.md) ------------------------------------------
# cargo-fuzz passes nightly-only flags (-Zsanitizer, sancov); RUSTC_BOOTSTRAP=1 lets the stable
# toolchain accept them. Not part of `make test`: a cold instrumented build takes 8-18 minutes on
# 2 cores. `make test` replays the same checks over the seeds and mutations without libFuzzer
# (tests/tests/hostile_input.rs). FUZZ_SECONDS per target; FUZZ_SANITIZER=none is ~2x faster.
FUZZ_TARGETS      ?= twilio_webhook textmagic_webhook twilio_signature phone_normalize work_payloads client_input telegram_update slack_event
FUZZ_SECONDS      ?= 10
FUZZ_SANITIZER    ?= address
CARGO_FUZZ_VERSION := 0.13.2
FUZZ_ENV          := RUSTC_BOOTSTRAP=1
FUZZ_DIR          := tests/fuzz

.PHONY: fuzz-smoke

fuzz-smoke:
	@if ! $(CARGO) fuzz --version 2>/dev/null | grep -qF "$(CARGO_FUZZ_VERSION)"; then \
	  echo "installing cargo-fuzz $(CARGO_FUZZ_VERSION)"; \
	  $(CARGO) install cargo-fuzz --version $(CARGO_FUZZ_VERSION) --locked; \
	fi
	$(FUZZ_ENV) $(CARGO) fuzz build --fuzz-dir $(FUZZ_DIR) -s $(FUZZ_SANITIZER)
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_DIR)/corpus/$$t $(FUZZ_DIR)/target; \
	  log=$(FUZZ_DIR)/target/smoke-$$t.log; \
	  dict=""; [ -f $(FUZZ_DIR)/dicts/$$t.dict ] && dict="-dict=$(FUZZ_DIR)/dicts/$$t.dict"; \
	  if ! $(FUZZ_ENV) $(CARGO) fuzz run --fuzz-dir $(FUZZ_DIR) -s $(FUZZ_SANITIZER) $$t \
	      $(FUZZ_DIR)/corpus/$$t $(FUZZ_DIR)/seeds/$$t -- \
	      -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $$dict >$$log 2>&1; then \
	    tail -n 60 $$log; echo "fuzz $$t FAILED (log: $$log, input: $(FUZZ_DIR)/artifacts/$$t/)"; exit 1; \
	  fi; \
	  runs=$$(sed -n 's/^stat::number_of_executed_units: *//p' $$log); \
	  rate=$$(sed -n 's/^stat::average_exec_per_sec: *//p' $$log); \
	  echo "fuzz $$t: $$runs runs in $(FUZZ_SECONDS) s ($$rate/s), no failure"; \
	done
