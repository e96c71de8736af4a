#!/usr/bin/env python
"""Decoding speed: vaswani_mt's `generate()` vs CTranslate2 (float32 and int8) on the same model.

The CTranslate2 models come from `vaswani_mt.export.marian.export_model` (the exact Marian conversion through
CTranslate2's converter). Every engine decodes the same batch of random source sentences of --source_tokens tokens
for exactly --steps target tokens (EOS suppressed until then: the work is identical), with the same search (greedy,
or beam 4 with length penalty 0.6), on --threads threads. Runs are interleaved (each repeat times every engine once,
in turn), and the table gives medians. The float32 greedy tokens of both engines are compared as a check.

    python benchmarks/decode_vs_ctranslate2.py --model outputs/ding-cpu
"""

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

from vaswani_mt.export.marian import export_model
from vaswani_mt.inference.loading import load_for_inference


def sources(vocab_size: int, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Random source ids (special tokens 0-3 avoided) ending in EOS=2, all of one length: no padding."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab_size, (batch, length - 1), generator=generator)
    return torch.cat((ids, torch.full((batch, 1), 2)), dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="outputs/ding-cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--source_tokens", type=int, default=30)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    import ctranslate2

    torch.set_num_threads(args.threads)
    model, tokenizer = load_for_inference(args.model, device="cpu")
    scratch = tempfile.TemporaryDirectory(prefix="ct2-bench-")
    translators = {}
    for compute_type in ("float32", "int8"):
        folder = Path(scratch.name, compute_type)
        export_model(args.model, "ctranslate2", folder, None if compute_type == "float32" else compute_type)
        translators[compute_type] = ctranslate2.Translator(
            str(folder), device="cpu", compute_type=compute_type, intra_threads=args.threads, inter_threads=1
        )

    def run_ours(ids: torch.Tensor, beams: int) -> list[list[int]]:
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=beams, min_new_tokens=args.steps,
                max_new_tokens=args.steps, **({"length_penalty": 0.6} if beams > 1 else {}),
            )  # fmt: skip
        return out[:, 1:].tolist()

    def run_ct2(compute_type: str, ids: torch.Tensor, beams: int) -> list[list[int]]:
        tokens = [tokenizer.convert_ids_to_tokens(row) for row in ids.tolist()]
        results = translators[compute_type].translate_batch(
            tokens, beam_size=beams, length_penalty=0.6, min_decoding_length=args.steps,
            max_decoding_length=args.steps, max_batch_size=0,
        )  # fmt: skip
        return [tokenizer.convert_tokens_to_ids(r.hypotheses[0]) for r in results]

    engines = {
        "vaswani_mt generate": run_ours,
        "CTranslate2 float32": lambda ids, beams: run_ct2("float32", ids, beams),
        "CTranslate2 int8": lambda ids, beams: run_ct2("int8", ids, beams),
    }
    cases = [(beams, batch) for beams in args.beams for batch in args.batch_sizes]
    batches = {batch: sources(model.config.vocab_size, batch, args.source_tokens) for batch in args.batch_sizes}
    checks = {}
    for beams, batch in cases:  # warm-up, and the work is really identical: every engine emits --steps tokens
        outputs = {name: run(batches[batch], beams) for name, run in engines.items()}
        assert all(len(row) == args.steps for rows in outputs.values() for row in rows), "unequal decoding lengths"
        if beams == 1:
            checks[batch] = outputs["vaswani_mt generate"] == outputs["CTranslate2 float32"]
    seconds = {(name, case): [] for name in engines for case in cases}
    for _ in range(args.repeats):
        for case in cases:
            beams, batch = case
            for name, run in engines.items():
                start = time.perf_counter()
                run(batches[batch], beams)
                seconds[name, case].append(time.perf_counter() - start)

    config = model.config
    print(
        f"model {args.model}: d_model {config.d_model}, {config.num_encoder_layers}+{config.num_decoder_layers} "
        f"layers, vocabulary {config.vocab_size}; source {args.source_tokens} tokens, exactly {args.steps} target "
        f"tokens; {args.threads} threads; median of {args.repeats} interleaved runs; torch {torch.__version__}, "
        f"transformers {transformers.__version__}, ctranslate2 {ctranslate2.__version__}, {platform.machine()}"
    )
    print("\n| search | batch | " + " | ".join(f"{name} (sent/s)" for name in engines) + " |")
    print("|---|---|" + "---|" * len(engines))
    rows = []
    for beams, batch in cases:
        rates = {name: batch / statistics.median(seconds[name, (beams, batch)]) for name in engines}
        base = rates["vaswani_mt generate"]
        cells = [f"{rates[name]:.2f}" + ("" if name == "vaswani_mt generate" else f" ({rates[name] / base:.2f}x)")
                 for name in engines]  # fmt: skip
        search = "greedy" if beams == 1 else f"beam {beams}"
        print(f"| {search} | {batch} | " + " | ".join(cells) + " |")
        rows.append({"beams": beams, "batch": batch, "sentences_per_second": rates})
    for batch, same in checks.items():
        print(f"\ngreedy, batch {batch}: CTranslate2 float32 tokens {'equal' if same else 'DIFFER from'} ours")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "greedy_equal": checks}, indent=2))
    scratch.cleanup()


if __name__ == "__main__":
    main()
