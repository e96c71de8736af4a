#!/usr/bin/env python
"""scripts/translate.py on a long standard input: wall time, lines per second, and the script's peak RSS after
10,000 lines and after 100,000 (flat memory: the two are close), every output line checked, in input order.

The script runs as a program of its own, as a user runs it: this process writes its standard input from a thread
(outputs read before it ends show that the script answers while input still arrives) and
reads its standard output line by line. The input cycles through 60 distinct lines of 1 to 3 sentences, in a
shuffled order, so that the length sort inside each chunk reorders them; each output must be the translation of
its own line alone (batch invariance, tests/inference/test_hostile_input.py), which is computed here first. The
peak RSS is the script's `VmHWM` from /proc, read every 10,000 lines of output (printed to stderr as it goes), with the
script's own CPU seconds: on a shared machine lines per CPU second is the throughput, wall time is not.

Without `--model` it builds the tests' tiny model (d_model 32, 2+2 layers, a 200-token vocabulary) fitted to six
sentence pairs in a second, in a temporary folder, and translates greedily (`--num_beams 1`).

    python benchmarks/translate_stream.py                           # 100,000 lines, tiny model, greedy
    python benchmarks/translate_stream.py --lines 20000 --checkpoint 2000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed_common import PAIRS, MachineRecord, tiny_model_folder  # noqa: E402


def distinct_lines() -> list[str]:
    """60 lines of 1 to 3 of the six sentences: 6 single ones, 30 ordered pairs and 24 triples."""
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


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def run(args: argparse.Namespace, folder: Path) -> dict:
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
                    "peak_rss_mib": round(_status_kib(process.pid, "VmHWM") / 1024, 1),
                    "rss_mib": round(_status_kib(process.pid, "VmRSS") / 1024, 1),
                    "wrong_or_out_of_order": wrong,
                }
                print(json.dumps({"lines": i + 1, **marks[i + 1]}), file=sys.stderr, flush=True)
        status = process.wait(timeout=120)
    finally:
        process.kill()
    wall = time.perf_counter() - start
    first, last = marks[args.checkpoint], marks[args.lines]
    return {
        "lines": args.lines,
        "num_beams": args.num_beams,
        "batch_size": args.batch_size,
        "chunk_size": args.chunk_size or 16 * args.batch_size,
        "exit_status": status,
        "outputs_in_order_and_correct": args.lines - wrong,
        "wrong_or_out_of_order": wrong,
        "outputs_before_input_ended": outputs_before_input_ended,
        "wall_seconds": round(wall, 1),
        "seconds_to_first_line": round(first_output, 1),
        "lines_per_second": round(args.lines / wall, 1),
        "lines_per_second_after_checkpoint": round(
            (args.lines - args.checkpoint) / max(last["seconds"] - first["seconds"], 1e-9), 1
        ),
        "script_cpu_seconds": last["cpu_seconds"],
        "lines_per_cpu_second_after_checkpoint": round(
            (args.lines - args.checkpoint) / max(last["cpu_seconds"] - first["cpu_seconds"], 1e-9), 1
        ),
        "at_lines": marks,
        "peak_rss_growth_mib": round(last["peak_rss_mib"] - first["peak_rss_mib"], 1),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="saved model folder (default: the tests' fitted tiny model, built here)")
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--checkpoint", type=int, default=10_000, help="the peak RSS is read every this many lines")
    parser.add_argument("--num_beams", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--chunk_size", type=int, default=None, help="default: translate.py's (16 batches)")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args(argv)
    if not 0 < args.checkpoint < args.lines:
        parser.error(f"--checkpoint must be between 0 and --lines ({args.lines}), got {args.checkpoint}")

    record = MachineRecord()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.model) if args.model else tiny_model_folder(Path(tmp))
        result = {"model": args.model or "tests' fitted tiny model", **run(args, folder)}
    result["machine"] = record.finish()
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
