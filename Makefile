# Lockstep: `make demo` runs the console with a demo cluster, `make test` runs the test suite.
# Both create the virtual environment and install what they need on a fresh machine.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements/*.txt | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: demo test test-sqlite lint host-packages agent-package native native-asan adapters clean

$(STAMP): requirements/console.txt requirements/agent.txt requirements/runtime.txt requirements/dev.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "Python 3.10 or newer is needed (got $$($(PYTHON) -V))"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements/dev.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .  # .venv/bin/lockstep
	rm -f $(VENV)/.installed-*
	touch $@

host-packages:
	@./scripts/setup-host.sh

# The probe mesh's native helper (agent/probemesh/native/): the agent runs it when it is built and
# falls back to its slower Python engine (saying so in its health) when it is not.
PROBED_SRC := $(wildcard agent/probemesh/native/*.c)
PROBED_HDR := agent/probemesh/native/probed.h
PROBED_CFLAGS := -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wconversion -Wno-sign-conversion
build/probemesh/lockstep-probed: $(PROBED_SRC) $(PROBED_HDR)
	@mkdir -p $(@D)
	$(CC) $(PROBED_CFLAGS) -o $@ $(PROBED_SRC)
build/probemesh/lockstep-probed-asan: $(PROBED_SRC) $(PROBED_HDR)
	@mkdir -p $(@D)
	$(CC) $(PROBED_CFLAGS) -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -o $@ $(PROBED_SRC)
native: build/probemesh/lockstep-probed
native-asan: build/probemesh/lockstep-probed-asan

# The NCCL network plugin, nccl_plugin/build/libnccl-net-lockstep.so (NCCL_NET_PLUGIN points at
# it; nccl_plugin/README.md). Its tests also build the sanitizer variant (make -C nccl_plugin asan).
.PHONY: plugin
plugin:
	$(MAKE) -C nccl_plugin

# The agent package /install.sh hands to nodes: the agent plus wheels of its dependencies,
# fetched once here so nodes install without internet.
agent-package: $(STAMP)
	DEBUG=$${DEBUG:-true} $(BIN)/python manage.py build_agent_package --download

# The console on embedded defaults (SQLite, in-memory channel layer, tasks in-process) with an
# emulated demo cluster; agents talk often so faults show within seconds.
demo: $(STAMP) host-packages agent-package native plugin
	DEBUG=true LOCKSTEP_NODE_LOST_AFTER_S=20 LOCKSTEP_AGENT_HEARTBEAT_INTERVAL_S=5 LOCKSTEP_SWEEP_INTERVAL_S=5 \
		$(BIN)/python manage.py demo

# The checkpoint adapters' environments (var/adapters: TorchTitan, DeepSpeed, Megatron-Core beside torch 2.13.0
# CPU): ~5.5 min on a fresh machine, then cached until requirements/adapters.txt or the script
# changes. The whole suite builds them, so tests/capture/test_adapters.py runs instead of
# skipping; a targeted run (PYTEST_ARGS set) does not wait for them.
ADAPTERS := var/adapters/.built-$(shell cat requirements/adapters.txt scripts/adapter-venvs.sh | cksum | cut -d' ' -f1)
$(ADAPTERS): requirements/adapters.txt scripts/adapter-venvs.sh
	./scripts/adapter-venvs.sh
	rm -f var/adapters/.built-*
	touch $@
# CI builds them beside the suite instead (.ci/run: `make adapters` in the background, then
# `make test ADAPTERS_BESIDE=1`, and the adapter tests wait for that build's status file).
adapters: $(ADAPTERS)

# The whole suite, on the local PostgreSQL and Redis when they are installed (started if they
# are down), or on DATABASE_URL/REDIS_URL when set; the first line says which parts it runs on.
test: $(STAMP) host-packages native plugin $(if $(PYTEST_ARGS)$(ADAPTERS_BESIDE),,$(ADAPTERS))
	$(BIN)/python scripts/testenv.py -- $(BIN)/python -m pytest -p no:cacheprovider $(PYTEST_ARGS)

# The console tests, the integration tests and the agent tests that run a real console, again on
# embedded defaults (SQLite, no Redis). The other agent tests talk to a fake console and never see
# the database: the full suite ran them once.
SQLITE_TESTS := tests/console tests/integration tests/agent/test_agent_enroll.py \
	tests/agent/test_agent_jobs_e2e.py tests/agent/test_agent_real_console.py
test-sqlite: $(STAMP) native
	$(BIN)/python scripts/testenv.py --embedded -- $(BIN)/python -m pytest -p no:cacheprovider $(SQLITE_TESTS) $(PYTEST_ARGS)

lint: $(STAMP) host-packages
	$(BIN)/ruff check .
	shellcheck -s sh scripts/*.sh .ci/run

clean:
	rm -rf $(VENV) var build .pytest_cache .ruff_cache
