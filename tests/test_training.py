"""The training recipe (§5): schedule, loss under DDP, resume, averaging, and the whole job on small data."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerControl, TrainerState

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration, training
from vaswani_mt.checkpoints import average_checkpoints, last_checkpoint, list_checkpoints, log_history, run_summary
from vaswani_mt.tokenization import train_tokenizer
from vaswani_mt.training import (
    VaswaniTrainer,
    build_model,
    native_bf16,
    paper_learning_rate,
    parse_args,
    plot_curves,
    resolve_attention,
    resolve_precision,
)

ROOT = Path(__file__).resolve().parent.parent
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


def test_cooldown_takes_the_rate_linearly_to_zero_over_the_budgets_last_minutes(tmp_path, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(training.time, "monotonic", lambda: now[0])
    clock = training.WallClockCallback(checkpoint_minutes=None, budget_minutes=10, cooldown_minutes=4)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", d_model=512, num_heads=8))
    training_args = parse_args(["--output_dir", str(tmp_path), "--report_to", "none", "--warmup_steps", "10"])[3]
    trainer = VaswaniTrainer(model=model, args=training_args, lr_factor=clock.lr_factor, callbacks=[clock])
    trainer.create_optimizer_and_scheduler(num_training_steps=1000)
    clock.on_train_begin(training_args, None, None)
    rates = {}
    for step, minute in enumerate((1, 6, 7, 8, 9.5, 10), start=1):
        now[0] = 1000.0 + 60 * minute
        control = clock.on_step_end(training_args, None, TrainerControl())
        trainer.optimizer.step()  # no gradients: a no-op, in the Trainer's order
        trainer.lr_scheduler.step()  # Trainer steps the scheduler before the callback; the factor applies next
        rates[minute] = trainer.optimizer.param_groups[0]["lr"] / paper_learning_rate(step + 1, 512, 10)
    assert rates == pytest.approx({1: 1.0, 6: 1.0, 7: 0.75, 8: 0.5, 9.5: 0.125, 10: 0.0})
    assert control.should_training_stop  # the budget's end, where the rate reaches 0
    assert training.WallClockCallback(budget_minutes=10).lr_factor() == 1.0  # no cooldown: Eq. (3) unchanged
    with pytest.raises(ValueError, match="time budget"):
        training.WallClockCallback(cooldown_minutes=4)
    with pytest.raises(ValueError, match="lr_schedule"):
        VaswaniTrainer(model=model, args=training_args, lr_schedule="trainer", lr_factor=clock.lr_factor)


@pytest.mark.parametrize("seconds_per_step, warmup_updates", [(10.0, 12), (30.0, 4)])
def test_warmup_on_the_clock_takes_the_same_minutes_on_a_slow_and_a_fast_machine(
    tmp_path, monkeypatch, seconds_per_step, warmup_updates
):
    now = [1000.0]
    monkeypatch.setattr(training.time, "monotonic", lambda: now[0])
    clock = training.WallClockCallback(budget_minutes=10, warmup_minutes=2)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", d_model=512, num_heads=8))
    training_args = parse_args(["--output_dir", str(tmp_path), "--report_to", "none", "--warmup_steps", "10"])[3]
    trainer = VaswaniTrainer(model=model, args=training_args, warmup_clock=clock, callbacks=[clock])
    trainer.create_optimizer_and_scheduler(num_training_steps=1000)
    state = TrainerState()
    clock.on_train_begin(training_args, state, TrainerControl())
    peak = paper_learning_rate(10, 512, 10)  # the peak --warmup_steps 10 gives Eq. (3)
    rates = {1: trainer.optimizer.param_groups[0]["lr"]}  # before any update is timed: --warmup_steps' slope
    for update in range(1, 48):  # the Trainer's order: update, scheduler step, then the callbacks
        now[0] += seconds_per_step
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        rates[update + 1] = trainer.optimizer.param_groups[0]["lr"]
        state.global_step = update
        clock.on_step_end(training_args, state, TrainerControl())
    w = warmup_updates  # 2 minutes hold 120 / seconds_per_step updates
    assert clock.warmup_end_step == w
    # updates 1 and 2 are set before any update is timed: --warmup_steps' slope; then the measured one
    assert [rates[1] / peak, rates[2] / peak] == pytest.approx([1 / 10, 2 / 10])
    assert [rates[n] / peak for n in range(3, w + 2)] == pytest.approx([min(1.0, n / w) for n in range(3, w + 2)])
    # then Eq. (3) with warmup W: the peak falls as (W / n)^0.5
    assert [rates[n] / peak for n in (w + 2, 2 * w, 4 * w)] == pytest.approx([(w / (w + 2)) ** 0.5, 0.5**0.5, 0.5])
    # saved with the clock: a resumed run keeps W
    resumed = training.WallClockCallback(budget_minutes=10, warmup_minutes=2)
    resumed.on_train_begin(training_args, TrainerState(global_step=47, stateful_callbacks=[clock]), TrainerControl())
    assert (resumed.warmup_end_step, resumed.timed_steps) == (w, 47)
    assert training.clock_warmup_rate(47, 512, 10, resumed) == pytest.approx(peak * (w / 48) ** 0.5)
    with pytest.raises(ValueError, match="above 0"):
        training.WallClockCallback(warmup_minutes=0)
    with pytest.raises(ValueError, match="less than the budget"):
        training.WallClockCallback(budget_minutes=10, warmup_minutes=10)
    with pytest.raises(ValueError, match="warmup on the clock"):
        VaswaniTrainer(model=model, args=training_args, warmup_clock=training.WallClockCallback(budget_minutes=10))


def test_set_dropout_reaches_every_residual_and_embedding_dropout():
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny"))
    ids = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 1]])
    batch = {"input_ids": ids, "attention_mask": (ids != 1).long(), "decoder_input_ids": ids}
    with torch.no_grad():
        evaluated = model.eval()(**batch).logits
        assert training.set_dropout(model, 0.0) == 2 * 2 + 2 * 3 + 2  # sublayers of 2+2 layers, the two stacks
        torch.testing.assert_close(model.train()(**batch).logits, evaluated)  # training mode, nothing dropped
        training.set_dropout(model, 0.5)
        assert not torch.allclose(model(**batch).logits, evaluated)
    assert model.config.dropout == 0.1  # the saved config keeps the value the model was built with
    with pytest.raises(ValueError, match="no vaswani_mt dropout"):
        training.set_dropout(torch.nn.Linear(2, 2), 0.3)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        training.set_dropout(model, 1.0)


def test_late_dropout_switches_once_the_budget_has_its_minutes_left(tmp_path, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(training.time, "monotonic", lambda: now[0])
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny"))
    clock = training.WallClockCallback(budget_minutes=10)
    late = training.LateDropoutCallback(clock, dropout=0.3, minutes=4)
    training_args = parse_args(["--output_dir", str(tmp_path), "--report_to", "none"])[3]
    clock.on_train_begin(training_args, None, None)
    seen = {}
    for step, minute in enumerate((1, 5.9, 6, 8), start=1):
        late.on_step_begin(training_args, type("State", (), {"global_step": step}), TrainerControl(), model=model)
        seen[minute] = {m.dropout for m in model.modules() if type(m).__name__ == "VaswaniSublayer"}
        now[0] = 1000.0 + 60 * minute
        clock.on_step_end(training_args, None, TrainerControl())
    # the step after the clock passed minute 6 (10 - 4) is the first with the late P_drop
    assert seen == {1: {0.1}, 5.9: {0.1}, 6: {0.1}, 8: {0.3}} and late.switched_at == 4
    with pytest.raises(ValueError, match="time budget"):
        training.LateDropoutCallback(training.WallClockCallback(), dropout=0.3, minutes=4)
    with pytest.raises(ValueError, match="late_dropout_minutes"):
        training.LateDropoutCallback(clock, dropout=0.3, minutes=11)
    config = tmp_path / "late.yaml"
    config.write_text("late_dropout: 0.3\n")
    with pytest.raises(ValueError, match="needs both"):
        training.run_training(*parse_args([str(config), "--output_dir", str(tmp_path / "x"), "--report_to", "none",
                                           "--dataset", str(tmp_path / "missing.jsonl")]))  # fmt: skip


def test_tag_extra_gets_a_token_of_its_own_and_needs_a_tokenizer_that_has_it(tmp_path):
    sentences = [{"en": "The house is small.", "de": "Das Haus ist klein."}] * 20
    phrases = [{"en": "<extra> a small house", "de": "ein kleines Haus"}] * 20
    corpus = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": sentences + phrases})})
    model_args, data_args, _, _ = parse_args(["--vocab_size", "200", "--tag_extra", "true"])
    tokenizer = training.build_tokenizer(model_args, corpus, data_args, tmp_path)
    assert tokenizer.convert_tokens_to_ids("<extra>") == 4
    assert not [t for t in tokenizer.get_vocab() if "extra" in t and t != "<extra>"]  # BPE never saw the tag
    assert tokenizer("<extra> a small house")["input_ids"][1:] == tokenizer("a small house")["input_ids"]
    untagged = tmp_path / "untagged"
    train_tokenizer(["a small house", "ein kleines Haus"] * 5, vocab_size=60, min_frequency=1).save_pretrained(untagged)
    with pytest.raises(ValueError, match="has no special token <extra>"):
        training.run_training(*parse_args(["--dataset", "ding+phrases", "--tag_extra", "true", "--tokenizer",
                                           str(untagged), "--output_dir", str(tmp_path / "x"),
                                           "--report_to", "none"]))  # fmt: skip


def test_add_reverse_gets_a_token_of_its_own(tmp_path):
    sentences = [{"en": "The house is small.", "de": "Das Haus ist klein."}] * 20
    reverse = [{"en": "<reverse> Das Haus ist klein.", "de": "The house is small."}] * 20
    phrases = [{"en": "<extra> a small house", "de": "ein kleines Haus"}] * 20
    corpus = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": sentences + reverse + phrases})})
    args = ["--vocab_size", "200", "--add_reverse", "true", "--tag_extra", "true"]
    model_args, data_args, _, _ = parse_args(args)
    tokenizer = training.build_tokenizer(model_args, corpus, data_args, tmp_path)
    assert [tokenizer.convert_tokens_to_ids(t) for t in ("<extra>", "<reverse>")] == [4, 5]
    assert not [t for t in tokenizer.get_vocab() if "reverse" in t and t != "<reverse>"]  # BPE never saw the tag
    assert tokenizer("<reverse> Das Haus")["input_ids"][1:] == tokenizer("Das Haus")["input_ids"]
    untagged = tmp_path / "untagged"
    train_tokenizer(["a small house", "ein kleines Haus"] * 5, vocab_size=60, min_frequency=1).save_pretrained(untagged)
    with pytest.raises(ValueError, match=r"--add_reverse: .* no special token <reverse>"):
        training.run_training(*parse_args(["--dataset", "ding", "--add_reverse", "true", "--tokenizer",
                                           str(untagged), "--output_dir", str(tmp_path / "x"),
                                           "--report_to", "none"]))  # fmt: skip


def test_config_file_sets_options_and_command_line_wins(tmp_path, tokenizer):
    config = tmp_path / "run.yaml"
    config.write_text(
        "preset: small\nmax_tokens_per_batch: 3000\nwarmup_steps: 800\nlearning_rate: 2.0\ninit_std: 0.02\n"
    )
    model_args, data_args, _, training_args = parse_args(["--config", str(config), "--warmup_steps", "900"])
    assert (model_args.preset, data_args.max_tokens_per_batch) == ("small", 3000)
    assert (training_args.warmup_steps, training_args.learning_rate) == (900, 2.0)
    model = build_model(model_args, tokenizer)
    assert model.config.init_std == 0.02 and model.config.d_model == 256
    weight = model.model.encoder.layers[0].ffn.fc1.weight
    assert abs(weight.std().item() - 0.02) < 0.002  # N(0, 0.02), not Xavier (0.039 for 256 x 1024)
    bad = tmp_path / "bad.yaml"
    bad.write_text("presett: small\n")
    with pytest.raises(ValueError, match=r"bad.yaml.*presett"):
        parse_args([str(bad)])


def test_shape_options_override_the_preset(tmp_path, tokenizer):
    argv = ["--output_dir", str(tmp_path), "--preset", "small", "--num_encoder_layers", "6"]
    model_args = parse_args([*argv, "--num_decoder_layers", "5", "--d_ff", "512", "--num_heads", "8"])[0]
    model = build_model(model_args, tokenizer)
    config = model.config
    assert (config.num_encoder_layers, config.num_decoder_layers, config.d_ff, config.num_heads) == (6, 5, 512, 8)
    assert config.d_model == 256 and config.dropout == 0.1  # the rest stays the preset's
    assert len(model.model.encoder.layers) == 6 and len(model.model.decoder.layers) == 5
    assert build_model(parse_args(argv[:4])[0], tokenizer).config.num_encoder_layers == 3


def test_the_main_jobs_config_parses_and_keeps_the_30_minute_budget():
    model_args, data_args, recipe, training_args = parse_args([str(ROOT / "configs" / "ding_cpu.yaml")])
    assert (model_args.preset, data_args.dataset, recipe.auto_bf16) == ("small", "ding+phrases", True)
    assert recipe.time_budget_minutes <= 27 and recipe.average_last == 5
    assert recipe.length_penalty == 1.2  # chosen on the dev split (benchmarks/RESULTS.md, sixth session)
    # bf16: small, 2048-token batches; float32: mini, 1024 (benchmarks/RESULTS.md, tenth and eleventh sessions)
    assert (data_args.max_tokens_per_batch, recipe.float32_max_tokens_per_batch) == (2048, 1024)
    assert recipe.float32_preset == "mini"
    with pytest.raises(ValueError, match=r"--length_penalty .* must be a number >= 0, got -1\.0"):
        training.run_training(*parse_args([str(ROOT / "configs" / "ding_cpu.yaml"), "--length_penalty", "-1"]))
    assert not training_args.bf16  # decided at run time by resolve_precision, from the hardware


@pytest.mark.parametrize(("native", "expected"), [(True, ("small", 256, 0.1, 2048)), (False, ("mini", 128, 0.0, 1024))])
def test_the_main_job_trains_small_with_dropout_under_bf16_and_mini_without_in_float32(
    tmp_path, monkeypatch, native, expected, tokenizer
):
    # benchmarks/RESULTS.md: bf16, small with P_drop 0.1 (seventh session); float32 on a CPU without native bf16,
    # mini (eleventh session) without dropout (twelfth session)
    monkeypatch.setattr(training, "native_bf16", lambda: native)
    config_file = str(ROOT / "configs" / "ding_cpu.yaml")
    model_args, data_args, recipe, args = parse_args([config_file, "--output_dir", str(tmp_path)])
    resolve_precision(recipe, args)
    preset, tokens = training.resolve_float32(recipe, model_args, data_args, args)
    config = build_model(model_args, tokenizer).config
    assert (preset, config.d_model, config.dropout, tokens) == expected
    assert args.bf16 is native and config.init_std == 0.02


def test_training_keeps_freed_memory_unless_told_not_to(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(training, "retain_freed_memory", lambda: calls.append("retain") or True)
    base = ["--output_dir", str(tmp_path), "--report_to", "none", "--preset", "tiny", "--late_dropout", "0.3"]
    for extra, expected in (([], ["retain"]), (["--retain_freed_memory", "false"], [])):
        calls.clear()
        # The missing --late_dropout_minutes stops the run right after the allocator is set up.
        with pytest.raises(ValueError, match="late dropout needs both"):
            training.run_training(*parse_args(base + extra))
        assert calls == expected


@pytest.mark.parametrize("native", [True, False])
def test_auto_bf16_turns_on_bf16_autocast_only_where_bf16_is_native(tmp_path, monkeypatch, native):
    monkeypatch.setattr(training, "native_bf16", lambda: native)
    _, _, recipe, args = parse_args(["--output_dir", str(tmp_path), "--report_to", "none", "--auto_bf16", "true"])
    assert not args.bf16
    resolve_precision(recipe, args)
    assert args.bf16 is native
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny"))
    trainer = VaswaniTrainer(model=model, args=args)
    assert trainer.accelerator.mixed_precision == ("bf16" if native else "no")
    with trainer.accelerator.autocast():  # what accelerate wraps the model's forward in
        assert torch.is_autocast_enabled("cpu") is native


@pytest.mark.parametrize(("native", "extra", "expected"), [
    (True, [], ("small", 2048)), (False, [], ("mini", 1024)), (False, ["--auto_bf16", "false"], ("small", 2048)),
    (False, ["--float32_max_tokens_per_batch", "512", "--float32_preset", "base"], ("base", 512)),
])  # fmt: skip
def test_float32_runs_take_the_float32_shape_and_batch_where_auto_bf16_finds_no_bf16(
    tmp_path, monkeypatch, native, extra, expected, tokenizer
):
    monkeypatch.setattr(training, "native_bf16", lambda: native)
    argv = ["--output_dir", str(tmp_path), "--report_to", "none", "--auto_bf16", "true", "--preset", "small",
            "--max_tokens_per_batch", "2048", "--float32_max_tokens_per_batch", "1024", "--float32_preset", "mini",
            "--d_ff", "384", *extra]  # fmt: skip
    model_args, data_args, recipe, args = parse_args(argv)
    resolve_precision(recipe, args)
    assert training.resolve_float32(recipe, model_args, data_args, args) == expected
    assert (model_args.preset, data_args.max_tokens_per_batch) == expected
    config = build_model(model_args, tokenizer).config
    preset = VaswaniConfig.from_preset(expected[0])
    assert (config.d_model, config.num_encoder_layers, config.d_ff) == (preset.d_model, preset.num_encoder_layers, 384)
    with pytest.raises(ValueError, match="at least 1, got 0"):
        training.resolve_float32(recipe.__class__(float32_max_tokens_per_batch=0), model_args, data_args, args)
    with pytest.raises(ValueError, match=r"--float32_preset: unknown preset 'huge'"):
        training.resolve_float32(recipe.__class__(float32_preset="huge"), model_args, data_args, args)


def test_bf16_without_native_support_is_kept_but_warned_about(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(training, "native_bf16", lambda: False)
    _, _, recipe, args = parse_args(["--output_dir", str(tmp_path), "--report_to", "none", "--bf16", "true"])
    with caplog.at_level("WARNING", logger="vaswani_mt.training"):
        resolve_precision(recipe, args)
    assert args.bf16 and "emulated" in caplog.text


@pytest.mark.parametrize(("precision", "expected"), [(["--bf16", "true"], "eager"), ([], "sdpa")])
def test_auto_attention_is_eager_for_cpu_bf16_training_and_sdpa_otherwise(
    tmp_path, monkeypatch, precision, expected, tokenizer
):
    monkeypatch.setattr(training, "native_bf16", lambda: True)
    argv = [
        "--output_dir",
        str(tmp_path),
        "--report_to",
        "none",
        "--use_cpu",
        "true",
        "--auto_bf16",
        "false",
        "--preset",
        "tiny",
    ]
    model_args, _, recipe, args = parse_args(argv + precision)
    assert model_args.attn_implementation == "auto"
    resolve_precision(recipe, args)
    assert resolve_attention(model_args, args) == expected == model_args.attn_implementation
    assert build_model(model_args, tokenizer).config._attn_implementation == expected
    # An explicit choice is kept; a wrong one is named.
    model_args, _, _, args = parse_args(argv + precision + ["--attn_implementation", "sdpa"])
    assert resolve_attention(model_args, args) == "sdpa"
    model_args, _, _, args = parse_args([*argv, "--attn_implementation", "flash"])
    with pytest.raises(ValueError, match="'flash'"):
        resolve_attention(model_args, args)


@pytest.mark.skipif(torch.cuda.is_available() or not Path("/proc/cpuinfo").exists(), reason="reads Linux CPU flags")
def test_native_bf16_matches_the_cpu_flags():
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    assert native_bf16() == bool({"avx512_bf16", "amx_bf16", "amx_tile"} & flags)


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


def _write_jsonl(path: Path, count: int = 240) -> Path:
    words = "the a house cat dog small big red green runs sleeps eats sees quickly today".split()
    german = "der die das Haus Katze Hund klein groß rot grün läuft schläft isst sieht schnell heute".split()
    rows = []
    for i in range(count):
        idx = [(i * 7 + k * 3) % len(words) for k in range(3 + i % 5)]
        en = " ".join(words[j] for j in idx).capitalize() + "."
        de = " ".join(german[j] for j in idx).capitalize() + "."
        rows.append(json.dumps({"translation": {"en": en, "de": de}}, ensure_ascii=False))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def _train_command(data: Path, output: Path, *extra: str) -> list[str]:
    return [
        PYTHON, str(ROOT / "scripts" / "train.py"), "--dataset", str(data), "--output_dir", str(output),
        "--preset", "tiny", "--vocab_size", "300", "--max_tokens_per_batch", "256", "--warmup_steps", "4",
        "--logging_steps", "1", "--save_steps", "2", "--save_total_limit", "10", "--report_to", "none",
        "--dropout", "0.0", "--seed", "3", "--test_bleu", "false", "--disable_tqdm", "true", *extra,
    ]  # fmt: skip


def _history(output: Path) -> list[dict]:
    return json.loads((output / "trainer_state.json").read_text())["log_history"]


@pytest.mark.parametrize("max_tokens", [256, 0])
def test_bpe_dropout_resegments_training_batches_only_and_punctuation_splits(tmp_path, max_tokens):
    data = _write_jsonl(tmp_path / "pairs.jsonl", count=60)
    argv = _train_command(data, tmp_path / "run", "--bpe_dropout", "0.3", "--split_punctuation", "true")[2:]
    model_args, data_args, _, args = parse_args([*argv, "--max_tokens_per_batch", str(max_tokens)])
    corpus = training.load_corpus(data_args.dataset)
    tokenizer = training.build_tokenizer(model_args, corpus, data_args, tmp_path)
    assert "." in tokenizer.get_vocab() and not any(t.endswith(".") and len(t) > 1 for t in tokenizer.get_vocab())
    tokenized = training.tokenize_corpus(corpus, tokenizer, data_args)
    model = build_model(model_args, tokenizer)
    plain = training.DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    calls = []

    def spy(features):
        calls.append(len(features))
        return dropout(features)

    dropout = training.BPEDropoutCollator(tokenizer, data_args.bpe_dropout, plain)
    trainer = VaswaniTrainer(
        model=model,
        args=args,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"].remove_columns(["source_length", "target_length"]),
        data_collator=plain,
        train_data_collator=spy,
        max_tokens_per_batch=data_args.max_tokens_per_batch,
    )
    batch = next(iter(trainer.get_train_dataloader()))
    assert calls and batch["labels"].shape[0] == calls[0]
    calls.clear()
    next(iter(trainer.get_eval_dataloader()))
    assert not calls and trainer.data_collator is plain  # evaluation keeps the deterministic segmentation


def test_resume_continues_the_schedule_and_the_data_order(tmp_path):
    data = _write_jsonl(tmp_path / "pairs.jsonl")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    # Runs past one epoch (about 8 batches of 256 tokens), so the resumed epoch must shuffle as the original did.
    subprocess.run(_train_command(data, straight, "--max_steps", "12"), check=True, env=env, capture_output=True)
    subprocess.run(_train_command(data, resumed, "--max_steps", "10"), check=True, env=env, capture_output=True)
    result = subprocess.run(_train_command(data, resumed, "--max_steps", "12"), env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from" in result.stderr and "checkpoint-10" in result.stderr
    a, b = _history(straight), _history(resumed)
    for step in (11, 12):
        row_a = next(r for r in a if r.get("step") == step and "loss" in r)
        row_b = next(r for r in b if r.get("step") == step and "loss" in r)
        assert row_b["learning_rate"] == pytest.approx(row_a["learning_rate"])
        assert row_b["target_tokens_per_step"] == row_a["target_tokens_per_step"]  # the same batch
        assert row_b["loss"] == pytest.approx(row_a["loss"], rel=1e-4)
    minutes = [r["train_minutes"] for r in b if "train_minutes" in r]
    assert len(minutes) == 12 and minutes == sorted(minutes) and minutes[0] > 0  # the clock goes on after resume
    wa, wb = (
        load_file(straight / "checkpoint-12" / "model.safetensors"),
        load_file(resumed / "checkpoint-12" / "model.safetensors"),
    )
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=1e-5, rtol=1e-4)


def test_killed_run_resumes_from_its_last_complete_checkpoint(tmp_path):
    data = _write_jsonl(tmp_path / "pairs.jsonl")
    output = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        _train_command(data, output, "--max_steps", "100000"), env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list_checkpoints(output)) < 2:
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    survivor = last_checkpoint(output)
    assert survivor is not None
    (output / "checkpoint-999999").mkdir()  # a checkpoint cut off while being written: no trainer_state.json
    (output / "checkpoint-999999" / "model.safetensors").write_bytes(b"partial")
    step = int(survivor.name.split("-")[1])
    result = subprocess.run(
        _train_command(data, output, "--max_steps", str(step + 2)), env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming from {survivor}" in result.stderr
    assert "ignoring" in result.stderr and "checkpoint-999999" in result.stderr
    assert json.loads((output / "trainer_state.json").read_text())["global_step"] == step + 2


def test_the_time_budget_counts_on_after_a_resume_and_a_spent_budget_trains_no_further(tmp_path):
    clock = training.WallClockCallback(checkpoint_minutes=1.5, budget_minutes=10)
    clock.elapsed = 590.0
    resumed = training.WallClockCallback(checkpoint_minutes=1.5, budget_minutes=10)
    resumed.on_train_begin(None, TrainerState(stateful_callbacks=[clock]), TrainerControl())
    assert resumed.elapsed == 590.0 and training.trained_seconds(TrainerState()) == 0.0
    assert not resumed.on_step_end(None, TrainerState(), TrainerControl()).should_training_stop
    resumed.start -= 10.0  # ten more seconds: the budget's 600 are spent
    assert resumed.on_step_end(None, TrainerState(), TrainerControl()).should_training_stop

    data = _write_jsonl(tmp_path / "pairs.jsonl", count=60)
    output = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # A warmup on the clock of 6 ms: it ends at the first update, W = 1, and the resumed run keeps it.
    budget = ["--time_budget_minutes", "0.5", "--checkpoint_minutes", "0.4", "--warmup_minutes", "0.0001"]
    first = subprocess.run(_train_command(data, output, "--max_steps", "4", *budget), env=env, capture_output=True)
    assert first.returncode == 0, first.stderr[-3000:]
    before = training.trained_seconds(TrainerState.load_from_json(str(output / "checkpoint-4" / "trainer_state.json")))
    assert 0.0 < before < 30.0
    second = subprocess.run(_train_command(data, output, "--max_steps", "6", *budget), env=env, capture_output=True,
                            text=True)  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from {output / 'checkpoint-4'} ({before / 60:.1f} minutes trained)" in second.stderr
    after = training.trained_seconds(TrainerState.load_from_json(str(output / "checkpoint-6" / "trainer_state.json")))
    assert after > before  # counted on from the first run's seconds, not from 0
    for step in (4, 6):
        state = TrainerState.load_from_json(str(output / f"checkpoint-{step}" / "trainer_state.json"))
        assert training._clock_attribute(state, "warmup_end_step") == 1
    peak = paper_learning_rate(4, 32, 4)  # tiny: d_model 32; --warmup_steps 4 sets the peak
    logged = {row["step"]: row["learning_rate"] for row in _history(output) if "learning_rate" in row}
    # Trainer logs the rate update n used. Update 2 was set before any update was timed (--warmup_steps' slope);
    # from W = 1 on, update n takes peak * (1 / n)^0.5, in the first run (3) and in the resumed one (5, 6).
    assert logged[2] == pytest.approx(peak * 2 / 4)
    assert [logged[n] for n in (3, 5, 6)] == pytest.approx([peak * n**-0.5 for n in (3, 5, 6)])

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


def test_plot_has_a_panel_per_logged_curve(tmp_path):
    history = [
        {"step": s, "loss": 5 - s / 10, "learning_rate": 1e-3, "target_tokens_per_second": 900} for s in range(5)
    ]
    path = plot_curves(history, tmp_path / "curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
    summary = run_summary(output)
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
