"""The benchmark scripts run end to end on tiny shapes: the speed benchmarks' equality checks pass and their ratio
fields are printed; the Marian comparison trains both models through one pipeline; the scripts that read a training
run (search and averaging, an ensemble, the run's summary) read the main job's small run (conftest.py's `job_run`)."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import rng_kept, torch_threads, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """Imports a module of benchmarks/; what the benchmark changes process-wide (torch's thread count, the seeds of
    every RNG) is put back after the test, and so is sys.path."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    with torch_threads(), rng_kept():
        yield lambda name: importlib.import_module(name)
    for name in ("speed_common", "speed", "quality", "scale"):
        sys.modules.pop(name, None)


def test_training_step_benchmark_checks_the_same_function_and_prints_ratios(bench, tmp_path, capsys):
    out = tmp_path / "train.json"
    bench("speed").main(
        ["train", "--preset", "tiny", "--vocab_size", "300", "--batch", "4", "--length", "6", "--repeats", "2",
         "--warmup", "1", "--threads", "1", "--no-memory", "--json", str(out)]
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["check"]["same_function"] and result["check"]["loss_rel_gap"] < 1e-5
    assert set(result["sides"]) == {"vaswani_mt", "vaswani_mt_bf16", "marian"}
    for side in ("vaswani_mt", "vaswani_mt_bf16"):
        assert result["sides"][side]["ratio_of_medians"] > 0 and result["sides"][side]["median_of_ratios"] > 0
    assert "machine" in result["record"] and "torch" in result["record"]["versions"]
    printed = capsys.readouterr().out
    assert "| vaswani_mt |" in printed and "ratio_of_medians" in printed


def test_checkpointed_step_sides_train_with_activation_checkpointing_and_the_same_losses(bench, tmp_path):
    train = bench("speed")
    args = train.train_args(["--preset", "tiny", "--vocab_size", "300", "--dropout", "0"])
    config = train.model_config(args)
    names = ["vaswani_mt", "vaswani_mt_checkpointed", "marian", "marian_checkpointed"]
    models = dict(zip(names, train.build_models(config, names, seed=0), strict=True))
    for name, model in models.items():
        flags = {
            module.gradient_checkpointing for module in model.modules() if hasattr(module, "gradient_checkpointing")
        }
        assert flags == {name.endswith("_checkpointed")}, name
    batch = train.synthetic_batch(config, 4, 6, seed=0)
    losses = {}
    for name, model in models.items():
        step = train.make_step(name, model, train.optimizer_for(model, 1e-3))
        losses[name] = [step(batch) for _ in range(2)]  # the second loss follows the first update
    for name in ("vaswani_mt", "marian"):
        assert losses[f"{name}_checkpointed"] == pytest.approx(losses[name], rel=1e-5)
    out = tmp_path / "step.json"
    train.main(
        ["train", "--preset", "tiny", "--vocab_size", "300", "--batch", "4", "--length", "6", "--repeats", "1",
         "--warmup", "0", "--threads", "1", "--no-memory", "--sides", "vaswani_mt,vaswani_mt_checkpointed",
         "--json", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text())["sides"]["vaswani_mt_checkpointed"]["ratio_of_medians"] > 0


def test_decoding_benchmark_finds_identical_tokens_and_prints_ratios(bench, tmp_path, capsys):
    out = tmp_path / "decode.json"
    bench("speed").main(
        ["decode", "--preset", "tiny", "--vocab_size", "300", "--length", "6", "--steps", "4", "--batches", "1,3",
         "--repeats", "1", "--threads", "1", "--no-memory", "--json", str(out)]
    )  # fmt: skip
    cases = json.loads(out.read_text())["cases"]
    assert {(c["search"], c["batch"]) for c in cases} == {("beam4", 1), ("beam4", 3), ("greedy", 1), ("greedy", 3)}
    assert all(c["identical_tokens"] and c["ratio_of_medians"] > 0 for c in cases)
    assert "| beam4 | 3 | True |" in capsys.readouterr().out


def test_decoding_benchmark_times_the_opt_in_bf16_sides_against_marian_fp32(bench, tmp_path, capsys):
    out = tmp_path / "decode.json"
    bench("speed").main(
        ["decode", "--preset", "tiny", "--vocab_size", "300", "--length", "6", "--steps", "4", "--batches", "3",
         "--bf16",
         "--searches", "beam4", "--repeats", "1", "--threads", "1", "--no-memory", "--json", str(out)]
    )  # fmt: skip
    (case,) = json.loads(out.read_text())["cases"]
    assert case["identical_tokens"]  # the float32 pair still matches
    assert set(case["ratios_of_medians"]) == {"vaswani_mt", "marian", "vaswani_mt_bf16", "marian_bf16"}
    assert case["ratios_of_medians"]["marian"] == 1.0 and case["ratios_of_medians"]["vaswani_mt_bf16"] > 0
    shares = case["share_equal_to_marian_fp32"]
    assert shares["vaswani_mt"] == shares["marian"] == 1.0 and 0.0 <= shares["vaswani_mt_bf16"] <= 1.0
    assert "vaswani_mt_bf16 x" in capsys.readouterr().out


@pytest.mark.usefixtures("one_thread")  # a tiny model on 2 threads of the busy 2-core VM: 110 s against 13
def test_peers_benchmark_reports_every_sides_bleu_and_the_targets_ratios_from_its_medians(bench, tmp_path, monkeypatch):
    pytest.importorskip("ctranslate2")
    speed, common = bench("speed"), bench("speed_common")
    from vaswani_mt.evaluation.terminology import reference_terms

    sources, references = [en for en, _ in common.PAIRS], [de for _, de in common.PAIRS]  # batches of 4 and 2
    monkeypatch.setattr(speed, "split_pairs", lambda split, limit=None: (sources, references))
    out = tmp_path / "peers.json"
    speed.main(["peers", "--model", str(common.tiny_model_folder(tmp_path / "model")), "--batch", "4", "--repeats", "2",
                "--threads", "1", "--json", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    sides = result["sides"]
    from vaswani_mt.system import native_bf16

    assert set(sides) == {"ours float32", "ours int8", "MarianMTModel float32", "CTranslate2 float32",
                          "CTranslate2 int8", "ours no terms", "ours one term", speed.THROUGH,
                          f"{speed.THROUGH}, own ranking", *(["ours bfloat16"] if native_bf16() else [])}  # fmt: skip
    for row in sides.values():
        assert isinstance(row["bleu"], float) and row["sentences_per_s"] > 0 and len(row["seconds"]) == 2
    with_term = sum(bool(terms) for terms in reference_terms(sources, references))
    assert result["sentences"] == 6 and result["sentences_with_a_term"] == with_term > 0
    for name, (side, other, at_least) in speed.PEER_TARGETS.items():
        ratio = result["ratios"][name]
        expected = sides[side]["sentences_per_s"] / sides[other]["sentences_per_s"]
        assert ratio["ratio_of_medians"] == pytest.approx(expected, abs=1e-3)
        assert ratio["met"] == (sides[side]["sentences_per_s"] >= at_least * sides[other]["sentences_per_s"])
    assert result["ratios"]["ours float32 / MarianMTModel float32"]["ratio_of_medians"] == pytest.approx(
        1 / sides["MarianMTModel float32"]["ratio_to_ours float32"], rel=0.01
    )


@pytest.mark.usefixtures("one_thread")
def test_peers_count_work_counts_each_sides_decoder_steps_and_rows_without_timing(bench, tmp_path, monkeypatch):
    """`peers --count_work` (issue 62, item 1): ours and CTranslate2 on the same lines, their decoder steps and rows;
    where both translate alike, each sentence is searched as many steps on both sides (CTranslate2's counted from its
    outputs by its rules), and both decode one row per sentence at the first step, so as many row-steps."""
    pytest.importorskip("ctranslate2")
    speed, common = bench("speed"), bench("speed_common")
    sources, references = [en for en, _ in common.PAIRS], [de for _, de in common.PAIRS]
    monkeypatch.setattr(speed, "split_pairs", lambda split, limit=None: (sources, references))
    out = tmp_path / "work.json"
    speed.main(["peers", "--model", str(common.tiny_model_folder(tmp_path / "model")), "--batch", "4", "--threads", "1",
                "--count_work", "--json", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    ours, theirs = result["work"]["ours float32"], result["work"]["CTranslate2 float32"]
    for row in (ours, theirs):
        assert row["row_steps"] >= row["decoder_steps"] > 0 and isinstance(row["bleu"], float)
        assert row["rows_per_step"] == round(row["row_steps"] / row["decoder_steps"], 2)
    if result["identical_lines"] == 1.0:
        assert ours["sentence_steps"] == theirs["sentence_steps"]
        assert ours["row_steps"] == theirs["row_steps"]
    assert "seconds" not in json.dumps(result["work"])
    kept, leaving = result["work"]["ours float32, every row kept"], result["leaving_against_every_row_kept"]
    assert kept["sentence_steps"] >= ours["sentence_steps"] and kept["decoder_steps"] == ours["decoder_steps"]
    assert leaving["nbest_hypotheses"] == 4 * len(sources) and leaving["nbest_max_abs_diff_log_prob"] <= 1e-5


def test_peak_memory_is_measured_in_a_separate_process(bench):
    common = bench("speed_common")
    peaks = common.measure_peak_rss(
        str(BENCHMARKS / "speed.py"),
        ["decode", "--preset", "tiny", "--vocab_size", "300", "--length", "6", "--steps", "2", "--threads", "1"],
        ["marian"],
        "decode",
    )
    assert 50 < peaks["marian"] < 4000


def test_checkpoint_curve_names_runs_of_one_folder_name_apart(bench, tmp_path):
    run_labels = bench("quality").run_labels
    runs = [tmp_path / "marian_s2" / "marian", tmp_path / "s2", tmp_path / "marian_s3" / "marian"]
    assert run_labels(runs) == ["marian_s2/marian", "s2", "marian_s3/marian"]
    assert run_labels([tmp_path / "a", tmp_path / "b"]) == ["a", "b"]
    with pytest.raises(SystemExit, match="named twice"):
        run_labels([tmp_path / "a", tmp_path / "x" / ".." / "a"])


def test_the_speed_benchmarks_run_on_cuda_where_there_is_one_else_on_the_cpu(bench):
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    speed = bench("speed")
    for parse_args in (speed.train_args, speed.decode_args):
        assert parse_args([]).device == expected
        assert parse_args(["--device", "cpu"]).device == "cpu"
    config = speed.model_config(speed.train_args(["--preset", "tiny", "--vocab_size", "300"]))
    assert {t.device.type for t in speed.synthetic_batch(config, 2, 3, seed=0, device="meta").values()} == {"meta"}


def test_paper_time_derives_the_hours_from_the_counted_flops(bench, capsys):
    result = bench("scale").main(["paper_time", "--models", "base", "--gpus", "H100,P100", "--mfu", "0.5"])
    base = result["models"]["base"]
    assert base["flops_per_target_token"] == pytest.approx(base["analytic_flops_per_target_token"], rel=1e-9)
    assert base["flops_per_target_token"] / 1e6 == pytest.approx(381, rel=0.01)
    assert base["total_flops"] == pytest.approx(base["flops_per_target_token"] * 25_000 * 100_000)
    for gpu, peak in {"H100": 989.4, "P100": 21.2}.items():
        hours = base["hours"][gpu]
        assert hours[1] == pytest.approx(base["total_flops"] / (0.5 * peak * 1e12) / 3600)
        assert hours[8] == pytest.approx(hours[1] / 8)
    # the paper's 12 h on 8 P100 and Table 2's 3.3e18 (= 12 h x 8 x 9.5 TFLOPS): the counted work is 29% of it
    assert base["paper_run_utilisation"] == pytest.approx(0.29, abs=0.01)
    printed = capsys.readouterr().out
    assert "| H100 | 989.4 | 32 min | 4 min |" in printed and "base: 380.9 MFLOP per target token" in printed


GPU_CHECK = BENCHMARKS / "gpu_check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_gpu_check_without_cuda_fails_with_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("GPU_CHECK_DRY_RUN", None)
    done = subprocess.run(["bash", str(GPU_CHECK), str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not out.exists() and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "no CUDA device" in done.stderr


def test_gpu_check_and_its_multi_gpu_worker_parse():
    assert subprocess.run(["bash", "-n", str(GPU_CHECK)], capture_output=True).returncode == 0
    compile((BENCHMARKS / "scale.py").read_text(), "scale.py", "exec")


@pytest.mark.slow
def test_gpu_check_dry_run_writes_one_json_with_every_figure(tmp_path):
    """The script's own check on any machine: every step at tiny shapes, without the tests, compiled by aot_eager,
    FSDP skipped (about 2 minutes)."""
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_DRY_RUN": "1", "GPU_CHECK_PEAK_TFLOPS": "0.2"}
    done = subprocess.run(["bash", str(GPU_CHECK), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["failed_steps"] == [] and set(result["steps"]) == {"train_base", "train_big", "train_base_24k",
                                                                      "loss_memory", "multi_gpu_ddp", "trainer_ddp",
                                                                      "trainer_fsdp", "decode", "translate_one",
                                                                      "translate_all"}  # fmt: skip
    assert result["skipped_steps"] == ["trainer_fsdp"]  # accelerate's FSDP needs GPUs
    trainer = result["trainer_ddp_vs_fsdp2"]
    assert trainer["processes"] == 2 and trainer["ddp"]["logs"] >= 2 and trainer["ddp"]["target_tokens_per_s"] > 0
    losses = {name: side["loss"] for name, side in result["loss_memory"]["sides"].items()}
    assert set(losses) == {"compiled_chunked", "compiled_one_chunk", "compiled_plain_before", "eager_fused"}
    assert max(losses.values()) - min(losses.values()) < 1e-4, losses  # one loss, four ways
    assert result["sharded_translation_seconds"]["same_bytes"] is True  # one process and two: the same bytes
    ddp = result["multi_gpu_ddp"]
    assert ddp["processes"] == 2 and ddp["backend"] == "gloo" and ddp["weights_equal_on_every_rank"] is True
    assert ddp["target_tokens_per_s_per_process"] > 0
    assert {"torch", "transformers"} <= set(result["versions"]) and result["peak_bf16_tflops"] == 0.2
    assert result["training_bf16"]["base_24k"]["target_tokens_per_step"] == 8 * result["training_bf16"]["base"][
        "target_tokens_per_step"]  # fmt: skip
    for preset in ("base", "big", "base_24k"):
        training = result["training_bf16"][preset]
        assert training["flops_per_target_token"] > 0 and set(training["sides"]) == {
            "marian_bf16", "vaswani_mt_bf16", "vaswani_mt_bf16_compiled", "vaswani_mt_bf16_weights",
            "vaswani_mt_weights"}  # fmt: skip
        assert all(side["target_tokens_per_s"] > 0 and 0 < side["mfu"] < 1 for side in training["sides"].values())
    cases = result["decoding"]["cases"]
    assert len(cases) == 4 and all(case["identical_tokens_fp32"] for case in cases)
    assert set(cases[0]["speed_vs_marian_fp32"]) == {"vaswani_mt", "marian", "vaswani_mt_bf16", "marian_bf16"}


# ---------------------------------------------------------------------------------------------------------------
# The benchmarks of training runs


def test_marian_benchmark_runs_both_models_through_the_same_pipeline(tmp_path):
    data = write_jsonl(tmp_path / "pairs.jsonl", count=300)
    config = tmp_path / "bench.yaml"
    config.write_text(
        f"dataset: {data}\npreset: tiny\nvocab_size: 300\nmax_tokens_per_batch: 256\nwarmup_steps: 4\n"
        "max_steps: 4\nsave_steps: 2\naverage_last: 2\nreport_to: none\nlogging_steps: 1\n"
    )
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "train_vs_marian.py"), "--config", str(config),
         "--output_dir", str(tmp_path / "bench"), "--max_eval_samples", "10", "--disable_tqdm", "true"],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| vaswani_mt |" in result.stdout and "| marian |" in result.stdout
    marian_config = json.loads((tmp_path / "bench" / "marian" / "config.json").read_text())
    assert marian_config["model_type"] == "marian" and marian_config["d_model"] == 32
    # the job built, and published, the model of the builder each run passed it; the card is vaswani_mt's alone
    assert json.loads((tmp_path / "bench" / "vaswani_mt" / "config.json").read_text())["model_type"] == "vaswani_mt"
    assert (tmp_path / "bench" / "vaswani_mt" / "README.md").exists()
    assert not (tmp_path / "bench" / "marian" / "README.md").exists()
    # the same tokenizer for both: Marian reused the first run's
    ours = json.loads((tmp_path / "bench" / "vaswani_mt" / "tokenizer.json").read_text())["model"]["vocab"]
    theirs = json.loads((tmp_path / "bench" / "marian" / "tokenizer.json").read_text())["model"]["vocab"]
    assert ours == theirs
    # the BLEU-vs-minutes curve of both runs, from their checkpoints
    curves = tmp_path / "curves.json"
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "quality.py"), "curve", str(tmp_path / "bench" / "vaswani_mt"),
         str(tmp_path / "bench" / "marian"), "--dataset", str(data), "--max_samples", "8", "--average_last", "2",
         "--json", str(curves)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    points = json.loads(curves.read_text())
    for name in ("vaswani_mt:validation", "marian:validation"):
        assert [p["step"] for p in points[name]] == [2, 4]
        assert 0 < points[name][0]["minutes"] < points[name][1]["minutes"]
        assert all(0 <= p["bleu"] <= 100 and p["nll"] > 0 and p["train_nll"] > 0 for p in points[name])
        assert "avg2_bleu" in points[name][1]


def _logged_rows(output: Path) -> tuple[list[dict], list[dict]]:
    """A run's log history and its rows with a training loss."""
    history = json.loads((output / "trainer_state.json").read_text())["log_history"]
    return history, [row for row in history if "loss" in row]


def test_search_and_averaging_scores_each_weights_under_each_search_on_the_same_test_pairs(bench, job_run, tmp_path):
    """benchmarks/quality.py search: {final, mean of last 2, mean of last 3} x {beam 4, greedy, the saved
    search, the alphas and the searches given} on the same 12 test pairs."""
    quality = bench("quality")
    output, data = job_run.output, job_run.data
    results = json.loads((output / "results.json").read_text())
    table = tmp_path / "search.json"
    quality.main([
        "search", str(output), "--dataset", str(data), "--average_last", "2,3", "--length_penalties", "1.0",
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
        quality.parse_search("length_penalty=1.0,no_repeat_ngram_size")
    assert quality.parse_search("length_penalty=1.2,no_repeat_ngram_size=3,do_sample=false") == {
        "length_penalty": 1.2,
        "no_repeat_ngram_size": 3,
        "do_sample": False,
    }


def test_run_summary_reads_a_runs_steps_epochs_median_speed_and_last_loss(bench, job_run):
    """speed_common.run_summary (train_vs_marian.py's table): updates, epochs, the median logged tokens per second,
    the last loss, from the last checkpoint's log."""
    output = job_run.output
    history, logged = _logged_rows(output)
    summary = bench("speed_common").run_summary(output)
    speeds = sorted(r["target_tokens_per_second"] for r in logged)
    assert summary["steps"] == 8 and summary["epochs"] == history[-1]["epoch"] > 0
    assert summary["final_train_loss"] == logged[-1]["loss"]
    assert summary["median_target_tokens_per_second"] == speeds[len(speeds) // 2]


def test_ensemble_benchmark_translates_the_last_checkpoints_beside_their_average(bench, job_run, tmp_path):
    """benchmarks/quality.py ensemble: the last 2 checkpoints ensembled, their average and the last alone translate
    the same 8 test pairs through the side-by-side runner; the average is the baseline."""
    out = tmp_path / "ensemble.json"
    bench("quality").main(
        ["ensemble", str(job_run.output), "--dataset", str(job_run.data), "--last", "2", "--limit", "8",
         "--batch_size", "4", "--json", str(out)]
    )  # fmt: skip
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert list(rows) == [
        "ensemble of the last 2 (checkpoint-6 .. checkpoint-8)", "average (published)", "last checkpoint (checkpoint-8)"
    ]  # fmt: skip
    assert result["sentences"] == 8 and rows["average (published)"]["ratio_to_average (published)"] == 1.0
    assert all(0 <= row["bleu"] <= 100 and row["sentences_per_s"] > 0 for row in rows.values())
    assert "machine" in result["record"]


def test_products_benchmark_times_each_way_of_a_decoder_product_and_the_packing(bench, tmp_path):
    """`speed.py products` (issue 62, item 4): every way of running the model's four product shapes at each row
    count, a figure each in microseconds, with the cost of packing beside them."""
    speed, common = bench("speed"), bench("speed_common")
    out = tmp_path / "products.json"
    speed.main(["products", "--model", str(common.tiny_model_folder(tmp_path / "model")), "--rows", "4,8",
                "--calls", "2", "--repeats", "1", "--threads", "1", "--json", str(out)])  # fmt: skip
    cases = json.loads(out.read_text())["cases"]
    assert [case["product"] for case in cases] == [p for p in ("d x d", "FFN in", "FFN out", "logits") for _ in "ab"]
    for case in cases:
        assert {"float32", "bfloat16", "int8"} <= set(case) and all(
            value > 0 for key, value in case.items() if key not in ("product", "shape")
        )
