"""Prepared weights (`vaswani_mt.inference.prepared`, issue 62 item 4): the bfloat16 compute type's linear layers
multiply by a weight reordered once for oneDNN, for any number of rows, and give what plain bf16 layers give; the
tied pre-softmax projection stays tied; without the ops (the feature check) the layers stay plain."""

import copy

import pytest
import torch
from conftest import SENTENCES, make_model
from torch import nn

from vaswani_mt.inference import compute_types, prepared
from vaswani_mt.inference.compute_types import compute_type_of, converted
from vaswani_mt.inference.prepared import PreparedLinear, prepare_weights

pytestmark = [pytest.mark.usefixtures("one_thread")]
needs_ops = pytest.mark.skipif(not prepared.ONEDNN_PREPACKED, reason="this torch has no oneDNN prepacked linear")


@needs_ops
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_prepared_layer_multiplies_any_number_of_rows_as_the_plain_one(dtype):
    torch.manual_seed(0)
    linear = nn.Linear(64, 48).to(dtype)
    layer = PreparedLinear(copy.deepcopy(linear))
    with torch.no_grad():
        for rows in (1, 4, 16, 40, 64):  # sentences leave: one reordered weight for every row count
            states = torch.randn(rows, 64).to(dtype)
            expected, got = linear(states), layer(states)
            assert got.dtype == dtype and got.shape == expected.shape
            if dtype == torch.bfloat16:
                assert torch.equal(got, expected)
            else:
                assert (got - expected).abs().max() < 1e-5
        assert layer(torch.randn(2, 3, 64).to(dtype)).shape == (2, 3, 48)
    states = torch.randn(4, 64).to(dtype).requires_grad_()
    layer(states).sum().backward()  # with autograd: the plain product, with its gradient
    assert states.grad is not None


@needs_ops
def test_bfloat16_prepares_every_linear_layer_keeps_the_projection_tied_and_gives_plain_bf16_tokens(
    tokenizer, monkeypatch
):
    monkeypatch.setattr(compute_types, "native_bf16", lambda: True)
    model = make_model()
    plain = copy.deepcopy(model).to(torch.bfloat16)
    linears = {name for name, module in model.named_modules() if type(module) is nn.Linear}
    bf16 = converted(copy.deepcopy(model), "bfloat16")
    assert {name for name, module in bf16.named_modules() if type(module) is PreparedLinear} == linears
    assert bf16.lm_head.weight is bf16.model.shared.weight and compute_type_of(bf16) == "bfloat16"
    inputs = tokenizer([en for en, _ in SENTENCES], padding=True, return_tensors="pt")
    copied = copy.deepcopy(bf16)  # reordered anew: an opaque reordered tensor has no storage to copy
    assert copied.lm_head.weight is copied.model.shared.weight and copied.lm_head.weight is not bf16.lm_head.weight
    with torch.no_grad():
        expected = plain.generate(**inputs, max_new_tokens=8)
        assert torch.equal(bf16.generate(**inputs, max_new_tokens=8), expected)
        assert torch.equal(copied.generate(**inputs, max_new_tokens=8), expected)


def test_without_the_ops_the_layers_stay_plain(monkeypatch):
    monkeypatch.setattr(prepared, "ONEDNN_PREPACKED", False)
    model = prepare_weights(make_model().to(torch.bfloat16))
    assert not any(isinstance(module, PreparedLinear) for module in model.modules())
    assert not prepared._has_onednn_prepacked(ops=object())  # a namespace without the two ops fails the check
