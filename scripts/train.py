#!/usr/bin/env python
"""Train vaswani_mt with the paper's recipe (§5) through Seq2SeqTrainer.

    python scripts/train.py --output_dir outputs/run --preset small ...
    python scripts/train.py configs/ding_cpu.yaml
    accelerate launch scripts/train.py ...                                # one or many GPUs (DDP)
    accelerate launch --multi_gpu --num_processes 2 scripts/train.py --use_cpu ...   # 2 CPU processes

Every Seq2SeqTrainingArguments flag works, plus --preset, --dataset, --source_lang, --target_lang,
--max_tokens_per_batch, --vocab_size, --tokenizer, ... (`--help` lists them). The options are in vaswani_mt.arguments,
the job in vaswani_mt.training.
"""

import logging
import shlex
import sys

from vaswani_mt.arguments import check_dataset_options, parse_args
from vaswani_mt.training import print_summary, run_training


def main() -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    try:
        model_args, data_args, recipe, training_args = parse_args()
        check_dataset_options(data_args, recipe)
    except ValueError as error:  # a bad option or config file: one line that names it, no traceback
        sys.exit(f"error: {error}")
    command = "python " + shlex.join(["scripts/train.py", *sys.argv[1:]])
    result = run_training(model_args, data_args, recipe, training_args, command=command)
    if "test" in result or "examples" in result:
        print_summary(result)


if __name__ == "__main__":
    main()
