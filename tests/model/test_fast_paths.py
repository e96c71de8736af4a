"""The speed paths compute what the plain ones do: the training loss without logits, prepacked weights for decoding,
the cached sinusoids, the beam cache reordering and bf16 autocast."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import make_model, padded_batch

import vaswani_mt.model.fast_paths_vaswani as fast_paths
import vaswani_mt.model.modeling_vaswani as modeling
from vaswani_mt import sinusoidal_position_encoding
from vaswani_mt.export.marian import to_marian

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]

LABELS = torch.tensor([[5, 6, 7, 8, 2, -100, -100], [9, 10, 2, 1, 1, 1, 1], [11, 12, 13, 14, 15, 16, 2]])


def reference_loss(model, ids, mask, labels, num_items=None):
    """Logits over every position, then F.cross_entropy with label smoothing, in the model's dtype."""
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_input_ids).logits
    targets = labels.masked_fill(labels == model.config.pad_token_id, -100)
    total = F.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum", label_smoothing=0.1
    )
    return total / (num_items if num_items is not None else targets.ne(-100).sum())


def gradients(model):
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("chunk_elements", [2**26, 3 * 200])  # one chunk; chunks of 3 rows (the loop and its seams)
@pytest.mark.parametrize("num_items", [None, 40])
def test_training_loss_without_logits_equals_cross_entropy_on_logits_in_float64(monkeypatch, chunk_elements, num_items):
    monkeypatch.setattr(fast_paths, "_LOSS_CHUNK_ELEMENTS", chunk_elements)
    model = make_model(seed=1, dropout=0.0).double().train()
    ids, mask = padded_batch(seed=2, lengths=(7, 4, 5))
    out = model(input_ids=ids, attention_mask=mask, labels=LABELS, num_items_in_batch=num_items)
    assert out.logits is None  # training asks for the loss only
    (3.0 * out.loss).backward()  # a scaled loss: backward must scale the stored gradients
    fused = gradients(model)
    reference = reference_loss(model, ids, mask, LABELS, num_items)
    (3.0 * reference).backward()
    assert abs(out.loss.item() - reference.item()) < 1e-12
    for name, grad in gradients(model).items():
        assert (fused[name] - grad).abs().max().item() < 1e-12, name


def test_training_loss_with_no_real_target_token_is_zero_with_zero_gradients():
    model = make_model(dropout=0.0).train()
    ids, mask = padded_batch(lengths=(5, 3))
    out = model(input_ids=ids, attention_mask=mask, labels=torch.full((2, 3), -100))
    out.loss.backward()
    assert out.loss.item() == 0.0 and model.lm_head.weight.grad.abs().max().item() == 0.0


def test_eval_mode_and_no_grad_still_return_logits_and_the_same_loss():
    model = make_model(seed=3, dropout=0.0)
    ids, mask = padded_batch(seed=1, lengths=(7, 4, 5))
    train_loss = model.train()(input_ids=ids, attention_mask=mask, labels=LABELS).loss
    with torch.no_grad():
        no_grad = model(input_ids=ids, attention_mask=mask, labels=LABELS)
    evaluated = model.eval()(input_ids=ids, attention_mask=mask, labels=LABELS)
    assert no_grad.logits is not None and evaluated.logits.shape == (3, 7, 200)
    assert train_loss.item() == pytest.approx(evaluated.loss.item(), rel=1e-6)
    assert no_grad.loss.item() == pytest.approx(evaluated.loss.item(), rel=1e-6)


def test_bf16_autocast_training_follows_float32():
    model = make_model(seed=4, dropout=0.0).train()
    ids, mask = padded_batch(seed=3, lengths=(7, 4, 5))
    fp32 = model(input_ids=ids, attention_mask=mask, labels=LABELS).loss
    fp32.backward()
    reference = gradients(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = model(input_ids=ids, attention_mask=mask, labels=LABELS).loss
    bf16.backward()
    assert bf16.dtype == torch.float32 and bf16.item() == pytest.approx(fp32.item(), rel=1e-2)
    for name, grad in gradients(model).items():
        assert grad.dtype == torch.float32
        cosine = F.cosine_similarity(grad.flatten(), reference[name].flatten(), dim=0).item()
        assert cosine > 0.98, name


needs_onednn = pytest.mark.skipif(not fast_paths._ONEDNN_LINEAR, reason="this torch has no oneDNN prepacked linear")


@needs_onednn
def test_prepacked_inference_products_equal_the_linear_layers_and_follow_weight_updates(monkeypatch):
    model = make_model(seed=5)
    ids, mask = padded_batch(seed=4, lengths=(7, 4, 5))
    target = torch.tensor([[0, 5, 6], [0, 7, 8], [0, 9, 10]])
    with torch.no_grad():
        packed = model(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
        assert fast_paths._REORDERED.get(model.lm_head) is not None  # the prepacked path was taken
        monkeypatch.setattr(fast_paths, "_ONEDNN_LINEAR", False)
        plain = model(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
        torch.testing.assert_close(packed, plain, atol=1e-5, rtol=1e-5)
        monkeypatch.setattr(fast_paths, "_ONEDNN_LINEAR", True)
        # An in-place update (what an optimizer step does) must reach the next prepacked call.
        model.model.decoder.layers[0].ffn.fc2.weight.mul_(2.0)
        model.lm_head.weight.add_(0.01)
        updated = model(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
        monkeypatch.setattr(fast_paths, "_ONEDNN_LINEAR", False)
        torch.testing.assert_close(
            updated, model(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits, atol=1e-5, rtol=1e-5
        )
        assert (updated - packed).abs().max().item() > 1e-3


@needs_onednn
def test_a_products_result_depends_on_its_shapes_alone_not_on_the_calls_before_it():
    """Rows shrink as sentences leave; one reordered copy serves every row count. Whatever came before, a product
    equals the one computed first in a fresh process, bit for bit (a resumed run writes the whole run's bytes), and
    equals the linear layer to round-off; no row count reorders the weight again."""
    layer = make_model(seed=5).model.decoder.layers[0].ffn.fc1
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the commands' default: two threads split the sums, one does not
    try:
        with torch.no_grad():
            for rows in (64, 7):
                probe = torch.randn(rows, layer.in_features, generator=torch.Generator().manual_seed(rows))
                fast_paths._REORDERED.pop(layer, None)
                first = fast_paths._project(layer, probe)  # the first call of a fresh process
                copy = fast_paths._REORDERED[layer][1]
                for run, calls in [(rows, 3), (60, 2), (56, 3), (52, 3), (48, 3), (300, 1), (rows, 1)]:
                    for _ in range(calls):  # a run of calls at one row count, as a batch decodes
                        states = torch.randn(run, layer.in_features)
                        torch.testing.assert_close(fast_paths._project(layer, states), layer(states), atol=1e-5, rtol=0)
                    assert torch.equal(fast_paths._project(layer, probe), first), (rows, run)
                assert fast_paths._REORDERED[layer][1] is copy
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(torch.bfloat16 not in fast_paths._PREPACKED_DTYPES, reason="oneDNN has no native bf16 here")
def test_bf16_prepacked_products_give_the_plain_bf16_tokens_and_the_tied_projection_stays_tied(monkeypatch):
    """The bfloat16 compute type (`model.to(torch.bfloat16)`) multiplies by reordered bf16 weights: the same tokens as
    plain bf16 products, the pre-softmax projection still the embeddings' matrix (§3.4)."""
    model = make_model(seed=2).to(torch.bfloat16).eval()
    ids, mask = padded_batch(seed=3, lengths=(7, 4, 5))
    with torch.no_grad():
        tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8)
        assert fast_paths._REORDERED[model.lm_head][0][-1] == torch.bfloat16  # the prepacked path was taken
        assert model.lm_head.weight is model.model.shared.weight
        monkeypatch.setattr(fast_paths, "_PREPACKED_DTYPES", (torch.float32,))
        assert torch.equal(model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8), tokens)


def test_prepacked_products_need_both_onednn_ops_and_without_them_are_the_linear_layer(monkeypatch):
    """The prepacked path calls two private oneDNN ops (reordering a weight, multiplying by it): a torch without
    either takes `linear(states)`, bit for bit, and touches neither."""
    assert not fast_paths._has_onednn_linear(SimpleNamespace(_linear_pointwise=None))
    assert not fast_paths._has_onednn_linear(SimpleNamespace(_reorder_linear_weight=None))
    layer = make_model(seed=5).model.decoder.layers[0].ffn.fc1
    states = torch.randn(3, 1, layer.in_features, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(fast_paths, "_ONEDNN_LINEAR", False)
    monkeypatch.setattr(torch.ops, "mkldnn", SimpleNamespace())  # as a build without them: a call would raise
    with torch.no_grad():
        assert torch.equal(fast_paths._project(layer, states), layer(states))
    assert layer not in fast_paths._REORDERED


def test_cached_sinusoids_equal_the_formula_at_any_offset():
    model = make_model()
    decoder = model.model.decoder
    ids = torch.full((1, 3), 5)
    for past_length in (0, 7, 300, 1000):  # 300 and 1000 outgrow the first table
        expected = decoder.embed_tokens(ids) * decoder.embed_scale + sinusoidal_position_encoding(
            torch.arange(past_length, past_length + 3), 32, torch.float32
        )
        assert torch.equal(decoder.embed(ids, past_length), expected)


def test_beam_search_leaves_the_encoder_attention_cache_in_place_and_matches_marian():
    model = make_model(seed=6)
    marian = to_marian(model)
    ids, mask = padded_batch(seed=7, lengths=(8, 5, 6))
    kwargs = dict(input_ids=ids, attention_mask=mask, num_beams=4, min_new_tokens=9, max_new_tokens=9)
    assert torch.equal(model.generate(**kwargs, length_penalty=0.6), marian.generate(**kwargs, length_penalty=0.6))
    cache = modeling.EncoderDecoderCache(modeling.DynamicCache(), modeling.DynamicCache())
    keys = torch.arange(4.0).view(4, 1, 1, 1)
    cache.self_attention_cache.update(keys, keys.clone(), 0)
    cache.cross_attention_cache.update(keys, keys.clone(), 0)
    model.reorder_beam_cache(cache, torch.tensor([1, 1, 0, 3]))
    assert cache.self_attention_cache.layers[0].keys.flatten().tolist() == [1, 1, 0, 3]
    assert cache.cross_attention_cache.layers[0].keys.flatten().tolist() == [0, 1, 2, 3]


def test_generate_compiled_with_a_static_cache_on_cpu_gives_the_eager_tokens():
    """torch.compile'd decoding (`cache_implementation="static"` + a `CompileConfig`): inductor cannot lower the
    prepacked product of `_project`, which raised inside the compiled forward; compiled code takes `linear` instead."""
    from transformers import CompileConfig

    model = make_model(seed=3)
    ids, mask = padded_batch(seed=1, lengths=(6, 4))
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 5, "min_new_tokens": 5, "num_beams": 1}
    config = CompileConfig(mode="default")
    config._compile_all_devices = True  # transformers compiles on accelerators only unless told (CPU: for tests)
    eager = model.generate(**kwargs)
    torch._dynamo.reset()
    try:
        compiled = model.generate(**kwargs, cache_implementation="static", compile_config=config)
    finally:
        torch._dynamo.reset()
    assert torch.equal(compiled, eager)


def test_without_torchs_private_functions_every_fast_path_falls_back_to_the_same_numbers(monkeypatch):
    model = make_model(seed=1, dropout=0.0).train()
    ids, mask = padded_batch(seed=2, lengths=(7, 4, 5))
    loss = model(input_ids=ids, attention_mask=mask, labels=LABELS).loss.item()
    with torch.no_grad():
        tokens = model.eval().generate(input_ids=ids, attention_mask=mask, max_len_b=6)
    # As a torch without them: the private functions gone, their feature checks false.
    monkeypatch.delattr(torch, "_log_softmax")
    monkeypatch.setattr(fast_paths, "_LOG_SOFTMAX_OUT", False)
    monkeypatch.setattr(fast_paths, "_ONEDNN_LINEAR", False)
    assert model.train()(input_ids=ids, attention_mask=mask, labels=LABELS).loss.item() == pytest.approx(loss, abs=1e-6)
    with torch.no_grad():
        assert torch.equal(model.eval().generate(input_ids=ids, attention_mask=mask, max_len_b=6), tokens)


def compiled_training_loss(model, ids, mask, labels, num_items):
    """The model's training loss under torch.compile (aot_eager: the graph inductor would get): a graph break
    raises (fullgraph). Returns the loss and the number of graphs compiled."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    run = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
    loss = run(input_ids=ids, attention_mask=mask, labels=labels, num_items_in_batch=num_items).loss
    return loss, counters["stats"]["unique_graphs"] - before


def test_compiled_training_loss_is_one_graph_equal_to_cross_entropy_on_logits_in_float64(monkeypatch):
    """In 4 chunks (a row budget that splits the tiny vocabulary so: ceil(200 * 2^20 / 2^26)); the 21 positions are
    padded to 24."""
    monkeypatch.setattr(fast_paths, "_COMPILED_LOSS_ROWS", 2**20)
    model = make_model(seed=1, dropout=0.0).double().train()
    ids, mask = padded_batch(seed=2, lengths=(7, 4, 5))
    loss, graphs = compiled_training_loss(model, ids, mask, LABELS, torch.tensor(40))
    assert graphs == 1
    (3.0 * loss).backward()
    compiled = gradients(model)
    reference = reference_loss(model, ids, mask, LABELS, 40)
    (3.0 * reference).backward()
    assert abs(loss.item() - reference.item()) < 1e-12
    for name, grad in gradients(model).items():
        assert (compiled[name] - grad).abs().max().item() < 1e-12, name


def test_compiled_training_loss_holds_one_chunk_of_log_probabilities_not_the_batchs(monkeypatch):
    """The peak of torch's CPU allocations over the compiled loss's forward and backward (aot_eager), at 1,024
    positions x 2,048 words (8 MiB of float32 log-probabilities): in 16 chunks under half of them, in one chunk (the
    same function, the measure's control) above them."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from loss_memory import inputs, peak_bytes

    hidden, weight, labels, scale = inputs(rows=1024, vocab=2048, d_model=16, padding=0.1)
    whole = 1024 * 2048 * 4
    peaks = {}
    for rows in (2**19, 1):  # 16 chunks: ceil(2048 * 2^19 / 2^26); 1 chunk
        monkeypatch.setattr(fast_paths, "_COMPILED_LOSS_ROWS", rows)
        torch._dynamo.reset()
        run = torch.compile(fast_paths.chunked_label_smoothed_cross_entropy, backend="aot_eager", dynamic=True)

        def step(run=run):
            hidden.grad = weight.grad = None
            run(hidden, weight, labels, 0.1, scale).backward()

        step()
        peaks[rows] = peak_bytes(step)
    sys.modules.pop("loss_memory", None)
    assert peaks[2**19] < whole / 2 < whole < peaks[1], peaks
