"""benchmarks/data_scale.py end to end at a small scale: every stage runs in a process of its own, the rerun finds
the tokenization cache, and a resumed sampler starts at the batch a straight run reaches. CI runs the stages in this
process (the same functions on the same corpus: each stage's figures, the cache found again, the resumed batch);
`pytest -m slow` runs the script, a process per stage."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "data_scale.py"
OPTIONS = ["--pairs", "3000", "--vocab_size", "400", "--tokenizer_sample", "1000", "--num_proc", "2",
           "--max_tokens", "256"]  # fmt: skip
STAGES = ("tokenizer", "tokenize", "tokenize_again", "sampler", "resume")


def _check(report: dict, corpus: Path) -> None:
    assert json.loads((corpus / "dataset_dict.json").read_text())["splits"] == ["train", "validation", "test"]
    for stage in STAGES:
        assert report[stage]["seconds"] >= 0 and report[stage]["peak_rss_mib"] > 0, stage
    assert report["tokenizer"]["vocabulary"] == 400
    # the rerun read the files the first run wrote beside the corpus
    assert report["tokenize_again"]["cache_files"] == report["tokenize"]["cache_files"] != []
    assert 0 < report["tokenize"]["train_pairs_kept"] <= 3000
    assert report["resume"]["resumed_batch_is_the_straight_runs"] is True
    assert report["resume"]["batch_at_middle"] == report["sampler"]["batch_at_middle"]


def test_each_stage_of_the_data_preparation_benchmark_in_this_process(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    for name in ("data_scale", "speed_common"):  # imported afresh from benchmarks/, and not left behind
        monkeypatch.delitem(sys.modules, name, raising=False)
    import data_scale

    work = tmp_path / "work"
    data_scale.make_corpus(work / "corpus", 3000, 1)
    report = {stage: data_scale.run_stage(data_scale.parse(["--work_dir", str(work), *OPTIONS, "--stage", stage]))
              for stage in STAGES}  # fmt: skip
    _check(report, work / "corpus")
    for name in ("data_scale", "speed_common"):
        sys.modules.pop(name, None)


@pytest.mark.slow  # 70 s (six processes); CI runs the same stages in this process (above)
def test_data_preparation_benchmark_measures_each_stage_and_resumes_at_the_same_batch(tmp_path):
    out = tmp_path / "scale.json"
    command = [sys.executable, str(SCRIPT), "--work_dir", str(tmp_path / "work"), *OPTIONS, "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    _check(report, tmp_path / "work" / "corpus")
    assert report["preparation_seconds"] > 0 and report["peak_rss_mib"] > 0
