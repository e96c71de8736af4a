#!/usr/bin/env python
"""Two simulated machines against one machine with two processes: the same training, side by side in one run.

Each round trains `--steps` steps of `--preset` on the built-in corpus twice, in alternating order: once as one
machine with two CPU processes (`accelerate launch --multi_gpu --num_processes 2`), once as two machines of one
process each on 127.0.0.1 (`--num_machines 2 --machine_rank 0/1 --rdzv_backend static`, one shared folder); both
gloo, `--use_cpu`. Reported: target tokens/s (the median of the logged steps after the first 5; medians over the
rounds and their ratio), whether the two ended with the same weights, bit for bit. With `--lost R`, R more rounds
lose machine 1 (its launcher and worker killed) after step 5 of two machines with folders of their own: the seconds
until machine 0's launcher ends, and whether both commands again resume to the uninterrupted run's weights.

    python benchmarks/multinode.py --rounds 3 --lost 3 --json benchmarks/multinode_2026-11-25.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
from safetensors.torch import load_file
from speed_common import MachineRecord

from vaswani_mt.system import native_bf16

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = str(Path(sys.executable).parent / "accelerate")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(args, output: Path) -> list[str]:
    return [str(ROOT / "scripts" / "train.py"), "--dataset", "ding", "--preset", args.preset, "--output_dir",
            str(output), "--max_steps", str(args.steps), "--max_tokens_per_batch", str(args.max_tokens),
            "--vocab_size", "8000", "--warmup_steps", "400", "--logging_steps", "1", "--save_steps", "10",
            "--report_to", "none", "--seed", "1", "--test_bleu", "false", "--disable_tqdm", "true",
            "--use_cpu"]  # fmt: skip


def _one_machine(args, output: Path) -> list[list[str]]:
    return [[ACCELERATE, "launch", "--multi_gpu", "--num_machines", "1", "--num_processes", "2",
             "--main_process_port", str(_port()), "--mixed_precision", "no", "--dynamo_backend", "no",
             *_train(args, output)]]  # fmt: skip


def _two_machines(args, outputs: list[Path]) -> list[list[str]]:
    port = _port()
    return [[ACCELERATE, "launch", "--multi_gpu", "--num_machines", "2", "--num_processes", "2", "--machine_rank",
             str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--rdzv_backend",
             "static", "--same_network", "--mixed_precision", "no", "--dynamo_backend", "no",
             *_train(args, outputs[rank])] for rank in (0, 1)]  # fmt: skip


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
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--max_tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lost", type=int, default=0, help="rounds that lose machine 1 after step 5")
    parser.add_argument("--json")
    args = parser.parse_args()
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
    one = statistics.median(r["one_machine"] for r in rounds) if rounds else None
    two = statistics.median(r["two_machines"] for r in rounds) if rounds else None
    machine = {**record.finish(), "native_bf16": native_bf16()}
    result = {"what": "benchmarks/multinode.py", "machine": machine, "args": vars(args), "rounds": rounds,
              "median_target_tokens_per_s": {"one_machine_2_processes": one, "two_machines_1_process": two},
              "ratio_two_over_one": round(two / one, 3) if rounds else None, "lost_machine": lost}  # fmt: skip
    print(f"\n| setup | target tokens/s (median of {args.rounds}) |\n|---|---|")
    print(f"| one machine, 2 processes | {one:.0f} |\n| two machines, 1 process each | {two:.0f} ({two / one:.2f}x) |")
    if lost:
        print(f"lost machine 1: machine 0 ended {[r['seconds_to_end'] for r in lost]} s after; resumed exactly: "
              f"{[r['same_weights'] for r in lost]}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
