"""Early stopping on dev BLEU (`--metric_for_best_model bleu --early_stopping_patience P`): the run stops after P
evaluations without improvement, logs eval_bleu, keeps the best checkpoint past --save_total_limit, publishes the
mean of the --average_last checkpoints ending at the best, and a finished run started again trains no further.
Bad combinations of the options end in one line. Tiny runs in this process, the dev BLEU replaced by a fixed
sequence of scores (the real score: tests/training/test_job.py's end-to-end job)."""

import json
import logging
from pathlib import Path

import pytest
import torch
from conftest import write_jsonl
from safetensors.torch import load_file

from vaswani_mt.cli.train import main as train_main
from vaswani_mt.training import job
from vaswani_mt.training.arguments import parse_args

pytestmark = [pytest.mark.usefixtures("restore_rng", "restore_threads"), pytest.mark.transformers_internals]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("early") / "pairs.jsonl", count=200)


def _argv(data: Path, output: Path, *extra: str) -> list[str]:
    """A tiny run that evaluates (greedy dev BLEU on 4 pairs) and checks the metric every 2 steps."""
    return [
        "--dataset", str(data), "--output_dir", str(output), "--preset", "tiny", "--vocab_size", "300",
        "--max_tokens_per_batch", "256", "--warmup_steps", "4", "--logging_steps", "2", "--save_steps", "100000",
        "--report_to", "none", "--dropout", "0.0", "--seed", "3", "--test_bleu", "false", "--disable_tqdm", "true",
        "--retain_freed_memory", "false", "--max_steps", "40", "--max_eval_samples", "4",
        "--eval_strategy", "steps", "--eval_steps", "2", "--metric_for_best_model", "bleu", *extra,
    ]  # fmt: skip


def _train(monkeypatch, argv: list[str], scores: list[float]) -> dict:
    """run_training in this process, the dev BLEU of the i-th evaluation being scores[i]."""
    remaining = list(scores)
    monkeypatch.setattr(job, "_bleu_metric", lambda tokenizer: lambda prediction: {"bleu": remaining.pop(0)})
    torch.set_num_threads(1)
    return job.run_training(*parse_args(argv))


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def _checkpoint_steps(folder: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("checkpoint-")) for p in folder.glob("checkpoint-*"))


def _state(folder: Path) -> dict:
    return json.loads((folder / "trainer_state.json").read_text())


def test_training_stops_after_patience_evaluations_without_improvement_and_publishes_the_mean_ending_at_the_best(
    pairs, tmp_path, monkeypatch, caplog
):
    output = tmp_path / "run"
    argv = _argv(pairs, output, "--early_stopping_patience", "3", "--average_last", "2", "--save_total_limit", "6")
    with caplog.at_level(logging.INFO, logger="vaswani_mt.training.job"):
        result = _train(monkeypatch, argv, [5.0, 6.0, 7.0, 6.5, 7.0, 2.0, 99.0])
    assert "dev BLEU at each evaluation: greedy search, each sentence at most its length + 50 tokens" in caplog.text
    state = _state(output)
    # best at step 6; 8, 10 (equal is no improvement) and 12 do not improve: stopped at 12, not at max_steps 40
    assert state["global_step"] == 12
    assert [(r["step"], r["eval_bleu"]) for r in state["log_history"] if "eval_bleu" in r] == [
        (2, 5.0), (4, 6.0), (6, 7.0), (8, 6.5), (10, 7.0), (12, 2.0)
    ]  # fmt: skip
    assert Path(state["best_model_checkpoint"]).name == "checkpoint-6" and state["best_metric"] == 7.0
    # a checkpoint at every evaluation (--save_steps 100000 saves none)
    assert _checkpoint_steps(output) == [2, 4, 6, 8, 10, 12]
    assert result["best"] == {"metric": "eval_bleu", "value": 7.0, "checkpoint": "checkpoint-6",
                              "stopped_early": True, "published": ["checkpoint-4", "checkpoint-6"]}  # fmt: skip
    assert json.loads((output / "results.json").read_text())["best"] == result["best"]
    published, four, six = _weights(output), _weights(output / "checkpoint-4"), _weights(output / "checkpoint-6")
    assert not torch.equal(four["model.shared.weight"], six["model.shared.weight"])
    for name, tensor in published.items():
        torch.testing.assert_close(tensor, ((four[name].double() + six[name].double()) / 2).float(), rtol=0, atol=0)
    assert (output / "training_curves.png").stat().st_size > 0

    finished_by = json.loads((output / "results.json").read_text())["finished_by"]
    assert finished_by == "early stopping, --early_stopping_patience"
    # The same command again leaves the finished run as it is (runs.py); resumed, it trains no further, as it
    # stopped early; --average_last 1 publishes the best itself.
    assert _train(monkeypatch, argv, [])["finished_before"]["step"] == 12
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vaswani_mt.training.job"):
        again = _train(monkeypatch, [*argv, "--average_last", "1", "--resume_from_checkpoint", "last"], [])
    assert "stopped early (3 evaluations without improvement): no more training" in caplog.text
    assert _state(output)["global_step"] == 12 and again["best"]["published"] == ["checkpoint-6"]
    published = _weights(output)
    assert all(torch.equal(tensor, six[name]) for name, tensor in published.items())


def test_save_total_limit_keeps_the_best_checkpoint_and_average_last_1_publishes_it(pairs, tmp_path, monkeypatch):
    output = tmp_path / "run"
    argv = _argv(pairs, output, "--early_stopping_patience", "2", "--average_last", "1", "--save_total_limit", "2")
    _train(monkeypatch, argv, [7.0, 5.0, 6.0])
    assert _state(output)["global_step"] == 6
    # checkpoint-2, the best, outlives checkpoint-4 although --save_total_limit 2 keeps the 2 newest
    assert _checkpoint_steps(output) == [2, 6]
    best = _weights(output / "checkpoint-2")
    assert all(torch.equal(tensor, best[name]) for name, tensor in _weights(output).items())


@pytest.mark.parametrize(
    "options, message",
    [
        (["--early_stopping_patience", "3"], "--early_stopping_patience needs --metric_for_best_model"),
        (["--metric_for_best_model", "bleu", "--eval_bleu", "false", "--eval_strategy", "steps"],
         "--metric_for_best_model bleu needs dev BLEU, which --eval_bleu false (from the command line) turns off"),
        (["--metric_for_best_model", "accuracy", "--eval_strategy", "steps"],
         "--metric_for_best_model accuracy: no evaluation computes it; choose bleu (dev BLEU) or loss (dev loss)"),
        (["--metric_for_best_model", "bleu", "--early_stopping_patience", "0", "--eval_strategy", "steps"],
         "--early_stopping_patience must be at least 1"),
        (["--metric_for_best_model", "bleu", "--early_stopping_patience", "3"],
         "--early_stopping_patience needs evaluations during training: add --eval_strategy steps --eval_steps N"),
        (["--metric_for_best_model", "loss", "--eval_strategy", "steps", "--save_strategy", "no"],
         "--metric_for_best_model loss chooses the best of the saved checkpoints, and --save_strategy no saves none"),
    ],
)  # fmt: skip
def test_a_bad_early_stopping_option_ends_in_one_line(options, message, tmp_path):
    with pytest.raises(SystemExit) as stop:
        train_main(["--output_dir", str(tmp_path), "--report_to", "none", *options])
    text = str(stop.value.code)
    assert text.startswith("error: ") and "\n" not in text and message in text, text
