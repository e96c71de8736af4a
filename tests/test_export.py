import pytest
import torch
from conftest import make_model, padded_batch
from transformers import MarianMTModel

from vaswani_mt.export import hidden_permutation, to_marian


def test_permutation_puts_sines_first():
    assert hidden_permutation(6).tolist() == [0, 2, 4, 1, 3, 5]


def test_marian_conversion_gives_the_same_logits_to_float64_round_off():
    model = make_model(seed=2).double()
    marian = to_marian(model)
    assert isinstance(marian, MarianMTModel) and marian.dtype == torch.float64
    ids, mask = padded_batch(seed=5, lengths=(9, 4, 6))
    target = torch.tensor([[0, 11, 12, 13, 2], [0, 21, 2, 1, 1], [0, 5, 6, 7, 1]])
    target_mask = target.ne(1).long()
    ours = model(
        input_ids=ids, attention_mask=mask, decoder_input_ids=target, decoder_attention_mask=target_mask
    ).logits
    theirs = marian(
        input_ids=ids, attention_mask=mask, decoder_input_ids=target, decoder_attention_mask=target_mask
    ).logits
    real = target_mask.bool()
    assert (ours[real] - theirs[real]).abs().max().item() < 1e-12


def test_base_shape_converts_with_the_anchor_parameter_count():
    model = make_model(
        vocab_size=37000, d_model=512, d_ff=2048, num_heads=8, num_encoder_layers=6, num_decoder_layers=6
    )
    marian = to_marian(model)
    trainable = sum(p.numel() for p in marian.parameters() if p.requires_grad)
    assert trainable == 63_082_496  # ANCHORS.md: transformer-base as Marian


def test_marian_greedy_and_beam_tokens_equal_ours():
    model = make_model(seed=4)
    marian = to_marian(model)
    ids, mask = padded_batch(seed=6, lengths=(8, 5))
    for num_beams in (1, 4):
        kwargs = dict(input_ids=ids, attention_mask=mask, num_beams=num_beams, min_new_tokens=12, max_new_tokens=12)
        ours = model.generate(**kwargs, length_penalty=0.0)
        theirs = marian.generate(**kwargs, length_penalty=0.0)
        assert torch.equal(ours, theirs)


def test_saved_marian_folder_reloads_with_the_same_greedy_tokens(tmp_path):
    model = make_model(seed=4)
    to_marian(model).save_pretrained(tmp_path)
    reloaded = MarianMTModel.from_pretrained(tmp_path).eval()
    ids, mask = padded_batch(seed=6, lengths=(8, 5))
    kwargs = dict(input_ids=ids, attention_mask=mask, num_beams=1, max_new_tokens=10)
    assert torch.equal(model.generate(**kwargs), reloaded.generate(**kwargs))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"position_encoding": "learned"}, "sinusoidal"), ({"d_k": 4}, "d_k"), ({"d_v": 16}, "d_v")],
)
def test_unconvertible_shapes_are_refused_with_a_reason(overrides, message):
    with pytest.raises(ValueError, match=message):
        to_marian(make_model(**overrides))
