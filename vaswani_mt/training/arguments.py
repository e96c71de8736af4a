"""The training command line: `scripts/train.py`'s options, their defaults (the paper's recipe, §5), and config files.

Every `Seq2SeqTrainingArguments` flag works, plus the three dataclasses below. `parse_args` reads them with
`HfArgumentParser`; a YAML or JSON file (`--config FILE`, or the file as the first argument) sets any option, and
the command line wins over it.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field, fields

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import HfArgumentParser, Seq2SeqTrainingArguments

from vaswani_mt.data.corpus import BUILTIN_CORPUS
from vaswani_mt.model.configuration_vaswani import PRESETS, VaswaniConfig

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    preset: str = field(default="base", metadata={"help": f"model shape: one of {sorted(PRESETS)}"})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "start from a saved vaswani_mt model (folder or Hub id) instead of a preset"}
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "reuse a saved tokenizer (folder or Hub id); default: train one"}
    )
    vocab_size: int = field(default=37000, metadata={"help": "size of the joint BPE vocabulary to train (§5.1)"})
    tokenizer_sample: int = field(
        default=0,
        metadata={
            "help": "learn the BPE from a random sample of this many training pairs (both sides), read as a stream; "
            "0: all of them (the WMT recipes: 1,000,000 of 4.5M)"
        },
    )
    dropout: float | None = field(default=None, metadata={"help": "P_drop; default: the preset's"})
    label_smoothing: float | None = field(default=None, metadata={"help": "eps_ls; default: the preset's (0.1)"})
    init_std: float | None = field(
        default=None,
        metadata={"help": "every weight from N(0, init_std) (MarianMTModel: 0.02); default: the preset's"},
    )
    attn_implementation: str = field(
        default="auto",
        metadata={
            "help": "sdpa or eager; auto: eager when training on a CPU under bf16 autocast (1.15-1.54x the steps of "
            "sdpa there, whose CPU backward is slow for short sentences: RESULTS.md), sdpa elsewhere"
        },
    )
    d_model: int | None = field(default=None, metadata={"help": "model width; default: the preset's"})
    d_ff: int | None = field(default=None, metadata={"help": "inner FFN width; default: the preset's"})
    num_heads: int | None = field(default=None, metadata={"help": "attention heads h; default: the preset's"})
    num_encoder_layers: int | None = field(default=None, metadata={"help": "encoder layers N; default: the preset's"})
    num_decoder_layers: int | None = field(default=None, metadata={"help": "decoder layers N; default: the preset's"})
    d_k: int | None = field(default=None, metadata={"help": "key size per head (Table 3 A, B); default d_model / h"})
    d_v: int | None = field(default=None, metadata={"help": "value size per head (Table 3 A); default d_model/h"})
    position_encoding: str | None = field(
        default=None, metadata={"help": "sinusoidal (§3.5) or learned (Table 3 row E); default: the preset's"}
    )


@dataclass
class DataArguments:
    dataset: str = field(
        default=BUILTIN_CORPUS,
        metadata={
            "help": "'ding' (built-in en-de), 'ding+phrases' (the same, plus dictionary phrases in training), "
            "a .jsonl/.tsv file, a PREFIX of PREFIX.<lang> files, a save_to_disk folder, or a Hub id"
        },
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset config, e.g. de-en for wmt14"})
    source_lang: str = field(default="en")
    target_lang: str = field(default="de")
    max_tokens_per_batch: int | None = field(
        default=4096,
        metadata={"help": "token budget per batch and device, each side (padded); 0 = Trainer's fixed batch size"},
    )
    max_source_length: int = field(default=256, metadata={"help": "longer pairs are dropped (counted in the log)"})
    preprocessing_num_workers: int | None = field(
        default=None,
        metadata={"help": "processes that tokenize the corpus (datasets.map, cached beside a corpus read from disk)"},
    )
    max_target_length: int = field(default=256)
    upsample_primary: int = field(
        default=1, metadata={"help": "ding+phrases: each training sentence N times per epoch (fairseq's)"}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training pairs"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N dev/test pairs"})


@dataclass
class RecipeArguments:
    lr_schedule: str = field(
        default="paper",
        metadata={"help": "'paper' (Eq. 3 times --lr_scale) or 'trainer' (--learning_rate and --lr_scheduler_type)"},
    )
    lr_scale: float = field(
        default=1.0,
        metadata={
            "help": "multiplier of Eq. (3): lr = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); "
            "the paper's is 1"
        },
    )
    checkpoint_minutes: float | None = field(
        default=None, metadata={"help": "also save a checkpoint every M minutes of wall time (the paper: 10)"}
    )
    time_budget_minutes: float | None = field(
        default=None, metadata={"help": "stop training (with a checkpoint) after M minutes of wall time"}
    )
    job_minutes: float | None = field(
        default=None,
        metadata={
            "help": "the whole job, start to printed result, in M minutes of this process's wall time: training "
            "stops (with a checkpoint) early enough for the averaging, the constrained alpha and the test set, "
            "their time estimated on this machine 5 minutes before the end (training/deadline.py)"
        },
    )
    alignment_supervision: bool = field(
        default=False,
        metadata={
            "help": "also train head 0 of the penultimate decoder layer to align words (Garg et al. 2019), on "
            "eflomal's alignments of the training split (needs pip install eflomal); the saved config names the "
            "head, and alignments then come from it"
        },
    )
    alignment_lambda: float = field(
        default=0.05, metadata={"help": "weight of the alignment loss with --alignment_supervision (Garg et al.: 0.05)"}
    )
    average_last: int = field(
        default=5,
        metadata={
            "help": "publish the mean of the last K checkpoints (§6.1; 1 = the final weights); with "
            "--metric_for_best_model, the last K ending at the best one (1 = the best checkpoint itself)"
        },
    )
    length_penalty: float | None = field(
        default=None,
        metadata={
            "help": "GNMT length penalty alpha saved in the model's generation_config.json: the test BLEU and every "
            "later generate() (translate, evaluate, pipeline, Hub) search with it; default: the paper's 0.6 (§6.1)"
        },
    )
    constrained_length_penalty: float | None = field(
        default=None,
        metadata={
            "help": "GNMT alpha of the sentences translated with terminology constraints, saved beside "
            "--length_penalty; default: chosen at the end of training by dev BLEU with a reference word of each dev "
            "sentence as its term, among 0, 0.3, ... up to --length_penalty (forced terms lengthen outputs at a large "
            "alpha: docs/constraints.md); a number fixes it"
        },
    )
    eval_bleu: bool = field(
        default=False,
        metadata={
            "help": "dev-set BLEU (eval_bleu) at each evaluation during training, by greedy search unless "
            "--generation_num_beams N (the test BLEU searches with the model's beam 4 and --length_penalty), each "
            "sentence at most its length + 50 tokens (§6.1) unless --generation_max_length; "
            "--metric_for_best_model bleu turns it on"
        },
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata={
            "help": "stop training after P evaluations in a row that do not improve --metric_for_best_model (needs "
            "it and an --eval_strategy); the published weights then end at the best checkpoint (--average_last)"
        },
    )
    test_bleu: bool = field(default=True, metadata={"help": "sacreBLEU on the test split at the end"})
    show_translations: int = field(default=5, metadata={"help": "test sentences printed with their translations"})
    auto_bf16: bool = field(
        default=False,
        metadata={
            "help": "train with --bf16 where the hardware multiplies bf16 natively (a CUDA GPU with bf16, a CPU with "
            "AVX512-BF16 or AMX), in float32 elsewhere; --auto_bf16 false keeps float32 under a config that sets it"
        },
    )
    bf16_weights: bool = field(
        default=False,
        metadata={
            "help": "forward and backward on bf16 copies of the weights, cast once per optimizer step, while Adam "
            "updates the float32 ones (fairseq's FP16Optimizer's master weights); the rest of the step in bf16 too, "
            "or under autocast with --bf16; one process (training/bf16_weights.py)"
        },
    )
    float32_overrides: dict | str | None = field(
        default=None,
        metadata={
            "help": "with --auto_bf16, where the hardware has no native bf16 (so training runs in float32): options "
            'that replace their values there, as JSON (\'{"preset": "mini", "max_tokens_per_batch": 1024}\') or a '
            "mapping in the config file; a float32 step is several times slower, so a smaller model and batch keep "
            "enough updates in a time budget (RESULTS.md). An option given on the command line is not replaced"
        },
    )
    retain_freed_memory: bool = field(
        default=True,
        metadata={
            "help": "on Linux (glibc): malloc keeps freed memory for the next step instead of unmapping it, so the "
            "step's large buffers are not page-faulted again at every step (vaswani_mt.system.allocator); false: as is"
        },
    )
    config: str | None = field(default=None, metadata={"help": "a YAML or JSON file with any of these options"})

    def __post_init__(self):
        # Which options the config file set and which the command line gave (`parse_args`), for messages.
        self.from_config_file: frozenset[str] = frozenset()
        self.from_command_line: frozenset[str] = frozenset()


# The recipe's defaults for Seq2SeqTrainingArguments: §5.3 Adam without weight decay or clipping.
TRAINING_DEFAULTS = dict(
    warmup_steps=4000,
    adam_beta1=0.9,
    adam_beta2=0.98,
    adam_epsilon=1e-9,
    weight_decay=0.0,
    optim="adamw_torch_fused",
    max_grad_norm=0.0,
    logging_steps=50,
    save_steps=1000,
    save_total_limit=5,
    report_to=["tensorboard"],
    output_dir="outputs/run",
    per_device_train_batch_size=64,
    per_device_eval_batch_size=64,
    dataloader_drop_last=False,
    remove_unused_columns=True,
    predict_with_generate=False,
    ddp_find_unused_parameters=False,
)

# Seq2SeqTrainingArguments' help where this job gives the flag a meaning of its own (`--help` prints these).
TRAINING_HELP = {
    "metric_for_best_model": "bleu (dev BLEU, which it turns on: --eval_bleu) or loss (dev loss): each evaluation "
    "then saves a checkpoint, --save_total_limit never deletes the best one, and the published weights are the mean "
    "of the last --average_last checkpoints ending at the best: §6.1 averages a run's last checkpoints, and the run "
    "is taken to end where the dev score peaked (--average_last 1: the best itself); --early_stopping_patience "
    "stops on it",
    "generation_num_beams": "beams of the dev-BLEU search at each evaluation (--eval_bleu); default here: 1, greedy "
    "(cheap); 4 = the test search (the model's generation_config)",
    "generation_max_length": "a length limit (tokens) for the dev-BLEU search, one per batch; default: each "
    "sentence's own length + 50 (§6.1)",
}
BEST_MODEL_METRICS = ("bleu", "loss")  # what an evaluation computes: dev BLEU (--eval_bleu) and the dev loss

ARGUMENT_CLASSES = (ModelArguments, DataArguments, RecipeArguments, Seq2SeqTrainingArguments)
# The options a float32 override may replace: the model's shape and the data's batching, not the Trainer's.
FLOAT32_OVERRIDABLE = (ModelArguments, DataArguments)


def _option_names(argv: list[str]) -> frozenset[str]:
    """The options a command line names (`--name value`, `--name=value`)."""
    return frozenset(arg[2:].split("=", 1)[0].replace("-", "_") for arg in argv if arg.startswith("--"))


def _read_config_file(path: str) -> dict:
    import yaml

    with open(path, encoding="utf-8") as f:
        values = yaml.safe_load(f) if path.endswith((".yaml", ".yml")) else json.load(f)
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of option names to values")
    return values


def parse_args(argv: list[str] | None = None):
    """Parses the training command line: every Seq2SeqTrainingArguments flag plus ours, with the recipe's
    defaults. `--config FILE` (YAML or JSON; also as the first argument) sets any of them; the command line wins.
    Returns `(model_args, data_args, recipe, training_args)`.

    The file is read here: `HfArgumentParser` reads a YAML file alone, with no command line to override it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser(ARGUMENT_CLASSES)
    parser.set_defaults(**TRAINING_DEFAULTS)
    for action in parser._actions:
        action.help = TRAINING_HELP.get(action.dest, action.help)
    # Without a GPU, say so up front: transformers refuses --bf16 (CPU autocast, AMX) unless use_cpu is set.
    parser.set_defaults(use_cpu=not (torch.cuda.is_available() or torch.backends.mps.is_available()))
    config_file = None
    if "--config" in argv:
        at = argv.index("--config")
        if at + 1 >= len(argv):
            raise ValueError("--config needs a file")
        config_file = argv[at + 1]
        del argv[at : at + 2]
    elif argv and argv[0].endswith((".yaml", ".yml", ".json")):
        config_file = argv.pop(0)
    values = _read_config_file(config_file) if config_file else {}
    known = {action.dest for action in parser._actions}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{config_file}: unknown options {unknown}")
    parser.set_defaults(**values)
    model_args, data_args, recipe, training_args = parser.parse_args_into_dataclasses(args=argv)
    recipe.config = config_file
    recipe.from_config_file = frozenset(values)
    recipe.from_command_line = _option_names(argv)
    if "learning_rate" in recipe.from_config_file | recipe.from_command_line and recipe.lr_schedule == "paper":
        where = "the command line" if "learning_rate" in recipe.from_command_line else config_file
        raise ValueError(
            f"--learning_rate (from {where}) is the Trainer's initial learning rate, which the paper's schedule does "
            "not use: Eq. (3)'s multiplier is --lr_scale; for a schedule of "
            "the Trainer's, add --lr_schedule trainer"
        )
    recipe.float32_overrides = float32_overrides(recipe)
    check_early_stopping(recipe, training_args)
    check_model_options(model_args)
    return model_args, data_args, recipe, training_args


def check_model_options(model_args: ModelArguments) -> None:
    """The preset with the shape and rate options, checked by the config's own rules before any data is read: one
    line naming the option (`--dropout 1.5`, `--num_heads 0`), not a traceback after the tokenizer is trained."""
    if model_args.model_name_or_path:
        return
    names = {f.name for f in fields(ModelArguments)} & set(VaswaniConfig.__dataclass_fields__)
    given = {name: getattr(model_args, name) for name in names if getattr(model_args, name) is not None}
    try:
        VaswaniConfig.from_preset(model_args.preset, **given)
    except StrictDataclassError as error:
        raise ValueError(f"model options: {error.__cause__}") from None


def float32_overrides(recipe: RecipeArguments) -> dict:
    """`--float32_overrides` as a mapping, checked: each key an option of the model or the data (not one the
    command line gave, which keeps its value), each value of that option's type."""
    overrides = recipe.float32_overrides
    if overrides in (None, ""):
        return {}
    if isinstance(overrides, str):
        try:
            overrides = json.loads(overrides)
        except json.JSONDecodeError as error:
            raise ValueError(f"--float32_overrides: not JSON ({error.msg}): {overrides!r}") from None
    if not isinstance(overrides, dict):
        raise ValueError(f"--float32_overrides: expected a mapping of option names to values, got {overrides!r}")
    allowed = {f.name: f for cls in FLOAT32_OVERRIDABLE for f in fields(cls)}
    unknown = sorted(set(overrides) - set(allowed))
    if unknown:
        raise ValueError(
            f"--float32_overrides: {unknown} are not options of the model or the data; choose from {sorted(allowed)}"
        )
    if "preset" in overrides and overrides["preset"] not in PRESETS:
        preset = overrides["preset"]
        raise ValueError(f"--float32_overrides: unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    for name, value in overrides.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"--float32_overrides: {name} must not be negative, got {value}")
    kept = sorted(set(overrides) & recipe.from_command_line)
    if kept:
        logger.info("--float32_overrides: %s given on the command line, not replaced", kept)
    return {name: value for name, value in overrides.items() if name not in recipe.from_command_line}


def check_dataset_options(data_args: DataArguments, recipe: RecipeArguments) -> None:
    """Raises, naming where each value came from, when an option does not apply to the chosen dataset; when a
    --dataset that looks like a path names no file (before any Hub call); and, one line saying how to install it,
    when --alignment_supervision lacks eflomal."""
    from vaswani_mt.data.alignment_labels import require_eflomal
    from vaswani_mt.data.corpus import BUILTIN_CORPORA
    from vaswani_mt.data.readers import missing_file

    missing = missing_file(data_args.dataset, (data_args.source_lang, data_args.target_lang))
    if missing:
        raise ValueError(f"--dataset {missing}")

    if recipe.alignment_supervision:
        try:
            require_eflomal()
        except ImportError as error:
            raise ValueError(f"--alignment_supervision: {error}") from None

    extra = BUILTIN_CORPORA.get(data_args.dataset)
    if data_args.upsample_primary != 1 and extra is None:
        source = "the command line"
        if "upsample_primary" in recipe.from_config_file and "upsample_primary" not in recipe.from_command_line:
            source = recipe.config
        given = "given on the command line" if "dataset" in recipe.from_command_line else f"from {recipe.config}"
        raise ValueError(
            f"upsample_primary: {data_args.upsample_primary} (from {source}) applies only to ding+phrases, not to "
            f"--dataset {data_args.dataset} ({given}); add --upsample_primary 1 to the command line"
        )


def check_early_stopping(recipe: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """Raises when `--metric_for_best_model` or `--early_stopping_patience` cannot work: patience below 1 or without
    a metric, a metric no evaluation computes (`bleu` or `loss`, with or without `eval_`), no evaluations or no
    checkpoints to choose the best from. `--metric_for_best_model bleu` turns `--eval_bleu` on."""
    patience, metric = recipe.early_stopping_patience, training_args.metric_for_best_model
    if patience is not None and patience < 1:
        raise ValueError(
            f"--early_stopping_patience must be at least 1 (evaluations that do not improve), got {patience}"
        )
    if patience is not None and metric is None:
        raise ValueError(
            "--early_stopping_patience needs --metric_for_best_model: bleu (dev BLEU) or loss (dev loss), the score "
            "that must improve"
        )
    if metric is None:
        return
    option = "--early_stopping_patience" if patience is not None else f"--metric_for_best_model {metric}"
    name = metric.removeprefix("eval_")
    if name not in BEST_MODEL_METRICS:
        raise ValueError(
            f"--metric_for_best_model {metric}: no evaluation computes it; choose bleu (dev BLEU) or loss (dev loss)"
        )
    if name == "bleu" and not recipe.eval_bleu:
        if "eval_bleu" in recipe.from_command_line | recipe.from_config_file:
            where = "the command line" if "eval_bleu" in recipe.from_command_line else recipe.config
            raise ValueError(
                f"--metric_for_best_model {metric} needs dev BLEU, which --eval_bleu false (from {where}) turns off"
            )
        recipe.eval_bleu = True
    if training_args.eval_strategy == "no":
        raise ValueError(
            f"{option} needs evaluations during training: add --eval_strategy steps --eval_steps N "
            "(or --eval_strategy epoch)"
        )
    if training_args.save_strategy == "no":
        raise ValueError(f"{option} chooses the best of the saved checkpoints, and --save_strategy no saves none")


__all__ = [
    "ARGUMENT_CLASSES",
    "BEST_MODEL_METRICS",
    "TRAINING_DEFAULTS",
    "TRAINING_HELP",
    "DataArguments",
    "ModelArguments",
    "RecipeArguments",
    "check_dataset_options",
    "check_early_stopping",
    "float32_overrides",
    "parse_args",
]
