"""benchmarks/data_scale.py end to end at a small scale: every stage runs in a process of its own, the rerun finds
the tokenization cache, and a resumed sampler starts at the batch a straight run reaches."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "data_scale.py"


def test_data_preparation_benchmark_measures_each_stage_and_resumes_at_the_same_batch(tmp_path):
    out = tmp_path / "scale.json"
    command = [sys.executable, str(SCRIPT), "--work_dir", str(tmp_path / "work"), "--pairs", "3000",
               "--vocab_size", "400", "--tokenizer_sample", "1000", "--num_proc", "2", "--max_tokens", "256",
               "--json", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    corpus = tmp_path / "work" / "corpus"
    assert json.loads((corpus / "dataset_dict.json").read_text())["splits"] == ["train", "validation", "test"]
    for stage in ("tokenizer", "tokenize", "tokenize_again", "sampler", "resume"):
        assert report[stage]["seconds"] >= 0 and report[stage]["peak_rss_mib"] > 0, stage
    assert report["tokenizer"]["vocabulary"] == 400
    # the rerun read the files the first run wrote beside the corpus
    assert report["tokenize_again"]["cache_files"] == report["tokenize"]["cache_files"] != []
    assert 0 < report["tokenize"]["train_pairs_kept"] <= 3000
    assert report["resume"]["resumed_batch_is_the_straight_runs"] is True
    assert report["resume"]["batch_at_middle"] == report["sampler"]["batch_at_middle"]
    assert report["preparation_seconds"] > 0 and report["peak_rss_mib"] > 0
