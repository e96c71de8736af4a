"""The architecture, read from the source: subpackages by concern whose imports run only downward, the model package
exactly the Hub payload (torch, transformers and itself), no private names across packages, no module past ~600
lines but the model, and an `import vaswani_mt` that loads no heavy optional library and changes nothing
process-wide beyond registering with the Auto classes."""

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

# Lower layers never import upper ones: model <- data <- training; model <- inference <- evaluation <- export <- hub;
# training sits on all of them (it scores and publishes the run), the commands (cli) on everything. A package may
# import those of lower rank only; two packages of one rank never import each other.
RANKS = {"model": 0, "system": 0, "data": 1, "inference": 1, "evaluation": 2, "export": 3, "hub": 4, "training": 5,
         "cli": 6}  # fmt: skip
PAYLOAD_IMPORTS = {"torch", "transformers", "__future__"}  # besides the standard library and relative siblings
MODEL_FILE_LIMIT, MODULE_LIMIT = 1000, 620


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _subpackage(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(absolute module, imported names, line) of every import in `path`, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(("vaswani_mt", *path.relative_to(PACKAGE).parts[:-1]))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            found.append((module, [alias.name for alias in node.names], node.lineno))
    return found


def _target(module: str, names: list[str]) -> str | None:
    """The subpackage an import of `module` (or of `names` from it) reaches, None outside vaswani_mt's packages."""
    parts = module.split(".")
    if parts[0] != "vaswani_mt":
        return None
    if len(parts) > 1:
        return parts[1]
    reached = {name for name in names if name in RANKS}  # `from vaswani_mt import training`
    return reached.pop() if len(reached) == 1 else None


def test_every_module_lives_in_a_subpackage_of_known_rank():
    loose = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"modules outside a subpackage: {loose}"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(RANKS)


def test_imports_run_only_downward():
    upward = []
    for path in _modules():
        mine = _subpackage(path)
        for module, names, line in _imports(path):
            target = _target(module, names)
            if target is None or target == mine:
                continue
            rank = RANKS["model"] if mine is None else RANKS[mine]  # vaswani_mt/__init__.py: the model only
            if (mine is None and target != "model") or (mine is not None and RANKS[target] >= rank):
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {module} ({mine} -> {target})")
    assert not upward, "\n".join(upward)


def test_no_private_name_is_imported_across_packages():
    private = []
    for path in _modules():
        for module, names, line in _imports(path):
            target = _target(module, names)
            if target is not None and target != _subpackage(path):
                private += [f"{path.relative_to(ROOT)}:{line} {module}.{n}" for n in names if n.startswith("_")]
    assert not private, "\n".join(private)


def test_the_model_package_is_the_hub_payload_and_imports_only_torch_transformers_and_itself():
    for path in (PACKAGE / "model").glob("*_vaswani.py"):
        for module, _, line in _imports(path):
            top = module.split(".")[0]
            if module.startswith("vaswani_mt.model."):  # a relative import of a sibling, resolved
                assert (PACKAGE / "model" / f"{module.split('.')[2]}.py").is_file()
                source = path.read_text(encoding="utf-8").splitlines()[line - 1]
                assert "from ." in source, f"{path.name}:{line}: siblings are imported relatively (remote code)"
                continue
            assert top in PAYLOAD_IMPORTS or top in sys.stdlib_module_names, f"{path.name}:{line} imports {module}"


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
        assert name == f"vaswani-mt-{module.rsplit('.', 1)[1]}" and function == "main"
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
