#!/usr/bin/env python
"""CTranslate2 as a back end with the paper's ranking (issue 44, item 5): a saved model is exported to Marian and
CTranslate2 (float32, and int8 through `quantization="int8"`) in a temporary folder, and the built-in test split is
translated, interleaved in one process, by

- `ours`: vaswani_mt's own search (`translate()`, float32): the model's beam, GNMT alpha, |X| + 50, exact stop;
- `ct2_float32_own_ranking`: CTranslate2's search and ranking, log P / |Y|^alpha
  (`CTranslate2Model(folder, ranking="ctranslate2")`);
- `ct2_float32_paper_ranking`: CTranslate2's hypotheses re-ranked by §6.1's GNMT score (`CTranslate2Model`'s
  default; `ctranslate2_nbest`);
- `ct2_int8_paper_ranking`: the same on the int8 export;
- `ct2_float32_paper_ranking_patience2`: with `patience=2` (CTranslate2 stops once 8 hypotheses have ended, not 4).

Each side translates the whole split `--repeats` times, the side order rotated each round, in batches of `--batch`
sentences (ours: of similar length; CTranslate2: `max_batch_size` within each group of one length limit). Reported:
sentences/s (median), the ratio to ours (ratio of medians, and median of the per-round ratios), sacreBLEU, and the
share of lines identical to ours. Where a side is not ours, why (`diagnosis`): for the lines that differ, whether our
translation is among the hypotheses CTranslate2 kept (then only the ranking differs) and whether ours scores higher
by §6.1 (then CTranslate2's search stopped before finding it). Target: 95% of lines identical, BLEU within 0.1.

    python benchmarks/ctranslate2_backend.py --model outputs/ding-cpu \
        --json benchmarks/ctranslate2_backend_2026-11-26.json
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from speed_common import MachineRecord, run_sides, split_pairs

from vaswani_mt.export.ctranslate2 import CTranslate2Model, ctranslate2_nbest
from vaswani_mt.export.marian import export_model
from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.inference.translate import translate, translate_nbest
from vaswani_mt.inference.translator import Translator


def make_sides(model, tokenizer, saved: str, folder: Path, threads: int, batch: int) -> tuple[dict, dict]:
    """name -> a function that translates a list of sentences; and the CTranslate2 engines, by name."""
    engines = {}
    for compute_type in ("float32", "int8"):
        export_model(saved, "ctranslate2", folder / compute_type, None if compute_type == "float32" else compute_type)
        engines[compute_type] = CTranslate2Model(folder / compute_type, intra_threads=threads, inter_threads=1)
    engines["float32_patience2"] = CTranslate2Model(folder / "float32", patience=2, intra_threads=threads,
                                                    inter_threads=1)  # fmt: skip
    engines["float32_own"] = CTranslate2Model(folder / "float32", ranking="ctranslate2", intra_threads=threads,
                                              inter_threads=1)  # fmt: skip
    translators = {name: Translator(engine, batch_size=batch) for name, engine in engines.items()}
    sides = {
        "ours": lambda sentences: translate(model, tokenizer, sentences, batch_size=batch),
        "ct2_float32_own_ranking": translators["float32_own"].translate,
        "ct2_float32_paper_ranking": translators["float32"].translate,
        "ct2_int8_paper_ranking": translators["int8"].translate,
        "ct2_float32_paper_ranking_patience2": translators["float32_patience2"].translate,
    }
    return sides, engines


def diagnose(texts: list[str], ours: list[str], sources: list[str], engine, model, tokenizer, batch: int) -> dict:
    """For the lines where `texts` are not `ours`: how often our translation is among the hypotheses `engine` kept
    (all `beam · patience` of them, re-ranked), and how often ours has the higher GNMT score."""
    differ = [i for i, (a, b) in enumerate(zip(texts, ours, strict=True)) if a != b]
    if not differ:
        return {"lines_that_differ": 0}
    subset = [sources[i] for i in differ]
    tokens = [engine.tokenizer.convert_ids_to_tokens(engine.tokenizer(s)["input_ids"]) for s in subset]
    lists = ctranslate2_nbest(
        engine.translator, tokens, engine.search_options, None, engine.patience, max_batch_size=batch
    )
    mine = translate_nbest(model, tokenizer, subset, 1, batch_size=batch)
    among = sum(ours[i] in [engine._text(h[0]) for h in hypotheses] for i, hypotheses in zip(differ, lists,
                                                                                            strict=True))  # fmt: skip
    higher = sum(m[0].score > h[0][2] + 1e-4 for m, h in zip(mine, lists, strict=True))
    return {
        "lines_that_differ": len(differ),
        "ours_among_ct2_hypotheses": among,
        "ours_scores_higher_than_ct2_best": higher,
        "hypotheses_kept_per_line": len(lists[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="outputs/ding-cpu", help="a saved vaswani_mt folder")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the whole split per side")
    parser.add_argument("--max_sentences", type=int, default=None)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    record = MachineRecord()
    model, tokenizer = load_for_inference(args.model, device="cpu")
    sources, references = split_pairs("test", args.max_sentences)
    scratch = tempfile.TemporaryDirectory(prefix="ct2-backend-")
    sides, engines = make_sides(model, tokenizer, args.model, Path(scratch.name), args.threads, args.batch)
    torch.set_num_threads(args.threads)  # a CTranslate2 translator sets the OpenMP thread count, torch's too
    print(f"\n{len(sources)} test sentences, batch {args.batch}, {args.threads} threads, model {args.model}")
    rows, outputs = run_sides(sides, sources, references, args.repeats, "ours")
    engine_of = {
        "ct2_float32_own_ranking": "float32",
        "ct2_float32_paper_ranking": "float32",
        "ct2_int8_paper_ranking": "int8",
        "ct2_float32_paper_ranking_patience2": "float32_patience2",
    }
    for name, engine in engine_of.items():
        rows[name]["diagnosis"] = diagnose(outputs[name], outputs["ours"], sources, engines[engine], model,
                                           tokenizer, args.batch)  # fmt: skip
    rows["ct2_int8_paper_ranking"]["diagnosis"]["note"] = "scores of the int8 model against ours in float32"
    config = model.generation_config
    result = {
        "model": args.model,
        "sentences": len(sources),
        "batch": args.batch,
        "search": {
            name: getattr(config, name, None) for name in ("num_beams", "length_penalty", "max_len_a", "max_len_b")
        },
        "ctranslate2": __import__("ctranslate2").__version__,
        "target": "identical_to_ours >= 0.95 and |BLEU - ours| <= 0.1 (float32, paper ranking)",
        "target_met": rows["ct2_float32_paper_ranking"]["identical_to_ours"] >= 0.95
        and abs(rows["ct2_float32_paper_ranking"]["bleu"] - rows["ours"]["bleu"]) <= 0.1,
        "sides": rows,
    }
    for name, row in rows.items():
        print(f"{name:<38}{row.get('diagnosis', '')}")
    record.report(result, args.json)
    scratch.cleanup()


if __name__ == "__main__":
    main()
