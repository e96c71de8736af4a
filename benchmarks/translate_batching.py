#!/usr/bin/env python
"""scripts/translate.py with token-budget batches (`--max_tokens N`, fairseq's `--max-tokens`) against fixed-size
batches (`--batch_size 16`) on the built-in corpus's test split: sentences per second of each, the median of
`--repeats` runs each, interleaved (A, B, B, A, ...: a busy machine slows both alike), and their ratio. Each run
is the whole command as a user runs it (model loading included), in a process of its own; every run's output must
be the same lines as the first fixed-size run's (token-budget batches change which sentences share a batch, not
their translations). CPU seconds of each run are reported too: on a shared machine they vary less than wall time.

    python benchmarks/translate_batching.py --model outputs/ding-cpu
    python benchmarks/translate_batching.py --model DIR --max_tokens 1200 --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed_common import MachineRecord  # noqa: E402


def test_sources(path: Path) -> int:
    """Writes the built-in corpus's English test sources to `path`, one a line; returns how many."""
    from vaswani_mt.data.corpus import load_corpus, source_target

    sources, _ = source_target(load_corpus("ding")["test"], "en", "de")
    path.write_text("\n".join(sources) + "\n", encoding="utf-8")
    return len(sources)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of one run of `command`."""
    cpu, start = _children_cpu(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return wall, _children_cpu() - cpu, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a trained model folder")
    parser.add_argument("--input", help="source file (default: the built-in test split's English side)")
    parser.add_argument("--max_tokens", type=int, default=1200)
    parser.add_argument("--batch_size", type=int, default=16, help="the fixed-size batches compared against")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()

    from vaswani_mt.system import native_bf16

    record = MachineRecord()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(args.input) if args.input else Path(tmp) / "test.en"
        lines = test_sources(source) if not args.input else len(source.read_text(encoding="utf-8").splitlines())
        base = [sys.executable, str(ROOT / "scripts" / "translate.py"), "--model", args.model, "--input", str(source)]
        sides = {
            f"batch_size {args.batch_size}": [*base, "--batch_size", str(args.batch_size)],
            f"max_tokens {args.max_tokens}": [*base, "--max_tokens", str(args.max_tokens)],
        }
        names = list(sides)
        walls: dict[str, list[float]] = {name: [] for name in names}
        cpus: dict[str, list[float]] = {name: [] for name in names}
        reference = None
        for round_ in range(args.repeats):
            for name in names if round_ % 2 == 0 else names[::-1]:
                wall, cpu, output = run_once(sides[name])
                reference = output if reference is None else reference
                if output != reference:
                    differ = sum(a != b for a, b in zip(output.splitlines(), reference.splitlines(), strict=True))
                    raise AssertionError(f"{name}: {differ} of {lines} translations differ from the first run's")
                walls[name].append(wall)
                cpus[name].append(cpu)
                print(f"round {round_ + 1}, {name}: {wall:.1f} s wall, {cpu:.1f} s CPU", file=sys.stderr, flush=True)
    fixed, budget = names
    result = {
        "benchmark": "translate_batching",
        "model": args.model,
        "sentences": lines,
        "native_bf16": native_bf16(),
        "commands": {name: " ".join(["python", *command[1:]]) for name, command in sides.items()},
        "outputs_identical": True,
        **{
            name: {
                "median_wall_s": round(statistics.median(walls[name]), 2),
                "sentences_per_s": round(lines / statistics.median(walls[name]), 2),
                "median_cpu_s": round(statistics.median(cpus[name]), 2),
                "wall_s": [round(x, 2) for x in walls[name]],
                "cpu_s": [round(x, 2) for x in cpus[name]],
            }
            for name in names
        },
        "speedup_wall": round(statistics.median(walls[fixed]) / statistics.median(walls[budget]), 3),
        "speedup_cpu": round(statistics.median(cpus[fixed]) / statistics.median(cpus[budget]), 3),
        "machine": record.finish(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
