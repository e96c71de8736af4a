"""The training recipe (§5): schedule, loss under DDP, the time budget across a resume, averaging, and the whole job
on small data. Kills, preemption, damaged checkpoints and exact resumes: test_faults.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from conftest import train_command as _train_command
from conftest import write_jsonl as _write_jsonl
from safetensors.torch import load_file
from transformers import TrainerState

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration, training
from vaswani_mt.data.batching import length_array
from vaswani_mt.data.corpus import SPLITS, load_corpus
from vaswani_mt.data.tokenization import train_tokenizer
from vaswani_mt.training.arguments import parse_args
from vaswani_mt.training.callbacks import trained_seconds
from vaswani_mt.training.checkpoints import (
    average_checkpoints,
    last_checkpoint,
    list_checkpoints,
    log_history,
)
from vaswani_mt.training.trainer import VaswaniTrainer, paper_learning_rate

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
ACCELERATE = str(Path(PYTHON).parent / "accelerate")


def test_learning_rate_at_step_1_warmup_and_100000():
    d, w = 512, 4000
    assert paper_learning_rate(1, d, w) == pytest.approx(512**-0.5 * 4000**-1.5)  # not zero on the first update
    assert paper_learning_rate(4000, d, w) == pytest.approx((512 * 4000) ** -0.5)  # the peak, 6.99e-4
    assert paper_learning_rate(4000, d, w) == pytest.approx(6.9877e-4, rel=1e-4)
    assert paper_learning_rate(100_000, d, w) == pytest.approx(512**-0.5 * 100_000**-0.5)
    assert paper_learning_rate(4001, d, w) < paper_learning_rate(4000, d, w) > paper_learning_rate(3999, d, w)
    assert paper_learning_rate(10, d, w, scale=2.0) == pytest.approx(2 * paper_learning_rate(10, d, w))


def test_trainer_uses_the_papers_schedule_and_adam(tmp_path):
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", d_model=512, num_heads=8))
    args_tuple = parse_args(["--output_dir", str(tmp_path), "--report_to", "none"])
    training_args = args_tuple[3]
    trainer = VaswaniTrainer(model=model, args=training_args, lr_schedule="paper")
    trainer.create_optimizer_and_scheduler(num_training_steps=200_000)
    optimizer, scheduler = trainer.optimizer, trainer.lr_scheduler
    group = optimizer.param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.9, 0.98), 1e-9, 0.0)
    assert group["lr"] == pytest.approx(paper_learning_rate(1, 512, 4000))  # the lr the first update uses
    for step in (4000, 100_000):  # lr used by update `step` = after step - 1 scheduler steps
        assert scheduler.lr_lambdas[0](step - 1) == pytest.approx(paper_learning_rate(step, 512, 4000))
    # --lr_scale multiplies Eq. (3); the Trainer's --learning_rate (its default 5e-5 here) plays no part in it
    scaled = VaswaniTrainer(model=model, args=training_args, lr_schedule="paper", lr_scale=2.0)
    scaled.create_optimizer_and_scheduler(num_training_steps=200_000)
    assert scaled.optimizer.param_groups[0]["lr"] == pytest.approx(2 * paper_learning_rate(1, 512, 4000))
    with pytest.raises(ValueError, match="above 0"):
        VaswaniTrainer(model=model, args=training_args, lr_scale=0.0)


def test_two_process_ddp_gives_the_same_loss_and_update_as_one_process(tmp_path):
    """Micro-batches of unequal token counts: the global mean must not become a mean of per-rank means."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    worker = str(ROOT / "tests" / "ddp_worker.py")
    single, double = tmp_path / "single", tmp_path / "double"
    subprocess.run([PYTHON, worker, str(single), "4", "--use_cpu"], check=True, env=env, capture_output=True)
    launch = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    launch += ["--main_process_port", str(_free_port())]
    launch += ["--mixed_precision", "no", "--dynamo_backend", "no", worker, str(double), "2", "--use_cpu"]
    result = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = (json.loads((d / "result.json").read_text()) for d in (single, double))
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert two["group_left"]  # leave_process_group closed the group (an open one made 1 exit in 4 abort)
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    a, b = load_file(single / "weights.safetensors"), load_file(double / "weights.safetensors")
    moved = False
    start = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=200)).state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=1e-5, msg=key)
        moved |= key in start and not torch.allclose(a[key], start[key]) if a[key].shape == start[key].shape else 0
    assert moved


def test_main_job_under_two_cpu_processes_publishes_and_scores_once(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2 scripts/train.py --use_cpu`: trains with DDP, then rank 0
    alone averages, scores the test split and writes the folder, and both processes exit 0."""
    data = _write_jsonl(tmp_path / "pairs.jsonl", count=300)
    output = tmp_path / "run"
    train = _train_command(data, output, "--max_steps", "4", "--average_last", "2", "--test_bleu", "true")
    train += ["--max_eval_samples", "12", "--use_cpu"]
    launch = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    launch += ["--main_process_port", str(_free_port()), "--mixed_precision", "no", "--dynamo_backend", "no"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(launch + train[1:], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("test sacreBLEU") == 1  # printed by rank 0 only
    results = json.loads((output / "results.json").read_text())
    assert 0.0 <= results["test"]["score"] <= 100.0
    assert [r["step"] for r in _history(output) if "loss" in r] == [1, 2, 3, 4]
    assert (output / "model.safetensors").exists() and (output / "README.md").exists()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _history(output: Path) -> list[dict]:
    return json.loads((output / "trainer_state.json").read_text())["log_history"]


def test_the_time_budget_counts_on_after_a_resume_and_a_spent_budget_trains_no_further(tmp_path):
    data = _write_jsonl(tmp_path / "pairs.jsonl", count=60)
    output = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    budget = ["--time_budget_minutes", "0.5", "--checkpoint_minutes", "0.4", "--disable_tqdm", "false"]
    first = subprocess.run(_train_command(data, output, "--max_steps", "4", *budget), env=env, capture_output=True,
                           text=True)  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert "/0.5 min" in first.stderr  # the progress bar counts the budget's minutes, not max_steps
    before = trained_seconds(TrainerState.load_from_json(str(output / "checkpoint-4" / "trainer_state.json")))
    assert 0.0 < before < 30.0
    second = subprocess.run(_train_command(data, output, "--max_steps", "6", *budget), env=env, capture_output=True,
                            text=True)  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from {output / 'checkpoint-4'} ({before / 60:.1f} minutes trained)" in second.stderr
    after = trained_seconds(TrainerState.load_from_json(str(output / "checkpoint-6" / "trainer_state.json")))
    assert after > before  # counted on from the first run's seconds, not from 0
    logged = {row["step"]: row["learning_rate"] for row in _history(output) if "learning_rate" in row}
    # Eq. (3) goes on across the resume: tiny's d_model 32, --warmup_steps 4
    assert [logged[n] for n in (2, 3, 5, 6)] == pytest.approx([paper_learning_rate(n, 32, 4) for n in (2, 3, 5, 6)])

    # a run whose budget is spent (here: recorded as spent) is scored again, not trained one step further
    state_file = output / "checkpoint-6" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["stateful_callbacks"]["WallClockCallback"]["attributes"]["trained_seconds"] = 30.0
    state_file.write_text(json.dumps(state))
    third = subprocess.run(_train_command(data, output, "--max_steps", "100", *budget), env=env, capture_output=True,
                           text=True)  # fmt: skip
    assert third.returncode == 0, third.stderr[-3000:]
    assert "trained the whole time budget (0.5 minutes): no more training" in third.stderr
    assert [c.name for c in list_checkpoints(output)] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert json.loads((output / "trainer_state.json").read_text())["global_step"] == 6


def test_averaging_writes_the_mean_of_the_last_k_checkpoints(tmp_path):
    checkpoints = tmp_path / "run"
    models = []
    for step, seed in ((1, 0), (2, 1), (3, 2)):
        torch.manual_seed(seed)
        model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny"))
        folder = checkpoints / f"checkpoint-{step}"
        model.save_pretrained(folder)
        (folder / "trainer_state.json").write_text("{}")
        models.append(model)
    (checkpoints / "checkpoint-4").mkdir()  # incomplete: ignored
    out = average_checkpoints(checkpoints, last=2, output=tmp_path / "avg")
    averaged = VaswaniForConditionalGeneration.from_pretrained(out)
    expected = (models[1].model.shared.weight + models[2].model.shared.weight) / 2
    torch.testing.assert_close(averaged.model.shared.weight, expected)
    assert averaged.lm_head.weight is averaged.model.shared.weight
    torch.testing.assert_close(
        averaged.model.decoder.layers[0].ffn.fc1.bias,
        (models[1].model.decoder.layers[0].ffn.fc1.bias + models[2].model.decoder.layers[0].ffn.fc1.bias) / 2,
    )
    assert not (out / "trainer_state.json").exists()
    # A window that ends earlier: checkpoints 1 and 2.
    window = VaswaniForConditionalGeneration.from_pretrained(
        average_checkpoints(checkpoints, last=2, output=tmp_path / "avg2", up_to_step=2)
    )
    torch.testing.assert_close(
        window.model.shared.weight, (models[0].model.shared.weight + models[1].model.shared.weight) / 2
    )
    with pytest.raises(FileNotFoundError, match="up to step 0"):
        average_checkpoints(checkpoints, last=2, output=tmp_path / "avg0", up_to_step=0)
    with pytest.raises(ValueError, match="checkpoints"):
        average_checkpoints(checkpoints, last=2, output=checkpoints)


def test_average_script_loads_in_a_fresh_process(tmp_path):
    checkpoints = tmp_path / "run"
    for step in (1, 2):
        torch.manual_seed(step)
        folder = checkpoints / f"checkpoint-{step}"
        VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny")).save_pretrained(folder)
        (folder / "trainer_state.json").write_text("{}")
    out = tmp_path / "averaged"
    subprocess.run(
        [PYTHON, str(ROOT / "scripts" / "average_checkpoints.py"), "--checkpoint_dir", str(checkpoints),
         "--last", "2", "--output", str(out)], check=True, capture_output=True,
    )  # fmt: skip
    probe = (
        "import sys, vaswani_mt; from transformers import AutoModelForSeq2SeqLM as A; A.from_pretrained(sys.argv[1])"
    )
    subprocess.run([PYTHON, "-c", probe, str(out)], check=True, capture_output=True)


def test_end_to_end_job_on_local_jsonl(tmp_path):
    """The main job, small: trains, averages the last checkpoints, scores the test split, writes a Hub folder."""
    data = _write_jsonl(tmp_path / "pairs.jsonl", count=400)
    output = tmp_path / "run"
    command = _train_command(data, output, "--max_steps", "8", "--average_last", "3", "--test_bleu", "true")
    command += ["--eval_bleu", "true", "--eval_strategy", "steps", "--eval_steps", "4", "--max_eval_samples", "12"]
    command += ["--length_penalty", "0.9"]  # saved in generation_config.json: the test BLEU and later searches use it
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test sacreBLEU" in result.stdout and "signature: nrefs:1|case:mixed" in result.stdout
    files = {p.name for p in output.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "modeling_vaswani.py", "tokenizer.json",
            "README.md", "results.json", "training_curves.png"} <= files  # fmt: skip
    assert "training_args.bin" not in files  # no pickle in the published folder
    results = json.loads((output / "results.json").read_text())
    assert 0.0 <= results["test"]["score"] <= 100.0
    card = (output / "README.md").read_text()
    assert f"value: {round(results['test']['score'], 2)}" in card and "checkpoint-8" in card
    assert "CPU (" in card and ", float32;" in card  # the hardware and the precision it trained in
    assert "Search: beam 4, GNMT length penalty α = 0.9," in card
    for folder in (output, output / "checkpoint-8"):
        saved = json.loads((folder / "generation_config.json").read_text())
        assert (saved["num_beams"], saved["length_penalty"]) == (4, 0.9)
    history = _history(output)
    logged = [r for r in history if "loss" in r]
    assert all(r["target_tokens_per_step"] > 0 and r["target_tokens_per_second"] > 0 for r in logged)
    assert logged[0]["learning_rate"] > 0
    evaluated = [r for r in history if "eval_bleu" in r]
    assert [r["step"] for r in evaluated] == [4, 8] and all(0 <= r["eval_bleu"] <= 100 for r in evaluated)

    # benchmarks/search_and_averaging.py: {final, mean of last 3} x {beam 4, greedy} on the same 12 test pairs
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import search_and_averaging
    finally:
        sys.path.pop(0)
    table = tmp_path / "search.json"
    search_and_averaging.main([
        str(output), "--dataset", str(data), "--average_last", "2,3", "--length_penalties", "1.0",
        "--search", "max_len_a=0,max_len_b=1", "--max_samples", "12", "--json", str(table),
    ])  # fmt: skip
    rows = {(r["weights"].split(" (")[0], r["search"]): r for r in json.loads(table.read_text())["rows"]}
    searches = (
        "beam 4 (paper)", "greedy", "beam 4, alpha 0.9 (saved)", "beam 4, alpha 1.0", "beam 4, max_len_a=0,max_len_b=1"
    )  # fmt: skip
    assert set(rows) == {(w, s) for w in ("final", "mean of last 2", "mean of last 3") for s in searches}
    assert "checkpoint-4 .. checkpoint-8" in rows["mean of last 3", "greedy"]["weights"]
    assert "checkpoint-6 .. checkpoint-8" in rows["mean of last 2", "greedy"]["weights"]
    # the averaged model with its saved search is what the job published and scored
    assert rows["mean of last 3", "beam 4, alpha 0.9 (saved)"]["bleu"] == round(results["test"]["score"], 2)
    # --search reaches generate(): at most one token per sentence (its EOS) leaves nothing to score
    assert rows["final", "beam 4, max_len_a=0,max_len_b=1"]["bleu"] == 0.0
    with pytest.raises(SystemExit, match="'no_repeat_ngram_size' is not KEY=VALUE"):
        search_and_averaging.parse_search("length_penalty=1.0,no_repeat_ngram_size")
    assert search_and_averaging.parse_search("length_penalty=1.2,no_repeat_ngram_size=3,do_sample=false") == {
        "length_penalty": 1.2,
        "no_repeat_ngram_size": 3,
        "do_sample": False,
    }

    # benchmarks/loss_at_minutes.py: the losses logged near each minute mark, from the last checkpoint's log
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import loss_at_minutes
    finally:
        sys.path.pop(0)
    points = loss_at_minutes.logged_losses(output)
    assert len(points) == len(logged) and points[-1][1] == logged[-1]["loss"]
    minute = points[-1][0]
    mean = sum(r["loss"] for r in logged) / len(logged)
    assert loss_at_minutes.loss_at(points, minute, window=1e9) == mean
    assert loss_at_minutes.loss_at(points, minute + 10, window=1.0) is None
    rows = loss_at_minutes.table([output], [minute + 10, minute], window=1.0).splitlines()
    assert rows[0] == f"| minute | {output.name} |" and rows[2] == f"| {minute + 10:g} |  |"
    assert rows[3] == f"| {minute:g} | {loss_at_minutes.loss_at(points, minute, 1.0):.3f} |"
    with pytest.raises(FileNotFoundError, match="no checkpoint-N folder"):
        loss_at_minutes.logged_losses(tmp_path)
    # run_summary (printed under the table): updates, epochs, the median logged tokens per second, the last loss
    summary = loss_at_minutes.run_summary(output)
    speeds = sorted(r["target_tokens_per_second"] for r in logged)
    assert summary["steps"] == 8 and summary["epochs"] == history[-1]["epoch"] > 0
    assert summary["final_train_loss"] == logged[-1]["loss"]
    assert summary["median_target_tokens_per_second"] == speeds[len(speeds) // 2]
    rows = loss_at_minutes.summary([output]).splitlines()
    median, epochs = speeds[len(speeds) // 2], summary["epochs"]
    assert rows[2] == f"| {output.name} | 8 | {epochs:.2f} | {median:,.0f} | {logged[-1]['loss']:.3f} |"
    # same_steps: a run against itself has every logged loss equal; a changed loss is found at its step
    same = loss_at_minutes.same_steps(output, output)
    assert same == {
        "common": len(logged),
        "last_common": logged[-1]["step"],
        "equal": len(logged),
        "first_different": None,
    }
    changed = tmp_path / "changed"
    changed.mkdir()
    edited = [dict(row, loss=row["loss"] + 1) if row.get("step") == logged[1]["step"] and "loss" in row else row
              for row in history]  # fmt: skip
    (changed / "trainer_state.json").write_text(json.dumps({"log_history": edited}))
    same = loss_at_minutes.same_steps(output, changed)
    assert (same["equal"], same["first_different"]) == (len(logged) - 1, logged[1]["step"])
    # log_history: the run's own final state, else (a run cut off by its time budget) its last checkpoint's
    assert log_history(output) == history
    (output / "trainer_state.json").rename(tmp_path / "state.json")
    last_state = json.loads((last_checkpoint(output) / "trainer_state.json").read_text())
    assert log_history(output) == last_state["log_history"]


def test_marian_benchmark_runs_both_models_through_the_same_pipeline(tmp_path):
    data = _write_jsonl(tmp_path / "pairs.jsonl", count=300)
    config = tmp_path / "bench.yaml"
    config.write_text(
        f"dataset: {data}\npreset: tiny\nvocab_size: 300\nmax_tokens_per_batch: 256\nwarmup_steps: 4\n"
        "max_steps: 4\nsave_steps: 2\naverage_last: 2\nreport_to: none\nlogging_steps: 1\n"
    )
    result = subprocess.run(
        [PYTHON, str(ROOT / "benchmarks" / "train_vs_marian.py"), "--config", str(config),
         "--output_dir", str(tmp_path / "bench"), "--max_eval_samples", "10", "--disable_tqdm", "true"],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| vaswani_mt |" in result.stdout and "| marian |" in result.stdout
    marian_config = json.loads((tmp_path / "bench" / "marian" / "config.json").read_text())
    assert marian_config["model_type"] == "marian" and marian_config["d_model"] == 32
    # the same tokenizer for both: Marian reused the first run's
    ours = json.loads((tmp_path / "bench" / "vaswani_mt" / "tokenizer.json").read_text())["model"]["vocab"]
    theirs = json.loads((tmp_path / "bench" / "marian" / "tokenizer.json").read_text())["model"]["vocab"]
    assert ours == theirs
    # the BLEU-vs-minutes curve of both runs, from their checkpoints
    curves = tmp_path / "curves.json"
    result = subprocess.run(
        [PYTHON, str(ROOT / "benchmarks" / "checkpoint_curve.py"), str(tmp_path / "bench" / "vaswani_mt"),
         str(tmp_path / "bench" / "marian"), "--dataset", str(data), "--max_samples", "8", "--average_last", "2",
         "--json", str(curves), "--plot", str(tmp_path / "curves.png")],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    points = json.loads(curves.read_text())
    for name in ("vaswani_mt:validation", "marian:validation"):
        assert [p["step"] for p in points[name]] == [2, 4]
        assert 0 < points[name][0]["minutes"] < points[name][1]["minutes"]
        assert all(0 <= p["bleu"] <= 100 and p["nll"] > 0 and p["train_nll"] > 0 for p in points[name])
        assert "avg2_bleu" in points[name][1]
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_the_bpe_is_learned_from_a_stream_of_the_corpus_or_a_sample_of_it(tmp_path, monkeypatch):
    pairs = [{"en": f"The house number {i} is small.", "de": f"Das Haus Nummer {i} ist klein."} for i in range(300)]
    corpus = {"train": datasets.Dataset.from_dict({"translation": pairs})}
    model_args, data_args, _, _ = parse_args(["--vocab_size", "120"])
    seen = {}
    real = training.train_tokenizer

    def spy(texts, **kwargs):
        seen["type"] = type(texts)
        texts = list(texts)
        seen["texts"] = texts
        return real(texts, **kwargs)

    monkeypatch.setattr(training, "train_tokenizer", spy)
    full = training.build_tokenizer(model_args, corpus, data_args, tmp_path / "full")
    assert not issubclass(seen["type"], (list, tuple))  # a stream, never a list of every sentence
    # all sources, then all targets, in corpus order: the vocabulary the old list gave, token for token
    assert seen["texts"] == [p["en"] for p in pairs] + [p["de"] for p in pairs]
    assert full.get_vocab() == real(seen["texts"], vocab_size=120).get_vocab()
    model_args.tokenizer_sample = 50
    training.build_tokenizer(model_args, corpus, data_args, tmp_path / "sample")
    assert len(seen["texts"]) == 100 and set(seen["texts"][:50]) <= {p["en"] for p in pairs}
    assert seen["texts"][50:] == [next(p["de"] for p in pairs if p["en"] == en) for en in seen["texts"][:50]]


def test_tokenization_in_several_processes_is_cached_beside_a_corpus_on_disk_and_reused(tmp_path):
    pairs = [{"en": "The house is" + " very" * (i % 9) + " small.", "de": "Das Haus ist" + " sehr" * (i % 9) + "."}
             for i in range(400)]  # fmt: skip
    features = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})
    folder = tmp_path / "corpus"
    datasets.DatasetDict(
        {split: datasets.Dataset.from_dict({"translation": pairs}, features=features) for split in SPLITS}
    ).save_to_disk(str(folder))
    tokenizer = train_tokenizer([t for p in pairs for t in p.values()], vocab_size=120, min_frequency=1)
    one = parse_args(["--max_source_length", "12", "--max_target_length", "12"])[1]
    two = parse_args(["--max_source_length", "12", "--max_target_length", "12", "--preprocessing_num_workers", "2"])[1]
    plain = training.tokenize_corpus(load_corpus(str(folder)), tokenizer, one)["train"]
    first = training.tokenize_corpus(load_corpus(str(folder)), tokenizer, two)["train"]
    assert first["input_ids"] == plain["input_ids"] and 0 < len(first) < 400  # the length filter dropped some
    cached = {Path(f["filename"]) for f in first.cache_files if Path(f["filename"]).parent.parent == folder}
    assert cached, "map wrote its result beside the corpus"
    stamps = {path: path.stat().st_mtime_ns for path in cached}
    again = training.tokenize_corpus(load_corpus(str(folder)), tokenizer, two)["train"]
    assert {Path(f["filename"]) for f in again.cache_files} >= cached  # the same files, read again
    assert {path: path.stat().st_mtime_ns for path in cached} == stamps  # not written a second time
    assert again["labels"] == first["labels"]
    assert list(length_array(again, "source_length")) == list(again["source_length"])  # through the filter's mapping
