"""What the hardware decides: bf16 where it is native, the float32 fallback's overrides, the attention kernel, and
the process-wide allocator setting."""

from pathlib import Path

import pytest
import torch
from conftest import make_model

from vaswani_mt import VaswaniConfig
from vaswani_mt.system import native_bf16
from vaswani_mt.training import hardware
from vaswani_mt.training.arguments import parse_args
from vaswani_mt.training.hardware import (
    apply_float32_overrides,
    configure_process,
    resolve_attention,
    resolve_precision,
)
from vaswani_mt.training.job import build_model
from vaswani_mt.training.trainer import VaswaniTrainer

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("native", "expected"), [(True, ("small", 256, 0.1, 2048)), (False, ("mini", 128, 0.0, 1024))])
def test_the_main_job_trains_small_with_dropout_under_bf16_and_mini_without_in_float32(
    tmp_path, monkeypatch, native, expected, tokenizer
):
    # benchmarks/RESULTS.md: bf16, small with P_drop 0.1; float32 on a CPU without native bf16, mini without dropout
    monkeypatch.setattr(hardware, "native_bf16", lambda: native)
    config_file = str(ROOT / "configs" / "ding_cpu.yaml")
    model_args, data_args, recipe, args = parse_args([config_file, "--output_dir", str(tmp_path)])
    resolve_precision(recipe, args)
    replaced = apply_float32_overrides(recipe, model_args, data_args, args)
    config = build_model(model_args, tokenizer).config
    assert (model_args.preset, config.d_model, config.dropout, data_args.max_tokens_per_batch) == expected
    assert args.bf16 is native and config.init_std == 0.02
    assert replaced == ({} if native else {"preset": ("small", "mini"), "max_tokens_per_batch": (2048, 1024)})


def test_training_keeps_freed_memory_unless_told_not_to(monkeypatch):
    calls = []
    monkeypatch.setattr(hardware, "retain_freed_memory", lambda: calls.append("retain") or True)
    for extra, expected in (([], ["retain"]), (["--retain_freed_memory", "false"], [])):
        calls.clear()
        configure_process(parse_args(["--report_to", "none", *extra])[2])
        assert calls == expected


@pytest.mark.parametrize("native", [True, False])
def test_auto_bf16_turns_on_bf16_autocast_only_where_bf16_is_native(tmp_path, monkeypatch, native, restore_rng):
    monkeypatch.setattr(hardware, "native_bf16", lambda: native)
    _, _, recipe, args = parse_args(["--output_dir", str(tmp_path), "--report_to", "none", "--auto_bf16", "true"])
    assert not args.bf16
    resolve_precision(recipe, args)
    assert args.bf16 is native
    trainer = VaswaniTrainer(model=make_model(), args=args)  # which seeds every RNG: restore_rng
    assert trainer.accelerator.mixed_precision == ("bf16" if native else "no")
    with trainer.accelerator.autocast():  # what accelerate wraps the model's forward in
        assert torch.is_autocast_enabled(trainer.accelerator.device.type) is native  # the GPU's, where one is


@pytest.mark.parametrize(("native", "extra", "expected"), [
    (True, [], ("small", 2048)), (False, [], ("mini", 1024)), (False, ["--auto_bf16", "false"], ("small", 2048)),
    (False, ["--float32_overrides", '{"preset": "base", "max_tokens_per_batch": 512}'], ("base", 512)),
    (False, ["--preset", "big"], ("big", 1024)),  # an option the command line gives is not replaced
])  # fmt: skip
def test_float32_runs_take_the_overrides_where_auto_bf16_finds_no_bf16(
    tmp_path, monkeypatch, native, extra, expected, tokenizer
):
    monkeypatch.setattr(hardware, "native_bf16", lambda: native)
    config = tmp_path / "run.yaml"
    config.write_text("preset: small\nmax_tokens_per_batch: 2048\nfloat32_overrides:\n  preset: mini\n"
                      "  max_tokens_per_batch: 1024\n")  # fmt: skip
    argv = [str(config), "--output_dir", str(tmp_path), "--report_to", "none", "--auto_bf16", "true", "--d_ff", "384"]
    model_args, data_args, recipe, args = parse_args([*argv, *extra])
    resolve_precision(recipe, args)
    apply_float32_overrides(recipe, model_args, data_args, args)
    assert (model_args.preset, data_args.max_tokens_per_batch) == expected
    config = build_model(model_args, tokenizer).config
    preset = VaswaniConfig.from_preset(expected[0])
    # the shape options still apply on top of the float32 preset
    assert (config.d_model, config.num_encoder_layers, config.d_ff) == (preset.d_model, preset.num_encoder_layers, 384)


def test_bf16_without_native_support_is_kept_but_warned_about(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(hardware, "native_bf16", lambda: False)
    _, _, recipe, args = parse_args(["--output_dir", str(tmp_path), "--report_to", "none", "--bf16", "true"])
    with caplog.at_level("WARNING", logger="vaswani_mt.training.hardware"):
        resolve_precision(recipe, args)
    assert args.bf16 and "emulated" in caplog.text


@pytest.mark.parametrize(("precision", "expected"), [(["--bf16", "true"], "eager"), ([], "sdpa")])
def test_auto_attention_is_eager_for_cpu_bf16_training_and_sdpa_otherwise(
    tmp_path, monkeypatch, precision, expected, tokenizer
):
    monkeypatch.setattr(hardware, "native_bf16", lambda: True)
    argv = ["--output_dir", str(tmp_path), "--report_to", "none", "--use_cpu", "true", "--auto_bf16", "false",
            "--preset", "tiny"]  # fmt: skip
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


def test_several_processes_on_a_machine_without_a_gpu_are_refused_in_one_line_unless_use_cpu(tmp_path, monkeypatch):
    """`accelerate launch --multi_gpu --num_processes 8 scripts/train.py CONFIG.yaml` where torch sees no GPU: each
    process's first check, in one line, before any data is read; `--use_cpu` (the command line or the config file)
    asks for CPU processes."""
    from vaswani_mt.cli import train as train_command

    parsed = parse_args(["--output_dir", str(tmp_path / "run"), "--dataset", "no-such-hub/dataset"])
    config = tmp_path / "cpu.yaml"
    config.write_text("use_cpu: true\n")
    for_cpu = [parse_args(["--use_cpu"])[2], parse_args([str(config)])[2]]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name, value in {"WORLD_SIZE": "8", "LOCAL_RANK": "0", "ACCELERATE_MIXED_PRECISION": "no"}.items():
        monkeypatch.setenv(name, value)
    # parsed as under a launch (where parsing joins the process group, which one process here cannot)
    monkeypatch.setattr(train_command, "parse_args", lambda argv: parsed)
    with pytest.raises(SystemExit) as stop:
        train_command.main([])
    assert stop.value.code == (
        "error: several processes (accelerate launch --multi_gpu, torchrun) on a machine with no GPU that torch can "
        "use: add --use_cpu to the script's options for CPU processes (gloo)"
    )
    assert not (tmp_path / "run").exists()
    for recipe in for_cpu:
        hardware.check_launch_has_gpus(recipe)
    monkeypatch.setenv("WORLD_SIZE", "1")
    hardware.check_launch_has_gpus(parsed[2])
