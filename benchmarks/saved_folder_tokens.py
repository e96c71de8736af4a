#!/usr/bin/env python
"""Saved folders give the same tokens: in process with the installed vaswani_mt, and as Hub remote code in a fresh
process without it, for the first --sentences sources of the built-in test split, with the folder's own search
(beam) and greedy. `--json` keeps the tokens; `--against` an earlier run's JSON (another commit, same folders by
position) says how many sequences are equal to it. `--ctranslate2` also exports each folder to CTranslate2 and
counts its translations equal to ours: greedy, the saved search (CTranslate2's ranking, and the paper's), and the
saved beam with alpha 0.

    python benchmarks/saved_folder_tokens.py OLD_FOLDER NEW_FOLDER --json before.json      # at the commit before
    python benchmarks/saved_folder_tokens.py OLD_FOLDER NEW_FOLDER --against before.json --ctranslate2
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from vaswani_mt.data.corpus import load_ding
from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.inference.translate import translate

_REMOTE = r"""
import json, sys, torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
assert "vaswani_mt" not in sys.modules
folder, sources = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
batch = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)(sources, return_tensors="pt", padding=True)
with torch.inference_mode():
    beam, greedy = model.generate(**batch), model.generate(**batch, num_beams=1)
print(json.dumps({"beam": beam.tolist(), "greedy": greedy.tolist()}))
"""


def in_process(folder: str, sources: list[str]) -> dict:
    model, tokenizer = load_for_inference(folder, device="cpu")
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    with torch.inference_mode():
        return {"beam": model.generate(**batch).tolist(), "greedy": model.generate(**batch, num_beams=1).tolist()}


def as_remote_code(folder: str, sources: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as cwd:  # no vaswani_mt checkout on the child's path
        done = subprocess.run([sys.executable, "-c", _REMOTE, str(Path(folder).resolve()), json.dumps(sources)],
                              cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"{folder}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ctranslate2_agreement(folder: str, sources: list[str]) -> dict:
    """How many of CTranslate2's translations equal ours, under four searches ("saved search": with CTranslate2's
    own ranking, as measured before `CTranslate2Model.translate` re-ranked as ours; and with that re-ranking)."""
    from vaswani_mt.export.ctranslate2 import CTranslate2Model
    from vaswani_mt.export.marian import export_model

    model, tokenizer = load_for_inference(folder, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        ct2 = CTranslate2Model(export_model(folder, "ctranslate2", Path(tmp) / "ct2"))
        searches = {"greedy": ({"num_beams": 1}, {"beam_size": 1}), "saved search": ({}, {"ranking": "ctranslate2"}),
                    "saved search, the paper's ranking": ({}, {}),
                    "saved beam, alpha 0": ({"length_penalty": 0.0}, {"length_penalty": 0.0})}  # fmt: skip
        counts = {}
        for name, (ours, theirs) in searches.items():
            pairs = zip(translate(model, tokenizer, sources, **ours), ct2.translate(sources, **theirs), strict=True)
            counts[name] = sum(a == b for a, b in pairs)
        return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--sentences", type=int, default=40)
    parser.add_argument("--json", help="write the tokens here")
    parser.add_argument("--against", help="an earlier run's --json: count the sequences equal to it")
    parser.add_argument("--ctranslate2", action="store_true", help="also count CTranslate2's equal translations")
    args = parser.parse_args()
    sources = [row["en"] for row in load_ding()["test"]["translation"][: args.sentences]]
    runs = [{"package": in_process(f, sources), "remote code": as_remote_code(f, sources)} for f in args.folders]
    earlier = json.loads(Path(args.against).read_text())["runs"] if args.against else None
    for i, (folder, run) in enumerate(zip(args.folders, runs, strict=True)):
        for where, tokens in run.items():
            for search, rows in tokens.items():
                reference = earlier[i]["package"][search] if earlier else run["package"][search]
                equal = sum(a == b for a, b in zip(rows, reference, strict=True))
                print(f"{folder}, {where}, {search}: {equal} of {len(rows)} equal to the "
                      f"{'earlier run' if earlier else 'package'}'s")  # fmt: skip
        if args.ctranslate2:
            agreement = ctranslate2_agreement(folder, sources)
            print(f"{folder}, CTranslate2 float32: equal translations of {len(sources)}: {agreement}")
    if args.json:
        Path(args.json).write_text(json.dumps({"folders": args.folders, "sources": sources, "runs": runs}) + "\n")


if __name__ == "__main__":
    main()
