#!/usr/bin/env python
"""A saved folder as Hub remote code under several transformers versions: the same tokens and scores from each.

Each `--python` is the interpreter of an environment of its own (say one with transformers 5.20, the lowest the
package supports, and one with the newest 5.x); in each, a fresh process without vaswani_mt on its path loads the
folder with `AutoModelForSeq2SeqLM.from_pretrained(..., trust_remote_code=True)` and translates the sources with the
folder's own search (the paper's beam search from its generation config), with `--num_beams 8`, and with a term
constraint ("Haus", tokenized by the folder's `constraints_vaswani.phrase_forms`) and a target prefix ("Das") on
every sentence. The tokens and `sequences_scores` must be equal in every environment.

    python -m venv ../tf520 && ../tf520/bin/pip install torch==2.13.0 transformers==5.20.0
    python benchmarks/remote_code_versions.py outputs/ding-cpu --python ../tf520/bin/python \
        --python .venv/bin/python --json benchmarks/remote_code_versions_2026-11-25.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r"""
import json, sys, torch, transformers
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
folder, sources = sys.argv[1], json.loads(sys.argv[2])
assert "vaswani_mt" not in sys.modules
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
batch = tokenizer(sources, return_tensors="pt", padding=True)
out = {"transformers": transformers.__version__, "torch": torch.__version__, "module": type(model).__module__}
constraints = sys.modules[type(model).__module__.replace("modeling_vaswani", "constraints_vaswani")]
term = [constraints.phrase_forms(tokenizer, "Haus")]  # by the folder's own code, as the pipeline does
prefix = tokenizer("Das", add_special_tokens=False)["input_ids"]
controls = {"constraints": [term] * len(sources), "target_prefix": [prefix] * len(sources)}
for name, options in (("saved search", {}), ("8 beams", {"num_beams": 8}), ("term and prefix", controls)):
    with torch.inference_mode():
        result = model.generate(**batch, output_scores=True, return_dict_in_generate=True, **options)
    out[name] = {"tokens": result.sequences.tolist(), "scores": [s.hex() for s in result.sequences_scores.tolist()]}
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--python", action="append", required=True, help="an environment's interpreter (repeat)")
    parser.add_argument("--sources", default="The house is small.|How are you?|The cat sleeps on the red chair.")
    parser.add_argument("--json")
    args = parser.parse_args()
    sources = args.sources.split("|")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    runs = {}
    with tempfile.TemporaryDirectory() as cwd:  # no vaswani_mt checkout on the child's path
        for python in args.python:
            command = [python, "-c", _CHILD, str(Path(args.folder).resolve()), json.dumps(sources)]
            done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                                  stdin=subprocess.DEVNULL)  # fmt: skip
            if done.returncode != 0:
                sys.exit(f"{python}: {done.stderr.strip().splitlines()[-1]}")
            runs[python] = json.loads(done.stdout.strip().splitlines()[-1])
            print(python, runs[python]["transformers"], runs[python]["module"], flush=True)
    first = next(iter(runs.values()))
    names = ("saved search", "8 beams", "term and prefix")
    equal = {name: all(run[name] == first[name] for run in runs.values()) for name in names}
    result = {"what": "benchmarks/remote_code_versions.py", "folder": args.folder, "sources": sources,
              "versions": {p: r["transformers"] for p, r in runs.items()}, "equal": equal, "runs": runs}  # fmt: skip
    print(json.dumps({"versions": result["versions"], "equal": equal}))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(0 if all(equal.values()) else 1)


if __name__ == "__main__":
    main()
