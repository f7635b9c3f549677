"""The weight-first product for decode steps (`chatcache.model.few_rows`) against plain `nn.Linear`."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, DynamicCache

from chatcache.model.few_rows import FEW_ROWS, FewRowsLinear, use_few_rows_matmul


def _decode_logits(model: nn.Module, rows: int, context: int) -> torch.Tensor:
    torch.manual_seed(1)
    ids = torch.randint(5, 200, (rows, context + 1))
    cache = DynamicCache(config=model.config)  # type: ignore[arg-type]
    with torch.no_grad():
        model(input_ids=ids[:, :context], cache=cache)
        return model(input_ids=ids[:, context:], cache=cache).logits  # type: ignore[no-any-return]


def test_the_loaded_cpu_model_decodes_as_plain_linear_layers_do(tiny_model, tiny_model_dir: Path) -> None:  # type: ignore[no-untyped-def]
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    swapped = tiny_model.model
    assert [name for name, m in swapped.named_modules() if type(m) is nn.Linear] == []
    assert sum(isinstance(m, FewRowsLinear) for m in swapped.modules()) == sum(type(m) is nn.Linear for m in plain.modules())
    assert swapped.state_dict().keys() == plain.state_dict().keys()
    for rows in (2, 3, 8):  # decode steps: the weight-first product, the same up to summation order
        torch.testing.assert_close(_decode_logits(swapped, rows, 12), _decode_logits(plain, rows, 12), rtol=1e-5, atol=1e-5)
    # One row, and a prefill chunk longer than FEW_ROWS, take nn.Linear's own product: bit for bit the same.
    assert torch.equal(_decode_logits(swapped, 1, 12), _decode_logits(plain, 1, 12))
    ids = torch.randint(5, 200, (1, FEW_ROWS + 1))
    with torch.no_grad():
        assert torch.equal(swapped(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_a_tied_output_embedding_stays_tied_and_hooked_layers_are_left() -> None:
    embedding = nn.Embedding(50, 16)
    head = nn.Linear(16, 50, bias=False)
    head.weight = embedding.weight
    hooked = nn.Linear(16, 16)
    hooked.register_forward_hook(lambda *args: None)
    biased = nn.Linear(16, 16)
    model = nn.ModuleDict({"embed": embedding, "head": head, "hooked": hooked, "biased": biased})
    want = biased(torch.ones(2, 16))

    assert use_few_rows_matmul(model) == 2
    assert isinstance(model["head"], FewRowsLinear) and model["head"].weight is embedding.weight
    assert model["hooked"] is hooked
    with torch.no_grad():
        embedding.weight[0, 0] = 5.0  # one parameter: a change through the embedding is the head's
    assert model["head"].weight[0, 0].item() == 5.0
    torch.testing.assert_close(model["biased"](torch.ones(2, 16)), want)
