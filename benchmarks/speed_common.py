"""The harness every benchmark shares: the machine record, interleaved timing, medians and ratios, peak memory,
the built-in corpus's splits, the side-by-side runner on a split, a run's logged summary, the JSON output.

Both sides of a comparison run in one process, interleaved (A, B, A, B, ... with the order rotated each round), so
a busy machine slows both alike; ratios are reported two ways: the ratio of the medians, and the median of the
per-round ratios (each round's two timings are seconds apart, so it cancels slow drifts in the load).

The scripts, one per purpose: speed.py (against the peers and faster inference: training step, decoding,
batching, the peers, our compute types and CTranslate2 as our back end in one run), quality.py (BLEU of runs:
curves, searches, ensembles), train_vs_marian.py (quality against Marian), terminology.py and alignments.py
(controls), data_scale.py, scale.py and demo_load.py (scale and faults), gpu_check.sh (the GPU path),
compile_step.py (the compiled decoder step against eager, each in fresh processes, cold and from inductor's cache).
"""

import argparse
import inspect
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # each script imports this one from benchmarks/
import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]  # the repository
TRANSLATE_PY = str(ROOT / "scripts" / "translate.py")  # the command the translation benchmarks run


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine since boot, from /proc/stat (None where there is none)."""
    try:
        with open("/proc/stat", encoding="utf-8") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


class MachineRecord:
    """The machine, versions and command, plus how much of the CPU other processes used while we measured."""

    def __init__(self):
        self.start_wall = time.monotonic()
        self.start_jiffies = _cpu_jiffies()
        self.start_self = _own_cpu_seconds()

    def finish(self) -> dict:
        wall = time.monotonic() - self.start_wall
        record = {
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "machine": f"{_cpu_model()}, {os.cpu_count()} cores, {_memory_gib():.0f} GiB",
            "versions": f"python {platform.python_version()}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}",
            "threads": torch.get_num_threads(),
            "wall_seconds": round(wall, 1),
        }
        end = _cpu_jiffies()
        if self.start_jiffies and end and end[1] > self.start_jiffies[1]:
            busy = (end[0] - self.start_jiffies[0]) / (end[1] - self.start_jiffies[1])
            ours = (_own_cpu_seconds() - self.start_self) / (wall * (os.cpu_count() or 1))
            record["others_cpu_share"] = round(max(busy - ours, 0.0), 2)
            record["machine_shared"] = record["others_cpu_share"] > 0.1
        return record

    def report(self, result: dict, json_path: str | None = None, **extra) -> dict:
        """`result` with this record (and `extra`, the device say) as its "record", printed as JSON and written to
        `json_path` (when given): every benchmark's JSON output."""
        result["record"] = {**self.finish(), **extra}
        text = json.dumps(result, indent=1, ensure_ascii=False)
        print(text)
        if json_path:
            Path(json_path).parent.mkdir(parents=True, exist_ok=True)
            Path(json_path).write_text(text + "\n", encoding="utf-8")
        return result


def _own_cpu_seconds() -> float:
    """CPU seconds of this process and of its finished children (the peak-memory runs are ours, not others')."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0


def peak_rss_mib(pid: int | str = "self", field: str = "VmHWM") -> float:
    """A process's peak resident set size in MiB (this one's by default): VmHWM, which starts afresh at exec
    (`ru_maxrss` does not: a child would report its parent's peak at fork time); `field="VmRSS"`: its RSS now. NaN
    for another process that has none (it has ended)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if pid == "self" else float("nan")


def interleave(runs: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Times each callable `repeats` times, interleaved, after `warmup` untimed rounds; seconds per call."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return times


def speedups(times: dict[str, list[float]], baseline: str) -> dict[str, dict]:
    """Per side: median and best seconds; against `baseline`: ratio of medians and median of per-round ratios
    (> 1 means faster than the baseline)."""
    out = {}
    for name, values in times.items():
        row = {"median_s": statistics.median(values), "min_s": min(values), "n": len(values)}
        if name != baseline:
            base = times[baseline]
            row["ratio_of_medians"] = statistics.median(base) / statistics.median(values)
            row["median_of_ratios"] = statistics.median(b / v for b, v in zip(base, values, strict=False))
        out[name] = row
    return out


def rates(times: dict[str, list[float]], sentences: int, baseline: str) -> dict[str, dict]:
    """`speedups(times, baseline)` of runs that each translate `sentences`, with each side's sentences/s (from its
    median) and its rounds' seconds."""
    rows = speedups(times, baseline)
    for name, row in rows.items():
        row["sentences_per_s"] = round(sentences / row["median_s"], 2)
        row["seconds"] = [round(t, 2) for t in times[name]]
    return rows


def rows_against(
    times: dict[str, list[float]], outputs: dict[str, list[str]], references: list[str], baseline: str
) -> dict[str, dict]:
    """The side-by-side runner's table on a split: per side sentences/s, the ratio to `baseline` (of medians and
    median of per-round ratios), sacreBLEU, and the share of lines identical to the baseline's."""
    from vaswani_mt.evaluation.metrics import bleu

    count = len(references)
    rows = {}
    for name, row in speedups(times, baseline).items():
        same = sum(a == b for a, b in zip(outputs[name], outputs[baseline], strict=True))
        rows[name] = {"sentences_per_s": round(count / row["median_s"], 2),
                      f"ratio_to_{baseline}": round(row.get("ratio_of_medians", 1.0), 3),
                      "median_of_round_ratios": round(row.get("median_of_ratios", 1.0), 3),
                      "bleu": round(bleu(outputs[name], references)["score"], 2),
                      f"identical_to_{baseline}": round(same / count, 4),
                      "seconds": [round(s, 2) for s in times[name]]}  # fmt: skip
        print(
            f"{name:<38}{rows[name]['sentences_per_s']:>9.2f} sent/s {rows[name][f'ratio_to_{baseline}']:>7.3f}x"
            f"{rows[name]['bleu']:>7.2f} BLEU {rows[name][f'identical_to_{baseline}']:>8.1%} = {baseline}"
        )
    return rows


def run_sides(
    sides: dict[str, Callable[[list[str]], list[str]]],
    sources: list[str],
    references: list[str],
    repeats: int,
    baseline: str,
) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """The side-by-side runner: each side (sentences -> translations) translates `sources` once untimed (first
    calls pack weights, allocate, warm caches), then `repeats` rounds interleaved; a side whose rounds disagree is
    an error. Returns `rows_against(...)` and each side's translations."""
    for translate in sides.values():
        translate(sources[:32])
    outputs: dict[str, list[str]] = {}

    def timed(name):
        def call():
            texts = sides[name](sources)
            if outputs.setdefault(name, texts) != texts:
                raise SystemExit(f"{name}: another round gave other translations")

        return call

    times = interleave({name: timed(name) for name in sides}, repeats, warmup=0)
    return rows_against(times, outputs, references, baseline), outputs


def split_pairs(split: str = "test", limit: int | None = None, dataset: str | None = None) -> tuple[list, list]:
    """The English sources and German references of `split` of `dataset` (a corpus `train.py --dataset` takes;
    default: the built-in one), the first `limit` of them."""
    from vaswani_mt.data.corpus import BUILTIN_CORPUS, load_corpus, source_target

    sources, references = source_target(load_corpus(dataset or BUILTIN_CORPUS, None, "en", "de")[split], "en", "de")
    return sources[:limit], references[:limit]


def run_summary(run: str | os.PathLike) -> dict:
    """What a finished run's log says about it: updates, epochs, the median of its logged target tokens per second
    (the upper one for an even count) and its last logged training loss."""
    from vaswani_mt.training.checkpoints import log_history

    history = log_history(run)
    rows = [row for row in history if "loss" in row]
    speeds = sorted(row["target_tokens_per_second"] for row in rows if "target_tokens_per_second" in row)
    return {
        "steps": max((row["step"] for row in history), default=0),
        "epochs": max((row["epoch"] for row in history if "epoch" in row), default=None),
        "final_train_loss": rows[-1]["loss"] if rows else None,
        "median_target_tokens_per_second": speeds[len(speeds) // 2] if speeds else None,
    }


def command_parser(command: str | Callable, json_help: str = "also write the result here") -> argparse.ArgumentParser:
    """A benchmark's parser, with the option every benchmark has: --json, the file its record is written to.
    `command`: a script's docstring, or the function of a command of a script of several (`SCRIPT COMMAND`)."""
    doc, prog = command, None
    if callable(command):
        doc, prog = command.__doc__, f"{Path(inspect.getfile(command)).name} {command.__name__}"
    parser = argparse.ArgumentParser(prog=prog, description=inspect.cleandoc(doc),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--json", help=json_help)
    return parser


def dispatch(doc: str, commands: dict[str, Callable], argv: list[str] | None):
    """`SCRIPT COMMAND [options]`: runs `commands[COMMAND](options)`; without one, or with -h, prints `doc`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in commands:
        print(f"{doc}\ncommands: {', '.join(commands)} (each takes --help)")
        raise SystemExit(0 if argv[:1] in (["-h"], ["--help"]) else 2)
    return commands[argv[0]](argv[1:])


def free_port() -> int:
    """A free TCP port on the loopback interface (the demo's server, the simulated machines' rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_argv(argv: list[str]) -> list[str]:
    """A benchmark's own arguments for a memory child: no timing, no memory runs of its own, no output file."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--json":
            skip = True
        elif arg not in ("--memory", "--no-memory") and not arg.startswith("--json="):
            out.append(arg)
    return out


def measure_peak_rss(script: str, argv: list[str], sides: list[str], title: str) -> dict[str, float]:
    """Peak RSS of each side alone, each in a fresh subprocess running `script ARGV --rss_child SIDE` (`child_argv`:
    so that peaks do not mix), printed; the child reports it with `child_peak`."""
    peaks = {}
    for side in sides:
        command = [sys.executable, script, *child_argv(argv), "--rss_child", side]
        done = subprocess.run(command, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"--rss_child {side} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        peaks[side] = round(json.loads(lines[-1])["peak_rss_mib"], 1)
    rows = [{"side": side, "peak_rss_mib": peak} for side, peak in peaks.items()]
    print_table(f"Peak RSS, {title}", rows, ["side", "peak_rss_mib"])
    return peaks


def child_peak(side: str, run: Callable[[], object], times: int) -> None:
    """The `--rss_child` process of `measure_peak_rss`: `run()` `times` times, then its peak RSS as one JSON line."""
    for _ in range(times):
        run()
    print(json.dumps({"side": side, "peak_rss_mib": peak_rss_mib()}))


def print_table(title: str, rows: list[dict], columns: list[str]) -> None:
    """A markdown table of `rows` (dicts) with the given columns."""
    print(f"\n{title}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = []
        for column in columns:
            value = row.get(column, "")
            if isinstance(value, float):
                cells.append(f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4g}")
            else:
                cells.append(str(value))
        print("| " + " | ".join(cells) + " |")


def synthetic_batch(config, batch: int, length: int, seed: int, device: str = "cpu") -> dict:
    """`batch` random training pairs of `length` tokens each side, ending in </s> (speed.py train, scale.py gpus)."""
    generator = torch.Generator().manual_seed(seed)
    source = torch.randint(4, config.vocab_size, (batch, length), generator=generator)
    labels = torch.randint(4, config.vocab_size, (batch, length), generator=generator)
    source[:, -1] = labels[:, -1] = config.eos_token_id
    decoder_input_ids = torch.full_like(labels, config.pad_token_id)
    decoder_input_ids[:, 0] = config.decoder_start_token_id
    decoder_input_ids[:, 1:] = labels[:, :-1]
    tensors = {"input_ids": source, "attention_mask": torch.ones_like(source), "decoder_input_ids": decoder_input_ids,
               "labels": labels}  # fmt: skip
    return {key: value.to(device) for key, value in tensors.items()}


PAIRS = [  # the tests' six sentence pairs (tests/conftest.py)
    ("The girl ate an apple.", "Das Mädchen hat einen Apfel gegessen."),
    ("How are you today?", "Wie geht es Ihnen heute?"),
    ("The street is closed because of the snow.", "Die Straße ist wegen des Schnees gesperrt."),
    ("I would like a coffee, please!", "Ich hätte gern einen Kaffee, bitte!"),
    ("She reads a book in the café.", "Sie liest ein Buch im Café."),
    ("We are annoyed about the oil price.", "Wir ärgern uns über den Ölpreis."),
]


def tiny_model_folder(folder: Path) -> Path:
    """The tests' fitted tiny model (tests/conftest.py: fit_tiny_model), saved with its tokenizer in `folder`."""
    import torch

    import vaswani_mt
    from vaswani_mt.data.tokenization import train_tokenizer

    tokenizer = train_tokenizer([side for pair in PAIRS for side in pair] * 4, vocab_size=200, min_frequency=1)
    torch.manual_seed(0)
    config = vaswani_mt.VaswaniConfig.from_preset("tiny", vocab_size=200, dropout=0.0)
    model = vaswani_mt.VaswaniForConditionalGeneration(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batch = tokenizer([en for en, _ in PAIRS], text_target=[de for _, de in PAIRS], padding=True)
    batch = {key: torch.tensor(value) for key, value in batch.items()}
    labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    for _ in range(40):
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
