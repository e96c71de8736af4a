"""Table 3 of the paper ("Variations on the Transformer architecture") as runnable variants.

Each row is a name and the training options it changes (`configs/table3/*.yaml`: `A-h1: {num_heads: 1, d_k: 512,
d_v: 512}`, ...). `run_table` trains chosen rows on top of a *scale*, a training config file
(`configs/wmt14_en_de_base.yaml`, or `configs/table3_cpu.yaml` for a 2-core CPU) plus overrides, and scores each as
the paper did: dev perplexity (no label smoothing) and dev BLEU without checkpoint averaging, beside its parameters.

At a scale whose d_model is not 512, a row's widths (d_model, d_ff, d_k, d_v) are multiplied by d_model / 512 and its
max_steps by the scale's max_steps / 100,000, so that a row keeps its meaning (`A-h1`: d_k = d_v = d_model).

    from vaswani_mt.training.table3 import run_table, markdown_table
    rows = run_table(["base", "A-h1"], "configs/table3_cpu.yaml", ["--time_budget_minutes", "4"], "outputs/t3")
    print(markdown_table(rows))
"""

from __future__ import annotations

import gc
import json
import logging
import math
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# The repository's configs/, relative to the working directory; `--rows_dir` and `--scale PATH` name others.
CONFIG_DIR = Path("configs")
ROWS_DIR = CONFIG_DIR / "table3"
# What a launcher runs for a row: the training command as a module (`accelerate launch -m ...`).
TRAIN_MODULE = "vaswani_mt.cli.train"
# --scale NAME: these files of CONFIG_DIR; any other value is a path to a training config file.
SCALES = {"paper": "wmt14_en_de_base.yaml", "big": "wmt14_en_de_big.yaml", "cpu": "table3_cpu.yaml"}
# The paper's base row: the widths and step count a row's values are relative to.
PAPER_D_MODEL = 512
PAPER_STEPS = 100_000
WIDTH_OPTIONS = ("d_model", "d_ff", "d_k", "d_v")
# What a row may change: the model's shape and regularisation (Table 3's columns) and the number of steps.
ROW_OPTIONS = (
    "num_heads",
    "d_k",
    "d_v",
    "num_encoder_layers",
    "num_decoder_layers",
    "d_model",
    "d_ff",
    "dropout",
    "label_smoothing",
    "position_encoding",
    "max_steps",
)
# Options every row runs with, last: Table 3 used no checkpoint averaging, and rows are scored on the dev set.
ROW_FIXED = ("--average_last", "1", "--test_bleu", "false", "--show_translations", "0")


@dataclass
class Table3Row:
    """One trained and scored row: its shape (Table 3's columns), steps, dev PPL and BLEU, parameters."""

    name: str
    options: dict  # the options given to training (scaled)
    N: int
    d_model: int
    d_ff: int
    h: int
    d_k: int
    d_v: int
    dropout: float
    label_smoothing: float
    position_encoding: str
    steps: int
    dev_ppl: float
    dev_bleu: float
    params: int
    train_minutes: float | None = None
    output_dir: str = ""
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# Rows


def load_rows(directory: str | Path = ROWS_DIR) -> dict[str, dict]:
    """Every row of the `*.yaml` files in `directory` (`base.yaml` first, then by file name), in file order:
    `{name: {option: value}}`. Raises on a repeated name or an option a row may not change (`ROW_OPTIONS`)."""
    import yaml

    files = sorted(Path(directory).glob("*.yaml"), key=lambda p: (p.stem != "base", p.name))
    if not files:
        raise FileNotFoundError(f"{directory}: no Table 3 row files (*.yaml)")
    rows: dict[str, dict] = {}
    for path in files:
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a mapping of row names to option overrides")
        for name, options in values.items():
            options = options or {}
            if not isinstance(options, dict):
                raise ValueError(f"{path}: row {name!r} must be a mapping of options, got {options!r}")
            if name in rows:
                raise ValueError(f"{path}: row {name!r} is defined twice")
            unknown = sorted(set(options) - set(ROW_OPTIONS))
            if unknown:
                raise ValueError(f"{path}: row {name!r} changes {unknown}; a row may change {list(ROW_OPTIONS)}")
            rows[str(name)] = dict(options)
    return rows


def select_rows(rows: dict[str, dict], names: str | Sequence[str] | None) -> list[str]:
    """Row names from `names`: a comma-separated string or a list; `all` (or None) is every row, a group letter
    (`A`) every row of that group (`A-h1`, `A-h4`, ...). Order as given, each row once."""
    if names is None:
        names = ["all"]
    if isinstance(names, str):
        names = names.split(",")
    chosen: list[str] = []
    for name in (n.strip() for n in names):
        if not name:
            continue
        if name == "all":
            matches = list(rows)
        elif name in rows:
            matches = [name]
        else:
            matches = [row for row in rows if row.startswith(f"{name}-")]
        if not matches:
            raise ValueError(f"no Table 3 row {name!r}; the rows are {', '.join(rows)}")
        chosen += [row for row in matches if row not in chosen]
    return chosen


def scale_row(options: dict, d_model: int, max_steps: int) -> dict:
    """A row's options at a scale of width `d_model` and `max_steps` steps (the paper's: 512 and 100,000):
    widths times d_model / 512 (at least 1), max_steps times max_steps / 100,000; the rest as they are."""
    width, steps = d_model / PAPER_D_MODEL, max_steps / PAPER_STEPS
    scaled = {}
    for name, value in options.items():
        if name in WIDTH_OPTIONS:
            value = max(1, round(value * width))
        elif name == "max_steps":
            value = max(1, round(value * steps))
        scaled[name] = value
    return scaled


def _option_value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def scale_settings(scale_argv: Sequence[str]) -> dict:
    """What training with `scale_argv` would use here (float32 overrides included): `d_model` and `max_steps` (what
    rows are scaled by), `tokenizer` (None: trained) and `eval_batch_size`."""
    from vaswani_mt.model.configuration_vaswani import PRESETS, VaswaniConfig

    from .arguments import parse_args
    from .hardware import apply_float32_overrides, resolve_precision

    model_args, data_args, recipe, training_args = parse_args(list(scale_argv))
    resolve_precision(recipe, training_args)
    apply_float32_overrides(recipe, model_args, data_args, training_args)
    return {
        "d_model": model_args.d_model or PRESETS[model_args.preset].get("d_model", VaswaniConfig.d_model),
        "max_steps": training_args.max_steps,
        "tokenizer": model_args.tokenizer,
        "eval_batch_size": training_args.per_device_eval_batch_size,
    }


def row_argv(scale_argv: Sequence[str], options: dict, output_dir: str | Path) -> list[str]:
    """The training command line of a row (without the program): the scale, then the row's options, then
    `ROW_FIXED` and the row's output folder; later options win."""
    argv = list(scale_argv)
    for name, value in options.items():
        argv += [f"--{name}", _option_value(value)]
    return [*argv, *ROW_FIXED, "--output_dir", str(output_dir)]


def resolve_scale(scale: str | Path) -> Path:
    """`--scale`: a name of `SCALES` (a file of configs/) or a path to a training config file."""
    path = CONFIG_DIR / SCALES[scale] if scale in SCALES else Path(scale)
    if not path.is_file():
        raise FileNotFoundError(f"scale {scale!r}: no such config file ({path}); names: {', '.join(SCALES)}")
    return path


# ---------------------------------------------------------------------------------------------------------------
# Training and scoring


def train_row(argv: Sequence[str], launcher: str | None = None) -> None:
    """Trains one row with the training options `argv`: in this process, or as `<launcher> -m vaswani_mt.cli.train
    argv` with a `launcher` that takes `-m MODULE` (`accelerate launch --multi_gpu ...`, `torchrun`)."""
    if launcher:
        command = [*shlex.split(launcher), "-m", TRAIN_MODULE, *argv]
        logger.info("running %s", shlex.join(command))
        subprocess.run(command, check=True)
        return
    from .arguments import parse_args
    from .job import run_training

    model_args, data_args, recipe, training_args = parse_args(list(argv))
    run_training(model_args, data_args, recipe, training_args, command=shlex.join(["scripts/train.py", *argv]))
    gc.collect()  # the row's trainer, model and optimizer state go before the next row's
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def dev_split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The validation split's sources and references for the data options of `argv`."""
    from vaswani_mt.data.corpus import load_run_corpus, source_target

    from .arguments import parse_args

    _, data_args, _, _ = parse_args(list(argv))
    dev = load_run_corpus(data_args)["validation"]
    if data_args.max_eval_samples:
        dev = dev.select(range(min(data_args.max_eval_samples, len(dev))))
    return source_target(dev, data_args.source_lang, data_args.target_lang)


def score_row(name: str, options: dict, output_dir: str | Path, dev: tuple[list[str], list[str]],
              batch_size: int = 64) -> Table3Row:  # fmt: skip
    """Dev PPL (exp of the token NLL, no label smoothing) and dev BLEU (the model's saved search: beam 4 and the
    recipe's length penalty) of the model a row's training left in `output_dir` (its final weights)."""
    from vaswani_mt.evaluation.metrics import evaluate_bleu, token_nll
    from vaswani_mt.inference.loading import load_for_inference

    from .checkpoints import log_history

    output_dir = Path(output_dir)
    model, tokenizer = load_for_inference(str(output_dir))
    sources, references = dev
    nll = token_nll(model, tokenizer, sources, references, batch_size=batch_size)
    bleu = evaluate_bleu(model, tokenizer, sources, references, batch_size=batch_size)
    history = log_history(output_dir)
    state_file = output_dir / "trainer_state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    minutes = [row["train_minutes"] for row in history if "train_minutes" in row]
    config = model.config
    return Table3Row(
        name=name,
        options=dict(options),
        N=config.num_encoder_layers,
        d_model=config.d_model,
        d_ff=config.d_ff,
        h=config.num_heads,
        d_k=config.d_k,
        d_v=config.d_v,
        dropout=config.dropout,
        label_smoothing=config.label_smoothing,
        position_encoding=config.position_encoding,
        steps=int(state.get("global_step") or max((row["step"] for row in history), default=0)),
        dev_ppl=math.exp(nll),
        dev_bleu=bleu["score"],
        params=sum(p.numel() for p in model.parameters()),
        train_minutes=round(max(minutes), 2) if minutes else None,
        output_dir=str(output_dir),
        extra={
            "dev_nll": nll,
            "dev_chrf": bleu["chrf"],
            "signature": bleu["signature"],
            "decoder_layers": config.num_decoder_layers,
        },
    )


def run_table(
    names: str | Sequence[str] | None,
    scale: str | Path,
    overrides: Sequence[str] = (),
    output_dir: str | Path = "outputs/table3",
    rows_dir: str | Path = ROWS_DIR,
    launcher: str | None = None,
    retrain: bool = False,
) -> list[Table3Row]:
    """Trains and scores the rows `names` (`select_rows`) at `scale` with the training options `overrides`, each in
    `<output_dir>/<row>`; a folder holding a finished run (`results.json`) is scored again, not retrained, unless
    `retrain`. All rows share the first row's tokenizer (unless the overrides name one). Writes `table3.md` and
    `table3.json` to `output_dir` and returns the rows."""
    all_rows = load_rows(rows_dir)
    chosen = select_rows(all_rows, names)
    scale_argv = [str(resolve_scale(scale)), *overrides]
    settings = scale_settings(scale_argv)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    shared_tokenizer = settings["tokenizer"]
    dev = None
    results: list[Table3Row] = []
    for name in chosen:
        options = scale_row(all_rows[name], settings["d_model"], settings["max_steps"])
        folder = output_dir / name
        argv = row_argv(scale_argv, options, folder)
        if shared_tokenizer is not None:
            argv[-2:-2] = ["--tokenizer", str(shared_tokenizer)]
        if retrain or not (folder / "results.json").is_file():
            logger.info("Table 3 row %s: %s", name, options or "the base recipe")
            if (folder / "results.json").is_file():  # a finished run trains on only when asked to (runs.py)
                argv = [*argv, "--resume_from_checkpoint", "last"]
            train_row(argv, launcher)
        else:
            logger.info("Table 3 row %s: %s holds a finished run; scoring it again", name, folder)
        if shared_tokenizer is None:
            shared_tokenizer = folder  # every later row reuses this row's tokenizer (saved beside its model)
        if dev is None:
            dev = dev_split(argv)
        results.append(score_row(name, options, folder, dev, batch_size=settings["eval_batch_size"]))
        _write(results, output_dir, scale_argv, settings)
    return results


def _write(rows: list[Table3Row], output_dir: Path, scale_argv: Sequence[str], settings: dict) -> None:
    summary = {"scale": list(scale_argv), **settings, "rows": [asdict(row) for row in rows]}
    (output_dir / "table3.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    (output_dir / "table3.md").write_text(markdown_table(rows) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------------
# The table

COLUMNS = ("", "N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "ε_ls", "train steps", "PPL (dev)", "BLEU (dev)",
           "params ×10^6")  # fmt: skip


def _millions(count: int) -> str:
    value = count / 1e6
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def markdown_table(rows: Sequence[Table3Row]) -> str:
    """The rows in the layout of the paper's Table 3: N, d_model, d_ff, h, d_k, d_v, P_drop, ε_ls, train steps,
    dev PPL, dev BLEU, parameters in millions; a row with learned positions says so in its first column."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        label = row.name + (" (learned positions)" if row.position_encoding == "learned" else "")
        n = str(row.N) if row.extra.get("decoder_layers", row.N) == row.N else f"{row.N}+{row.extra['decoder_layers']}"
        cells = [label, n, row.d_model, row.d_ff, row.h, row.d_k, row.d_v, f"{row.dropout:g}",
                 f"{row.label_smoothing:g}", row.steps, f"{row.dev_ppl:.2f}", f"{row.dev_bleu:.2f}",
                 _millions(row.params)]  # fmt: skip
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines)


def describe_rows(names: str | Sequence[str] | None, scale: str | Path, overrides: Sequence[str] = (),
                  rows_dir: str | Path = ROWS_DIR) -> str:  # fmt: skip
    """What each chosen row would change at `scale`, one line each (`scripts/table3.py --list`)."""
    all_rows = load_rows(rows_dir)
    scale_argv = [str(resolve_scale(scale)), *overrides]
    settings = scale_settings(scale_argv)
    lines = [f"scale {shlex.join(scale_argv)}: d_model {settings['d_model']}, max_steps {settings['max_steps']}"]
    for name in select_rows(all_rows, names):
        options = scale_row(all_rows[name], settings["d_model"], settings["max_steps"])
        changes = " ".join(f"--{k} {_option_value(v)}" for k, v in options.items())
        lines.append(f"  {name:14s} {changes or '(the scale as it is)'}")
    return "\n".join(lines)


__all__ = [
    "ROWS_DIR",
    "SCALES",
    "Table3Row",
    "describe_rows",
    "dev_split",
    "load_rows",
    "markdown_table",
    "resolve_scale",
    "row_argv",
    "run_table",
    "scale_row",
    "scale_settings",
    "score_row",
    "select_rows",
    "train_row",
]
