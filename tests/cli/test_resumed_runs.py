"""A resumed run (issue 61) is the run it continues, or is refused: its key is what makes the output (the model's
weights, configs and tokenizer, every option, the input's and the prefix file's contents, --first_line), and a rerun
that differs in one is refused in one line naming it, with nothing written."""

import shutil
from pathlib import Path

import pytest
from conftest import ENGLISH, exit_code, stop_at_batch
from safetensors.torch import load_file, save_file

from vaswani_mt.cli import translate as translate_cli
from vaswani_mt.inference.backends import TorchBackend

pytestmark = pytest.mark.usefixtures("one_thread")


def _main(argv: list[str]):
    return exit_code(translate_cli.main, argv)


@pytest.fixture
def stopped(fitted_folder, tmp_path, monkeypatch, capsys):
    """A copy of the fitted model, an input, the whole run's output, and the same command stopped in its 2nd chunk:
    (argv without --output, the output, the whole run's text)."""
    model = tmp_path / "model"
    shutil.copytree(fitted_folder, model)
    source = tmp_path / "in.en"
    source.write_text("\n".join(ENGLISH * 2) + "\n")
    argv = ["--model", str(model), "--input", str(source), "--batch_size", "2", "--chunk_size", "4",
            "--num_beams", "2"]  # fmt: skip
    assert _main([*argv, "--output", str(tmp_path / "whole.de")]) is None
    with monkeypatch.context() as patch:
        stop_at_batch(patch, TorchBackend, batch=4)  # the 2nd batch of the 2nd chunk
        assert _main([*argv, "--output", str(tmp_path / "out.de")]) == 130
    capsys.readouterr()
    return argv, tmp_path / "out.de", (tmp_path / "whole.de").read_text()


def _refused(argv: list[str], output: Path) -> str:
    """The one line a rerun is refused with, checked to have written nothing."""
    partial, state = Path(f"{output}.partial"), Path(f"{output}.resume")
    before = partial.read_bytes(), state.read_bytes()
    code = _main([*argv, "--output", str(output)])
    assert isinstance(code, str) and "\n" not in code and not output.exists()
    assert (partial.read_bytes(), state.read_bytes()) == before
    return code


def test_a_rerun_with_other_weights_is_refused_naming_them_and_the_same_one_continues(stopped):
    argv, output, whole = stopped
    weights_file = Path(argv[1]) / "model.safetensors"
    saved = weights_file.read_bytes()
    weights = load_file(weights_file)
    save_file({name: tensor * 0.5 for name, tensor in weights.items()}, weights_file, metadata={"format": "pt"})
    assert _refused(argv, output) == (
        f"error: {output}.partial was written by a run with other options or input (the model's model.safetensors): "
        f"rerun that command to continue it, or remove {output}.partial and {output}.resume to start again"
    )
    weights_file.write_bytes(saved)
    assert _main([*argv, "--output", str(output)]) is None and output.read_text() == whole


def test_a_rerun_with_another_input_prefix_file_or_first_line_is_refused_naming_it(stopped, tmp_path):
    argv, output, _ = stopped
    source = Path(argv[3])
    text = source.read_text()
    source.write_text(text.replace("apple", "appel"))  # the same size
    assert "(--input's contents)" in _refused(argv, output)
    source.write_text(text)
    assert "(--first_line)" in _refused([*argv, "--first_line", "3"], output)
    (tmp_path / "config.json").write_text((Path(argv[1]) / "config.json").read_text())
    config = Path(argv[1]) / "config.json"
    config.write_text(config.read_text().replace("\n", " \n", 1))  # the same model, another config.json
    assert "(the model's config.json)" in _refused(argv, output)
    config.write_text((tmp_path / "config.json").read_text())
    prefixes = tmp_path / "prefixes.de"
    prefixes.write_text("\n" * len(text.splitlines()))
    assert "(--target_prefix_file's contents)" in _refused([*argv, "--target_prefix_file", str(prefixes)], output)
    assert "(--nbest)" in _refused([*argv, "--nbest", "2"], output)


@pytest.mark.usefixtures("live_sigint")
@pytest.mark.parametrize("output", [True, False], ids=["output", "stdout"])
def test_a_stop_while_starting_or_loading_says_one_same_line(fitted_folder, tmp_path, monkeypatch, capsys, output):
    import signal

    source = tmp_path / "in.en"
    source.write_text("The house is small.\n")
    argv = ["--model", str(fitted_folder), "--input", str(source)] + (["--output", str(tmp_path / "o")] if output
                                                                       else [])  # fmt: skip
    with monkeypatch.context() as patch:  # Ctrl-C while loading the model
        patch.setattr(translate_cli, "load_translator", lambda *_: signal.raise_signal(signal.SIGINT))
        assert _main(argv) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "interrupted while starting: nothing done"

    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(translate_cli, "check_compute_type", interrupted)  # while checking the options
    assert _main(argv) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "interrupted while starting: nothing done"
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


@pytest.mark.parametrize("hard", [False, True], ids=["clean-stop", "hard-stop"])
def test_a_kept_line_whose_controls_failed_is_reported_again_and_the_status_is_the_whole_runs(
    fitted_folder, tmp_path, monkeypatch, caplog, hard
):
    import json

    source, output = tmp_path / "in.en", tmp_path / "out.de"
    source.write_text("\tHaus\n" + "".join(f"{line}\n" for line in ENGLISH * 2))  # line 1: a term, no source
    argv = ["--model", str(fitted_folder), "--input", str(source), "--batch_size", "2", "--chunk_size", "4",
            "--num_beams", "2", "--constraints", "unordered"]  # fmt: skip
    failed = "error: 1 of 13 lines not translated: bad constraints or target prefixes (first: line 1: constraints or "
    assert _main([*argv, "--output", str(tmp_path / "whole.de")]).startswith(failed)
    with monkeypatch.context() as patch:
        stop_at_batch(patch, TorchBackend, batch=4)  # in the 2nd chunk: line 1 is written, and kept
        assert _main([*argv, "--output", str(output)]) == 130
    state = Path(f"{output}.resume")
    assert json.loads(state.read_text())["outcomes"] == {"1": {"failed": "constraints or a target prefix but no "
                                                                         "source text"}}  # fmt: skip
    if hard:  # what kill -9 leaves: the outcomes recorded before their lines were written, no clean stop's record
        kept = {k: v for k, v in json.loads(state.read_text()).items() if k in ("key", "parts", "outcomes")}
        state.write_text(json.dumps(kept))
    caplog.clear()
    assert _main([*argv, "--output", str(output)]).startswith(failed)
    assert "line 1: constraints or a target prefix but no source text: not translated" in caplog.text
    assert output.read_text() == (tmp_path / "whole.de").read_text()


def test_a_rerun_whose_tabbed_lines_are_all_in_finished_chunks_does_not_warn_that_none_has_a_tab(
    fitted_folder, tmp_path, monkeypatch, caplog
):
    """Issue 61: the rerun reads only the chunks left (lines 5-8 here, none with a tab): the input has tabs, so the
    warning that constrained input has none would be false."""
    source, output = tmp_path / "in.en", tmp_path / "out.de"
    source.write_text(f"{ENGLISH[0]}\tApfel\n" + "".join(f"{line}\n" for line in (ENGLISH * 2)[1:8]))
    argv = ["--model", str(fitted_folder), "--input", str(source), "--batch_size", "2", "--chunk_size", "4",
            "--num_beams", "2", "--constraints", "unordered", "--output", str(output)]  # fmt: skip
    with monkeypatch.context() as patch:
        stop_at_batch(patch, TorchBackend, batch=4)  # the 2nd batch of the 2nd chunk: chunk 1 is kept
        assert _main(argv) == 130
    caplog.clear()
    assert _main(argv) is None
    assert "has a tab" not in caplog.text and output.exists()
    source.write_text("".join(f"{line}\n" for line in (ENGLISH * 2)[:8]))  # no tab anywhere: the warning is due
    output.unlink()
    assert _main(argv) is None and "none of the 8 input lines has a tab" in caplog.text


def test_resume_reads_back_only_the_last_chunk_of_a_long_partial(tmp_path):
    import tracemalloc

    from vaswani_mt.system.outputs import ResumableOutput

    output = ResumableOutput(tmp_path / "o", {"run": 1})
    partial = tmp_path / "o.partial"
    partial.write_bytes(b"x" * 99 + b"\n")
    output.stopped(1, {})  # F.resume as a clean stop leaves it
    partial.write_bytes((b"x" * 99 + b"\n") * 200_003 + b"cut")  # 20 MB, a line cut short at the end
    output.stopped(200_003, {})
    tracemalloc.start()
    try:
        start, kept = output.resume(chunk=4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert start == 200_000 and kept == {line: "x" * 99 + "\n" for line in (200_001, 200_002, 200_003)}
    assert partial.stat().st_size == 200_000 * 100 and peak < 4 << 20, peak


def test_two_runs_never_write_one_output_at_once(tmp_path):
    from vaswani_mt.system.outputs import ResumableOutput

    first, second = ResumableOutput(tmp_path / "o", {"run": 1}), ResumableOutput(tmp_path / "o", {"run": 1})
    assert first.resume() == (0, {})
    with first.open() as f:
        f.write(b"one\n")
        for attempt in (second.resume, second.open):
            with pytest.raises(ValueError, match=r"o\.partial is being written by another run: wait for it to end, or "
                                                 r"stop it first$"):  # fmt: skip
                attempt()
    assert (tmp_path / "o.partial").read_bytes() == b"one\n"
    assert second.resume() == (1, {})  # once the first has ended


def test_a_bom_is_dropped_from_line_1_only_not_from_a_shard_or_resumed_runs_first_line():
    import io

    from vaswani_mt.inference.streams import read_text_lines

    data = b"\xef\xbb\xbfa\n\xef\xbb\xbfb\n"
    assert list(read_text_lines(io.BytesIO(data))) == ["a", "\ufeffb"]
    assert list(read_text_lines(io.BytesIO(data[data.index(b"\n") + 1 :]), first=2)) == ["\ufeffb"]


@pytest.mark.usefixtures("live_sigint")
def test_a_signal_after_the_last_line_is_written_says_the_output_is_whole(fitted_folder, tmp_path, monkeypatch,
                                                                          capsys):  # fmt: skip
    import signal

    source, output = tmp_path / "in.en", tmp_path / "out.de"
    source.write_text("".join(f"{line}\n" for line in ENGLISH))
    monkeypatch.setattr(translate_cli, "report_controls", lambda *_: signal.raise_signal(signal.SIGTERM))  # held
    assert _main(["--model", str(fitted_folder), "--input", str(source), "--output", str(output)]) == 143
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"interrupted at the end: all 6 lines written to {output}"
    assert len(output.read_text().splitlines()) == 6 and not Path(f"{output}.partial").exists()
