"""What several test files share: the six sentence pairs and the tiny model (`make_model`, fitted: `fitted_folder`),
training runs read by several files (`reference`, `ddp_reference`, `job_run`) and the launch helpers, the bad model
folders, the hostile texts, and guards that put process-wide settings (threads, RNG states, environment) back. A
fixture or helper lives here when two files need it; one file's own stays in that file."""

import contextlib
import io
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import pytest
import torch
from filelock import FileLock

import vaswani_mt
from vaswani_mt.data.tokenization import train_tokenizer

ROOT = Path(__file__).resolve().parent.parent

SENTENCES = [
    ("The girl ate an apple.", "Das Mädchen hat einen Apfel gegessen."),
    ("How are you today?", "Wie geht es Ihnen heute?"),
    ("The street is closed because of the snow.", "Die Straße ist wegen des Schnees gesperrt."),
    ("I would like a coffee, please!", "Ich hätte gern einen Kaffee, bitte!"),
    ("She reads a book in the café.", "Sie liest ein Buch im Café."),
    ("We are annoyed about the oil price.", "Wir ärgern uns über den Ölpreis."),
]
ENGLISH = [english for english, _ in SENTENCES]


# ---------------------------------------------------------------------------------------------------------------
# Process-wide settings: set for the session through monkeypatch, put back after it, never left behind by a test


@pytest.fixture(scope="session", autouse=True)
def tokenizers_parallelism_off():
    """No tokenizers thread pool: the tests fork (datasets.map, subprocesses), and a pool used before a fork can
    deadlock."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TOKENIZERS_PARALLELISM", os.environ.get("TOKENIZERS_PARALLELISM", "false"))
        yield


@contextlib.contextmanager
def torch_threads(count: int | None = None):
    """torch's intra-op thread count set to `count` (None: as it is) and put back on exit, whatever changed it inside
    (an OpenMP library such as CTranslate2's sets the count its own way)."""
    threads = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def one_torch_thread():
    """Tiny matrices: one thread is many times faster on a busy 2-core machine (`torch_threads(1)`)."""
    return torch_threads(1)


@pytest.fixture(scope="session", autouse=True)
def one_thread_for_the_session():
    """One torch thread for the tests in this process, put back after the session: their models are tiny, and two
    threads on a 2-core machine that also runs the tests' subprocesses (or anything else) made in-process tests many
    times slower (tests/cli/test_line_checks.py: 12 s a test with two, 0.3 s with one, under a load of 2). A test of
    more threads sets them itself (`torch_threads`). The tests' subprocesses get one thread too (OMP_NUM_THREADS,
    unless it is set already): the README's Python example took 27.5 s with two, 8.2 s with one."""
    with one_torch_thread(), pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        yield


@pytest.fixture(scope="module")
def one_thread():
    """`one_torch_thread` for a whole module (`pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    with one_torch_thread():
        yield


@pytest.fixture
def live_sigint():
    """SIGINT live in this process, and so in every child it starts (a handler, unlike SIG_IGN, is not inherited
    across exec), for the test; put back after it. Started in the background (`cmd &`, nohup, some CI runners), a
    process inherits SIGINT ignored and the commands rightly keep it so: a test that sends it makes it live first."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def restore_threads():
    """torch's thread count put back after the test (`torch_threads`)."""
    with torch_threads():
        yield


@contextlib.contextmanager
def rng_kept():
    """Python's, numpy's and torch's random states put back on exit: a Trainer seeds all three when it is built
    (`set_seed(args.seed)`), and loading a checkpoint's RNG state sets them."""
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])


@pytest.fixture
def restore_rng():
    """`rng_kept` around a test (one that builds a Trainer in this process, say)."""
    with rng_kept():
        yield


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_launch(*argv: str) -> list[str]:
    """`accelerate launch` of 2 CPU processes (gloo) on this machine, each running `argv` (a script and its
    arguments); a command's `--use_cpu` makes the Trainer's processes CPU ones. GPUs are hidden: with one visible,
    accelerate's barrier puts rank 1 on a `cuda:1` that is not there (seen on a 1-GPU H200)."""
    accelerate = str(Path(sys.executable).parent / "accelerate")
    return ["env", "CUDA_VISIBLE_DEVICES=", accelerate, "launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--main_process_port",
            str(free_port()), "--mixed_precision", "no", "--dynamo_backend", "no", *argv]  # fmt: skip


def exit_code(main, argv: list[str]) -> str | int | None:
    """The exit code of a command's `main(argv)` run in this process: None when it returned."""
    try:
        main(argv)
    except SystemExit as exit:
        return exit.code
    return None


def run_main(module, argv: list[str], monkeypatch, stdin: bytes = b"") -> tuple[str, str | int | None]:
    """(stdout, exit code: None when main returned) of a command's `module.main(argv)` in this process, with `stdin`
    as its standard input."""
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = None
    try:
        module.main(argv)
    except SystemExit as exit:
        code = exit.code
    return stdout.buffer.getvalue().decode(), code


# ---------------------------------------------------------------------------------------------------------------
# The tiny model and its data


# ---------------------------------------------------------------------------------------------------------------
# Builds that several test files read: made once per pytest run, also under pytest-xdist's workers


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder `name`, filled by `build(folder)` once per pytest run. Under pytest-xdist (`-n`) the workers share
    it: the first to need it builds it under a file lock, and the others wait and read it, rather than each training
    a copy of its own. A build that failed or was cut off is never taken as whole: `name.done` beside the folder is
    written after it, and a folder without one is built again from nothing."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    root = tmp_path_factory.getbasetemp().parent  # the run's folder, above each worker's own
    folder, done = root / name, root / f"{name}.done"
    with FileLock(root / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def tokenizer():
    texts = [side for pair in SENTENCES for side in pair] * 4
    return train_tokenizer(texts, vocab_size=200, min_frequency=1)


def make_model(seed: int = 0, **config_overrides) -> vaswani_mt.VaswaniForConditionalGeneration:
    """The tiny preset (vocabulary 200 unless `vocab_size` is given; any other `VaswaniConfig` field as a keyword),
    initialised from `seed`, in eval mode. The seed is set inside `torch.random.fork_rng`: the global RNG is the
    same afterwards as before."""
    config = vaswani_mt.VaswaniConfig.from_preset("tiny", **{"vocab_size": 200, **config_overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = vaswani_mt.VaswaniForConditionalGeneration(config)
    return model.eval()


@pytest.fixture
def model():
    return make_model()


def uneven_pairs() -> list[dict]:
    """Four pairs whose source and target token counts all differ: a mean of per-batch means is not the mean."""
    rows = []
    for i, (src, tgt) in enumerate([(6, 2), (3, 9), (5, 5), (4, 1)]):
        g = torch.Generator().manual_seed(i)
        rows.append(
            {
                "input_ids": [*torch.randint(4, 200, (src,), generator=g).tolist(), 2],
                "labels": [*torch.randint(4, 200, (tgt,), generator=g).tolist(), 2],
            }
        )
    return rows


def one_sgd_step_arguments(output_dir, per_device: int, accumulation: int = 1, use_cpu: bool = True, *,
                           max_steps: int = 1, learning_rate: float = 1.0, seed: int = 0):  # fmt: skip
    """Plain SGD at a constant rate, by default one step at lr 1: the update is the gradient itself, so equal
    updates mean equal gradients."""
    from transformers import Seq2SeqTrainingArguments

    return Seq2SeqTrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        max_steps=max_steps,
        learning_rate=learning_rate,
        optim="sgd",
        lr_scheduler_type="constant",
        report_to=[],
        save_strategy="no",
        use_cpu=use_cpu,
        disable_tqdm=True,
        logging_steps=1,
        ddp_find_unused_parameters=False,
        seed=seed,
    )


def padded_batch(seed: int = 0, lengths=(7, 4, 5), vocab: int = 200, pad: int = 1):
    """Source ids (specials 0-3 avoided, EOS=2 last) right-padded with `pad`, and the matching attention mask."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths)), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, : length - 1] = torch.randint(4, vocab, (length - 1,), generator=generator)
        ids[row, length - 1] = 2
        mask[row, :length] = 1
    return ids, mask


def fit_tiny_model(tokenizer, steps: int = 40, seed: int = 0) -> vaswani_mt.VaswaniForConditionalGeneration:
    """The tiny model fitted to SENTENCES (well under a second on one thread): unlike a random post-LN model, whose
    greedy output repeats one token, it translates them, so token-equality checks compare varied sequences."""
    model = make_model(seed=seed, dropout=0.0).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batch = tokenizer([en for en, _ in SENTENCES], text_target=[de for _, de in SENTENCES], padding=True)
    batch = {key: torch.tensor(value) for key, value in batch.items()}
    labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    with one_torch_thread():
        for _ in range(steps):
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return model.eval()


def card_values(model, tokenizer, score: dict, examples: list[str]) -> dict:
    """The values training fills the model card with (`vaswani_mt.hub.card.card_values`), for a model fitted in a
    test."""
    from vaswani_mt.hub.card import search_summary

    config = model.config
    return {
        "source_lang": "en",
        "target_lang": "de",
        "license": "apache-2.0",
        "dataset_id": "tests/six-sentences",
        "dataset_name": "six test sentences",
        "dataset_note": "the pairs of tests/conftest.py",
        "examples": list(examples),
        "model_name": "vaswani-mt-tiny-en-de",
        "architecture": f"N = {config.num_encoder_layers}+{config.num_decoder_layers}, d_model = {config.d_model}",
        "vocab_size": len(tokenizer),
        "parameters": f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M",
        "preset": "tiny",
        "initialisation": "Xavier-uniform linear layers, N(0, d_model^-0.5) embeddings (tensor2tensor's)",
        "train_pairs": len(SENTENCES),
        "lr_scale": 1.0,
        "warmup": 4,
        "label_smoothing": config.label_smoothing,
        "dropout": config.dropout,
        "max_tokens": 256,
        "steps": 40,
        "train_minutes": 0.01,
        "hardware": "CPU",
        "precision": "float32",
        "weights_note": "the final weights",
        "test_pairs": len(SENTENCES),
        "bleu": round(score["score"], 2),
        "chrf": round(score["chrf"], 2),
        "signature": score["signature"],
        "compound_split_bleu": round(score["compound_split_bleu"], 2) if "compound_split_bleu" in score else "n/a",
        "compound_split_signature": score.get("compound_split_signature", "not evaluated"),
        "search": search_summary(model.generation_config),
        "command": "pytest tests/",
        "limitations": "A test model: it knows six sentences.",
        "repo_id": "USER/vaswani-mt-tiny-en-de",
    }


@pytest.fixture(scope="session")
def fitted_folder(tmp_path_factory, tokenizer):
    """A saved, fitted tiny model with its tokenizer and a model card rendered from a real evaluation (what
    scripts/train.py leaves in its output folder)."""
    from vaswani_mt.evaluation.metrics import evaluate_bleu
    from vaswani_mt.hub.card import render_model_card

    def build(folder: Path) -> None:
        model = fit_tiny_model(tokenizer)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        sources, references = [en for en, _ in SENTENCES], [de for _, de in SENTENCES]
        score = evaluate_bleu(model, tokenizer, sources, references, num_beams=1)
        (folder / "README.md").write_text(render_model_card(card_values(model, tokenizer, score, sources[:2])))

    return built_once(tmp_path_factory, "fitted", build)


@pytest.fixture(scope="module")
def fitted(fitted_folder):
    """The fitted tiny model and its tokenizer, loaded as the entry points load them (a copy of its own per module)."""
    from vaswani_mt.inference.loading import load_for_inference

    return load_for_inference(str(fitted_folder), device="cpu")


@pytest.fixture(scope="module")
def demo_model(fitted_folder):
    """The demo's own copy of the model, loaded as build_demo loads it (eager attention, for the heatmap)."""
    from vaswani_mt.inference.loading import load_for_inference

    return load_for_inference(str(fitted_folder), device="cpu", attn_implementation="eager")


# Text that breaks careless handling (tests/inference/test_hostile_input.py states the policy it is held to).
LONG_LINE = ("The girl ate an apple. " * 4348 + "x")[:100_000]  # 100,000 characters, about 26,000 tokens
HOSTILE = [
    "",
    " ",
    "\t \u3000\u2003",  # tab, ideographic and em spaces: blank
    "\x00",
    "The\x00girl\x00",
    "\x1b[31mred\x1b[0m \x07\x08\x7f",  # terminal escapes, bell, backspace, DEL
    "\u202eThe girl ate an apple.\u202c",  # right-to-left override
    "שלום עולם",
    "مرحبا بالعالم\u200f",  # Arabic and a right-to-left mark
    "👩\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈",  # emoji joined by zero-width joiners
    "e\u0301\u0301\u0301\u0301 Z\u0334\u0327\u031b\u0347a\u0337",  # stacked combining marks
    "\ud800",  # a lone high surrogate
    "a\udfffb\ud800",  # lone low and high surrogates inside text
    "\ud83d\ude00",  # a surrogate pair: 😀 as UTF-16 code units
    "\ufeffThe girl ate an apple.",  # a byte-order mark
    "one\u2028two\u2029three\x85four\x0cfive\x1csix\rseven",  # line breaks other than \n
    "\ufffd\U0010ffff\ue000",  # the replacement character, a noncharacter, private use
    LONG_LINE,
]
# A quick search for the fitted model: greedy, a few tokens.
FAST = {"num_beams": 1, "max_new_tokens": 12}


class PaddingOnlyTokenizer:
    """What DataCollatorForSeq2Seq needs of a tokenizer: right padding with id 1 (the workers' token-id data)."""

    pad_token_id = 1
    padding_side = "right"

    def pad(self, features, return_tensors=None, **kwargs):
        width = max(len(f["input_ids"]) for f in features)
        return {
            "input_ids": torch.tensor([f["input_ids"] + [1] * (width - len(f["input_ids"])) for f in features]),
            "attention_mask": torch.tensor(
                [[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in features]
            ),
        }


def write_jsonl(path: Path, count: int = 240) -> Path:
    """`count` English-German pairs of 3 to 7 words from a 15-word vocabulary, as a jsonl corpus for training runs."""
    words = "the a house cat dog small big red green runs sleeps eats sees quickly today".split()
    german = "der die das Haus Katze Hund klein groß rot grün läuft schläft isst sieht schnell heute".split()
    rows = []
    for i in range(count):
        idx = [(i * 7 + k * 3) % len(words) for k in range(3 + i % 5)]
        en = " ".join(words[j] for j in idx).capitalize() + "."
        de = " ".join(german[j] for j in idx).capitalize() + "."
        rows.append(json.dumps({"translation": {"en": en, "de": de}}, ensure_ascii=False))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def train_command(data: Path, output: Path, *extra: str) -> list[str]:
    """`python scripts/train.py ...` for the tiny model on `data`: a checkpoint every 2 steps, one log row a step."""
    return [
        sys.executable, str(ROOT / "scripts" / "train.py"), "--dataset", str(data), "--output_dir", str(output),
        "--preset", "tiny", "--vocab_size", "300", "--max_tokens_per_batch", "256", "--warmup_steps", "4",
        "--logging_steps", "1", "--save_steps", "2", "--save_total_limit", "10", "--report_to", "none",
        "--dropout", "0.0", "--seed", "3", "--test_bleu", "false", "--disable_tqdm", "true", *extra,
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Training runs that several files read (shared and read-only: copy a folder before changing it)

REFERENCE_STEPS = 10  # about 6 steps an epoch: the runs cross an epoch boundary, where the sampler reshuffles
# unbuffered: tests/training/test_faults.py reads the log live
REFERENCE_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


def reference_command(corpus: Path, output: Path) -> list[str]:
    """The reference run's command: REFERENCE_STEPS steps with dropout on, so that the RNG state matters."""
    return train_command(corpus, output, "--max_steps", str(REFERENCE_STEPS), "--dropout", "0.1")


def checkpoint_step(checkpoint: Path | None) -> int:
    return int(checkpoint.name.split("-")[1]) if checkpoint else 0


def _step_rows(output: Path) -> dict[int, dict]:
    rows = json.loads((output / "trainer_state.json").read_text())["log_history"]
    return {row["step"]: row for row in rows if "loss" in row}


def assert_same_training(run: Path, reference: Path, steps: int = REFERENCE_STEPS) -> None:
    """Bit for bit the same weights at every checkpoint the two runs share, and the same loss and learning rate at
    every step; the trained minutes and seconds only grow across the resumes."""
    from safetensors.torch import load_file
    from transformers import TrainerState

    from vaswani_mt.training.callbacks import trained_seconds
    from vaswani_mt.training.checkpoints import list_checkpoints

    shared = sorted({c.name for c in list_checkpoints(reference)} & {c.name for c in list_checkpoints(run)})
    assert f"checkpoint-{steps}" in shared
    for name in shared:
        ours, theirs = load_file(run / name / "model.safetensors"), load_file(reference / name / "model.safetensors")
        assert ours.keys() == theirs.keys()
        for key in theirs:
            assert torch.equal(ours[key], theirs[key]), f"{name}: {key} differs from the uninterrupted run's"
    ours, theirs = _step_rows(run), _step_rows(reference)
    assert sorted(ours) == sorted(theirs) == list(range(1, steps + 1))
    for step, row in theirs.items():
        assert (ours[step]["loss"], ours[step]["learning_rate"]) == (row["loss"], row["learning_rate"]), step
    minutes = [ours[step]["train_minutes"] for step in sorted(ours)]
    assert minutes == sorted(minutes) and minutes[0] > 0
    seconds = [trained_seconds(TrainerState.load_from_json(str(c / "trainer_state.json"))) for c in
               list_checkpoints(run)]  # fmt: skip
    assert seconds == sorted(seconds) and seconds[0] > 0


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """The reference run's training pairs (`write_jsonl`)."""
    return built_once(tmp_path_factory, "corpus", lambda folder: write_jsonl(folder / "pairs.jsonl")) / "pairs.jsonl"


@pytest.fixture(scope="session")
def reference(tmp_path_factory, corpus) -> Path:
    """An uninterrupted run of `reference_command`: complete checkpoints every 2 steps (what tests/training's fault
    tests resume to, and what tests/training/test_checkpoints.py damages copies of)."""

    def build(folder: Path) -> None:
        result = subprocess.run(reference_command(corpus, folder / "run"), env=REFERENCE_ENV, capture_output=True,
                                text=True)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]

    output = built_once(tmp_path_factory, "reference", build) / "run"
    assert json.loads((output / "config.json").read_text())["dropout"] == 0.1
    return output


def ddp_command(corpus: Path, output: Path) -> list[str]:
    """The reference run's command on 2 CPU processes of one machine."""
    return accelerate_launch(*reference_command(corpus, output)[1:], "--use_cpu")


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory, corpus) -> Path:
    """An uninterrupted two-rank run of `ddp_command`: what every interrupted two-rank run, on one machine or two,
    must end with. After training it scores the test split too, as the main job does (which changes no checkpoint
    and no logged step): tests/training/test_job.py reads its stdout, `stdout.txt` beside the run's folder."""
    from vaswani_mt.training.checkpoints import is_complete, list_checkpoints

    def build(folder: Path) -> None:
        command = [*ddp_command(corpus, folder / "run"), "--test_bleu", "true", "--max_eval_samples", "12"]
        result = subprocess.run(command, env=REFERENCE_ENV, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        (folder / "stdout.txt").write_text(result.stdout)

    output = built_once(tmp_path_factory, "ddp-reference", build) / "run"
    assert all(is_complete(c, processes=2) for c in list_checkpoints(output)), "every rank's RNG state is there"
    return output


@dataclass
class Launch:
    """What a launch (`accelerate launch`) did: its status, how long it took to end, what it printed, its workers."""

    returncode: int
    seconds: float  # from the fault (or the last step logged, when the fault comes from inside) to the exit
    stderr: str
    workers: dict[int, int] = field(default_factory=dict)  # rank: pid
    left: list[int] = field(default_factory=list)  # workers still alive after the launcher's exit

    def lines(self, start: str) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith(start)]


def launch_workers(launcher: subprocess.Popen) -> dict[int, int]:
    """The launcher's worker processes by rank (torchrun starts each in a session of its own)."""
    found = {}
    try:
        children = psutil.Process(launcher.pid).children(recursive=True)
    except psutil.Error:  # the launcher has ended
        return found
    for child in children:
        try:
            rank = child.environ().get("RANK")
        except psutil.Error:
            continue
        if rank is not None:
            found[int(rank)] = child.pid
    return found


def kill_launch(launcher: subprocess.Popen) -> None:
    """SIGKILL to a launcher and its workers (a lost machine; a hung test's end)."""
    for pid in [*launch_workers(launcher).values(), launcher.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


@pytest.fixture(scope="session")
def job_run(tmp_path_factory) -> SimpleNamespace:
    """The main job, small, as `scripts/train.py` runs it: 8 steps on 400 pairs, BLEU on 12 validation pairs at steps
    4 and 8, the last 3 checkpoints averaged, the test split scored (a saved length penalty of 0.9), the Hub folder
    written. `data` (the jsonl corpus), `output` (the run's folder) and `stdout`."""

    def build(root: Path) -> None:
        data = write_jsonl(root / "pairs.jsonl", count=400)
        command = train_command(data, root / "run", "--max_steps", "8", "--average_last", "3", "--test_bleu", "true")
        command += ["--eval_bleu", "true", "--eval_strategy", "steps", "--eval_steps", "4", "--max_eval_samples", "12"]
        command += ["--length_penalty", "0.9"]  # saved in generation_config.json: the test BLEU and searches use it
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr[-3000:]
        (root / "stdout.txt").write_text(result.stdout)

    root = built_once(tmp_path_factory, "job", build)
    return SimpleNamespace(data=root / "pairs.jsonl", output=root / "run", stdout=(root / "stdout.txt").read_text())


# ---------------------------------------------------------------------------------------------------------------
# OPUS-MT checkpoints as the Hub has them (MarianMTModel folders), made here: tests/export/test_import.py and the
# tests that run every feature on an imported model.

# opus-mt-en-de's config.json, but for the vocabulary (two small SentencePiece models trained on the built-in corpus).
OPUS_MT_EN_DE = dict(
    d_model=512, encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
    encoder_layers=6, decoder_layers=6, activation_function="swish", scale_embedding=True,
    share_encoder_decoder_embeddings=True, tie_word_embeddings=True, static_position_embeddings=True,
    normalize_before=False, normalize_embedding=False, add_final_layer_norm=False, max_position_embeddings=512,
    dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, bos_token_id=0, eos_token_id=0, forced_eos_token_id=0,
)  # fmt: skip
OPUS_MT_TINY = dict(d_model=32, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                    decoder_ffn_dim=64, encoder_layers=2, decoder_layers=2)  # fmt: skip


def marian_tokenizer_files(folder: Path, pairs: list[tuple[str, str]], vocab_size: int = 600) -> None:
    """source.spm, target.spm (unigram SentencePiece models, as OPUS-MT's, trained on each side of `pairs`) and one
    vocab.json in Marian's order: `</s>` 0, `<unk>` 1, the pieces of both models, `<pad>` last."""
    import sentencepiece

    folder.mkdir(parents=True, exist_ok=True)
    pieces = []
    for side, name in ((0, "source"), (1, "target")):
        text = folder / f"{name}.txt"
        text.write_text("\n".join(pair[side] for pair in pairs) + "\n", encoding="utf-8")
        sentencepiece.SentencePieceTrainer.train(
            input=str(text), model_prefix=str(folder / name), vocab_size=vocab_size, model_type="unigram",
            character_coverage=1.0, bos_id=-1, eos_id=2, unk_id=1, pad_id=-1, minloglevel=2, num_threads=1,
        )  # fmt: skip
        (folder / f"{name}.model").rename(folder / f"{name}.spm")
        text.unlink()
        (folder / f"{name}.vocab").unlink()
        processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / f"{name}.spm"))
        pieces += [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")


def make_marian_folder(folder: Path, tokenizer_folder: Path, seed: int = 0, **config) -> Path:
    """A MarianMTModel folder as OPUS-MT publishes them (`OPUS_MT_EN_DE` unless `config` says otherwise), with
    `tokenizer_folder`'s MarianTokenizer and random weights whose biases, logits bias and LayerNorm weights are all
    nonzero (a bias the import missed could not pass), positions the sinusoids."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    tokenizer = MarianTokenizer(str(tokenizer_folder / "source.spm"), str(tokenizer_folder / "target.spm"),
                                str(tokenizer_folder / "vocab.json"), source_lang="en", target_lang="de")  # fmt: skip
    pad = tokenizer.pad_token_id
    values = {**OPUS_MT_EN_DE, **config}
    marian_config = MarianConfig(vocab_size=len(tokenizer), decoder_vocab_size=len(tokenizer), pad_token_id=pad,
                                 decoder_start_token_id=pad, **values)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MarianMTModel(marian_config).eval()
        with torch.no_grad():
            for name, tensor in model.named_parameters():
                if name.endswith(".bias"):
                    tensor.normal_(0.0, 0.1)
                elif "layer_norm" in name:
                    tensor.normal_(1.0, 0.1)
            model.final_logits_bias.normal_(0.0, 0.2)
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.num_beams = 4
    model.generation_config.max_length = 512
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def opus_mt(tmp_path_factory):
    """MarianMTModel folders as OPUS-MT's: `swish` (opus-mt-en-de's shape), `relu` (the same with ReLU), `tiny`
    (swish, d_model 32, 2 + 2 layers) and `tokenizer` (the MarianTokenizer files alone); `test` holds the built-in
    corpus's test split as (en, de) pairs."""
    from vaswani_mt.data.corpus import load_ding

    corpus = load_ding("en", "de")
    pairs = lambda split: [(row["en"], row["de"]) for row in corpus[split]["translation"]]  # noqa: E731

    def build(root: Path) -> None:
        marian_tokenizer_files(root / "tokenizer", pairs("train"))
        make_marian_folder(root / "swish", root / "tokenizer")
        make_marian_folder(root / "relu", root / "tokenizer", seed=1, activation_function="relu")
        make_marian_folder(root / "tiny", root / "tokenizer", seed=2, **OPUS_MT_TINY)

    root = built_once(tmp_path_factory, "opus_mt", build)
    return SimpleNamespace(**{name: root / name for name in ("swish", "relu", "tiny", "tokenizer")}, test=pairs("test"))


# ---------------------------------------------------------------------------------------------------------------
# Folders that are not servable vaswani_mt models (tests/inference: test_bad_models.py, test_loading.py)

# Bad folder -> what its message must say, besides the folder's name.
BAD_FOLDERS = {
    "missing": "no such folder",
    "empty": "it has no config.json",
    "garbage_config": "config.json is not valid JSON",
    "impossible_config": "config.json: dropout must be a number in [0, 1), got 1.5",
    "config_disagrees_with_weights": "config.json does not match the weights",
    "marian": "holds a 'marian' model, not a vaswani_mt one: import the MarianMTModel exactly with vaswani-mt-import",
    "bart": "holds a 'bart' model, not a vaswani_mt one",
    "pickle_only": "has no model.safetensors, only pytorch_model.bin",
    "truncated_weights": "model.safetensors is not a complete safetensors file",
    "unreachable_hub_id": "is not a folder here, and downloading it from the Hub failed",
}
HUB_ID = "nobody-here/no-such-vaswani-model"  # HF_HUB_OFFLINE=1 in these tests: never fetched


def edit_config(folder: Path, **changes) -> None:
    values = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**values, **changes}))


def _tiny_seq2seq(kind: str):
    """A tiny model of another architecture, as transformers saves it."""
    from transformers import BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel

    sizes = dict(vocab_size=200, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                 max_position_embeddings=64)  # fmt: skip
    if kind == "marian":
        return MarianMTModel(MarianConfig(**sizes, decoder_start_token_id=0, pad_token_id=1))
    return BartForConditionalGeneration(BartConfig(**sizes))


@pytest.fixture(scope="session")
def bad(tmp_path_factory, tokenizer):
    """The bad folders (name -> path or Hub id), built once from one saved tiny model, and the files to translate.
    Read-only: a test that changes a folder copies it first."""
    root = tmp_path_factory.mktemp("bad-models")
    good = root / "good"
    model = make_model()
    model.save_pretrained(good)
    tokenizer.save_pretrained(good)

    def variant(name: str) -> Path:
        return Path(shutil.copytree(good, root / name))

    folders = {"missing": root / "missing", "unreachable_hub_id": HUB_ID, "empty": root / "empty"}
    folders["empty"].mkdir()
    folders["garbage_config"] = variant("garbage_config")
    (folders["garbage_config"] / "config.json").write_text("{'d_model': 32,")
    folders["impossible_config"] = variant("impossible_config")
    edit_config(folders["impossible_config"], dropout=1.5)
    folders["config_disagrees_with_weights"] = variant("config_disagrees")
    edit_config(folders["config_disagrees_with_weights"], d_ff=128)
    for kind in ("marian", "bart"):
        folders[kind] = root / kind
        _tiny_seq2seq(kind).save_pretrained(folders[kind])
        tokenizer.save_pretrained(folders[kind])
    folders["pickle_only"] = variant("pickle_only")
    (folders["pickle_only"] / "model.safetensors").unlink()
    torch.save(model.state_dict(), folders["pickle_only"] / "pytorch_model.bin")
    folders["truncated_weights"] = variant("truncated_weights")
    weights = folders["truncated_weights"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert set(folders) == set(BAD_FOLDERS)
    (root / "source.en").write_text("\n".join(en for en, _ in SENTENCES[:2]) + "\n")
    (root / "reference.de").write_text("\n".join(de for _, de in SENTENCES[:2]) + "\n")
    return {"root": root, "good": good, **{name: str(path) for name, path in folders.items()}}


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)


def assert_one_clear_line(message: str, model: str, expected: str) -> None:
    assert message.startswith("error: ") and "\n" not in message.strip(), message
    assert model in message and expected in message, message


def stop_at_batch(monkeypatch, backend_class, batch: int) -> list:
    """The backend's `search` raises TranslationInterrupted (as a signal inside `interruptible` does) when batch
    number `batch` (from 1) starts; returns the list of the batches searched."""
    search, calls = backend_class.search, []

    def stopping(self, rows, options):
        calls.append(len(rows.ids))
        if len(calls) == batch:
            from vaswani_mt.system.signals import TranslationInterrupted

            raise TranslationInterrupted(signal.SIGINT)
        return search(self, rows, options)

    monkeypatch.setattr(backend_class, "search", stopping)
    return calls
