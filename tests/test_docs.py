"""The pages a newcomer follows, README.md and docs/*.md: every `--flag` their shell blocks give a script of ours is
one of that script's options (its `--help`), so a renamed or dropped option fails here, not in a reader's shell; and
every Python block of docs/*.md runs, as written, through Sybil (README.md's: test_readme.py), and so does every
shell block whose commands are our translating, scoring, averaging and export scripts, in this process, in a folder
where `outputs/ding-cpu` is a tiny model whose vocabulary is learned from the pages themselves (every word they
translate is in it; the outputs are not the pages' examples, which the pages mark as such). A block that trains,
installs, needs the Hub, a GPU, several processes or machines, Slurm or a web server is skipped, saying which.

Sybil: a maintained library made for this (documentation examples as tests, Markdown code blocks included) that
runs a parsed page's examples from a test, as here; pytest-examples checks output comments that here are examples
of their form, and mktestdocs runs blocks without a per-block id or skip."""

import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest
from conftest import built_once

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The Slurm scripts pass their arguments on to these.
SLURM = {"train_multinode.sbatch": "scripts/train.py", "translate_multinode.sbatch": "scripts/translate.py"}


def shell_blocks(page: Path) -> list[tuple[int, str]]:
    """(line, text) of each ```bash block of `page`, continuation lines joined."""
    text = page.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 2, m.group(1).replace("\\\n", " "))
            for m in re.finditer(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S)]  # fmt: skip


def script_flags(block: str) -> list[tuple[str, str]]:
    """(script, --flag) for each option a command line of `block` gives one of our scripts (after the script's
    name: a launcher's own options come before it)."""
    found = []
    for line in block.splitlines():
        for command in re.split(r"\|\||&&|\||;", line):
            try:
                words = shlex.split(command, comments=True)
            except ValueError:  # an unbalanced quote in an example: not a command line to check
                continue
            script = None
            for word in words:
                name = Path(word).name
                if word.endswith(".py") and (word.startswith("scripts/") or word == "app.py"):
                    script = word
                elif name in SLURM:
                    script = SLURM[name]
                elif script and word.startswith("--"):
                    found.append((script, word.split("=", 1)[0]))
    return found


def _help(script: str) -> str:
    """The `--help` text of a script of ours (the command its file calls)."""
    module = re.search(r"from (vaswani_mt\.cli\.\w+) import main", (ROOT / script).read_text()).group(1)
    with contextlib.redirect_stdout(io.StringIO()) as text, pytest.raises(SystemExit):
        importlib.import_module(module).main(["--help"])
    return text.getvalue()


def test_every_flag_the_pages_give_a_script_is_one_of_its_options():
    named = {(page.name, line, script, flag) for page in PAGES for line, block in shell_blocks(page)
             for script, flag in script_flags(block)}  # fmt: skip
    scripts = sorted({script for _, _, script, _ in named})
    assert {"scripts/train.py", "scripts/translate.py", "scripts/evaluate_model.py"} <= set(scripts), scripts
    helps = {script: _help(script) for script in scripts}
    unknown = sorted(f"{page}:{line}: {script} {flag}" for page, line, script, flag in named
                     if not re.search(rf"{re.escape(flag)}\b(?!-)", helps[script]))  # fmt: skip
    assert unknown == []


def _section(title: str) -> str:
    """README.md's section `## title` (or `### title`), up to the next heading."""
    text = PAGES[0].read_text(encoding="utf-8")
    return re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#)", text, re.S | re.M).group(1)


def _span_flags(text: str) -> list[str]:
    """The --flags of `text`'s code spans, but a span that names another command's option as an attribute
    (`an --format ctranslate2 export`)."""
    return [flag for before, span in re.findall(r"(\S*\s?)`([^`]+)`", text) if before.strip() not in ("a", "an")
            for flag in re.findall(r"--\w+", span)]  # fmt: skip


def test_the_readmes_option_table_and_decoding_list_name_options_of_their_scripts():
    """The Train table's options are train.py's; each Decoding options item's are translate.py's, and
    evaluate_model.py's unless the item names translate.py alone."""
    helps = {script: _help(f"scripts/{script}") for script in ("train.py", "translate.py", "evaluate_model.py")}
    named = [("train.py", flag) for row in _section("Train").splitlines() if row.startswith("| `--")
             for flag in _span_flags(row.split(" | ")[0])]  # fmt: skip
    for item in (line for line in _section("Decoding options").splitlines() if line.startswith("- ")):
        scripts = ["translate.py"] if "`translate.py`" in item else ["translate.py", "evaluate_model.py"]
        named += [(script, flag) for script in scripts for flag in _span_flags(item)]
    assert len(named) > 30 and ("translate.py", "--buffer_size") in named
    assert [(script, flag) for script, flag in named if not re.search(rf"{flag}\b(?!-)", helps[script])] == []


def test_the_flag_check_finds_the_options_after_the_script_only():
    block = ("accelerate launch --multi_gpu --num_processes 2 scripts/train.py configs/x.yaml --use_cpu \\\n"
             "  --output_dir out  # --not_this\necho x | python scripts/translate.py --model=m --no_such_option\n"
             "sbatch --nodes 2 scripts/slurm/train_multinode.sbatch C.yaml --max_steps 5")  # fmt: skip
    assert script_flags(block.replace("\\\n", " ")) == [
        ("scripts/train.py", "--use_cpu"), ("scripts/train.py", "--output_dir"), ("scripts/translate.py", "--model"),
        ("scripts/translate.py", "--no_such_option"), ("scripts/train.py", "--max_steps"),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# The Python blocks of docs/*.md, run

HUB_ID = re.compile(r"""["'](?!outputs/)[A-Za-z0-9][\w.-]*/[\w.-]+["']""")  # "org/name", not a folder of outputs/


def _python_blocks() -> list:
    from sybil import Sybil
    from sybil.parsers.markdown import PythonCodeBlockParser

    parse = Sybil([PythonCodeBlockParser()]).parse
    blocks = []
    for page in PAGES[1:]:  # README.md's block: test_readme.py
        for example in parse(page).examples():
            code = example.region.parsed
            marks = [pytest.mark.skip(reason="needs the Hub")] if HUB_ID.search(str(code)) else []
            blocks.append(pytest.param(example, id=f"{page.name}:{example.line}", marks=marks))
    return blocks


@pytest.fixture(scope="session")
def docs_folder(tmp_path_factory) -> Path:
    """A folder to run the blocks in: `outputs/ding-cpu`, a tiny untrained model whose BPE is learned from the
    pages' text, its CTranslate2 export `outputs/ding-cpu-ct2` (where ctranslate2 is installed), and `big.en`."""

    def build(folder: Path) -> None:
        from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
        from vaswani_mt.data.tokenization import config_token_ids, train_tokenizer

        texts = [line for page in PAGES for line in page.read_text(encoding="utf-8").splitlines() if line.strip()]
        tokenizer = train_tokenizer(texts, vocab_size=2000, min_frequency=1)
        model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", **config_token_ids(tokenizer)))
        model.generation_config.max_len_b = 8  # short outputs from untrained weights
        model.save_pretrained(folder / "outputs" / "ding-cpu")
        tokenizer.save_pretrained(folder / "outputs" / "ding-cpu")
        (folder / "big.en").write_text("The house is small.\nHow are you?\n", encoding="utf-8")
        # the user's own files the pages name
        (folder / "test.en").write_text("The house is small.\nHow are you?\n", encoding="utf-8")
        (folder / "test.de").write_text("Das Haus ist klein.\nWie geht es dir?\n", encoding="utf-8")
        (folder / "test.tsv").write_text("The house is small.\tHaus\nHow are you?\n", encoding="utf-8")
        for step in range(1, 6):  # what the main job leaves for average_checkpoints.py
            checkpoint = folder / "outputs" / "ding-cpu" / f"checkpoint-{step}"
            model.save_pretrained(checkpoint)
            (checkpoint / "trainer_state.json").write_text("{}")
        with contextlib.suppress(ImportError):
            import ctranslate2  # noqa: F401

            from vaswani_mt.export.marian import export_model

            export_model(folder / "outputs" / "ding-cpu", "ctranslate2", folder / "outputs" / "ding-cpu-ct2")

    return built_once(tmp_path_factory, "docs", build)


@pytest.mark.parametrize("example", _python_blocks())
def test_every_python_block_of_the_docs_runs_as_written(example, docs_folder, monkeypatch):
    monkeypatch.chdir(docs_folder)
    if "ding-cpu-ct2" in str(example.region.parsed) and not (docs_folder / "outputs" / "ding-cpu-ct2").is_dir():
        pytest.skip("needs ctranslate2 (pip install 'vaswani-mt[ctranslate2]')")
    example.namespace.clear()  # each block whole by itself
    example.evaluate()


# Why a shell block does not run here, by what it holds (the first that applies).
NOT_RUN = [
    (re.compile(r"\bpip install|python3 -m venv"), "installs packages"),
    (re.compile(r"\bsbatch\b"), "needs Slurm"),
    (re.compile(r"--num_machines|--machine_rank"), "needs several machines"),
    (
        re.compile(r"accelerate launch|torchrun"),
        "several processes (tests/training/test_job.py, tests/cli/test_sharded_translation.py run them small)",
    ),
    (re.compile(r"scripts/train\.py"), "trains (tests/training/test_job.py runs the main job small)"),
    (re.compile(r"push_to_hub\.py(?!.*--dry_run)"), "needs the Hub"),
    (
        re.compile(r"import_model\.py --model \w[\w.-]*/[\w.-]+"),
        "needs the Hub (tests/export/test_import.py imports folders made here)",
    ),
    (re.compile(r"\bapp\.py\b"), "a web server (tests/app/test_demo.py)"),
]


def _shell_blocks() -> list:
    blocks = []
    for page in PAGES:
        for line, block in shell_blocks(page):
            reason = next((why for pattern, why in NOT_RUN if pattern.search(block)), None)
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            blocks.append(pytest.param(block, id=f"{page.name}:{line}", marks=marks))
    return blocks


def _stdin(words: list[str]) -> bytes:
    """What `echo ...` or `printf ...` writes."""
    if words[0] == "echo":
        return (" ".join(words[1:]) + "\n").encode()
    return words[1].encode().decode("unicode_escape").encode("latin-1")  # printf's escapes; UTF-8 kept


@pytest.mark.parametrize("block", _shell_blocks())
def test_every_runnable_shell_block_of_the_pages_runs_as_written(block, docs_folder, monkeypatch, tmp_path):
    """Each command `[echo ... |] python scripts/X.py ...` of the block, its main() in this process, in the docs
    folder (a copy: a block may write outputs of its own), ends with status 0."""
    import shutil

    from conftest import run_main

    folder = Path(shutil.copytree(docs_folder, tmp_path / "docs"))
    monkeypatch.chdir(folder)
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        stdin = b""
        if "|" in words:
            at = words.index("|")
            stdin, words = _stdin(words[:at]), words[at + 1 :]
        assert words[0] == "python" and words[1].startswith("scripts/"), line
        if "--output" in words and "--overwrite" not in words:  # what the block writes, it writes afresh
            shutil.rmtree(folder / words[words.index("--output") + 1], ignore_errors=True)
        module = re.search(r"from (vaswani_mt\.cli\.\w+) import main", (ROOT / words[1]).read_text()).group(1)
        _, code = run_main(importlib.import_module(module), words[2:], monkeypatch, stdin)
        assert code in (None, 0), (line, code)
