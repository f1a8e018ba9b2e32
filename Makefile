# worldline: the two set-up commands are `make run` and `make test`.
# The interpreter the venv is made with: the system's python3 when it is 3.11 or newer and
# can make a venv that builds C extensions (Debian's is built with profile-guided and
# link-time optimization and a static libpython), else the first python3 on PATH. A
# default pyenv or python-build interpreter has neither optimization, and the daemon's
# checkpoints cost about a fifth more CPU on it (docs/operations.md, "The interpreter"). Overriding:
# `make install PYTHON=/path/to/python3` on a fresh clone (an existing .venv is kept).
PYTHON ?= $(or $(shell for p in /usr/bin/python3; do \
  $$p -c 'import ensurepip, os, sys, sysconfig; sys.exit(sys.version_info < (3, 11) or not \
  os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  2>/dev/null && { echo $$p; break; }; done),python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
RUNTIME_STAMP := $(VENV)/.runtime-stamp
PROTO  := proto/worldline/v1/worldline.proto
GEN    := proto/worldline/v1/worldline_pb2.py proto/worldline/v1/worldline_pb2.pyi \
          proto/worldline/v1/worldline_pb2_grpc.py
PYTEST_ARGS ?=
# The suite runs in this many processes (pytest-xdist; each makes its own daemons,
# PostgreSQL cluster and S3 emulator): 2 took it from 998 s to 575 s on this 2-core VM.
# PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2

.PHONY: install runtime run test bench stages soak proto proto-check lint docker test-tools postgres agents browser clean bytecode

install: $(STAMP)

# The daemon and the CLI with their runtime dependencies only (what `make run` needs): no
# test tools, no benchmark peers. `make install` adds the dev dependencies to the same venv.
runtime: $(RUNTIME_STAMP)

# A strict editable install: the package is a tree of symlinks to these folders (no
# import hook at every start, which cost each `worldline hook` process ~25 ms). A new or
# removed module changes its folder, and the tree is made again.
PKG_DIRS := daemon daemon/capture daemon/edge daemon/storage client client/hooks client/console \
  client/console/templates client/console/static client/langgraph proto/worldline/v1 \
  proto/worldline/wire

$(STAMP): pyproject.toml daemon/capture/_walk.c daemon/_codec.c $(PKG_DIRS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]' --config-settings editable_mode=strict
	$(MAKE) --no-print-directory bytecode
	touch $(STAMP) $(RUNTIME_STAMP)

$(RUNTIME_STAMP): pyproject.toml daemon/capture/_walk.c daemon/_codec.c $(PKG_DIRS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e . --config-settings editable_mode=strict
	$(MAKE) --no-print-directory bytecode
	touch $(RUNTIME_STAMP)

# Compiled bytecode beside the package's link tree, so that a new process reads it even
# where PYTHONDONTWRITEBYTECODE is set (compiling cli.py and the hooks anew cost every
# `worldline hook` ~50 ms). Stale files are only slower: Python checks the source.
bytecode:
	@$(BIN)/python -c "import compileall, glob; \
	  [compileall.compile_dir(d, quiet=1) for d in glob.glob('build/__editable__.*')]"

# Start the daemon in the foreground on the embedded default (SQLite + local blobs).
run: runtime
	@echo "worldline: the CLI is $(CURDIR)/$(BIN)/worldline;" \
	  "put it on your PATH with: export PATH=\"$(CURDIR)/$(BIN):\$$PATH\"" >&2
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

# PostgreSQL's server binaries for the fleet tests (installs postgresql when absent); the
# tests make and remove a throwaway cluster of their own.
postgres:
	bash deploy/ensure-postgres.sh

# The real agents' programs (Claude Code, Gemini CLI, Codex), pinned, from the npm registry,
# cached under ~/.cache/worldline/agents (Node from Debian's packages when absent).
agents:
	bash deploy/ensure-agents.sh

# Debian's chromium, which the console's tests drive headless (Playwright, system browser).
browser:
	bash deploy/ensure-browser.sh

test: install proto-check lint docker test-tools postgres agents browser
	GRPC_ENABLE_FORK_SUPPORT=false $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

bench: install docker bytecode
	$(BIN)/python -m tests.bench.run

# Where a checkpoint's time goes, stage by stage, in the daemon's own process (not part of
# `make bench`): STAGES=history (the default), idle or edits; STAGES_ARGS=--sql and so on.
stages: install
	$(BIN)/python -m tests.bench.stages $(or $(STAGES),history) $(STAGES_ARGS)

# A long load of checkpoints, restores, forks and gc with periodic SIGKILLs (not part of
# `make test`): SOAK_MINUTES (default 20), SOAK_SESSIONS (4), SOAK_SEED.
soak: install
	$(BIN)/python -m tests.soak

lint: install
	$(BIN)/ruff check daemon client proto/worldline/wire tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
