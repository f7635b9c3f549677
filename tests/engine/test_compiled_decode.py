"""The compiled decode step gives the replies the eager step gives, token for token.

Each test compiles one batch bucket (its rows padded up to it), to keep inductor's compile
short; the padding rows, the dynamic buffer length and the in-place KV writes are all exercised.
The tests share one inductor cache on disk, as a server's restarts do.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from chatcache import load_chat_model
from chatcache.config import GenerationConfig
from chatcache.errors import ConfigError
from chatcache.model import compiled_decode
from chatcache.model.batch_kv import BatchKV
from chatcache.model.few_rows import FewRowsLinear, use_few_rows_matmul
from chatcache.model.scheduler import Scheduler

PROMPTS = ([5, 17, 42, 99, 7], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3], list(range(20, 250)))  # the last outgrows a buffer block


def _model(directory: Path) -> PreTrainedModel:
    """The model as `load_chat_model` sets it up on the CPU: its few-row products weight-first."""
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    use_few_rows_matmul(model)
    return model


def _replies(model: PreTrainedModel, compiled: bool, prompts: tuple[list[int], ...], new_tokens: int) -> list[list[int]]:
    """Greedy replies to `prompts`, all submitted at once to a scheduler of their own on `model`
    (a compiled one packs its weights, which the eager step then reads too: eager goes first).
    It runs at most as many rows as there are prompts, so that its warm-up compiles only the
    buckets they use (one, under `one_bucket`), not those of the default batch as well."""
    scheduler = Scheduler(model, max_batch=len(prompts), compiled=compiled)
    try:
        params = GenerationConfig(max_new_tokens=new_tokens)
        requests = [scheduler.submit(DynamicCache(config=model.config), prompt, params, eos_ids=set()) for prompt in prompts]
        return [[token.token_id for token in request] for request in requests]
    finally:
        scheduler.close()


@pytest.fixture(scope="module")
def inductor_cache(shared_data_dir: Path) -> Iterator[None]:
    """Inductor's cache on disk, none of the user's: beside the bundled model converted for the
    tests (`CHATCACHE_TEST_MODELS`), so that a later run loads what an earlier one compiled, as a
    server's restart does (compiling the bundled model's step takes about a minute, loading it
    about 10 s). Its entries are keyed by the graph, torch's version and inductor's settings, so
    a change to any of them compiles again."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared_data_dir / "inductor"))
        yield


@pytest.fixture
def one_bucket(inductor_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch of up to 4 rows padded to 4: one compile."""
    monkeypatch.setattr(compiled_decode, "BATCH_BUCKETS", (4,))


def _graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    return int(counters["stats"]["unique_graphs"])


def test_compiled_greedy_replies_equal_eager_ones(tiny_model_dir: Path, one_bucket: None) -> None:
    """Three requests joining one by one (1, 2, 3 rows in a bucket of 4), 40 tokens each; the
    third grows the buffers from one block of positions to two (a new length, the same graph).
    The eager step multiplies weight-first, the compiled one by the packed weights."""
    model = _model(tiny_model_dir)
    eager = _replies(model, False, PROMPTS, 40)
    compiled = _replies(model, True, PROMPTS, 40)
    assert compiled == eager


def test_padded_rows_leave_real_rows_alone(tiny_model_dir: Path, one_bucket: None) -> None:
    """A row's logits are the same whatever the padding rows hold (here, stale KV of rows that left)."""
    model = _model(tiny_model_dir)
    step = compiled_decode.CompiledDecode(model)
    batch = BatchKV(model.config)
    with torch.no_grad():
        for prompt in reversed(PROMPTS):  # the longest first: it sets the columns attended to either way
            cache = DynamicCache(config=model.config)
            model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
            batch.join(cache, room=8)
        alone = step(batch, [1, 2, 3])
        batch.lengths = batch.lengths[:1]  # rows 1 and 2 become padding, their KV left in the buffer
        assert torch.equal(step(batch, [1])[0], alone[0])


def test_warm_up_compiles_every_bucket_before_the_first_step(
    tiny_model_dir: Path, inductor_cache: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The scheduler's worker compiles the buckets of up to `max_batch` rows before its first
    request and says how long it took; the requests' steps (1, 2 and 3 rows) compile nothing."""
    monkeypatch.setattr(compiled_decode, "BATCH_BUCKETS", (1, 2, 4))
    torch._dynamo.reset()  # no graph left from another test: the warm-up must compile its own
    after_warm_up: list[int] = []
    warm_up = compiled_decode.CompiledDecode.warm_up

    def counted(step: compiled_decode.CompiledDecode, rows: int) -> float:
        seconds = warm_up(step, rows)
        after_warm_up.append(_graphs())
        return seconds

    monkeypatch.setattr(compiled_decode.CompiledDecode, "warm_up", counted)
    before = _graphs()
    with caplog.at_level(logging.INFO, logger="chatcache"):
        model = _model(tiny_model_dir)
        scheduler = Scheduler(model, max_batch=3, compiled=True)
        try:
            params = GenerationConfig(max_new_tokens=6)
            requests = [scheduler.submit(DynamicCache(config=model.config), prompt, params, eos_ids=set()) for prompt in PROMPTS]
            assert all(len(list(request)) == 6 for request in requests)
        finally:
            scheduler.close()
    assert after_warm_up[0] > before and _graphs() == after_warm_up[0]
    assert scheduler.peak_running == 3
    assert any("compiled decode step ready for up to 3 rows in" in record.getMessage() for record in caplog.records)


@pytest.mark.bundled
def test_compiled_greedy_replies_equal_eager_ones_on_the_bundled_model(bundled_model_dir: Path, one_bucket: None) -> None:
    """On the bundled model, 24 tokens of two requests: the replies eager decoding gives."""
    model = _model(bundled_model_dir)
    prompts = (PROMPTS[1], PROMPTS[2])
    eager = _replies(model, False, prompts, 24)
    compiled = _replies(model, True, prompts, 24)
    assert compiled == eager


def test_packed_product_is_the_linear_product(tiny_model_dir: Path) -> None:
    """Packed or not, a layer's product with a few rows is the same up to the order of summation."""
    layer = next(m for m in _model(tiny_model_dir).modules() if isinstance(m, FewRowsLinear))
    rows = torch.randn(5, layer.in_features)
    with torch.no_grad():
        expected = torch.nn.functional.linear(rows, layer.weight)
        layer.pack()
        assert torch.allclose(layer(rows), expected, atol=1e-5)


def test_int8_precision_is_not_compiled(tiny_model_dir: Path) -> None:
    """int8's float64 attention has no compiled step: asking for both fails at load, not at the first turn."""
    with pytest.raises(ConfigError, match="compiled_decode"):
        load_chat_model(str(tiny_model_dir), precision="int8", compiled_decode=True)


def test_a_compile_beside_eager_forwards_on_another_thread_succeeds(
    tiny_model_dir: Path, inductor_cache: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """transformers' `kernels` routing keeps one variable for the whole process while dynamo
    traces (torch's "compiling" flag is the process's, not the thread's): an eager forward of
    the model on another thread (a long system prompt's prefill on the caller's thread) wrote
    it under the trace and the warm-up failed. Here eager forwards of the same model run on a
    thread through the whole compile; the warm-up must succeed and their logits stay the same."""
    import threading

    monkeypatch.setattr(compiled_decode, "BATCH_BUCKETS", (1, 2))
    torch._dynamo.reset()
    model = _model(tiny_model_dir)
    ids = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    compiled = threading.Event()
    forwards: list[torch.Tensor] = []

    def eager_forwards() -> None:
        with torch.no_grad():
            while not compiled.is_set():
                forwards.append(model(input_ids=ids).logits)

    worker = threading.Thread(target=eager_forwards)
    with caplog.at_level(logging.INFO, logger="chatcache"):
        worker.start()
        try:
            scheduler = Scheduler(model, max_batch=2, compiled=True)
            try:
                request = scheduler.submit(DynamicCache(config=model.config), PROMPTS[0], GenerationConfig(max_new_tokens=3), eos_ids=set())
                assert len(list(request)) == 3
            finally:
                scheduler.close()
        finally:
            compiled.set()
            worker.join()
    assert not [r for r in caplog.records if "compiling the decode step failed" in r.getMessage()]
    assert any("compiled decode step ready for up to 2 rows in" in r.getMessage() for r in caplog.records)
    # The packed weights the compile reads sum in another order: the same logits up to rounding.
    assert len(forwards) > 1 and all(torch.allclose(logits, expected, atol=1e-4) for logits in forwards)


def test_every_layer_the_kernels_package_wrapped_is_given_its_own_forward_back(tiny_model_dir: Path) -> None:
    """If transformers stops wrapping layers, or wraps them another way, this says so."""
    model = _model(tiny_model_dir)
    wrapped = [m for m in model.modules() if "_kernel_funcs" in vars(m)]
    assert wrapped  # the attention layers, today
    assert compiled_decode.without_hub_kernel_routing(model) == len(wrapped)
    assert all(m.forward.__func__ is type(m).forward.__wrapped__ for m in wrapped)  # type: ignore[attr-defined]
