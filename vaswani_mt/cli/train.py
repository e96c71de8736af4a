"""Train vaswani_mt with the paper's recipe (§5) through Seq2SeqTrainer.

    python scripts/train.py --output_dir outputs/run --preset small ...
    python scripts/train.py configs/ding_cpu.yaml
    accelerate launch scripts/train.py ...                                # one or many GPUs (DDP)
    accelerate launch --multi_gpu --num_processes 2 scripts/train.py --use_cpu ...   # 2 CPU processes

Every Seq2SeqTrainingArguments flag works, plus --preset, --dataset, --source_lang, --target_lang,
--max_tokens_per_batch, --vocab_size, --tokenizer, ... (`--help` lists them). The options are in
vaswani_mt.training.arguments, the job in vaswani_mt.training.job.

Started again with the same command, a run resumes from its last complete checkpoint; a finished run (its
results.json written) is left as it is, in one line, unless `--resume_from_checkpoint last` asks to train it on.
SIGINT (Ctrl-C) or SIGTERM (preemption) ends the current step, saves a checkpoint and exits with status 128 + the
signal's number (130, 143), not 0: the job is not finished, and the same command resumes it. A second signal stops
at once.

Under a launcher the ranks end together, and each machine's first process alone prints the run's outcome in one line
on stderr: `finished at step N`, where the run stopped, or the `error:` (rank 0 on one machine). A worker whose
launcher dies is killed with it (`end_with_launcher`).
"""

import logging
import os
import shlex
import sys
from typing import NoReturn

from vaswani_mt.cli import names_missing_extras, start_command
from vaswani_mt.training.arguments import check_dataset_options, parse_args  # transformers' training options
from vaswani_mt.training.hardware import check_launch_has_gpus
from vaswani_mt.training.machines import (
    MachinesError,
    end_with_launcher,
    exit_run,
    is_lost_peer,
    is_store_failure,
    lost_machine_error,
    speaks_for_machine,
)


def _fail(error: BaseException) -> NoReturn:
    exit_run(f"error: {error}" if speaks_for_machine() else None, 1)


@names_missing_extras
def main(argv: list[str] | None = None) -> None:
    end_with_launcher()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    try:
        model_args, data_args, recipe, training_args = parse_args(argv)
        check_launch_has_gpus(recipe)
        check_dataset_options(data_args, recipe)
    except ValueError as error:  # a bad option or config file: one line that names it, no traceback
        _fail(error)
    start_command()
    from vaswani_mt.data.corpus import DataError
    from vaswani_mt.training.checkpoints import CheckpointError
    from vaswani_mt.training.job import print_summary, run_training

    command = "python " + shlex.join(["scripts/train.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        result = run_training(model_args, data_args, recipe, training_args, command=command)
    except (CheckpointError, DataError, MachinesError) as error:  # bad data (file:line), a full disk, a lost machine
        _fail(error)
    except RuntimeError as error:  # a peer or the store lost outside the training steps: starting, or after the end
        if not (is_lost_peer(error) or is_store_failure(error)):
            raise
        _fail(lost_machine_error(error))
    if "finished_before" in result:  # a finished run stays finished: one line, status 0
        from vaswani_mt.training.runs import finished_line

        said = finished_line(result["output_dir"], result["finished_before"])
        exit_run(said if speaks_for_machine() else None, 0)
    if "preempted" in result:
        stop = result["preempted"]
        said = (f"stopped by {stop['signal']} at step {stop['step']}; {stop['checkpoint']} saved: run the same "
                "command to resume")  # fmt: skip
        exit_run(said if speaks_for_machine() else None, stop["exit_code"])
    if "test" in result or "examples" in result:
        print_summary(result)
    if speaks_for_machine():  # rank 0 publishes the model once training is over, the other machines exit
        where = f"the model is in {result['output_dir']}" if os.environ.get("RANK", "0") == "0" else (
            "machine 0 publishes the model")  # fmt: skip
        print(f"finished at step {result['step']}: {where}", file=sys.stderr)


if __name__ == "__main__":
    main()
