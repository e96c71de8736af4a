import math
import warnings

import pytest
import torch
from conftest import make_model, one_sgd_step_arguments, padded_batch, uneven_pairs
from safetensors import safe_open
from torch import nn
from transformers import AutoModel, AutoModelForSeq2SeqLM, Seq2SeqTrainer, Seq2SeqTrainingArguments

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel, sinusoidal_position_encoding
from vaswani_mt.model.modeling_vaswani import _CACHE_OUTPUT_FIELD, shift_tokens_right

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]


def test_positional_encoding_is_the_papers_interleaved_formula():
    d_model = 16
    pe = sinusoidal_position_encoding(torch.arange(50), d_model, torch.float64)
    for pos in (0, 1, 7, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_embeddings_are_scaled_by_sqrt_d_model_plus_positions(model):
    ids, _ = padded_batch(lengths=(6,))
    embedded = model.model.encoder.embed(ids)
    expected = model.model.shared.weight[ids] * math.sqrt(32) + sinusoidal_position_encoding(
        torch.arange(6), 32, torch.float32
    )
    torch.testing.assert_close(embedded, expected)


def test_one_matrix_is_source_embedding_target_embedding_and_softmax_projection(model):
    shared = model.model.shared.weight
    assert model.model.encoder.embed_tokens.weight is shared
    assert model.model.decoder.embed_tokens.weight is shared
    assert model.lm_head.weight is shared
    with torch.no_grad():
        shared[5].fill_(0.25)
    assert torch.all(model.lm_head.weight[5] == 0.25) and torch.all(model.model.decoder.embed_tokens.weight[5] == 0.25)


def test_tie_survives_save_and_load_and_is_saved_once(model, tmp_path):
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        embedding_keys = [k for k in f.keys() if "embed_tokens" in k or "shared" in k or "lm_head" in k]
    assert embedding_keys == ["model.shared.weight"]
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    shared = loaded.model.shared.weight
    assert loaded.lm_head.weight is shared and loaded.model.encoder.embed_tokens.weight is shared
    assert loaded.model.decoder.embed_tokens.weight is shared
    torch.testing.assert_close(shared, model.model.shared.weight)


def test_post_ln_layers_and_no_final_layer_norm(model):
    # Two LayerNorms per encoder layer, three per decoder layer, none after the stacks (§3.1).
    norms = [name for name, module in model.named_modules() if isinstance(module, nn.LayerNorm)]
    assert len(norms) == 2 * 2 + 3 * 2
    ids, mask = padded_batch()
    encoder = model.model.encoder
    hidden = encoder.embed(ids)
    for layer in encoder.layers:  # LayerNorm(x + Sublayer(x)) written out by hand, dropout off
        attended = layer.self_attn.out_proj(
            _reference_attention(layer.self_attn, hidden, hidden, mask[:, None, None, :].bool())
        )
        hidden = layer.self_attn_sublayer.layer_norm(hidden + attended)
        ffn = layer.ffn.fc2(torch.relu(layer.ffn.fc1(hidden)))
        hidden = layer.ffn_sublayer.layer_norm(hidden + ffn)
    out = encoder(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(out[mask.bool()], hidden[mask.bool()])


def _reference_attention(attn, queries, keys, allowed):
    """Eq. (1) with h heads, written independently of the model's code path."""
    batch, tq, _ = queries.shape
    q = attn.q_proj(queries).view(batch, tq, attn.num_heads, attn.d_k).transpose(1, 2)
    k = attn.k_proj(keys).view(batch, keys.shape[1], attn.num_heads, attn.d_k).transpose(1, 2)
    v = attn.v_proj(keys).view(batch, keys.shape[1], attn.num_heads, attn.d_v).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(attn.d_k)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, tq, -1)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_decoder_cannot_see_future_tokens(implementation):
    model = make_model()
    model.set_attn_implementation(implementation)
    ids, mask = padded_batch(lengths=(6,))
    target = torch.tensor([[0, 11, 12, 13, 14, 15]])
    changed = target.clone()
    changed[0, 4] = 99
    a = model(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
    b = model(input_ids=ids, attention_mask=mask, decoder_input_ids=changed).logits
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_decoding_step_by_step_with_the_cache_under_either_name_gives_the_full_logits(model, name):
    """transformers >= 5.24 passes the KV cache to forward as `cache`, earlier versions as `past_key_values`; the
    model takes either and returns it where the installed `generate()` reads it back."""
    ids, mask = padded_batch()
    target = torch.tensor([[0, 11, 12, 13, 14], [0, 21, 22, 23, 24], [0, 31, 32, 33, 34]])
    full = model(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
    encoder_outputs = model.get_encoder()(ids, attention_mask=mask)
    model_kwargs, steps = {}, []
    for position in range(target.shape[1]):
        outputs = model(
            attention_mask=mask,
            encoder_outputs=encoder_outputs,
            decoder_input_ids=target[:, position : position + 1],
            use_cache=True,
            **({name: model_kwargs["cache"]} if model_kwargs else {}),
        )
        steps.append(outputs.logits)
        # What generate() does between steps (GenerationMixin._update_model_kwargs_for_generation, either version).
        model_kwargs = model._update_model_kwargs_for_generation(outputs, {}, is_encoder_decoder=True)
        model_kwargs["cache"] = model_kwargs.pop("past_key_values", model_kwargs.get("cache"))
        assert model_kwargs["cache"].get_seq_length() == position + 1
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="Both `past_key_values` and `cache` are set"):
        cache = model_kwargs["cache"]
        model(encoder_outputs=encoder_outputs, decoder_input_ids=target[:, :1], cache=cache, past_key_values=cache)


@torch.no_grad()
def test_passing_the_cache_as_past_key_values_warns_from_5_24_and_gives_the_logits_of_cache(model):
    """transformers 5.24 renamed `past_key_values` to `cache`: the old name still works, with in-tree models'
    FutureWarning where the new name exists; under 5.20-5.23, whose `generate()` passes the old name, silently."""
    ids, mask = padded_batch()
    target = torch.tensor([[0, 11, 12], [0, 21, 22], [0, 31, 32]])
    encoder_outputs = model.get_encoder()(ids, attention_mask=mask)

    def cache_of_the_first_two_tokens():
        prefix = model(attention_mask=mask, encoder_outputs=encoder_outputs, decoder_input_ids=target[:, :2])
        return getattr(prefix, _CACHE_OUTPUT_FIELD)

    step = {"attention_mask": mask, "encoder_outputs": encoder_outputs, "decoder_input_ids": target[:, 2:]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none for the new name
        expected = model(**step, cache=cache_of_the_first_two_tokens()).logits
    if _CACHE_OUTPUT_FIELD == "cache":
        with pytest.warns(FutureWarning, match="`past_key_values` is deprecated .* Use `cache` instead"):
            logits = model(**step, past_key_values=cache_of_the_first_two_tokens()).logits
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            logits = model(**step, past_key_values=cache_of_the_first_two_tokens()).logits
    assert torch.equal(logits, expected)
    full = model(attention_mask=mask, encoder_outputs=encoder_outputs, decoder_input_ids=target).logits
    torch.testing.assert_close(logits, full[:, 2:], atol=1e-5, rtol=1e-5)  # the cache was used, not ignored


@pytest.mark.parametrize("model_class", [VaswaniModel, VaswaniForConditionalGeneration])
def test_return_dict_false_gives_the_output_fields_as_a_tuple(model_class):
    """As in-tree models (`can_return_tuple`): the fields that are set, in the output class's order."""
    torch.manual_seed(0)
    model = model_class(VaswaniConfig.from_preset("tiny", vocab_size=200)).eval()
    model.set_attn_implementation("eager")
    ids, mask = padded_batch()
    batch = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids[:, :4], "output_hidden_states": True}
    batch["output_attentions"] = True
    output = model(**batch)
    as_tuple = model(**batch, return_dict=False)
    assert type(as_tuple) is tuple and len(as_tuple) == len(output.to_tuple()) > 3
    for key, value, from_tuple in zip(output.keys(), output.values(), as_tuple, strict=True):
        if torch.is_tensor(value):
            assert torch.equal(from_tuple, value), key
        elif isinstance(value, tuple):
            assert all(torch.equal(a, b) for a, b in zip(from_tuple, value, strict=True)), key
        else:  # the KV cache
            assert type(from_tuple) is type(value) and from_tuple.get_seq_length() == value.get_seq_length(), key
    encoder = model.get_encoder()
    assert torch.equal(encoder(ids, attention_mask=mask, return_dict=False)[0], output.encoder_last_hidden_state)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_encoder_is_not_causal(implementation):
    model = make_model()
    model.set_attn_implementation(implementation)
    ids, mask = padded_batch(lengths=(6,))
    changed = ids.clone()
    changed[0, 4] = 99
    a = model.model.encoder(ids, attention_mask=mask).last_hidden_state
    b = model.model.encoder(changed, attention_mask=mask).last_hidden_state
    assert not torch.allclose(a[:, 0], b[:, 0])


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_padding_is_masked_in_every_attention(implementation):
    model = make_model()
    model.set_attn_implementation(implementation)
    ids, mask = padded_batch(lengths=(7, 4))
    target = torch.tensor([[0, 11, 12, 13, 1, 1], [0, 21, 22, 1, 1, 1]])
    target_mask = target.ne(1).long()
    target_mask[:, 0] = 1
    logits = model(
        input_ids=ids, attention_mask=mask, decoder_input_ids=target, decoder_attention_mask=target_mask
    ).logits
    # Whatever sits under the padding, source or target, changes nothing at the real positions.
    ids2, target2 = ids.clone(), target.clone()
    ids2[1, 4:] = 77
    target2[0, 4:] = 55
    target2[1, 3:] = 66
    logits2 = model(
        input_ids=ids2, attention_mask=mask, decoder_input_ids=target2, decoder_attention_mask=target_mask
    ).logits
    real = target_mask.bool()
    torch.testing.assert_close(logits[real], logits2[real])
    # And each sentence alone gives the same logits as inside the padded batch.
    alone = model(input_ids=ids[1:, :4], decoder_input_ids=target[1:, :3]).logits
    torch.testing.assert_close(alone[0], logits[1, :3], atol=1e-5, rtol=1e-5)


def test_sdpa_and_eager_agree():
    ids, mask = padded_batch()
    target = torch.tensor([[0, 11, 12], [0, 21, 22], [0, 5, 6]])
    eager, sdpa = make_model(), make_model()
    eager.set_attn_implementation("eager")
    torch.testing.assert_close(
        eager(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits,
        sdpa(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits,
        atol=1e-5,
        rtol=1e-5,
    )


def test_label_smoothed_loss_matches_hand_computation(model):
    ids, mask = padded_batch(lengths=(5, 3))
    labels = torch.tensor([[17, 18, 19, 2], [27, 2, -100, -100]])
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    log_probs = out.logits.double().log_softmax(-1)
    eps, vocab = 0.1, 200
    terms = []
    for row, col in [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]:
        target = labels[row, col]
        # q'(k) = (1 - eps) * delta(k, y) + eps / K (Szegedy et al. 2016, cited in §5.4)
        terms.append(-(1 - eps) * log_probs[row, col, target] - eps / vocab * log_probs[row, col].sum())
    assert out.loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)
    # With num_items_in_batch (Trainer, accumulation, DDP) the loss is the sum over that global count.
    out = model(input_ids=ids, attention_mask=mask, labels=labels, num_items_in_batch=10)
    assert out.loss.item() == pytest.approx(torch.stack(terms).sum().item() / 10, rel=1e-5)


def test_pad_labels_are_ignored_like_minus_100(model):
    ids, mask = padded_batch(lengths=(5, 3))
    with_pad = torch.tensor([[17, 18, 2], [27, 2, 1]])
    with_ignore = torch.tensor([[17, 18, 2], [27, 2, -100]])
    decoder_input_ids = shift_tokens_right(with_ignore, 1, 0)
    a = model(input_ids=ids, attention_mask=mask, labels=with_pad, decoder_input_ids=decoder_input_ids).loss
    b = model(input_ids=ids, attention_mask=mask, labels=with_ignore).loss
    assert a.item() == pytest.approx(b.item())


def test_labels_are_shifted_right_after_the_start_token():
    labels = torch.tensor([[5, 6, 2], [7, 2, -100]])
    assert shift_tokens_right(labels, pad_token_id=1, decoder_start_token_id=0).tolist() == [[0, 5, 6], [0, 7, 2]]


def test_learned_positions_option_and_its_limit():
    model = make_model(position_encoding="learned", max_position_embeddings=8)
    assert model.model.encoder.embed_positions.weight.shape == (8, 32)
    ids, mask = padded_batch(lengths=(8,))
    model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids)
    too_long = torch.randint(4, 200, (1, 9))
    with pytest.raises(ValueError, match="max_position_embeddings=8"):
        model(input_ids=too_long, decoder_input_ids=too_long[:, :2])


def test_separate_d_k_and_d_v_run():
    model = make_model(d_k=4, d_v=12)
    ids, mask = padded_batch()
    assert model.model.encoder.layers[0].self_attn.v_proj.weight.shape == (4 * 12, 32)
    logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :3]).logits
    assert logits.shape == (3, 3, 200)


def test_loaded_model_gives_identical_logits_and_auto_classes_resolve(model, tmp_path):
    model.save_pretrained(tmp_path)
    ids, mask = padded_batch()
    target = ids[:, :4]
    reference = model(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is VaswaniForConditionalGeneration
    torch.testing.assert_close(loaded(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits, reference)
    base = AutoModel.from_pretrained(tmp_path).eval()
    assert type(base) is VaswaniModel
    hidden = base(input_ids=ids, attention_mask=mask, decoder_input_ids=target).last_hidden_state
    torch.testing.assert_close(loaded.lm_head(hidden), reference)


def test_output_attentions_with_eager_and_a_clear_error_otherwise():
    model = make_model()
    ids, mask = padded_batch(lengths=(5, 3))
    with pytest.raises(ValueError, match="eager"):
        model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :2], output_attentions=True)
    model.set_attn_implementation("eager")
    out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :2], output_attentions=True)
    assert len(out.encoder_attentions) == 2 and out.cross_attentions[0].shape == (2, 4, 2, 5)
    # Padded source positions get no attention weight; each row sums to one.
    assert torch.all(out.cross_attentions[0][1, :, :, 3:] == 0)
    torch.testing.assert_close(out.cross_attentions[0].sum(-1), torch.ones(2, 4, 2))


def _collate(features):
    width = max(len(f["input_ids"]) for f in features)
    target_width = max(len(f["labels"]) for f in features)
    return {
        "input_ids": torch.tensor([f["input_ids"] + [1] * (width - len(f["input_ids"])) for f in features]),
        "attention_mask": torch.tensor(
            [[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in features]
        ),
        "labels": torch.tensor([f["labels"] + [-100] * (target_width - len(f["labels"])) for f in features]),
    }


def _one_sgd_step(output_dir, batch_size, accumulation=1, dropout=0.0, **arguments):
    """The tiny model after one Seq2SeqTrainer SGD step (lr 1) on `uneven_pairs()` in order."""
    rows = uneven_pairs()
    model = make_model(dropout=dropout)
    args = one_sgd_step_arguments(output_dir, batch_size, accumulation)
    for name, value in arguments.items():
        setattr(args, name, value)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=rows, data_collator=_collate)
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(rows)
    trainer.train()
    return model


def test_gradient_accumulation_under_seq2seq_trainer_matches_one_big_batch(tmp_path):
    """Micro-batches with different token counts: the summed gradient must equal the full batch's (SGD shows it)."""
    one, accumulated = _one_sgd_step(tmp_path / "run1", 4, 1), _one_sgd_step(tmp_path / "run2", 2, 2)
    start = make_model(dropout=0.0)
    moved = (one.model.shared.weight - start.model.shared.weight).abs().max()
    assert moved > 1e-3
    for (name, a), (_, b) in zip(one.named_parameters(), accumulated.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_keeps_1_minus_p_scales_by_its_inverse_and_passes_the_same_mask_back(dtype):
    from vaswani_mt.model.fast_paths_vaswani import apply_dropout

    x = (torch.rand(400, 2500) + 0.5).to(dtype).requires_grad_()
    torch.manual_seed(0)
    y = apply_dropout(x, 0.1, training=True)
    kept = y != 0
    assert y.dtype == dtype
    assert abs(kept.float().mean().item() - 0.9) < 0.002  # 1e6 draws: the standard error is 0.0003
    torch.testing.assert_close(y[kept], (x[kept].float() / 0.9).to(dtype))
    y.backward(torch.full_like(y, 2.0))
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad, torch.where(kept, 2.0 / 0.9, 0.0).to(dtype))
    torch.manual_seed(0)
    assert torch.equal(apply_dropout(x, 0.1, training=True), y)  # the seed decides the mask
    assert apply_dropout(x, 0.1, training=False) is x
    assert apply_dropout(x, 0.0, training=True) is x


def test_training_forward_drops_and_is_reproducible_under_a_seed(model):
    ids, mask = padded_batch()
    batch = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids}
    model.eval()
    with torch.no_grad():
        evaluated = model(**batch).logits
    model.train()
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        with torch.no_grad():
            runs.append(model(**batch).logits)
    model.eval()
    assert torch.equal(runs[0], runs[1])
    assert not torch.allclose(runs[0], evaluated)


def _enable_activation_checkpointing(model) -> None:
    # transformers 5.23 named it activation_checkpointing_enable (gradient_checkpointing_enable, the 5.20-5.22 name,
    # is its deprecated alias since)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def _loss_gradients_and_saved_bytes(model, batch: dict, seed: int):
    """One training forward + backward: the loss, every parameter's gradient, and the bytes autograd kept for the
    backward outside checkpointed layers (a checkpointed layer's own hooks take what is saved inside it)."""
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    model.train()
    model.zero_grad()
    torch.manual_seed(seed)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}, sum(saved)


def test_activation_checkpointing_gives_the_same_loss_and_gradients_and_keeps_fewer_activations():
    """With dropout on, so the replayed layers must draw the same masks as the first pass."""
    ids, mask = padded_batch(lengths=(30, 22, 27))
    labels, _ = padded_batch(seed=1, lengths=(26, 30, 19), pad=-100)
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    model = make_model(dropout=0.1)
    assert model.supports_gradient_checkpointing
    plain_loss, plain_grads, plain_bytes = _loss_gradients_and_saved_bytes(model, batch, seed=5)
    _enable_activation_checkpointing(model)
    layers = [*model.model.encoder.layers, *model.model.decoder.layers]
    assert all(layer.gradient_checkpointing for layer in layers)
    loss, grads, kept_bytes = _loss_gradients_and_saved_bytes(model, batch, seed=5)
    torch.testing.assert_close(loss, plain_loss, rtol=1e-6, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    assert kept_bytes < plain_bytes / 3, (kept_bytes, plain_bytes)
    # A different dropout seed draws other masks: the equality above is not vacuous.
    other_loss, _, _ = _loss_gradients_and_saved_bytes(model, batch, seed=6)
    assert not torch.allclose(other_loss, plain_loss)
    # Caching is off while checkpointed layers train (a replayed layer would write the cache twice)...
    output = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids, use_cache=True)
    assert getattr(output, _CACHE_OUTPUT_FIELD) is None
    # ...and inference, where nothing is checkpointed, decodes as before.
    model.eval()
    plain = make_model(dropout=0.1)
    kwargs = {"max_new_tokens": 6, "min_new_tokens": 6, "num_beams": 2}
    assert torch.equal(
        model.generate(ids, attention_mask=mask, **kwargs), plain.generate(ids, attention_mask=mask, **kwargs)
    )


def test_the_trainers_activation_checkpointing_flag_trains_the_same_step(tmp_path):
    """`scripts/train.py --gradient_checkpointing true` (or, from transformers 5.23, `--activation_checkpointing
    true`): one SGD step with dropout gives the same weights as without (before, the Trainer raised)."""
    fields = Seq2SeqTrainingArguments.__dataclass_fields__
    flag = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    plain = _one_sgd_step(tmp_path / "plain", 4, dropout=0.1)
    checkpointed = _one_sgd_step(tmp_path / "checkpointed", 4, dropout=0.1, **{flag: True})
    assert checkpointed.model.decoder.layers[0].gradient_checkpointing
    start = make_model(dropout=0.1)
    assert (plain.model.shared.weight - start.model.shared.weight).abs().max() > 1e-3
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
