"""The architecture, read from the source: subpackages by concern whose imports run only downward, the model package
exactly the Hub payload (torch, transformers, huggingface_hub and itself), no private names across packages, no
module past ~600 lines but the model, and an `import vaswani_mt` that loads no heavy optional library and changes
nothing process-wide beyond registering with the Auto classes."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vaswani_mt"

# Lower layers never import upper ones: model <- data <- inference <- evaluation <- export <- hub (inference reads
# words as data does: data.words); training sits on all of them (it scores and publishes the run), the demo app on
# inference, the commands (cli) on everything. A package may import those of lower rank only; two packages of one
# rank never import each other, so nothing but cli imports app (training's rank).
RANKS = {"model": 0, "system": 0, "data": 1, "inference": 2, "evaluation": 3, "export": 4, "hub": 5, "training": 6,
         "app": 6, "cli": 7}  # fmt: skip
# Besides the standard library and relative siblings. huggingface_hub comes with every transformers 5, whose configs
# take `@strict` from it.
PAYLOAD_IMPORTS = {"torch", "transformers", "huggingface_hub", "__future__"}
MODEL_FILE_LIMIT, MODULE_LIMIT = 1000, 620


def _modules(package: Path = PACKAGE) -> list[Path]:
    return sorted(package.rglob("*.py"))


def _subpackage(path: Path, package: Path = PACKAGE) -> str | None:
    parts = path.relative_to(package).parts
    return parts[0] if len(parts) > 1 else None


_IMPORTING_CALLS = {"import_module", "__import__"}  # importlib.import_module("vaswani_mt.x"), __import__("...")


def _imports(path: Path, package: Path = PACKAGE) -> list[tuple[str, list[str], int]]:
    """(absolute module, imported names, line) of every import in `path`, relative ones resolved; also modules
    imported by a string (`importlib.import_module("vaswani_mt.x")`) and subpackages reached by attribute from an
    imported `vaswani_mt` (`import vaswani_mt` then `vaswani_mt.x.f()`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    dotted = ".".join(("vaswani_mt", *path.relative_to(package).parts[:-1]))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = dotted.split(".")[: len(dotted.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            found.append((module, [alias.name for alias in node.names], node.lineno))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if function in _IMPORTING_CALLS and isinstance(node.args[0].value, str):
                found.append((node.args[0].value, [], node.lineno))
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "vaswani_mt"
              and node.attr in RANKS):  # fmt: skip
            found.append((f"vaswani_mt.{node.attr}", [], node.lineno))
    return found


def _targets(module: str, names: list[str]) -> set[str]:
    """The subpackages an import of `module` (or of `names` from it) reaches: none outside vaswani_mt's packages,
    several for `from vaswani_mt import training, model`."""
    parts = module.split(".")
    if parts[0] != "vaswani_mt":
        return set()
    if len(parts) > 1:
        return {parts[1]}
    return {name for name in names if name in RANKS}


def _upward_imports(package: Path = PACKAGE) -> list[str]:
    upward = []
    for path in _modules(package):
        mine = _subpackage(path, package)
        for module, names, line in _imports(path, package):
            for target in _targets(module, names) - {mine}:
                rank = RANKS["model"] if mine is None else RANKS[mine]  # vaswani_mt/__init__.py: the model only
                if (mine is None and target != "model") or (mine is not None and RANKS[target] >= rank):
                    upward.append(f"{path.relative_to(package.parent)}:{line} imports {module} ({mine} -> {target})")
    return upward


def _private_imports(package: Path = PACKAGE) -> list[str]:
    private = []
    for path in _modules(package):
        for module, names, line in _imports(path, package):
            if _targets(module, names) - {_subpackage(path, package)}:
                private += [
                    f"{path.relative_to(package.parent)}:{line} {module}.{n}" for n in names if n.startswith("_")
                ]
    return private


def _payload_violations(package: Path = PACKAGE) -> list[str]:
    """Imports of the payload's files other than PAYLOAD_IMPORTS, the standard library and relative siblings."""
    bad = []
    for path in (package / "model").glob("*_vaswani.py"):
        lines = path.read_text(encoding="utf-8").splitlines()
        for module, _, line in _imports(path, package):
            if module.startswith("vaswani_mt.model."):  # a sibling: imported relatively, so that remote code finds it
                if not ((package / "model" / f"{module.split('.')[2]}.py").is_file() and "from ." in lines[line - 1]):
                    bad.append(f"{path.name}:{line}: {module} (siblings are imported relatively)")
            elif module.split(".")[0] not in PAYLOAD_IMPORTS | set(sys.stdlib_module_names) or module == "vaswani_mt":
                bad.append(f"{path.name}:{line} imports {module}")
    return bad


def test_every_module_lives_in_a_subpackage_of_known_rank():
    loose = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"modules outside a subpackage: {loose}"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(RANKS)


def test_imports_run_only_downward():
    assert _upward_imports() == []


def test_no_private_name_is_imported_across_packages():
    assert _private_imports() == []


def test_the_model_package_is_the_hub_payload_and_imports_only_torch_transformers_and_itself():
    assert _payload_violations() == []


PLANTED = {
    "plain": ("data/corpus.py", "from vaswani_mt.training.job import run_training\n", _upward_imports),
    "relative, several names": ("data/corpus.py", "from .. import model, training\n", _upward_imports),
    "module, then an attribute": ("data/corpus.py", "import vaswani_mt\nvaswani_mt.training.job\n", _upward_imports),
    "importlib string": ("inference/ensemble.py", "import importlib\nimportlib.import_module('vaswani_mt.hub.card')\n",
                         _upward_imports),
    "app imported below cli": ("training/job.py", "from vaswani_mt.app.demo import launch\n", _upward_imports),
    "private name": ("training/job.py", "from vaswani_mt.data.corpus import _clean\n", _private_imports),
    "payload imports the package": ("model/pipeline_vaswani.py", "import vaswani_mt.data\n", _payload_violations),
    "payload imports a sibling absolutely": ("model/pipeline_vaswani.py",
                                             "from vaswani_mt.model.constraints_vaswani import ORDERS\n",
                                             _payload_violations),
    "payload imports numpy": ("model/fast_paths_vaswani.py", "import numpy\n", _payload_violations),
}  # fmt: skip


@pytest.mark.parametrize(("module", "planted", "check"), PLANTED.values(), ids=PLANTED)
def test_each_rule_fires_on_a_planted_violation(tmp_path, module, planted, check):
    import shutil

    copy = tmp_path / "vaswani_mt"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert check(copy) == []  # the copy as it is passes
    with open(copy / module, "a", encoding="utf-8") as f:
        f.write(planted)
    assert len(check(copy)) >= 1


def test_no_module_but_the_model_is_longer_than_about_600_lines():
    long = {p.relative_to(ROOT).as_posix(): n for p in _modules() if (n := len(p.read_text().splitlines())) > 0}
    assert long.pop("vaswani_mt/model/modeling_vaswani.py") <= MODEL_FILE_LIMIT
    assert {name: n for name, n in long.items() if n > MODULE_LIMIT} == {}


def test_every_command_is_a_console_entry_point_and_a_thin_script():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    commands = project["scripts"]
    cli = {p.stem for p in (PACKAGE / "cli").glob("*.py") if p.stem != "__init__"}
    assert {target.split(":")[0].rsplit(".", 1)[1] for target in commands.values()} == cli
    for name, target in commands.items():
        module, function = target.split(":")
        # cli/import_.py is `vaswani-mt-import`: PEP 8's trailing underscore for a name that is a keyword
        assert name == f"vaswani-mt-{module.rsplit('.', 1)[1].rstrip('_')}" and function == "main"
    for script in [*(ROOT / "scripts").glob("*.py"), ROOT / "app.py"]:
        tree = ast.parse(script.read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        imports = [m for m, _, _ in _imports_of(tree)]
        assert not functions and len(imports) == 1 and imports[0].startswith("vaswani_mt.cli."), script.name


def _imports_of(tree: ast.Module) -> list[tuple[str, list[str], int]]:
    return [(n.module, [a.name for a in n.names], n.lineno) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]


# Run in a fresh interpreter: what `import vaswani_mt` loads, and what importing every module changes.
_PROBE = r"""
import faulthandler, json, logging, os, signal, sys, warnings
import torch, transformers
from transformers import AutoConfig
what = sys.argv[1]
if what == "light":
    import vaswani_mt, vaswani_mt.model, vaswani_mt.system, vaswani_mt.training.hardware
    heavy = [m for m in ("datasets", "pyarrow", "gradio", "matplotlib", "evaluate", "sacrebleu") if m in sys.modules]
    print(json.dumps({"heavy": heavy, "registered": type(AutoConfig.for_model("vaswani_mt")).__name__}))
    raise SystemExit
import datasets, evaluate, accelerate, sacrebleu, tokenizers, yaml, matplotlib, gradio, safetensors  # their effects
def state():
    root = logging.getLogger()
    return {
        "threads": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
        "dtype": str(torch.get_default_dtype()), "grad": torch.is_grad_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(), "environ": sorted(os.environ.items()),
        "root_logging": [root.level, len(root.handlers)], "verbosity": transformers.logging.get_verbosity(),
        "warnings": len(warnings.filters),
        "signals": [str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)],
        "cwd": os.getcwd(), "recursion": sys.getrecursionlimit(), "seed": torch.initial_seed(),
    }
before = state()
import pkgutil, importlib, vaswani_mt
for info in pkgutil.walk_packages(vaswani_mt.__path__, "vaswani_mt."):
    importlib.import_module(info.name)
after = state()
changed = {k: [before[k], after[k]] for k in before if before[k] != after[k]}
if "environ" in changed:  # only what changed
    old, new = (dict(items) for items in changed["environ"])
    changed["environ"] = {k: [old.get(k), new.get(k)] for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
print(json.dumps(changed, default=str))
"""


def _probe(what: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, what], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_model_loads_no_data_demo_or_plotting_library():
    probe = _probe("light")
    assert probe == {"heavy": [], "registered": "VaswaniConfig"}


@pytest.mark.filterwarnings("ignore")
def test_importing_every_module_changes_nothing_process_wide():
    assert _probe("all") == {}


def test_the_console_commands_are_installed_and_run():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bin_dir = Path(sys.executable).parent
    missing = [name for name in project["scripts"] if not (bin_dir / name).is_file()]
    if missing == list(project["scripts"]):
        pytest.skip(f"the package is not installed with its commands in {bin_dir}")
    assert missing == []
    done = subprocess.run([bin_dir / "vaswani-mt-train", "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("usage: vaswani-mt-train") and "--lr_scale" in done.stdout


def test_every_repository_file_the_package_names_exists():
    """A docstring or message that names a test, a script, a benchmark, a doc or a config names one that is there."""
    root = Path(__file__).resolve().parents[1]
    named = re.compile(r"(?<![\w/])((?:tests|benchmarks|docs|scripts|configs)/[\w./-]*\w\.(?:py|md|sh|yaml|json))")
    missing = sorted(
        f"{path.relative_to(root)}: {name}"
        for path in (root / "vaswani_mt").rglob("*.py")
        for name in named.findall(path.read_text(encoding="utf-8"))
        if not (root / name).exists()
    )
    assert missing == []


# One name for one thing on every command: `--model` read, `--input` read, `--output` written. The former names stay
# as hidden aliases (`cli.old_name`) for one release. The training commands keep Seq2SeqTrainingArguments'
# `--output_dir`, the name every transformers user knows.
FORMER_NAMES = {"--output_dir": "--output", "--checkpoint_dir": "--model", "--source_file": "--input"}
TRAINING_COMMANDS = {"train.py", "table3.py"}


def test_the_commands_share_option_names_and_keep_former_ones_hidden():
    visible = []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        if path.name in TRAINING_COMMANDS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"):
                continue
            names = [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
            hidden = any(k.arg == "help" and getattr(k.value, "attr", None) == "SUPPRESS" for k in node.keywords)
            visible += [f"{path.name}: {name} (say {FORMER_NAMES[name]})" for name in names
                        if name in FORMER_NAMES and not hidden]  # fmt: skip
    assert visible == []
