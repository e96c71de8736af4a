"""FLOPs per target token counted from the model agree with the analytic count, the fused loss's products included."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vaswani_mt import VaswaniConfig
from vaswani_mt.model.fast_paths_vaswani import projected_label_smoothed_cross_entropy
from vaswani_mt.training.flops import (
    PAPER_RUNS,
    PAPER_TOKENS_PER_STEP,
    analytic_training_flops_per_token,
    count_training_flops,
    mfu,
    non_embedding_parameters,
    peak_tflops,
)

# count_training_flops seeds torch's global RNG (torch.manual_seed) to initialise its model: put back after each test
pytestmark = pytest.mark.usefixtures("restore_rng", "one_thread")


def test_base_at_length_30_costs_381_mflop_per_target_token_as_counted_by_hand():
    counted = count_training_flops("base", 30)
    analytic = analytic_training_flops_per_token("base", 30)
    assert counted.per_target_token == pytest.approx(analytic["total"], rel=1e-9)
    # ANCHORS.md: 6 x 44.1M non-embedding parameters = 265, output layer 6 d V = 114, attention about 3
    assert counted.per_target_token / 1e6 == pytest.approx(381, rel=0.01)
    assert analytic["output_layer"] / 1e6 == pytest.approx(114, rel=0.01)
    assert analytic["attention"] / 1e6 == pytest.approx(3.3, rel=0.05)
    parameters = non_embedding_parameters("base")
    assert parameters / 1e6 == pytest.approx(44.1, rel=0.002)
    assert analytic["matrices"] == pytest.approx(6 * parameters, rel=0.005)  # biases and LayerNorms: no products
    assert set(counted.by_operator) == {"aten.mm", "aten.addmm", "aten.bmm"}
    assert counted.per_step() == pytest.approx(counted.per_target_token * PAPER_TOKENS_PER_STEP)


@pytest.mark.parametrize(
    "overrides, source_length, target_length",
    [
        ({}, 7, 7),
        ({}, 5, 9),  # the encoder's work per target token scales with source / target length
        (dict(d_k=8, d_v=24, num_heads=3, num_encoder_layers=1, num_decoder_layers=3), 6, 4),
        (dict(position_encoding="learned", d_ff=40), 4, 6),
    ],
)
def test_counted_flops_equal_the_analytic_count_for_other_shapes(overrides, source_length, target_length):
    config = VaswaniConfig.from_preset("tiny", vocab_size=300, **overrides)  # the config is what is counted
    counted = count_training_flops(config, source_length, target_length, batch=3)
    analytic = analytic_training_flops_per_token(config, source_length, target_length)
    assert counted.target_tokens == 3 * target_length
    assert counted.per_target_token == pytest.approx(analytic["total"], rel=1e-9)


def test_the_fused_projection_and_loss_are_counted_with_their_backward_products():
    """The training loss's autograd Function does the backward products in its forward: 3 products of 2 N d V."""
    tokens, d_model, vocab = 10, 16, 50
    hidden = torch.randn(tokens, d_model, requires_grad=True)
    weight = torch.randn(vocab, d_model, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    with FlopCounterMode(display=False) as counter:
        loss = projected_label_smoothed_cross_entropy(hidden, weight, labels, 0.1, 1.0 / tokens)
    assert counter.get_total_flops() == 6 * tokens * d_model * vocab
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    assert counter.get_total_flops() == 0 and hidden.grad is not None and weight.grad is not None


def test_the_paper_table2_costs_are_upper_bounds_of_the_counted_work():
    """Table 2 is GPU-hours x 9.5 TFLOPS per P100: the counted work is 29% (base) and 42% (big) of it."""
    for name, utilisation in (("base", 0.29), ("big", 0.42)):
        per_step = analytic_training_flops_per_token(name, 27)["total"] * PAPER_TOKENS_PER_STEP
        total = per_step * PAPER_RUNS[name]["steps"]
        assert total / PAPER_RUNS[name]["table2_flops"] == pytest.approx(utilisation, abs=0.01)
        assert total / (PAPER_RUNS[name]["hours_on_8_p100"] * 3600 * 8 * 9.5e12) == pytest.approx(utilisation, abs=0.01)


def test_device_peaks_are_read_from_the_device_name():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H200") == 989.4
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == peak_tflops("NVIDIA A100 80GB PCIe") == 312.0
    assert peak_tflops("NVIDIA A10") == 125.0 and peak_tflops("NVIDIA L4") == 121.0
    assert peak_tflops("Tesla V100-SXM2-16GB") == 125.0 and peak_tflops("Tesla V100-PCIE-32GB") == 112.0
    assert peak_tflops("Tesla P100-PCIE-16GB") == 18.7 and peak_tflops("Tesla P100-SXM2-16GB") == 21.2
    assert peak_tflops("NVIDIA GeForce RTX 3090") is None
    assert mfu(1000.0, 4e8, 1.0) == pytest.approx(0.4)
