"""The main job (`vaswani_mt.training.job`, `scripts/train.py`) on small data: under 2-process DDP, the time budget
across a resume, the averaging command, and the whole job. Eq. (3) and the Trainer: test_trainer.py; checkpoints and
averaging: test_checkpoints.py; kills, preemption and exact resumes: test_faults.py."""

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import REFERENCE_ENV, REFERENCE_STEPS, ddp_command, make_model, reference_command
from conftest import train_command as _train_command
from conftest import write_jsonl as _write_jsonl
from safetensors.torch import load_file
from transformers import TrainerState

from vaswani_mt.hub.card import check_card
from vaswani_mt.training.callbacks import trained_seconds
from vaswani_mt.training.checkpoints import CheckpointError, list_checkpoints
from vaswani_mt.training.runs import keep_tokens_per_step
from vaswani_mt.training.trainer import paper_learning_rate

pytestmark = pytest.mark.transformers_internals

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def test_main_job_under_two_cpu_processes_publishes_and_scores_once(ddp_reference):
    """`accelerate launch --multi_gpu --num_processes 2 scripts/train.py --use_cpu ... --test_bleu true` (the shared
    two-rank run, tests/conftest.py's `ddp_reference`): trains with DDP, then rank 0 alone averages, scores the test
    split and writes the folder, and both processes exit 0."""
    output = ddp_reference
    stdout = (output.parent / "stdout.txt").read_text()
    assert stdout.count("test sacreBLEU") == 1  # printed by rank 0 only
    results = json.loads((output / "results.json").read_text())
    assert 0.0 <= results["test"]["score"] <= 100.0
    assert [r["step"] for r in _history(output) if "loss" in r] == list(range(1, REFERENCE_STEPS + 1))
    assert (output / "model.safetensors").exists() and (output / "README.md").exists()


def test_two_processes_on_a_finished_run_train_nothing_and_say_so_in_one_line(ddp_reference, corpus, tmp_path):
    """The README's 2-process command on a finished folder (here the two-rank reference run's, copied): status 0,
    one line on stderr, and not one byte of the folder changed."""
    output = Path(shutil.copytree(ddp_reference, tmp_path / "run"))
    files = _contents(output)
    again = subprocess.run(ddp_command(corpus, output), env=REFERENCE_ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    said = [line for line in again.stderr.splitlines() if line.startswith(str(output))]
    assert len(said) == 1 and said[0].startswith(f"{output} holds a finished run (step {REFERENCE_STEPS}, "), said
    assert "resuming" not in again.stderr and _contents(output) == files


@pytest.mark.usefixtures("restore_rng", "restore_threads")
def test_a_run_resumed_on_another_number_of_processes_keeps_the_tokens_of_its_steps(ddp_reference, corpus, tmp_path,
                                                                                      caplog):  # fmt: skip
    """The two-rank reference run's checkpoint-6 resumed by one process: twice the accumulation, said in one line, and
    the steps after it hold the very tokens of the two-rank run's (each rank takes every other batch of one list)."""
    from vaswani_mt.cli.train import main as train_main

    output = tmp_path / "run"
    for name in ("checkpoint-6", "tokenizer"):
        shutil.copytree(ddp_reference / name, output / name)
    with caplog.at_level(logging.WARNING, logger="vaswani_mt.training.job"):
        train_main(reference_command(corpus, output)[2:])
    assert (f"resuming {output / 'checkpoint-6'}, trained by 2 processes, on 1: --gradient_accumulation_steps 2 and "
            "--max_tokens_per_batch 256 keep its 512 tokens a step") in caplog.text  # fmt: skip
    ours, theirs = ({row["step"]: row for row in _history(run) if "loss" in row} for run in (output, ddp_reference))
    steps = range(7, REFERENCE_STEPS + 1)
    assert [ours[n]["target_tokens_per_step"] for n in steps] == [theirs[n]["target_tokens_per_step"] for n in steps]


def test_a_resume_on_another_number_of_processes_keeps_the_tokens_of_a_step_or_is_refused(tmp_path):
    """One process's checkpoint resumed by two: each takes half the token budget; where half is not a whole number
    of tokens the resume is refused in one line, before anything is written. A checkpoint that records no layout
    tells its processes by its RNG files."""
    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()

    def resume(tokens: int | None, recorded: int | None = 4096):
        layout = {"processes": 1, "gradient_accumulation_steps": 1, "max_tokens_per_batch": recorded}
        state = TrainerState(stateful_callbacks={"WallClockCallback": {"args": {}, "attributes": {
            "batch_layout": layout if recorded else None}}})  # fmt: skip
        data = SimpleNamespace(max_tokens_per_batch=tokens)
        args = SimpleNamespace(world_size=2, gradient_accumulation_steps=1, per_device_train_batch_size=64)
        return keep_tokens_per_step(str(checkpoint), state, data, args), data, args

    said, data, args = resume(4096)
    assert said == (f"resuming {checkpoint}, trained by 1 process, on 2: --gradient_accumulation_steps 1 and "
                    "--max_tokens_per_batch 2048 keep its 4096 tokens a step")  # fmt: skip
    assert (data.max_tokens_per_batch, args.gradient_accumulation_steps) == (2048, 1)
    with pytest.raises(
        CheckpointError,
        match=r"trained by 1 process with 4095 tokens a step \(--max_tokens_per_batch "
        r"4095 x --gradient_accumulation_steps 1 each\), which 2 processes cannot make: resume it on 1",
    ):
        resume(4096, recorded=4095)
    assert resume(4096, recorded=None)[0] is None  # no layout and no RNG file: nothing known to keep
    (checkpoint / "rng_state.pth").touch()  # written by one process
    assert resume(1024, recorded=None)[1].max_tokens_per_batch == 512


def _history(output: Path) -> list[dict]:
    return json.loads((output / "trainer_state.json").read_text())["log_history"]


@pytest.mark.usefixtures("restore_rng", "restore_threads")
def test_the_time_budget_counts_on_after_a_resume_and_a_spent_budget_trains_no_further(tmp_path, capfd, caplog):
    """Three runs of the command in this process (`vaswani_mt.cli.train.main`, as scripts/train.py calls it): the
    clock, its resume and the spent budget are the job's own, not the process's (a new process per run: the killed,
    signalled and resumed runs of test_faults.py)."""
    from vaswani_mt.cli.train import main as train_main

    data = _write_jsonl(tmp_path / "pairs.jsonl", count=60)
    output = tmp_path / "run"
    budget = ["--time_budget_minutes", "0.5", "--checkpoint_minutes", "0.4", "--disable_tqdm", "false"]
    budget += ["--retain_freed_memory", "false"]  # malloc's settings are this process's for good

    def train(*extra: str) -> str:
        """The run's stderr and the job's log."""
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="vaswani_mt.training.job"):
            train_main(_train_command(data, output, *extra, *budget)[2:])
        return capfd.readouterr().err + caplog.text

    first = train("--max_steps", "4")
    assert "/0.5 min" in first  # the progress bar counts the budget's minutes, not max_steps
    before = trained_seconds(TrainerState.load_from_json(str(output / "checkpoint-4" / "trainer_state.json")))
    assert 0.0 < before < 30.0
    assert json.loads((output / "results.json").read_text())["finished_by"] == "--max_steps"

    # A finished run stays finished: the same command, or one with other options, trains nothing, writes nothing,
    # and says so in one line, with status 0; --resume_from_checkpoint last trains it on.
    files = _contents(output)
    for again in ((), ("--max_steps", "6")):
        with pytest.raises(SystemExit) as stop:
            train(*again)
        said = capfd.readouterr().err.splitlines()
        assert stop.value.code == 0 and said == [
            f"{output} holds a finished run (step 4, no test BLEU, stopped by --max_steps): nothing trained or "
            "written; --resume_from_checkpoint last trains it on (with a larger --time_budget_minutes or --max_steps "
            "where those stopped it), another --output_dir starts a new run"
        ]  # fmt: skip
        assert _contents(output) == files
    budget += ["--resume_from_checkpoint", "last"]
    second = train("--max_steps", "6")
    assert f"resuming from {output / 'checkpoint-4'} ({before / 60:.1f} minutes trained)" in second
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
    third = train("--max_steps", "100", "--average_last", "1")
    assert "trained the whole time budget (0.5 minutes): no more training" in third
    assert [c.name for c in list_checkpoints(output)] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert json.loads((output / "trainer_state.json").read_text())["global_step"] == 6
    # what it publishes is the trained checkpoint's weights (read from disk), not the untrained model it built
    published, last = (load_file(folder / "model.safetensors") for folder in (output, output / "checkpoint-6"))
    assert published.keys() == last.keys() and all(torch.equal(published[k], last[k]) for k in last)


def _contents(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` by its path, with its bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_average_script_loads_in_a_fresh_process(tmp_path):
    checkpoints = tmp_path / "run"
    for step in (1, 2):
        folder = checkpoints / f"checkpoint-{step}"
        make_model(seed=step, vocab_size=1000).save_pretrained(folder)  # the tiny preset's own vocabulary
        (folder / "trainer_state.json").write_text("{}")
    out = tmp_path / "averaged"
    # One fresh process: the script as a program (run as __main__ from its path, its own argv), then the averaged
    # folder loaded through transformers' Auto class with nothing but `import vaswani_mt` before it.
    probe = (
        "import runpy, sys; script, out = sys.argv[1], sys.argv[-1]; sys.argv = sys.argv[1:]; "
        "runpy.run_path(script, run_name='__main__'); "
        "import vaswani_mt; from transformers import AutoModelForSeq2SeqLM as A; print(type(A.from_pretrained(out)))"
    )
    loaded = subprocess.run(
        [PYTHON, "-c", probe, str(ROOT / "scripts" / "average_checkpoints.py"), "--checkpoint_dir", str(checkpoints),
         "--last", "2", "--output", str(out)], check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert loaded.stdout.strip().endswith("VaswaniForConditionalGeneration'>"), loaded.stdout
    # A folder without checkpoints and --last 0: one line each, no traceback.
    from vaswani_mt.cli import average

    for argv, message in ((["--checkpoint_dir", str(tmp_path / "nope")], f"error: {tmp_path / 'nope'}: no complete"),
                          (["--checkpoint_dir", str(checkpoints), "--last", "0"], None)):  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            average.main([*argv, "--output", str(tmp_path / "x")])
        assert (message is None and stop.value.code == 2) or str(stop.value.code).startswith(message)


def test_end_to_end_job_on_local_jsonl(job_run):
    """The main job, small (tests/conftest.py's `job_run`): trains, averages the last checkpoints, scores the test
    split, writes a Hub folder. The benchmarks that read such a run: tests/test_speed_benchmarks.py."""
    output = job_run.output
    assert "test sacreBLEU" in job_run.stdout and "signature: nrefs:1|case:mixed" in job_run.stdout
    files = {p.name for p in output.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "modeling_vaswani.py", "tokenizer.json",
            "README.md", "results.json", "training_curves.png"} <= files  # fmt: skip
    assert "training_args.bin" not in files  # no pickle in the published folder
    results = json.loads((output / "results.json").read_text())
    assert 0.0 <= results["test"]["score"] <= 100.0
    card = (output / "README.md").read_text()
    sacrebleu = check_card(card)["model-index"][0]["results"][0]["metrics"][0]
    assert sacrebleu["value"] == round(results["test"]["score"], 2) and "checkpoint-8" in card
    assert "CPU (" in card and ", float32;" in card  # the hardware and the precision it trained in
    assert "Search: beam 4, GNMT length penalty α = 0.9," in card
    # its usage names the model's own repository, and says the saved search is under Results, not the paper's 0.6
    assert 'model="USER/vaswani-mt-tiny-en-de"' in card
    assert "(the paper's, §6.1, is beam 4, GNMT" in " ".join(card.split())
    for folder in (output, output / "checkpoint-8"):
        saved = json.loads((folder / "generation_config.json").read_text())
        assert (saved["num_beams"], saved["length_penalty"]) == (4, 0.9)
    # The constrained sentences' alpha, chosen on dev among 0, 0.3, ... up to the saved 0.9, saved beside it.
    chosen = results["constrained_length_penalty"]
    assert sorted(chosen["dev_bleu_with_terms"]) == ["0.0", "0.3", "0.6", "0.9"]
    assert chosen["dev_bleu_with_terms"][str(chosen["alpha"])] == max(chosen["dev_bleu_with_terms"].values())
    assert json.loads((output / "generation_config.json").read_text())["constrained_length_penalty"] == chosen["alpha"]
    history = _history(output)
    logged = [r for r in history if "loss" in r]
    assert all(r["target_tokens_per_step"] > 0 and r["target_tokens_per_second"] > 0 for r in logged)
    assert logged[0]["learning_rate"] > 0
    evaluated = [r for r in history if "eval_bleu" in r]
    assert [r["step"] for r in evaluated] == [4, 8] and all(0 <= r["eval_bleu"] <= 100 for r in evaluated)
