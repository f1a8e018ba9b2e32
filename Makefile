# worldline: the two set-up commands are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PROTO  := proto/worldline/v1/worldline.proto
GEN    := proto/worldline/v1/worldline_pb2.py proto/worldline/v1/worldline_pb2.pyi \
          proto/worldline/v1/worldline_pb2_grpc.py
PYTEST_ARGS ?=

.PHONY: install run test bench soak proto proto-check lint docker test-tools clean

install: $(STAMP)

$(STAMP): pyproject.toml daemon/_walk.c daemon/_codec.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Start the daemon in the foreground on the embedded default (SQLite + local blobs).
run: install
	$(BIN)/worldline daemon

# Regenerate the committed gRPC code from the .proto files.
proto: install
	cd proto && ../$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
	  --grpc_python_out=. worldline/v1/worldline.proto

# Fail when the committed generated code drifts from the .proto files.
proto-check: install
	@tmp=$$(mktemp -d) && trap 'rm -rf '"$$tmp" EXIT && \
	  (cd proto && ../$(BIN)/python -m grpc_tools.protoc -I. --python_out=$$tmp \
	    --pyi_out=$$tmp --grpc_python_out=$$tmp worldline/v1/worldline.proto) && \
	  for f in $(GEN); do \
	    cmp -s $$f $$tmp/worldline/v1/$$(basename $$f) || \
	      { echo "proto-check: $$f is stale: run 'make proto' and commit" >&2; exit 1; }; \
	  done && echo "proto-check: generated code matches $(PROTO)"

# The Docker engine and the local base image (installs docker.io when absent).
docker:
	bash deploy/ensure-docker.sh

# What the tests use to act as an agent would (setfattr, setfacl, setcap, setpriv).
test-tools:
	bash deploy/ensure-test-tools.sh

test: install proto-check lint docker test-tools
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install docker
	$(BIN)/python -m tests.bench.run

# A long load of checkpoints, restores, forks and gc with periodic SIGKILLs (not part of
# `make test`): SOAK_MINUTES (default 20), SOAK_SESSIONS (4), SOAK_SEED.
soak: install
	$(BIN)/python -m tests.soak

lint: install
	$(BIN)/ruff check daemon client tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
