#!/usr/bin/env python
"""What `--help` costs: seconds for a fresh process to run bare Python, `import torch`, transformers' Auto classes,
`import vaswani_mt`, and each command's `--help` (scripts/*.py), median of --repeats, the rows interleaved.

    python benchmarks/help_time.py --repeats 5
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = {
        "bare python": ["-c", "pass"],
        "import torch": ["-c", "import torch"],
        "from transformers import AutoConfig, AutoModel": ["-c", "from transformers import AutoConfig, AutoModel"],
        "import vaswani_mt": ["-c", "import vaswani_mt"],
        **{f"{script.name} --help": [str(script), "--help"] for script in sorted((ROOT / "scripts").glob("*.py"))},
    }
    seconds: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.repeats):
        for name, argv in rows.items():
            start = time.perf_counter()
            subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, check=True)
            seconds[name].append(time.perf_counter() - start)
    print("| process | median seconds | min | max |\n|---|---|---|---|")
    for name, values in seconds.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")


if __name__ == "__main__":
    main()
