#!/usr/bin/env python
"""Training quality side by side: vaswani_mt vs transformers.MarianMTModel of the same shape.

Both go through the identical pipeline (vaswani_mt.training.job.run_training): the same corpus and split, the same
tokenizer (trained once by the first run and reused), the same token-budget batches, Adam settings, Eq. (3)
schedule, dropout, label smoothing 0.1 and wall-time budget, the same checkpoint averaging and the same test
set. The only difference is the model (the Marian run passes its own `build_model` to the job, and writes no
vaswani_mt model card): Marian keeps its own init and loss path (cross-entropy, label-smoothed as Seq2SeqTrainer's
LabelSmoother does) and its own beam search (transformers' length penalty, beam 4, alpha 0.6). The runs are
sequential in one process, so both see the same machine.

    python benchmarks/train_vs_marian.py --config configs/ding_cpu.yaml --time_budget_minutes 20
"""

import json
import os
import time
from pathlib import Path

import torch
from speed_common import MachineRecord, command_parser, print_table, run_summary
from torch.nn import functional as F
from transformers import MarianMTModel

from vaswani_mt.export.marian import marian_config
from vaswani_mt.training.arguments import parse_args
from vaswani_mt.training.job import build_model, run_training


class LabelSmoothedMarian(MarianMTModel):
    """MarianMTModel whose training loss is label-smoothed cross-entropy (eps_ls = config.label_smoothing), as
    Seq2SeqTrainer's `LabelSmoother` computes it: (1 - eps) * NLL + eps * the mean over the vocabulary of -log p,
    averaged over the target tokens that are not padding."""

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, labels=None, **kwargs):
        # Named arguments: the Trainer keeps the dataset columns that forward's signature names.
        kwargs.update(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        if labels is None or not self.training:
            return super().forward(labels=labels, **kwargs)
        if decoder_input_ids is None:
            kwargs["decoder_input_ids"] = self.prepare_decoder_input_ids_from_labels(labels)
        output = super().forward(**kwargs)  # without labels: no second, unsmoothed loss
        logits = output.logits.float().flatten(0, 1)
        eps = self.config.label_smoothing
        output.loss = F.cross_entropy(logits, labels.flatten(), ignore_index=-100, label_smoothing=eps)
        return output


def marian_model(model_args, tokenizer) -> MarianMTModel:
    """The Marian run's `build_model`: MarianMTModel with our config's shape, its own initialisation, label smoothing
    and a paper-like beam search, trained and scored by exactly the same job."""
    shape = build_model(model_args, tokenizer).config
    marian = LabelSmoothedMarian(marian_config(shape))
    marian.config.label_smoothing = shape.label_smoothing
    marian.config._attn_implementation = model_args.attn_implementation
    generation = marian.generation_config
    generation.num_beams, generation.length_penalty, generation.max_new_tokens = 4, 0.6, 128
    generation.bad_words_ids = None
    return marian


def main() -> None:
    parser = command_parser(__doc__)
    parser.add_argument("--config", default="configs/ding_cpu.yaml", help="the training config both sides run")
    parser.add_argument("--output_dir", default="outputs/bench-train", help="each side's run in a folder of it")
    parser.add_argument("--only", choices=["vaswani_mt", "marian"], help="run one side only")
    args, overrides = parser.parse_known_args()

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", torch.get_num_threads())))
    record = MachineRecord()
    results = {}
    tokenizer_dir = None
    for name in ("vaswani_mt", "marian"):
        if args.only and name != args.only:
            continue
        argv = ["--config", args.config, "--output_dir", f"{args.output_dir}/{name}", *overrides]
        if tokenizer_dir:
            argv += ["--tokenizer", tokenizer_dir]
        model_args, data_args, recipe, training_args = parse_args(argv)
        started = time.monotonic()
        marian = name == "marian"
        result = run_training(model_args, data_args, recipe, training_args,
                              build_model=marian_model if marian else build_model, model_card=not marian)  # fmt: skip
        result = result.get("finished_before", result)  # a finished folder is left as it is: its results.json
        tokenizer_dir = tokenizer_dir or str(Path(training_args.output_dir) / "tokenizer")
        results[name] = {
            "test_bleu": round(result["test"]["score"], 2),
            "test_chrf": round(result["test"]["chrf"], 2),
            "wall_minutes": round((time.monotonic() - started) / 60, 2),
            **run_summary(training_args.output_dir),
            "signature": result["test"]["signature"],
        }
        print(json.dumps({name: results[name]}), flush=True)

    record.report({"results": results}, args.json)
    print_table("Test sacreBLEU and chrF, steps, median target tokens/s, last training loss, wall minutes",
                [{"model": name, **row} for name, row in results.items()], ["model", "test_bleu", "test_chrf", "steps",
                 "median_target_tokens_per_second", "final_train_loss", "wall_minutes"])  # fmt: skip


if __name__ == "__main__":
    main()
