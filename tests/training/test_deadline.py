"""`--job_minutes` (`vaswani_mt.training.deadline`): the whole job on one clock, training stopped in time for the work
after it, whose time is measured once near the end."""

import json
import logging

import pytest
from conftest import make_model
from conftest import train_command as _train_command
from conftest import write_jsonl as _write_jsonl

from vaswani_mt.evaluation.terminology import alphas_to_try, reference_terms
from vaswani_mt.training import deadline
from vaswani_mt.training.deadline import FIXED_SECONDS, MARGIN, WARM_UP, JobDeadline, after_training_seconds


def test_the_deadline_measures_the_work_after_training_once_and_stops_training_with_room_for_it():
    calls = []
    clock = JobDeadline(10, started=1000.0, estimate=lambda: calls.append(1) or 100.0, lead_minutes=5)
    assert not clock.training_must_stop(1000.0 + 200) and calls == []  # 400 s left: not measured yet
    assert not clock.training_must_stop(1000.0 + 320) and calls == [1]  # 280 s left: measured, 100 s needed
    assert not clock.training_must_stop(1000.0 + 490)  # 110 s left
    assert clock.training_must_stop(1000.0 + 505) and calls == [1]  # 95 s left: stop; measured only once
    short = JobDeadline(0.5, started=0.0, estimate=lambda: 10.0)  # shorter than the lead: measured at once
    assert short.training_must_stop(0.0) is False and short.after_seconds == 10.0
    assert short.training_must_stop(0.0 + 25)  # 5 s left, 10 needed
    spent = JobDeadline(0.5, started=0.0, estimate=lambda: 40.0)  # the work after training needs the whole job
    assert spent.training_must_stop(0.0)
    with pytest.raises(ValueError, match="above 0"):
        JobDeadline(0, started=0.0, estimate=lambda: 0.0)


def test_the_estimate_counts_the_test_set_and_each_alpha_on_the_dev_sentences_with_terms(monkeypatch, tokenizer):
    """A fake translation takes 0.5 s a sentence on a fake clock: the estimate is the test set and each alpha's
    constrained dev pass at the sample's rates, as `_score_and_publish` runs them, with the margin and fixed part."""
    now = [0.0]
    translated = []

    def fake_translate(model, tokenizer, sentences, batch_size, constraints=None):
        assert not model.training  # translated in eval mode
        translated.append((len(sentences), constraints))
        now[0] += 0.5 * len(sentences)
        return list(sentences)

    monkeypatch.setattr(deadline, "translate", fake_translate)
    monkeypatch.setattr(deadline.time, "monotonic", lambda: now[0])
    sources = [f"the house number {i} is small" for i in range(40)]
    references = [f"das Gebäude nummer {i} ist klein" if i % 2 else sources[i] for i in range(40)]  # half: no term
    model = make_model().train()  # the paper's alpha 0.6: 0, 0.3 and 0.6 tried
    alphas = alphas_to_try(model)
    termed = sum(bool(t) for t in reference_terms(sources, references))
    assert len(alphas) > 1 and 0 < termed < 40
    seconds = after_training_seconds(model, tokenizer, sources, references, test_sentences=100, choose_alpha=True,
                                     batch_size=16, sample=8)  # fmt: skip
    assert seconds == pytest.approx((0.5 * 100 + 0.5 * termed * len(alphas)) * MARGIN + FIXED_SECONDS)
    assert model.training  # put back as it was
    warm_up, timed = translated[:2], translated[2:]  # untimed first (WARM_UP sentences), plain then with terms
    assert warm_up[0] == (WARM_UP, None) and warm_up[1][0] == WARM_UP and all(warm_up[1][1])
    assert timed[0] == (8, None) and timed[1][0] == 8 and all(timed[1][1])  # the sample: plain, then with terms
    plain = after_training_seconds(model, tokenizer, sources, references, test_sentences=100, choose_alpha=False,
                                   batch_size=16, sample=8)  # fmt: skip
    assert plain == pytest.approx(0.5 * 100 * MARGIN + FIXED_SECONDS)
    translated.clear()
    after_training_seconds(model, tokenizer, sources, references, test_sentences=100, choose_alpha=False, batch_size=16)
    assert translated == [(WARM_UP, None), (16, None)]  # by default the sample is one whole batch


@pytest.mark.usefixtures("restore_rng", "restore_threads")
def test_a_job_with_a_job_budget_stops_training_early_enough_to_end_within_it(tmp_path, caplog):
    """The command in this process: training stops by the deadline (long before --max_steps), and the job, test set
    and constrained alpha included, ends within its minutes."""
    from vaswani_mt.cli.train import main as train_main

    data = _write_jsonl(tmp_path / "pairs.jsonl", count=120)
    output = tmp_path / "run"
    job = 0.4
    command = _train_command(data, output, "--max_steps", "100000", "--job_minutes", str(job), "--test_bleu", "true")
    command = [*command, "--max_eval_samples", "16", "--retain_freed_memory", "false"]
    with caplog.at_level(logging.INFO, logger="vaswani_mt.training.deadline"):
        train_main(command[2:])
    assert "the work after training: about" in caplog.text
    results = json.loads((output / "results.json").read_text())
    assert 0 < results["step"] < 100000 and "score" in results["test"]
    assert results["finished_by"] == "the job's deadline, --job_minutes"  # a finished run: the same command stops
    assert "constrained_length_penalty" in results  # the alpha was chosen after training, inside the job
    assert results["wall_minutes"] <= job * 1.1  # measured on this machine, under its load
