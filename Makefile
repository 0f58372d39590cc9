# Switchboard: `make run` runs the product on the embedded stack, `make test` proves it.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

STACK       := deploy/local/stack.sh
RUN_PORTS   := 14222 15432
TEST_PORTS  := 24222 25432
CARGO       ?= cargo
PID_FILE    := .stack/switchboard.pid

# With SB_NATS_URL and SB_DATABASE_URL set, those servers are used and no stack is started.
EXTERNAL := $(and $(SB_NATS_URL),$(SB_DATABASE_URL))

.PHONY: help run stop test check build clean-stack

help:
	@echo "make run    - start NATS + Postgres (embedded), build, run everything (switchboard up)"
	@echo "make stop   - stop what make run started"
	@echo "make test   - start a separate test stack, run every test, stop it"
	@echo "make check  - cargo fmt --check and clippy -D warnings"

build:
	$(CARGO) build --workspace --bins

run: build
	@if [ -z "$(EXTERNAL)" ]; then \
	  eval "$$($(STACK) up run $(RUN_PORTS))"; \
	else \
	  echo "using SB_NATS_URL=$$SB_NATS_URL and SB_DATABASE_URL (no embedded stack)"; \
	fi; \
	echo "switchboard is starting; in another terminal try:"; \
	echo "  target/debug/switchboard sms send --from +14155550100 --text 'Hello Reggie'"; \
	echo $$$$ > $(PID_FILE); \
	exec target/debug/switchboard up

stop:
	@if [ -f $(PID_FILE) ]; then \
	  pid=$$(cat $(PID_FILE)); \
	  if kill -0 $$pid 2>/dev/null; then kill -TERM $$pid; echo "stopped switchboard (pid $$pid)"; fi; \
	  rm -f $(PID_FILE); \
	fi
	@$(STACK) down run

test:
	@if [ -z "$(EXTERNAL)" ]; then \
	  $(STACK) destroy test >/dev/null 2>&1 || true; \
	  eval "$$(SB_STACK_FAST=1 $(STACK) up test $(TEST_PORTS))"; \
	  trap '$(STACK) down test' EXIT; \
	fi; \
	$(CARGO) build --workspace --bins --tests; \
	if $(CARGO) nextest --version >/dev/null 2>&1; then \
	  $(CARGO) nextest run --workspace --no-fail-fast; \
	else \
	  $(CARGO) test --workspace --no-fail-fast; \
	fi

check:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean-stack:
	$(STACK) destroy run || true
	$(STACK) destroy test || true
