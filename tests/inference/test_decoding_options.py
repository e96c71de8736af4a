"""Decoding options (issue 31): n-best lists in Marian's format, seeded sampling for back-translation and
token-budget batches, each with the paper's beam search and with greedy search, on lists and on streams, and the
one-line errors of the scripts for options that do not go together."""

import io
import re

import pytest
import torch
from conftest import ENGLISH, make_model, run_main

from vaswani_mt.cli import evaluate as evaluate_cli
from vaswani_mt.cli import translate as translate_cli
from vaswani_mt.inference.batching import token_budget_batches
from vaswani_mt.inference.streams import translate_stream
from vaswani_mt.inference.translate import (
    Sampling,
    format_nbest,
    translate,
    translate_nbest,
)
from vaswani_mt.inference.translator import Translator
from vaswani_mt.model.beam_search_vaswani import gnmt_length_penalty

pytestmark = pytest.mark.usefixtures("one_thread")

# Lines of 1 to 30 tokens, a blank one among them.
LINES = [*ENGLISH, "apple", "", " ".join(ENGLISH[:3]), "How are you?", ENGLISH[2] + " " + ENGLISH[5], "café"]
# The paper's search (beam 4, GNMT penalty, |X| + b) with a short limit; greedy search with the same limit.
SEARCHES = {"beam4": {"max_len_b": 12}, "greedy": {"num_beams": 1, "max_len_b": 12}}
NBEST_LINE = re.compile(r"^(\d+) \|\|\| (.*) \|\|\| F0= (-?\d+\.\d{6}) \|\|\| (-?\d+\.\d{6})$")


def _nbest_rows(text: str) -> list[tuple[int, str, float, float]]:
    """The (ID, translation, F0, score) of each line of an n-best list; every line must be in Marian's format."""
    rows = [NBEST_LINE.match(line).groups() for line in text.splitlines()]
    return [(int(i), hypothesis, float(f0), float(score)) for i, hypothesis, f0, score in rows]


def _assert_same_nbest(text: str, expected: str) -> None:
    """The same IDs and hypotheses, and the same numbers up to float noise (a batch's padding moves the last digit)."""
    rows, expected_rows = _nbest_rows(text), _nbest_rows(expected)
    assert [row[:2] for row in rows] == [row[:2] for row in expected_rows]
    numbers = [number for row in rows for number in row[2:]]
    assert numbers == pytest.approx([number for row in expected_rows for number in row[2:]], abs=1e-5)


def test_token_budget_batches_pack_longest_first_within_the_budget_and_put_a_too_long_line_alone():
    lengths = [3, 9, 4, 30, 9, 1, 5, 12, 2, 9]
    batches = token_budget_batches(lengths, max_tokens=20)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert [lengths[i] for batch in batches for i in batch] == sorted(lengths, reverse=True)
    assert batches[0] == [3]  # 30 tokens > 20: alone
    for batch in batches[1:]:
        assert len(batch) * max(lengths[i] for i in batch) <= 20
    assert batches[1:3] == [[7], [1, 4]]  # 12 + 12 > 20; two 9s (ties in input order), a third would be 27
    assert all(len(batch) <= 2 for batch in token_budget_batches(lengths, 1000, max_sentences=2))
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        token_budget_batches(lengths, 0)


@pytest.mark.parametrize("search", SEARCHES.values(), ids=SEARCHES)
def test_max_tokens_batches_translate_to_the_same_tokens_as_fixed_size_batches(fitted, search, caplog):
    model, tokenizer = fitted
    fixed = translate(model, tokenizer, LINES, batch_size=3, **search)
    with caplog.at_level("WARNING", logger="vaswani_mt.inference.translate"):
        budget = translate(model, tokenizer, LINES, batch_size=None, max_tokens=29, **search)
    assert budget == fixed
    assert sum(len(text.split()) > 2 for text in fixed) >= 5  # real translations were compared
    # LINES[8] (three sentences, 30 tokens) is over the budget: translated alone, and the warning names its line
    assert "line 9: 30 source tokens, more than max_tokens=29: translated in a batch of its own" in caplog.text
    translator = Translator(model, tokenizer, batch_size=None, chunk_size=4, max_tokens=29, generate_kwargs=search)
    assert list(translator.translate_iterable(LINES)) == fixed


def _teacher_forced(model, source_ids: torch.Tensor, target: list[int]) -> float:
    """log P(target | source): the sum of log-softmax of the logits at the target's tokens (EOS included)."""
    decoder_input = torch.tensor([[model.config.decoder_start_token_id, *target[:-1]]])
    logits = model(input_ids=source_ids, decoder_input_ids=decoder_input).logits[0].float()
    return float(logits.detach().log_softmax(-1).gather(-1, torch.tensor(target)[:, None]).sum())


@pytest.mark.parametrize("search", SEARCHES.values(), ids=SEARCHES)
def test_nbest_lists_are_best_first_with_the_search_score_and_the_teacher_forced_log_probability(fitted, search):
    model, tokenizer = fitted
    nbest = 4 if search.get("num_beams", 4) == 4 else 1
    lists = translate_nbest(model, tokenizer, LINES, nbest, batch_size=3, **search)
    assert [hypotheses[0].text for hypotheses in lists] == translate(model, tokenizer, LINES, **search)
    alpha, eos, pad = model.generation_config.length_penalty, tokenizer.eos_token_id, tokenizer.pad_token_id
    for line, hypotheses in zip(LINES, lists, strict=True):
        assert len(hypotheses) == nbest
        if not line.strip():
            assert set(hypotheses) == {("", 0.0, 0.0)}
            continue
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
        # The hypotheses as token ids: the search of this line alone (a line's search does not depend on its batch)
        source = tokenizer(line, return_tensors="pt")["input_ids"]
        rows = model.generate(input_ids=source, num_return_sequences=nbest, **search).tolist()
        for h, row in zip(hypotheses, rows, strict=True):
            target = row[1 : row.index(eos) + 1] if eos in row else [t for t in row[1:] if t != pad]
            assert h.text == tokenizer.decode(target, skip_special_tokens=True).strip()
            # F0 is log P(Y|X) under teacher forcing; the score, the search's, is F0 over the GNMT penalty (§6.1)
            assert h.log_prob == pytest.approx(_teacher_forced(model, source, target), abs=1e-4)
            assert h.score == pytest.approx(h.log_prob / gnmt_length_penalty(len(target), alpha), abs=1e-4)
    if nbest > 1:
        assert len({h.text for h in lists[0]}) == nbest  # distinct hypotheses


def test_nbest_stream_writes_k_marian_lines_per_line_with_ids_in_input_order(fitted):
    model, tokenizer = fitted
    sink = io.BytesIO()
    data = "\n".join(LINES).encode()
    assert (
        translate_stream(Translator(model, tokenizer, batch_size=2, chunk_size=5, nbest=3), io.BytesIO(data), sink)
        == 12
    )
    rows = _nbest_rows(sink.getvalue().decode())
    assert [row[0] for row in rows] == [i for i in range(len(LINES)) for _ in range(3)]
    assert rows[3 * 7 : 3 * 8] == [(7, "", 0.0, 0.0)] * 3  # the blank line keeps its 3 lines
    assert "7 |||  ||| F0= 0.000000 ||| 0.000000\n" in sink.getvalue().decode()
    expected = translate_nbest(model, tokenizer, LINES, 3, max_tokens=40)
    _assert_same_nbest(sink.getvalue().decode(), "".join(format_nbest(i, h) for i, h in enumerate(expected)))


def test_sampling_depends_on_the_seed_and_the_line_but_not_on_batches_or_chunks(fitted):
    model, tokenizer = fitted
    lines = [ENGLISH[i % 6] for i in range(12)]
    search = {"max_new_tokens": 12}
    one = translate(model, tokenizer, lines, batch_size=1, sampling=Sampling(seed=5, temperature=1.5), **search)
    assert translate(model, tokenizer, lines, sampling=Sampling(seed=5, temperature=1.5), **search) == one
    budget = translate(model, tokenizer, lines, batch_size=None, max_tokens=25,
                       sampling=Sampling(seed=5, temperature=1.5), **search)  # fmt: skip
    stream = io.BytesIO()
    translator = Translator(
        model, tokenizer, batch_size=4, chunk_size=5, sampling=True, seed=5, temperature=1.5, generate_kwargs=search
    )
    translate_stream(translator, io.BytesIO("\n".join(lines).encode()), stream)
    assert stream.getvalue().decode().splitlines() == one
    assert budget == one
    assert len(set(one)) > 6  # a line's draws depend on its position: the six sentences twice, sampled apart
    other = translate(model, tokenizer, lines, sampling=Sampling(seed=6, temperature=1.5), **search)
    assert other != one
    # top-k = 1 (or a near-zero temperature) leaves the search nothing to draw: greedy search's output
    greedy = translate(model, tokenizer, lines, num_beams=1, **search)
    assert translate(model, tokenizer, lines, sampling=Sampling(seed=5, top_k=1), **search) == greedy
    assert translate(model, tokenizer, lines, sampling=Sampling(seed=5, temperature=1e-4), **search) == greedy
    # ... also where |X| + b ends a sentence: EOS is forced there even though top-k left it out
    cut = {"max_len_b": 2}
    sampled = translate_nbest(model, tokenizer, lines[:6], 1, sampling=Sampling(top_k=1), **cut)
    searched = translate_nbest(model, tokenizer, lines[:6], 1, num_beams=1, **cut)
    assert [h[0].text for h in sampled] == [h[0].text for h in searched]
    assert [h[0].log_prob for h in sampled] == pytest.approx([h[0].log_prob for h in searched], abs=1e-5)


def test_sampling_draws_first_tokens_with_the_model_probabilities_within_top_k(tokenizer):
    model = make_model(seed=3)  # untrained: a spread-out first-token distribution
    source = ENGLISH[0]
    encoded = tokenizer(source, return_tensors="pt")
    start = torch.full((1, 1), model.config.decoder_start_token_id)
    with torch.no_grad():
        logits = model(**encoded, decoder_input_ids=start).logits[0, -1].float()
    top = logits.topk(5)
    expected: dict[str, float] = {}
    for probability, token in zip(top.values.softmax(-1).tolist(), top.indices.tolist(), strict=True):
        text = tokenizer.decode([token], skip_special_tokens=True).strip()
        expected[text] = expected.get(text, 0.0) + probability
    draws = 3000
    samples = translate(model, tokenizer, [source] * draws, batch_size=draws, max_new_tokens=1,
                        sampling=Sampling(seed=0, top_k=5))  # fmt: skip
    counts = {text: samples.count(text) / draws for text in set(samples)}
    assert set(counts) <= set(expected)
    total_variation = sum(abs(counts.get(text, 0.0) - p) for text, p in expected.items()) / 2
    assert total_variation < 0.04, (counts, expected)


# ---------------------------------------------------------------------------------------------------------------
# The scripts


BAD_OPTIONS = {
    "nbest above the beam": (["--nbest", "5"], "nbest=5 is more than the beam size (4)"),
    "nbest above greedy's beam": (["--nbest", "2", "--num_beams", "1"], "nbest=2 is more than the beam size (1)"),
    "sampling with nbest": (["--sampling", "--nbest", "2"], "sampling draws one translation per line: nbest must be 1"),
    "sampling with beams": (
        ["--sampling", "--num_beams", "4"],
        "sampling draws one translation per line with one beam",
    ),
    "max_tokens 0": (["--max_tokens", "0"], "max_tokens must be at least 1, got 0"),
    "top-p 0": (["--sampling", "--topp", "0"], "top-p must be in (0, 1], got 0.0"),
    "top-p above 1": (["--sampling", "--topp", "1.5"], "top-p must be in (0, 1], got 1.5"),
    "temperature 0": (["--sampling", "--temperature", "0"], "the temperature must be above 0, got 0.0"),
    "temperature below 0": (["--sampling", "--temperature", "-1"], "the temperature must be above 0, got -1.0"),
    "top-k below 0": (["--sampling", "--topk", "-1"], "top-k must be 0 (all tokens) or more, got -1"),
    "seed without sampling": (["--seed", "3", "--topp", "0.9"], "--topp, --seed only go with --sampling"),
}


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS.values(), ids=BAD_OPTIONS)
def test_translate_script_refuses_options_that_do_not_go_together_in_one_line(fitted_folder, monkeypatch, options,
                                                                               message):  # fmt: skip
    stdout, code = run_main(translate_cli, ["--model", str(fitted_folder), *options], monkeypatch, b"How are you?\n")
    assert stdout == "" and isinstance(code, str)
    assert code.startswith("error: ") and "\n" not in code and message in code, code


def test_evaluate_script_writes_the_nbest_file_and_scores_its_best(fitted_folder, fitted, tmp_path, monkeypatch):
    source, reference = tmp_path / "test.en", tmp_path / "test.de"
    source.write_text("\n".join(ENGLISH[:3]) + "\n")
    reference.write_text("Das Mädchen hat einen Apfel gegessen.\nWie geht es Ihnen heute?\nDie Straße.\n")
    files = ["--model", str(fitted_folder), "--source_file", str(source), "--reference_file", str(reference)]
    assert run_main(evaluate_cli, [*files, "--nbest", "5", "--nbest_file", "x"], monkeypatch)[1] == (
        "error: nbest=5 is more than the beam size (4): the search keeps 4 hypotheses"
    )
    assert (
        run_main(evaluate_cli, [*files, "--nbest", "2"], monkeypatch)[1]
        == "error: --nbest and --nbest_file go together"
    )
    plain, _ = run_main(evaluate_cli, [*files, "--num_beams", "1"], monkeypatch)
    nbest_file = tmp_path / "test.nbest"
    with_nbest, code = run_main(evaluate_cli, [*files, "--num_beams", "1", "--nbest", "1", "--nbest_file",
                                           str(nbest_file), "--max_tokens", "20"], monkeypatch)  # fmt: skip
    assert code is None and with_nbest == plain  # the same scores
    model, tokenizer = fitted
    expected = translate_nbest(model, tokenizer, ENGLISH[:3], 1, num_beams=1)
    _assert_same_nbest(nbest_file.read_text(), "".join(format_nbest(i, h) for i, h in enumerate(expected)))


def test_translate_script_options_nbest_sampling_and_max_tokens(fitted_folder, monkeypatch):
    lines = [*ENGLISH, "", "How are you?"]
    data = ("\n".join(lines) + "\n").encode()
    model = ["--model", str(fitted_folder)]
    plain, code = run_main(translate_cli, [*model, "--batch_size", "2"], monkeypatch, data)
    assert code is None and len(plain.splitlines()) == len(lines)
    assert run_main(translate_cli, [*model, "--max_tokens", "24", "--buffer_size", "5"], monkeypatch, data)[0] == plain
    nbest, _ = run_main(translate_cli, [*model, "--nbest", "2", "--max_tokens", "40"], monkeypatch, data)
    rows = _nbest_rows(nbest)
    assert [row[0] for row in rows] == [i for i in range(len(lines)) for _ in range(2)]
    assert [row[1] for row in rows[::2]] == plain.splitlines()  # the best of each list is the translation
    sampled = [run_main(translate_cli, [*model, "--sampling", "--seed", str(seed), "--temperature", "2", "--topp",
                                    "0.95"], monkeypatch, data)[0] for seed in (1, 1, 2)]  # fmt: skip
    assert sampled[0] == sampled[1] != sampled[2]
    assert len(sampled[0].splitlines()) == len(lines) and sampled[0].splitlines()[6] == ""


def test_early_stopping_option_gives_the_library_rule_of_that_name(fitted, fitted_folder, monkeypatch):
    """--early_stopping never|true|false searches as translate(..., early_stopping="never"|True|False) does: the
    search's stopping test gets that rule, and the lines are the call's."""
    from vaswani_mt.model import beam_search_vaswani

    model, tokenizer = fitted
    data = ("\n".join(ENGLISH) + "\n").encode()
    rules, can_improve = [], beam_search_vaswani.can_improve

    def spy(**kwargs):
        rules.append(kwargs["early_stopping"])
        return can_improve(**kwargs)

    monkeypatch.setattr(beam_search_vaswani, "can_improve", spy)
    for word, rule in (("never", "never"), ("true", True), ("false", False)):
        rules.clear()
        out, code = run_main(
            translate_cli, ["--model", str(fitted_folder), "--early_stopping", word], monkeypatch, data
        )
        assert code is None and rules and set(rules) == {rule}
        assert out.splitlines() == translate(model, tokenizer, ENGLISH, early_stopping=rule)
    _, code = run_main(
        translate_cli, ["--model", str(fitted_folder), "--early_stopping", "sometimes"], monkeypatch, data
    )
    assert code == 2  # argparse: invalid choice
