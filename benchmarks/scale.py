#!/usr/bin/env python
"""Scale and faults: several machines and GPUs, the paper's runs on GPUs, a long input stream.

    python benchmarks/scale.py machines ...    # two simulated machines against one of two processes; a lost one
    python benchmarks/scale.py gpus ...        # gpu_check.sh's multi-GPU worker, under `accelerate launch`
    python benchmarks/scale.py paper_time ...  # the paper's two runs on 1 and 8 GPUs, from counted FLOPs
    python benchmarks/scale.py stream ...      # translate.py on 100,000 lines of standard input: speed, flat memory
    python benchmarks/scale.py shards ...      # translate.py as 2 processes of 1 thread against 1 process of 2

`python benchmarks/scale.py COMMAND --help` describes each. WMT-scale data preparation: data_scale.py; the demo
under load: demo_load.py.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from speed_common import ROOT, MachineRecord, command_parser, dispatch, free_port, print_table, synthetic_batch

sys.path.insert(0, str(ROOT))  # the repository, for a run without installing

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.training.flops import (
    GPU_PEAK_TFLOPS,
    PAPER_P100_TFLOPS,
    PAPER_RUNS,
    PAPER_TOKENS_PER_STEP,
    WMT14_MEAN_LENGTH,
    analytic_training_flops_per_token,
    count_training_flops,
)
from vaswani_mt.training.sharding import share_embedding_module

# --- machines: two simulated machines against one --------------------------------------------------------------------


ACCELERATE = str(Path(sys.executable).parent / "accelerate")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def _train(args, output: Path) -> list[str]:
    return [str(ROOT / "scripts" / "train.py"), "--dataset", "ding", "--preset", args.preset, "--output_dir",
            str(output), "--max_steps", str(args.steps), "--max_tokens_per_batch", str(args.max_tokens),
            "--vocab_size", "8000", "--warmup_steps", "400", "--logging_steps", "1", "--save_steps", "10",
            "--report_to", "none", "--seed", "1", "--test_bleu", "false", "--disable_tqdm", "true",
            "--use_cpu"]  # fmt: skip


def _launch(machines: int, processes: int, port: int) -> list[str]:
    """`accelerate launch` of `processes` CPU processes in all (gloo) on `machines` machines."""
    return [ACCELERATE, "launch", "--multi_gpu", "--num_machines", str(machines), "--num_processes", str(processes),
            "--main_process_port", str(port), "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip


def _one_machine(args, output: Path) -> list[list[str]]:
    return [[*_launch(1, 2, free_port()), *_train(args, output)]]


def _two_machines(args, outputs: list[Path]) -> list[list[str]]:
    port = free_port()
    return [[*_launch(2, 2, port), "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--rdzv_backend",
             "static", "--same_network", *_train(args, outputs[rank])] for rank in (0, 1)]  # fmt: skip


def _run(commands: list[list[str]], envs: list[dict] | None = None, lose_after: int | None = None) -> dict:
    """Runs the launchers together; with `lose_after`, kills machine 1 (launcher and workers) once machine 0 logged
    that many steps and times machine 0's end."""
    envs = envs or [ENV] * len(commands)
    launchers = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, text=True, start_new_session=True)
                 for i, (c, e) in enumerate(zip(commands, envs, strict=True))]  # fmt: skip
    steps, lost_at = 0, None
    for line in launchers[0].stdout:
        steps += "'loss'" in line
        if lose_after is not None and steps == lose_after and lost_at is None:
            import psutil

            victims = [*psutil.Process(launchers[1].pid).children(recursive=True), psutil.Process(launchers[1].pid)]
            for process in victims:
                process.kill()
            lost_at = time.monotonic()
    codes = [launcher.wait(timeout=600) for launcher in launchers]
    return {"codes": codes, "seconds_to_end": time.monotonic() - lost_at if lost_at else None}


def _tokens_per_second(output: Path) -> float:
    rows = json.loads((output / "trainer_state.json").read_text())["log_history"]
    return statistics.median(row["target_tokens_per_second"] for row in rows if row.get("step", 0) > 5
                             and "target_tokens_per_second" in row)  # fmt: skip


def _same(a: Path, b: Path) -> bool:
    from safetensors.torch import load_file

    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def machines(argv=None) -> None:
    """Two simulated machines (accelerate's multi-node path, gloo, one process each) against one machine of two
    processes, rounds interleaved: tokens/s and the same weights; --lost N rounds lose machine 1 and resume."""
    parser = command_parser(machines)
    parser.add_argument("--preset", default="small", help="the model trained")
    parser.add_argument("--steps", type=int, default=30, help="training steps of each run")
    parser.add_argument("--max_tokens", type=int, default=1024, help="token budget per batch and process")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of one machine and two")
    parser.add_argument("--lost", type=int, default=0, help="rounds that lose machine 1 after step 5")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1: a lost machine's weights are checked against round 0's")
    record = MachineRecord()
    work = Path(tempfile.mkdtemp(prefix="multinode-"))
    rounds = []
    try:
        for index in range(args.rounds):
            one, two = work / f"one{index}", work / f"two{index}"
            order = [("one", lambda one=one: _run(_one_machine(args, one))),
                     ("two", lambda two=two: _run(_two_machines(args, [two, two])))]  # fmt: skip
            for name, run in order if index % 2 == 0 else order[::-1]:
                assert run()["codes"] == [0] * (1 if name == "one" else 2), f"round {index}: {name} failed"
            rounds.append(
                {
                    "one_machine": _tokens_per_second(one),
                    "two_machines": _tokens_per_second(two),
                    "same_weights": _same(one / f"checkpoint-{args.steps}", two / f"checkpoint-{args.steps}"),
                }
            )
            print(f"round {index}: {rounds[-1]}", flush=True)
        lost = []
        reference = work / "one0" / f"checkpoint-{args.steps}"
        for index in range(args.lost):
            folders = [work / f"lost{index}-m{rank}" for rank in (0, 1)]
            envs = [{**ENV, "HF_DATASETS_CACHE": str(work / f"cache{rank}")} for rank in (0, 1)]
            killed = _run(_two_machines(args, folders), envs, lose_after=5)
            resumed = _run(_two_machines(args, folders), envs)
            lost.append(
                {
                    "seconds_to_end": round(killed["seconds_to_end"], 2),
                    "exit_status": killed["codes"][0],
                    "resumed": resumed["codes"] == [0, 0],
                    "same_weights": all(_same(f / f"checkpoint-{args.steps}", reference) for f in folders),
                }
            )
            print(f"lost machine {index}: {lost[-1]}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    one = statistics.median(r["one_machine"] for r in rounds)
    two = statistics.median(r["two_machines"] for r in rounds)
    from vaswani_mt.system import native_bf16

    medians = {"one_machine_2_processes": one, "two_machines_1_process": two}
    result = {"args": vars(args), "rounds": rounds, "lost_machine": lost, "median_target_tokens_per_s": medians,
              "ratio_two_over_one": round(two / one, 3)}  # fmt: skip
    rows = [{"setup": "one machine, 2 processes", "target tokens/s": one},
            {"setup": "two machines, 1 process each", "target tokens/s": two, "ratio": two / one}]  # fmt: skip
    print_table(f"Median of {args.rounds} rounds", rows, ["setup", "target tokens/s", "ratio"])
    if lost:
        print(f"lost machine 1: machine 0 ended {[r['seconds_to_end'] for r in lost]} s after; resumed exactly: "
              f"{[r['same_weights'] for r in lost]}")  # fmt: skip
    record.report(result, args.json, native_bf16=native_bf16())


# --- gpus: the multi-GPU step of gpu_check.sh ------------------------------------------------------------------------


def _timed_steps(accelerator, model, optimizer, config, steps: int, args) -> list[float]:
    """Seconds of each of `steps` training steps on random pairs (each rank and step its own), kernels waited for."""
    times = []
    for step in range(steps):
        seed = 1000 * step + accelerator.process_index
        batch = synthetic_batch(config, args.batch, args.length, seed, accelerator.device)
        if accelerator.device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if accelerator.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return times


def _tied(model) -> bool:
    """Whether the source embedding, the target embedding and the pre-softmax projection are still one matrix."""
    matrices = [model.model.encoder.embed_tokens.weight, model.model.decoder.embed_tokens.weight,
                model.get_output_embeddings().weight, model.get_input_embeddings().weight]  # fmt: skip
    return len({matrix.data_ptr() for matrix in matrices}) == 1


def gpus(argv=None) -> None:
    """gpu_check.sh's multi-GPU step (`gpus`), one process per GPU under `accelerate launch`:

        accelerate launch --multi_gpu --num_processes N benchmarks/scale.py gpus --mode ddp --json OUT.json
        accelerate launch --use_fsdp --fsdp_version 2 --num_processes N benchmarks/scale.py gpus --mode fsdp ...

    - `ddp`: NCCL data parallel on every visible GPU (gloo on CPU processes with --cpu, gpu_check.sh's dry run): the
      model of --preset trained --steps steps on random pairs of --length tokens, --batch pairs per GPU, bf16 autocast,
      fused AdamW; records target tokens/s per GPU (median step) and whether the weights are bit-for-bit equal on every
      rank afterwards (a SHA-256 of each rank's parameters, gathered).
    - `fsdp`: the same steps under the FSDP plugin the launcher set (FSDP2: `--use_fsdp --fsdp_version 2`), the
      encoder and decoder using the shared embedding module (`sharding.share_embedding_module`, as VaswaniTrainer
      does under FSDP), so that the three-way tied matrix (§3.4) is one group's; records target tokens/s per GPU and
      whether the three are still one parameter afterwards, or the error.
    With one GPU either runs as one process (no `--multi_gpu`): FSDP2 against no wrapper at all.

    Rank 0 writes the record to --json."""
    import accelerate
    from accelerate import Accelerator
    from accelerate.utils import gather_object

    parser = command_parser(gpus, "rank 0 writes the record here")
    parser.add_argument("--mode", choices=["ddp", "fsdp"], required=True, help="the check (the doc above)")
    parser.add_argument("--preset", default="base", help="the model trained")
    parser.add_argument("--vocab_size", type=int, default=37000, help="the model's vocabulary")
    parser.add_argument("--batch", type=int, default=100, help="pairs per GPU and step")
    parser.add_argument("--length", type=int, default=30, help="tokens per random sentence")
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--cpu", action="store_true", help="CPU processes (gloo): the dry run of gpu_check.sh")
    args = parser.parse_args(argv)

    accelerator = Accelerator(cpu=args.cpu, mixed_precision="no" if args.cpu else "bf16")
    config = VaswaniConfig.from_preset(args.preset, vocab_size=args.vocab_size)
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(config)
    shape = {"preset": args.preset, "batch_per_process": args.batch, "length": args.length}
    record: dict = {"mode": args.mode, "processes": accelerator.num_processes,
                    "device": torch.cuda.get_device_name() if torch.cuda.is_available() and not args.cpu else "cpu",
                    "backend": str(torch.distributed.get_backend()) if torch.distributed.is_initialized() else None,
                    "accelerate": accelerate.__version__, "torch": torch.__version__, "shape": shape}  # fmt: skip
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                                      fused=not args.cpu)  # fmt: skip
        if args.mode == "fsdp":
            share_embedding_module(model)
        model, optimizer = accelerator.prepare(model, optimizer)
        times = _timed_steps(accelerator, model, optimizer, config, args.steps, args)
        unwrapped = accelerator.unwrap_model(model)
        warm = times[min(3, len(times) - 1) :]
        record["target_tokens_per_s_per_process"] = round(args.batch * args.length / statistics.median(warm), 1)
        if args.mode == "ddp":
            digest = hashlib.sha256()
            for name, parameter in sorted(unwrapped.state_dict().items()):
                digest.update(name.encode())
                digest.update(parameter.detach().float().cpu().numpy().tobytes())
            digests = gather_object([digest.hexdigest()])
            record["weights_equal_on_every_rank"] = len(set(digests)) == 1
        else:
            record["fsdp_step"] = "ok"
            record["tied_after_fsdp"] = _tied(unwrapped)
    except Exception as error:  # the answer to record (FSDP refusing the tied matrix, say), not a crash
        record["error"] = f"{type(error).__name__}: {' '.join(str(error).split())[:400]}"
    if accelerator.is_main_process:
        print(json.dumps(record))
        if args.json:
            Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    accelerator.wait_for_everyone()
    accelerator.end_training()


# --- paper_time: the paper's runs on GPUs ----------------------------------------------------------------------------


GPU_COUNTS = (1, 8)  # the paper's 8 P100 GPUs, and one


def estimate(args) -> dict:
    gpus = args.gpus.split(",")
    models = {}
    for name in args.models.split(","):
        paper = PAPER_RUNS[name]
        counted = count_training_flops(name, args.length, vocab_size=args.vocab_size)
        analytic = analytic_training_flops_per_token(name, args.length, vocab_size=args.vocab_size)
        per_step = counted.per_target_token * PAPER_TOKENS_PER_STEP
        total = per_step * paper["steps"]
        seconds = {gpu: total / (args.mfu * GPU_PEAK_TFLOPS[gpu] * 1e12) for gpu in gpus}  # on one GPU
        hours = {gpu: {n: seconds[gpu] / n / 3600 for n in GPU_COUNTS} for gpu in gpus}
        paper_seconds = paper["hours_on_8_p100"] * 3600
        models[name] = {
            "steps": paper["steps"],
            "flops_per_target_token": counted.per_target_token,
            "analytic_flops_per_target_token": analytic["total"],
            "flops_per_step": per_step,
            "total_flops": total,
            "paper_table2_flops": paper["table2_flops"],
            "paper_hours_on_8_p100": paper["hours_on_8_p100"],
            # the counted work per second of the paper's run over its assumed 8 x 9.5 TFLOPS
            "paper_run_utilisation": total / (paper_seconds * 8 * PAPER_P100_TFLOPS * 1e12),
            "hours": hours,
        }
    return {
        "mfu": args.mfu,
        "length": args.length,
        "tokens_per_step": PAPER_TOKENS_PER_STEP,
        "peak_tflops": {gpu: GPU_PEAK_TFLOPS[gpu] for gpu in gpus},
        "models": models,
    }


def _duration(hours: float) -> str:
    if hours < 1:
        return f"{hours * 60:.0f} min"
    return f"{hours:.1f} h" if hours < 48 else f"{hours:.0f} h ({hours / 24:.1f} d)"


def paper_time(argv=None) -> dict:
    """The paper's two runs (base, big) in hours on 1 and 8 GPUs of each kind: the training FLOPs counted from the
    model (and by formula, the check), at an assumed model FLOPs utilisation (--mfu) of each GPU's dense bf16 peak.
    The JSON has each model's FLOPs per target token, per step and in all, and the paper's own utilisation."""
    parser = command_parser(paper_time)
    parser.add_argument("--mfu", type=float, default=0.35, help="model FLOPs utilisation assumed on every GPU")
    parser.add_argument("--gpus", default=",".join(GPU_PEAK_TFLOPS), help=f"of {', '.join(GPU_PEAK_TFLOPS)}")
    parser.add_argument("--models", default="base,big", help="of base, big")
    parser.add_argument("--length", type=int, default=WMT14_MEAN_LENGTH, help="tokens per sentence, each side")
    parser.add_argument("--vocab_size", type=int, default=37000, help="the shared BPE vocabulary's size")
    args = parser.parse_args(argv)
    unknown = [g for g in args.gpus.split(",") if g not in GPU_PEAK_TFLOPS]
    if unknown or not 0 < args.mfu <= 1:
        parser.error(f"unknown GPU kind {unknown}" if unknown else "--mfu must be in (0, 1]")
    result = estimate(args)
    for name, m in result["models"].items():
        print(f"{name}: {m['flops_per_target_token'] / 1e6:.1f} MFLOP per target token, {m['total_flops']:.3g} in "
              f"{m['steps']:,} steps; the paper's run: {m['paper_run_utilisation']:.0%} of 8 x 9.5 TFLOPS")  # fmt: skip
    runs = {f"{name}, {n} GPU{'s' if n > 1 else ''}": (model, n) for name, model in result["models"].items()
            for n in GPU_COUNTS}  # fmt: skip
    rows = []
    for gpu, peak in result["peak_tflops"].items():
        rows.append({"GPU": gpu, "peak TFLOPS": f"{peak:g}"})
        rows[-1].update({run: _duration(m["hours"][gpu][n]) for run, (m, n) in runs.items()})
    print_table(f"Expected wall time at MFU {args.mfu:.2f} of the dense bf16/fp16 tensor peak (vendor data sheets)",
                rows, ["GPU", "peak TFLOPS", *runs])  # fmt: skip
    return MachineRecord().report(result, args.json)


# --- stream: translate.py on a long standard input -------------------------------------------------------------------


def distinct_lines() -> list[str]:
    """60 lines of 1 to 3 of the six sentences: 6 single ones, 30 ordered pairs and 24 triples."""
    from speed_common import PAIRS

    english = [en for en, _ in PAIRS]
    lines = list(english)
    lines += [f"{a} {b}" for a in english for b in english if a != b]
    lines += [f"{english[i]} {english[(i + 1) % 6]} {english[(i + k) % 6]}" for i in range(6) for k in (2, 3, 4, 5)]
    return lines


def input_line(i: int, lines: list[str]) -> str:
    return lines[(i * 37) % len(lines)]  # 37 is prime to 60: every line once in each 60, in a shuffled order


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc/PID/stat): its throughput on a shared machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_stream(args: argparse.Namespace, folder: Path) -> dict:
    from speed_common import peak_rss_mib

    from vaswani_mt.inference.loading import load_for_inference
    from vaswani_mt.inference.translate import translate

    lines = distinct_lines()
    model, tokenizer = load_for_inference(str(folder), device="cpu")
    expected = translate(model, tokenizer, lines, batch_size=1, num_beams=args.num_beams)
    assert all(expected), "the model left a line untranslated: the order check would be weak"
    del model

    command = [sys.executable, str(ROOT / "scripts" / "translate.py"), "--model", str(folder), "--num_beams",
               str(args.num_beams), "--batch_size", str(args.batch_size)]  # fmt: skip
    if args.chunk_size:
        command += ["--chunk_size", str(args.chunk_size)]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               env=env)  # fmt: skip

    def write_input() -> None:
        block = 1000
        for first in range(0, args.lines, block):
            data = "".join(f"{input_line(i, lines)}\n" for i in range(first, min(first + block, args.lines)))
            process.stdin.write(data.encode())
        process.stdin.close()  # translate.py holds a last partial chunk until the input ends
        written.set()

    written = threading.Event()
    threading.Thread(target=write_input, daemon=True).start()
    outputs_before_input_ended = None
    marks, wrong, first_output = {}, 0, None
    try:
        for i in range(args.lines):
            output = process.stdout.readline()
            if first_output is None:
                first_output = time.perf_counter() - start
            if outputs_before_input_ended is None and written.is_set():
                outputs_before_input_ended = i
            if not output:
                raise RuntimeError(f"translate.py ended after {i} of {args.lines} lines (status {process.wait()})")
            wrong += output.decode("utf-8").rstrip("\n") != expected[(i * 37) % len(lines)]
            if (i + 1) % args.checkpoint == 0 or i + 1 == args.lines:
                marks[i + 1] = {
                    "seconds": round(time.perf_counter() - start, 1),
                    "cpu_seconds": round(_cpu_seconds(process.pid), 1),
                    "peak_rss_mib": round(peak_rss_mib(process.pid), 1),
                    "rss_mib": round(peak_rss_mib(process.pid, "VmRSS"), 1),
                    "wrong_or_out_of_order": wrong,
                }
                print(json.dumps({"lines": i + 1, **marks[i + 1]}), file=sys.stderr, flush=True)
        status = process.wait(timeout=120)
    finally:
        process.kill()
    wall = time.perf_counter() - start
    first, last = marks[args.checkpoint], marks[args.lines]
    after = args.lines - args.checkpoint  # the lines after the first reading: the steady state
    cpu_after = last["cpu_seconds"] - first["cpu_seconds"]
    return {"lines": args.lines, "num_beams": args.num_beams, "batch_size": args.batch_size,
            "chunk_size": args.chunk_size or 16 * args.batch_size, "exit_status": status,
            "outputs_in_order_and_correct": args.lines - wrong, "wrong_or_out_of_order": wrong,
            "outputs_before_input_ended": outputs_before_input_ended, "wall_seconds": round(wall, 1),
            "seconds_to_first_line": round(first_output, 1), "lines_per_second": round(args.lines / wall, 1),
            "lines_per_second_after_checkpoint": round(after / max(last["seconds"] - first["seconds"], 1e-9), 1),
            "script_cpu_seconds": last["cpu_seconds"], "at_lines": marks,
            "lines_per_cpu_second_after_checkpoint": round(after / max(cpu_after, 1e-9), 1),
            "peak_rss_growth_mib": round(last["peak_rss_mib"] - first["peak_rss_mib"], 1)}  # fmt: skip


def stream(argv=None) -> dict:
    """scripts/translate.py on --lines lines of standard input: every output in order and right, lines/s, and the
    process's memory read every --checkpoint lines (a long stream must not grow it)."""
    from speed_common import tiny_model_folder

    parser = command_parser(stream)
    parser.add_argument("--model", help="saved model folder (default: the tests' fitted tiny model, built here)")
    parser.add_argument("--lines", type=int, default=100_000, help="input lines, 60 distinct ones in turn")
    parser.add_argument("--checkpoint", type=int, default=10_000, help="the peak RSS is read every this many lines")
    parser.add_argument("--num_beams", type=int, default=1, help="translate.py's")
    parser.add_argument("--batch_size", type=int, default=64, help="translate.py's")
    parser.add_argument("--chunk_size", type=int, default=None, help="default: translate.py's (16 batches)")
    args = parser.parse_args(argv)
    if not 0 < args.checkpoint < args.lines:
        parser.error(f"--checkpoint must be between 0 and --lines ({args.lines}), got {args.checkpoint}")

    record = MachineRecord()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.model) if args.model else tiny_model_folder(Path(tmp))
        result = {"model": args.model or "tests' fitted tiny model", **run_stream(args, folder)}
    return record.report(result, args.json)


def shards(argv=None) -> dict:
    """scripts/translate.py on --lines lines of the test split (repeated past its end) as --processes processes of
    one thread each under `accelerate launch` (sharded), against one process of --processes threads: sentences/s
    from the median of interleaved rounds, start-up (imports, loading) included, and whether the two outputs are the
    same bytes."""
    from speed_common import interleave, rates, split_pairs

    parser = command_parser(shards)
    parser.add_argument("--model", required=True, help="saved model folder (the main job's: outputs/ding-cpu)")
    parser.add_argument("--processes", type=int, default=2, help="processes of one thread (and threads of one)")
    parser.add_argument("--lines", type=int, default=584, help="the test split's first lines (584: all of it)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of each side")
    args = parser.parse_args(argv)

    record = MachineRecord()
    sources, _ = split_pairs("test")
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        source, one, many = Path(tmp, "in.en"), Path(tmp, "one.de"), Path(tmp, "many.de")
        lines = (sources * (args.lines // len(sources) + 1))[: args.lines]
        source.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        translate = [str(ROOT / "scripts" / "translate.py"), "--model", args.model, "--input", str(source)]
        sides = {
            f"1 process x {args.processes} threads": lambda: subprocess.run(
                [sys.executable, *translate, "--output", str(one), "--threads", str(args.processes)], env=env,
                check=True, capture_output=True),
            f"{args.processes} processes x 1 thread": lambda: subprocess.run(
                [*_launch(1, args.processes, free_port()), *translate, "--output", str(many), "--threads", "1"],
                env=env, check=True, capture_output=True),
        }  # fmt: skip
        times = interleave(sides, args.repeats, warmup=0)
        same = one.read_bytes() == many.read_bytes()
    rows = rates(times, args.lines, baseline=next(iter(times)))
    ratio = round(list(rows.values())[1]["ratio_of_medians"], 3)  # processes over threads
    return record.report({"lines": args.lines, "sides": rows, "ratio": ratio, "same_bytes": same}, args.json)


def main(argv=None):
    commands = {"machines": machines, "gpus": gpus, "paper_time": paper_time, "stream": stream, "shards": shards}
    return dispatch(__doc__, commands, argv)


if __name__ == "__main__":
    main()
