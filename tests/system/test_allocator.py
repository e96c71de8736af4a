"""retain_freed_memory: a large block freed and allocated again is not page-faulted again (glibc on Linux)."""

import json
import subprocess
import sys

import pytest

from vaswani_mt.system import allocator

# Allocates, fills and frees a 64 MiB tensor (above glibc's largest mmap threshold) over and over, as a training
# step does with its large buffers, and counts the minor page faults per allocation once the heap has settled (the
# first rounds may still grow it: a freed block's hole can be a few bytes short of an aligned request), with or
# without retain_freed_memory() first.
_CHILD = """
import json, resource, sys
import torch
from vaswani_mt.system.allocator import retain_freed_memory
applied = retain_freed_memory() if sys.argv[1] == "retain" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.ones(16 * 2**20)
before = faults()
for _ in range(4):
    torch.ones(16 * 2**20)
print(json.dumps({"applied": applied, "faults": (faults() - before) / 4}))
"""

glibc = pytest.mark.skipif(allocator._glibc() is None, reason="mallopt parameters are glibc's")


def _settled_allocation(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc
def test_a_freed_large_block_is_reused_without_page_faults():
    default = _settled_allocation("default")
    retained = _settled_allocation("retain")
    # 64 MiB are 16,384 pages of 4 KiB: without the setting each allocation maps and faults them all again.
    assert default["faults"] > 10_000, default
    assert retained["applied"] is True
    assert retained["faults"] < 500, retained


@glibc
def test_applying_twice_is_harmless():
    assert allocator.retain_freed_memory() is True
    assert allocator.retain_freed_memory() is True


def test_elsewhere_it_changes_nothing(monkeypatch):
    monkeypatch.setattr(allocator, "_applied", False)
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert allocator.retain_freed_memory() is False
    assert allocator._applied is False
