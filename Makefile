# The two commands in the README, and a few more. Every target installs what it needs first.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
DEMO_ARGS ?=

.PHONY: demo test lint bench setup build

setup:
	@scripts/setup.sh

build: setup
	cargo build --release --locked

## Run a local 3-node cluster with one 3-way mirrored volume, exported over NBD (Ctrl-C stops it).
demo: build
	./target/release/trireme up $(DEMO_ARGS)

## Lints and every test (unit, property, process-level, interop with real NBD clients), two test
## binaries at a time with a summary per binary (scripts/test.py; TEST_LANES=1: one at a time).
test: setup lint
	scripts/test.py

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings

## trireme vs nbdkit memory through fio's nbd engine (prints the table for the issue's targets).
bench: build
	python3 bench/nbd_vs_nbdkit.py $(BENCH_ARGS)
