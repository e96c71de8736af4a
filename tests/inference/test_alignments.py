"""Word alignments from cross-attention (`vaswani_mt.inference.alignments`): the same translations with and without
them, Marian's format read back, subword pieces merged into whitespace words, shift-att reading the next step's row,
an ensemble's alignments the mean of its members', and every search (n-best, constraints, prefixes, token budgets)."""

import io

import pytest
import torch
from conftest import ENGLISH, make_model

from vaswani_mt.cli import translate as translate_command
from vaswani_mt.inference.alignments import (
    AlignedTranslation,
    cross_attention,
    default_method,
    format_aligned_line,
    hard_links,
    parse_alignment,
    realign,
    select,
    token_words,
    word_matrix,
)
from vaswani_mt.inference.ensemble import ensemble
from vaswani_mt.inference.streams import translate_stream
from vaswani_mt.inference.translate import translate, translate_nbest
from vaswani_mt.inference.translator import Translator

pytestmark = pytest.mark.usefixtures("one_thread")


def check_indices(aligned: AlignedTranslation, source: str) -> None:
    assert aligned.source_words == source.split() and aligned.target_words == aligned.split()
    assert sorted(t for _, t in aligned.links) == list(range(len(aligned.target_words)))  # one link per target word
    assert all(0 <= s < len(aligned.source_words) for s, _ in aligned.links)


def test_alignments_leave_the_translations_and_the_attention_implementation_as_they_were(fitted):
    model, tokenizer = fitted
    sentences = [*ENGLISH, "", "The  girl ate\tan apple."]
    plain = translate(model, tokenizer, sentences, batch_size=3)
    aligned = translate(model, tokenizer, sentences, batch_size=3, alignments="hard")
    assert aligned == plain and not any(isinstance(text, AlignedTranslation) for text in plain)
    assert model.config._attn_implementation == "sdpa"
    for source, text in zip(sentences, aligned, strict=True):
        assert isinstance(text, AlignedTranslation)
        if source.strip():
            check_indices(text, source)
    assert aligned[-2].links == [] and aligned[-2] == ""


def test_marian_lines_read_back_to_the_links_and_distributions(fitted):
    model, tokenizer = fitted
    hard = translate(model, tokenizer, ENGLISH[:3], alignments="hard")
    soft = translate(model, tokenizer, ENGLISH[:3], alignments="soft")
    for h, s in zip(hard, soft, strict=True):
        text, field = format_aligned_line(h).split(" ||| ")
        assert text == h and parse_alignment(field) == h.links
        rows = parse_alignment(format_aligned_line(s).split(" ||| ")[1])
        assert len(rows) == len(s.target_words) and all(len(row) == len(s.source_words) for row in rows)
        assert all(abs(sum(row) - 1) < 0.01 for row in rows)
        # the hard links are the argmax of the soft rows
        assert [max(range(len(row)), key=row.__getitem__) for row in rows] == [src for src, _ in h.links]


def test_subword_pieces_merge_into_their_whitespace_words(tokenizer):
    text = "The oilprice annoyed us."
    ids = tokenizer(text)["input_ids"]
    words, index = token_words(tokenizer, text, ids)
    pieces = tokenizer.convert_ids_to_tokens(ids)
    assert words == text.split() and len(pieces) > len(words) + 1  # some word has several pieces
    assert index[-1] == -1  # </s> belongs to no word
    assert sorted(set(index[:-1])) == list(range(len(words)))
    assert index[:-1] == sorted(index[:-1])
    # source pieces summed, target pieces averaged, rows renormalised
    attention = torch.tensor([[0.2, 0.3, 0.4, 0.1], [0.5, 0.0, 0.5, 0.0], [0.1, 0.1, 0.7, 0.1]])
    matrix = word_matrix(attention, [0, 0, 1, -1], [0, 1, 1], 2, 2)
    torch.testing.assert_close(matrix, torch.tensor([[5 / 9, 4 / 9], [0.35 / 0.95, 0.6 / 0.95]]))
    mean = word_matrix(attention, [0, 0, 1, -1], [0, 1, 1], 2, 2, merge="mean")
    torch.testing.assert_close(mean[0], torch.tensor([0.25 / 0.65, 0.4 / 0.65]))


def test_shift_att_aligns_a_target_word_from_the_step_that_reads_it():
    # row r of the attention attends to source word r: naive attention links target word i to i, shift-att to i + 1
    attention = torch.eye(5).unsqueeze(0)  # 1 layer, 5 rows (decoder inputs <s> y0 y1 y2 y3), 5 source tokens
    aligned = AlignedTranslation("a b c d", "w x y z v".split(), "a b c d".split())
    aligned.attention, aligned.source_index, aligned.target_index = attention, [0, 1, 2, 3, 4], [0, 1, 2, 3]
    assert realign(aligned, "layer0").links == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert realign(aligned, "shift-layer0").links == [(1, 0), (2, 1), (3, 2), (4, 3)]
    layers = torch.stack([torch.eye(5), torch.eye(5).roll(1, 1)])
    torch.testing.assert_close(select(layers, "shift-mean", 4), layers.mean(0)[1:5])
    torch.testing.assert_close(select(layers, "layer1", 4), layers[1][:4])
    with pytest.raises(ValueError, match="alignment method"):
        select(layers, "layers", 4)


def test_a_model_with_a_supervised_head_aligns_from_that_head_by_name_with_the_same_tokens(fitted):
    model, tokenizer = fitted
    plain = translate(model, tokenizer, ENGLISH[:3])
    mean = translate(model, tokenizer, ENGLISH[:3], alignments="soft")
    assert default_method(model) == "mean"
    with pytest.raises(ValueError, match="alignment_supervision"):
        translate(model, tokenizer, ENGLISH[:1], alignments="hard", alignment_method="supervised")
    model.config.alignment_head = [1, 2]
    try:
        assert default_method(model) == "mean"  # the head measured below the mean (RESULTS.md): asked for by name
        by_default = translate(model, tokenizer, ENGLISH[:3], alignments="soft")
        assert all(torch.equal(a.soft, b.soft) for a, b in zip(by_default, mean, strict=True))
        supervised = translate(model, tokenizer, ENGLISH[:3], alignments="soft", alignment_method="supervised")
        source_ids = tokenizer(ENGLISH[0])["input_ids"]
        output = tokenizer(text_target=str(supervised[0]))["input_ids"][:-1]
        model.set_attn_implementation("eager")
        with torch.no_grad():
            out = model(input_ids=torch.tensor([source_ids]), decoder_input_ids=torch.tensor([[0, *output]]),
                        output_attentions=True)  # fmt: skip
    finally:
        model.config.alignment_head = None
        model.set_attn_implementation("sdpa")
    assert supervised == plain == mean  # the same tokens with and without alignments, by either method
    assert torch.allclose(supervised[0].supervised, out.cross_attentions[1][0, 2].float(), atol=1e-5)
    for s, m in zip(supervised, mean, strict=True):
        assert torch.equal(realign(s, "supervised").soft, s.soft) and torch.equal(realign(s, "mean").soft, m.soft)
    assert any(not torch.allclose(s.soft, m.soft) for s, m in zip(supervised, mean, strict=True))


def test_hard_rules_argmax_intersection_and_threshold():
    soft = torch.tensor([[0.7, 0.3], [0.6, 0.4], [0.1, 0.9]])
    assert hard_links(soft) == [(0, 0), (0, 1), (1, 2)]
    assert hard_links(soft, "intersect") == [(0, 0), (1, 2)]
    assert hard_links(soft, 0.35) == [(0, 0), (0, 1), (1, 1), (1, 2)]


def test_an_ensembles_attention_is_the_mean_of_its_members():
    members = [make_model(seed=1), make_model(seed=2)]
    sources, targets = [[5, 6, 7, 2], [8, 9, 2]], [[10, 11, 12], [13]]
    together = cross_attention(ensemble(members), sources, targets)
    alone = [cross_attention(member, sources, targets) for member in members]
    torch.testing.assert_close(together, (alone[0] + alone[1]) / 2)
    assert together.shape == (2, 2, 4, 4)  # layers, batch, rows (<s> + 3 tokens), source tokens


def test_the_searchs_encoder_states_give_the_attention_of_a_fresh_pass(fitted):
    model, _ = fitted
    sources, targets = [[5, 6, 7, 2], [8, 9, 2]], [[10, 11, 12], [13]]
    ids = torch.tensor([[5, 6, 7, 2], [8, 9, 2, model.config.pad_token_id]])
    mask = (ids != model.config.pad_token_id).long()
    with torch.no_grad():
        states = model.get_encoder()(ids, attention_mask=mask).last_hidden_state
    reused = cross_attention(model, sources, targets, (states, mask))
    torch.testing.assert_close(reused, cross_attention(model, sources, targets), atol=1e-5, rtol=1e-4)
    assert reused.shape == (model.config.num_decoder_layers, 2, 4, 4)


def test_every_search_gives_its_own_tokens_aligned(fitted):
    model, tokenizer = fitted
    sentences = ENGLISH[:4]
    searches = [
        {"num_beams": 1},
        {"max_tokens": 12, "batch_size": None},
        {"constraints": [["Apfel"], [], ["Schnee"], []]},
        {"target_prefixes": ["Das", "", "", "Ich"]},
    ]
    for options in searches:
        plain = translate(model, tokenizer, sentences, **options)
        aligned = translate(model, tokenizer, sentences, alignments="hard", **options)
        assert aligned == plain, options
        for source, text in zip(sentences, aligned, strict=True):
            check_indices(text, source)
    nbest = translate_nbest(model, tokenizer, sentences, 2, alignments="soft")
    plain_nbest = translate_nbest(model, tokenizer, sentences, 2)
    assert [[h.text for h in hs] for hs in nbest] == [[h.text for h in hs] for hs in plain_nbest]
    for source, hypotheses in zip(sentences, nbest, strict=True):
        assert all(h.text.soft.shape == (len(h.text.split()), len(source.split())) for h in hypotheses)
    twice = ensemble([model, model])
    assert translate(twice, tokenizer, sentences, alignments="hard") == translate(model, tokenizer, sentences)


def test_the_stream_and_the_command_write_marian_lines(fitted, fitted_folder, tmp_path, capfd):
    model, tokenizer = fitted
    sink = io.BytesIO()
    translate_stream(Translator(model, tokenizer, alignments="hard"), io.BytesIO("\n".join(ENGLISH[:2]).encode()), sink)
    lines = sink.getvalue().decode().splitlines()
    plain = translate(model, tokenizer, ENGLISH[:2])
    assert [line.split(" ||| ")[0] for line in lines] == plain
    source = tmp_path / "in.txt"
    source.write_text("\n".join(ENGLISH[:2]) + "\n")
    translate_command.main(["--model", str(fitted_folder), "--input", str(source), "--alignments", "hard"])
    assert capfd.readouterr().out.splitlines() == lines
