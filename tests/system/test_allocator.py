"""retain_freed_memory: a large block freed and allocated again is not page-faulted again (glibc on Linux).

`retain_freed_memory()` changes malloc for its whole process, for good: every call here runs in a child process, so
that the rest of the suite runs with glibc's defaults (tests/training's in-process runs leave it out too)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import built_once

from vaswani_mt.system import allocator

# Allocates, fills and frees a 64 MiB tensor (above glibc's largest mmap threshold) over and over, as a training
# step does with its large buffers, and counts the minor page faults per allocation once the heap has settled (the
# first rounds may still grow it: a freed block's hole can be a few bytes short of an aligned request), with or
# without retain_freed_memory() first; in "retain" mode it is called twice, and the faults are counted after both.
_CHILD = """
import json, resource, sys
import torch
from vaswani_mt.system.allocator import retain_freed_memory
applied = [retain_freed_memory(), retain_freed_memory()] if sys.argv[1] == "retain" else [False]
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.ones(16 * 2**20)
before = faults()
for _ in range(4):
    torch.ones(16 * 2**20)
print(json.dumps({"applied": applied, "faults": (faults() - before) / 4}))
"""

# The module alone (it imports nothing of vaswani_mt), on a platform that is not Linux.
_ELSEWHERE = """
import importlib.util, json, sys
sys.platform = "darwin"
spec = importlib.util.spec_from_file_location("allocator", sys.argv[1])
allocator = importlib.util.module_from_spec(spec)
spec.loader.exec_module(allocator)
print(json.dumps({"retained": allocator.retain_freed_memory(), "returned": allocator.return_freed_memory(),
                  "applied": allocator._applied}))
"""

glibc = pytest.mark.skipif(allocator._glibc() is None, reason="mallopt parameters are glibc's")


def _child(code: str, *argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def settled(tmp_path_factory) -> dict:
    """The settled page faults per allocation, with glibc's defaults and with retain_freed_memory() (called twice);
    measured once per pytest run (`built_once`: two child processes)."""

    def build(folder: Path) -> None:
        measured = {mode: _child(_CHILD, mode) for mode in ("default", "retain")}
        (folder / "settled.json").write_text(json.dumps(measured))

    return json.loads((built_once(tmp_path_factory, "allocator", build) / "settled.json").read_text())


@glibc
def test_a_freed_large_block_is_reused_without_page_faults(settled):
    default, retained = settled["default"], settled["retain"]
    # 64 MiB are 16,384 pages of 4 KiB: without the setting each allocation maps and faults them all again.
    assert default["faults"] > 10_000, default
    assert retained["applied"][0] is True
    assert retained["faults"] < 500, retained


@glibc
def test_applying_twice_is_harmless(settled):
    retained = settled["retain"]
    assert retained["applied"] == [True, True]
    assert retained["faults"] < 500, retained  # the second call undid nothing of the first


def test_elsewhere_it_changes_nothing():
    assert _child(_ELSEWHERE, str(Path(allocator.__file__))) == {"retained": False, "returned": False, "applied": False}
