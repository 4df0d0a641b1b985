# Two commands do all the set-up on a fresh machine:
#   make run   - create .venv, install decodegap, analyze the bundled example trace
#   make test  - create .venv with the test extras (CPU torch + triton for the interpreter), run pytest
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# CPU torch for the capture/kernel/demo tests (pip takes 2.13.0 from the local wheel store when there is one);
# the analysis core itself never imports torch.
TORCH_SPEC  ?= torch==2.13.0
TRITON_SPEC ?= triton==3.8.0

.PHONY: run test bench clean chromium

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[test]' "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	touch $@

run: $(VENV)/.installed
	$(BIN)/decodegap analyze --example

# The HTML report's browser test (tests/test_html_browser.py) needs chromium: installed when missing and we are root
# with apt-get (CI); otherwise the test skips.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium not installed: the browser test will skip"

test: $(VENV)/.test-installed chromium
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV)
