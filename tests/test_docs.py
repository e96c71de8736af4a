"""The pages a newcomer follows, README.md and docs/*.md: every `--flag` their shell blocks give a script of ours is
one of that script's options (its `--help`), so a renamed or dropped option fails here, not in a reader's shell."""

import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

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


def test_the_flag_check_finds_the_options_after_the_script_only():
    block = ("accelerate launch --multi_gpu --num_processes 2 scripts/train.py configs/x.yaml --use_cpu \\\n"
             "  --output_dir out  # --not_this\necho x | python scripts/translate.py --model=m --no_such_option\n"
             "sbatch --nodes 2 scripts/slurm/train_multinode.sbatch C.yaml --max_steps 5")  # fmt: skip
    assert script_flags(block.replace("\\\n", " ")) == [
        ("scripts/train.py", "--use_cpu"), ("scripts/train.py", "--output_dir"), ("scripts/translate.py", "--model"),
        ("scripts/translate.py", "--no_such_option"), ("scripts/train.py", "--max_steps"),
    ]  # fmt: skip
