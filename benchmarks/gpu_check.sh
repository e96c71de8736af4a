#!/usr/bin/env bash
# One check of the GPU path, in under 10 minutes on a machine with a CUDA GPU, written to ONE JSON file:
#
#   1. bf16 training throughput (target tokens/s) and MFU at the base and big shapes with sdpa attention:
#      speed.py train, step mode, 100 pairs x 30 tokens (3,000 target tokens, the per-GPU batch of the 8-GPU recipe),
#      and base at 800 x 30 (24,000: the one-GPU recipe's 25,000 tokens a step in one batch, where the GPU is full);
#      ours and MarianMTModel under bf16 autocast, forward + loss + backward + fused AdamW; ours also compiled
#      (torch.compile of the model with its loss, inductor: `vaswani_mt_bf16_compiled`), and at base 3,000 tokens
#      with CUDA graphs too (mode reduce-overhead: `vaswani_mt_bf16_graphs`); ours with bf16 weights cast once per
#      step (--bf16_weights: `vaswani_mt_bf16_weights` under autocast, `vaswani_mt_weights` all in bf16); each side
#      profiled for 3 steps (kernels per step, the device's busy share); MFU = tokens/s x the
#      training FLOPs per target token counted by vaswani_mt.flops / the device's dense bf16 peak (the table in
#      vaswani_mt/training/flops.py, by torch.cuda.get_device_name(), or GPU_CHECK_PEAK_TFLOPS);
#   2. the loss over the vocabulary at 24,000 positions x 37,000 words, bf16 (benchmarks/loss_memory.py): peak memory
#      and milliseconds of the compiled loss in chunks, in one chunk, the plain log-softmax it replaced, eager's;
#   3. every visible GPU (benchmarks/scale.py gpus): NCCL DDP at base shapes, target tokens/s per GPU and the
#      weights equal on every rank; FSDP2 (accelerate's, the tied matrix of §3.4 in one group) at the same shapes,
#      its tokens/s per GPU against DDP's and whether the matrix is still tied; with one GPU both run as one process
#      (FSDP2 against no wrapper);
#   4. the same under VaswaniTrainer (scripts/train.py, 3,000-token batches, 60 steps): DDP against
#      `accelerate launch --use_fsdp --fsdp_version 2`, target tokens/s from the Trainer's logs;
#   5. decoding speed against MarianMTModel with the same weights: speed.py decode (synthetic), base shapes,
#      beam 4 and greedy at batch 1, 16 and 64, float32 and bf16 weights;
#   6. the tests that run differently where CUDA is visible (Trainer trains on the GPU, the speed benchmarks default
#      to it) and the model's own: modeling, generation, fast paths, training, callbacks, hardware, export, speed
#      benchmarks (in 4 processes where pytest-xdist is installed; the counts of passed and failed tests are kept);
#   7. sharded translation: 2,000 lines with a base-shaped model on one GPU, then on every GPU (accelerate launch):
#      seconds each, and whether the outputs are the same bytes;
#
#   bash benchmarks/gpu_check.sh OUT.json
#
# Each step has a time limit, and the whole run GPU_CHECK_SECONDS (default 540): a step gets at most what is left
# (less 30 s for the summary), and one that would get under 20 s is skipped and recorded so.
# Environment: PYTHON (default .venv/bin/python, else python3); GPU_CHECK_PEAK_TFLOPS (the peak, where the device
# is not in the table); GPU_CHECK_LOGS (a .tar.gz to keep every step's log in); GPU_CHECK_DRY_RUN=1 runs the steps
# at tiny shapes on any device, without the tests, compiling with aot_eager and without FSDP (a check of this script
# itself, for machines without a GPU).
# Without CUDA (and no dry run) it exits with status 2 and one line saying so. A step that fails is recorded in the
# JSON and the others still run; the exit status is then 1.
set -euo pipefail

out=${1:?usage: bash benchmarks/gpu_check.sh OUT.json}
[[ $out == /* ]] || out=$PWD/$out  # the script runs from the repository root
cd "$(dirname "$0")/.."
if [[ -z ${PYTHON:-} ]]; then
    PYTHON=python3
    [[ -x .venv/bin/python ]] && PYTHON=.venv/bin/python
fi
dry_run=${GPU_CHECK_DRY_RUN:-0}
if [[ $dry_run != 1 ]] && ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check.sh: no CUDA device (torch.cuda.is_available() is False in $PYTHON); nothing was measured" >&2
    exit 2
fi

work=$(mktemp -d)
trap '[[ -n ${GPU_CHECK_LOGS:-} ]] && tar -czf "$GPU_CHECK_LOGS" -C "$work" --exclude translate .; rm -rf "$work"' EXIT
start=$SECONDS

budget=${GPU_CHECK_SECONDS:-570}
# inductor's caches for this run's compiled sides (a rerun on the same machine compiles from them)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-${TMPDIR:-/tmp}/gpu_check_inductor}
[[ -n ${GPU_CHECK_LOGS:-} && ${GPU_CHECK_LOGS} != /* ]] && GPU_CHECK_LOGS=$PWD/$GPU_CHECK_LOGS

# step NAME LIMIT_SECONDS COMMAND...: runs it with its output in $work/NAME.log and its exit status in $work/NAME.rc
# (124: over the limit; 125: skipped, no time left); never stops the script.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((budget - 30 - (SECONDS - start)))
    ((left < limit)) && limit=$left
    if ((limit < 20)); then
        echo "skipped: ${left} s of GPU_CHECK_SECONDS=$budget left" >"$work/$name.log"
        echo 125 >"$work/$name.rc"
        echo "== $name: skipped, ${left} s left"
        return
    fi
    echo "== $name (at most ${limit} s): $*"
    local rc=0
    local began=$SECONDS
    timeout --signal=INT --kill-after=15 "$limit" "$@" >"$work/$name.log" 2>&1 || rc=$?
    echo "$rc" >"$work/$name.rc"
    echo $((SECONDS - began)) >"$work/$name.seconds"
    tail -n 3 "$work/$name.log"
    echo "== $name: exit status $rc, $((SECONDS - start)) s so far"
}

if [[ $dry_run == 1 ]]; then
    device=$("$PYTHON" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
    shape=(--preset tiny --vocab_size 300 --threads 1)
    train_length=6
    train_shape=(--batch 4 --length $train_length --repeats 2 --warmup 1)
    decode_shape=(--length 6 --steps 4 --batches 1,3 --repeats 1)
    loss_shape=(--rows 600 --vocab 300 --d_model 32)
    compile_backend=aot_eager  # the graph without inductor's code generation: minutes a graph on a CPU
else
    device=cuda
    shape=(--vocab_size 37000)
    train_length=30
    train_shape=(--batch 100 --length $train_length --repeats 20 --warmup 3)
    decode_shape=(--length 30 --steps 30 --batches 1,16,64 --repeats 3)
    loss_shape=(--rows 24000 --vocab 37000 --d_model 512 --bf16)  # the 1-GPU recipe's batch
    compile_backend=inductor
fi
for run in base big base_24k; do
    preset_args=("${shape[@]}")
    [[ $dry_run == 1 ]] || preset_args+=(--preset "${run%_24k}")
    run_shape=("${train_shape[@]}")
    [[ $run == *_24k ]] && run_shape+=(--batch $((8 * ${train_shape[1]})))  # the last --batch wins
    # bf16 weights (--bf16_weights): under autocast, and the whole step in bf16
    sides=marian_bf16,vaswani_mt_bf16,vaswani_mt_bf16_compiled,vaswani_mt_bf16_weights,vaswani_mt_weights
    [[ $run == base && $device == cuda ]] && sides+=,vaswani_mt_bf16_graphs  # CUDA graphs: where the host limits
    step "train_$run" 150 "$PYTHON" benchmarks/speed.py train --mode step --device "$device" "${preset_args[@]}" \
        "${run_shape[@]}" --sides "$sides" --profile 3 --no-memory --compile_backend "$compile_backend" \
        --json "$work/train_$run.json"
done
# 2. The loss over the vocabulary: the peak memory (and on a GPU the time) of the compiled loss in chunks, against one
# chunk, the plain log-softmax the compiled step used before, and eager's fused loss
step loss_memory 120 "$PYTHON" benchmarks/loss_memory.py --device "$device" "${loss_shape[@]}" \
    --backend "$compile_backend" --json "$work/loss_memory.json"
# 3. Every visible GPU: NCCL DDP (tokens/s per GPU, the same weights on every rank), and the tied matrix under FSDP2.
# The dry run: 2 CPU processes (gloo), no FSDP (accelerate's FSDP needs GPUs).
accelerate=$(dirname "$PYTHON")/accelerate
[[ -x $accelerate ]] || accelerate=accelerate
if [[ $dry_run == 1 ]]; then
    gpus=2
    multi=(--preset tiny --vocab_size 300 --batch 4 --length 6 --steps 4 --cpu)
else
    gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
    multi=(--preset base --batch 100 --length 30 --steps 20)
fi
launch=("$accelerate" launch --num_machines 1 --num_processes "$gpus" --main_process_port 29517 --dynamo_backend no)
# skip NAME REASON: recorded as skipped (125), not as failed
skip() { echo "skipped: $2" >"$work/$1.log" && echo 125 >"$work/$1.rc" && echo "== $1: skipped, $2"; }
one_gpu="one GPU: accelerate's --multi_gpu needs two processes, each on a GPU of its own"
ddp=(--multi_gpu)
((gpus > 1)) || ddp=()  # one GPU: one process, no wrapper (accelerate's --multi_gpu needs two)
step multi_gpu_ddp 120 "${launch[@]}" "${ddp[@]}" benchmarks/scale.py gpus --mode ddp "${multi[@]}" \
    --json "$work/multi_gpu_ddp.json"
if [[ $dry_run != 1 ]]; then
    step multi_gpu_fsdp 120 "${launch[@]}" --use_fsdp --fsdp_version 2 benchmarks/scale.py gpus --mode fsdp \
        "${multi[@]}" --json "$work/multi_gpu_fsdp.json"
fi

# The data of 4 and 7: a base-shaped model (random weights, a tokenizer of its own), 2,000 lines, and pairs of them.
"$PYTHON" - "$work/translate" "$dry_run" <<'PYTHON'
import random, sys
from pathlib import Path
from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.data.tokenization import train_tokenizer
folder, dry_run = Path(sys.argv[1]), sys.argv[2] == "1"
draw = random.Random(0)
words = [f"w{i}" for i in range(3000)]
lines = [" ".join(draw.choice(words) for _ in range(draw.randint(3, 30))) for _ in range(24 if dry_run else 2000)]
tokenizer = train_tokenizer(lines, vocab_size=500 if dry_run else 8000, min_frequency=1)
config = VaswaniConfig.from_preset("tiny" if dry_run else "base", vocab_size=len(tokenizer))
VaswaniForConditionalGeneration(config).save_pretrained(folder / "model")
tokenizer.save_pretrained(folder / "model")
(folder / "in.txt").write_text("".join(f"{line}\n" for line in lines))
# pairs for the Trainer runs below: a line and its words reversed
pairs = lines * 10
(folder / "pairs.tsv").write_text("en\tde\n" + "".join(f"{x}\t{' '.join(x.split()[::-1])}\n" for x in pairs))
PYTHON

# 4. The same comparison under VaswaniTrainer, as users train (scripts/train.py: token-budget batches of 3,000 target
# tokens a GPU, bf16, at base shapes): DDP (one process with no wrapper where there is one GPU) against FSDP2
# (accelerate's --use_fsdp --fsdp_version 2, the tied matrix in one group); target tokens/s from the Trainer's logs.
# The dry run: DDP on 2 CPU processes (gloo) only, as accelerate refuses FSDP on CPU processes.
trainer=(scripts/train.py --dataset "$work/translate/pairs.tsv" --tokenizer "$work/translate/model" --save_strategy no
         --test_bleu false --average_last 1 --report_to none --disable_tqdm true --dataloader_num_workers 0)
if [[ $dry_run == 1 ]]; then
    trainer+=(--preset tiny --max_tokens_per_batch 128 --max_steps 4 --logging_steps 2 --use_cpu)
else
    trainer+=(--preset base --max_tokens_per_batch 3000 --max_steps 60 --logging_steps 10 --bf16 true)
fi
step trainer_ddp 120 "${launch[@]}" "${ddp[@]}" "${trainer[@]}" --output_dir "$work/trainer_ddp"
if [[ $dry_run != 1 ]]; then
    step trainer_fsdp 120 "${launch[@]}" --use_fsdp --fsdp_version 2 --fsdp_state_dict_type FULL_STATE_DICT \
        "${trainer[@]}" --output_dir "$work/trainer_fsdp"
else
    skip trainer_fsdp "accelerate's FSDP needs GPUs (a dry run has CPU processes)"
fi
# 5, 6. Decoding against Marian, and the tests that run differently with CUDA (after the measurements above).
step decode 120 "$PYTHON" benchmarks/speed.py decode --device "$device" "${shape[@]}" \
    "${decode_shape[@]}" --bf16 --no-memory --json "$work/decode.json"
if [[ $dry_run != 1 ]]; then
    parallel=()
    "$PYTHON" -c 'import xdist' 2>/dev/null && parallel=(-n 4)
    step tests 180 "$PYTHON" -m pytest -q -p no:cacheprovider "${parallel[@]}" --junitxml="$work/tests.xml" \
        tests/model/test_modeling_vaswani.py tests/model/test_generation.py tests/model/test_fast_paths.py \
        tests/training/test_trainer.py tests/training/test_callbacks.py tests/training/test_hardware.py \
        tests/export/test_export.py tests/test_speed_benchmarks.py tests/training/test_compiled_step.py \
        tests/training/test_sharding.py tests/training/test_bf16_weights.py
fi

# 7. Sharded translation (docs/translating.md): the base-shaped model translates the 2,000 lines with one GPU, then
# with every GPU (accelerate launch); the two outputs must be the same bytes.
translate=(--model "$work/translate/model" --input "$work/translate/in.txt")
[[ $dry_run == 1 ]] && translate+=(--num_beams 1)  # random weights write to the length limit: keep the check short
step translate_one 120 "$PYTHON" scripts/translate.py "${translate[@]}" --output "$work/translate/one.txt"
if ((gpus > 1)); then
    step translate_all 120 "${launch[@]}" --multi_gpu scripts/translate.py "${translate[@]}" \
        --output "$work/translate/all.txt"
    [[ -f $work/translate/all.txt ]] && { cmp -s "$work/translate/one.txt" "$work/translate/all.txt" && echo 1 || echo 0; } \
        >"$work/translate_same"
else
    skip translate_all "$one_gpu"
fi

status=0
"$PYTHON" - "$out" "$work" "$device" "$dry_run" "$train_length" "$((SECONDS - start))" "$gpus" <<'PYTHON' || status=$?
"""Gathers the steps' records into one JSON file, with MFU from the counted FLOPs per token."""
import json
import os
import platform
import re
import statistics
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import torch
import transformers

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.training.flops import count_training_flops, mfu, peak_tflops

out, work, device, dry_run, length, seconds, gpus = sys.argv[1:]
work, dry_run, length = Path(work), dry_run == "1", int(length)


def read(name: str):
    path = work / name
    return json.loads(path.read_text()) if path.exists() else None


def step_status(name: str) -> dict | None:
    rc_file = work / f"{name}.rc"
    if not rc_file.exists():
        return None
    rc = int(rc_file.read_text())
    log = (work / f"{name}.log").read_text(errors="replace").splitlines()
    return {"exit_status": rc, "timed_out": rc == 124, "skipped": rc == 125, "log_tail": log[-15:] if rc else log[-2:]}


name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
peak = float(os.environ["GPU_CHECK_PEAK_TFLOPS"]) if os.environ.get("GPU_CHECK_PEAK_TFLOPS") else peak_tflops(name)
result = {
    "what": "benchmarks/gpu_check.sh" + (" (dry run: tiny shapes, no tests)" if dry_run else ""),
    "device": name,
    "peak_bf16_tflops": peak,
    "versions": {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
    },
    # what speed.py train builds: VaswaniForConditionalGeneration(config) with transformers' default choice
    "attn_implementation": VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny"))
    .to(device)
    .config._attn_implementation,
    "seconds_before_this_summary": int(seconds),
    "steps": {},
}
tests = step_status("tests")
if tests is not None:
    result["steps"]["tests"] = tests
    if (work / "tests.xml").exists():
        suite = ET.parse(work / "tests.xml").getroot()
        suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
        counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
        counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
        result["tests"] = counts

result["training_bf16"] = {}
for run in ("base", "big", "base_24k"):
    result["steps"][f"train_{run}"] = step_status(f"train_{run}")
    record = read(f"train_{run}.json")
    if record is None:
        continue
    preset = run.removesuffix("_24k")
    config = VaswaniConfig.from_preset("tiny" if dry_run else preset, vocab_size=300 if dry_run else 37000)
    per_token = count_training_flops(config, length, batch=1).per_target_token
    sides = {}
    for side, row in record["sides"].items():
        sides[side] = {
            "target_tokens_per_s": round(row["target_tokens_per_s"], 1),
            "median_step_s": round(row["median_s"], 5),
            "mfu": round(mfu(row["target_tokens_per_s"], per_token, peak), 4) if peak else None,
        }
        if "ratio_of_medians" in row:
            sides[side]["speed_vs_marian_bf16"] = round(row["ratio_of_medians"], 3)
        profile = row.get("profile") or {}
        for key in ("kernels_per_step", "device_busy_share"):
            if key in profile:
                sides[side][key] = profile[key]
    eager = sides.get("vaswani_mt_bf16", {}).get("target_tokens_per_s")
    for side in ("vaswani_mt_bf16_compiled", "vaswani_mt_bf16_graphs", "vaswani_mt_bf16_weights", "vaswani_mt_weights"):
        if eager and side in sides:
            sides[side]["speed_vs_eager"] = round(sides[side]["target_tokens_per_s"] / eager, 3)
    result["training_bf16"][run] = {
        "shape": record["shape"],
        "target_tokens_per_step": record["target_tokens_per_step"],
        "flops_per_target_token": per_token,
        "sides": sides,
    }

result["steps"]["decode"] = step_status("decode")
decode = read("decode.json")
if decode is not None:
    result["decoding"] = {
        "shape": decode["shape"],
        "cases": [
            {
                "search": case["search"],
                "batch": case["batch"],
                "identical_tokens_fp32": case["identical_tokens"],
                "sentences_per_s": {k: round(v, 2) for k, v in case["sentences_per_s"].items()},
                "speed_vs_marian_fp32": {k: round(v, 3) for k, v in case["ratios_of_medians"].items()},
                "share_equal_to_marian_fp32": case["share_equal_to_marian_fp32"],
            }
            for case in decode["cases"]
        ],
    }
trainer = {}
for mode in ("ddp", "fsdp"):
    result["steps"][f"trainer_{mode}"] = status = step_status(f"trainer_{mode}")
    log = work / f"trainer_{mode}.log"
    # the Trainer's logs, every --logging_steps: all processes' target tokens over the wall seconds since the last
    rates = [float(x) for x in re.findall(r"'target_tokens_per_second': '?([0-9.]+)", log.read_text(errors="replace"))
             ] if log.exists() else []  # fmt: skip
    if status and not status["skipped"]:
        later = rates[1:] or rates  # the first window holds the start (and any compiling)
        trainer[mode] = {"logs": len(rates), "target_tokens_per_s": round(statistics.median(later), 1) if later else None}
if trainer:
    trainer["processes"] = int(gpus)  # with one, "ddp" is that process without a wrapper
    speeds = [trainer.get(mode, {}).get("target_tokens_per_s") for mode in ("fsdp", "ddp")]
    if all(speeds):
        trainer["fsdp2_vs_ddp_tokens_per_s"] = round(speeds[0] / speeds[1], 3)
    result["trainer_ddp_vs_fsdp2"] = trainer
result["steps"]["loss_memory"] = step_status("loss_memory")
result["loss_memory"] = read("loss_memory.json")
for mode in ("ddp", "fsdp"):
    status = step_status(f"multi_gpu_{mode}")
    if status is not None:
        result["steps"][f"multi_gpu_{mode}"] = status
        result[f"multi_gpu_{mode}"] = read(f"multi_gpu_{mode}.json")
speeds = [(result.get(f"multi_gpu_{mode}") or {}).get("target_tokens_per_s_per_process") for mode in ("fsdp", "ddp")]
if all(speeds):
    result["fsdp2_vs_ddp_tokens_per_s"] = round(speeds[0] / speeds[1], 3)
sharded = {}
for name in ("translate_one", "translate_all"):
    result["steps"][name] = step_status(name)
    seconds_file = work / f"{name}.seconds"
    sharded[name] = int(seconds_file.read_text()) if seconds_file.exists() else None
if (work / "translate_same").exists():
    sharded["processes"] = int(gpus)
    sharded["same_bytes"] = (work / "translate_same").read_text().strip() == "1"
    result["sharded_translation_seconds"] = sharded
failed = [step for step, status in result["steps"].items() if status is None or status["exit_status"] not in (0, 125)]
result["failed_steps"] = failed
result["skipped_steps"] = [step for step, status in result["steps"].items() if status and status["skipped"]]
Path(out).parent.mkdir(parents=True, exist_ok=True)
Path(out).write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result, indent=2))
print(f"gpu_check.sh: wrote {out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
sys.exit(1 if failed else 0)
PYTHON
echo "gpu_check.sh: $((SECONDS - start)) s in all"
exit "$status"
