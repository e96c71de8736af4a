"""The compiled decoder step (`vaswani_mt.inference.compiled`, issue 62 item 5): `compile_step` reaches the search as
a `CompileConfig` of dynamic shapes, traced without duck sizing and with inductor's `freezing` on, both only
while the search runs; its compile is kept in the user's cache folder; translate.py's `auto` compiles long inputs
only; the compiled step with frozen weights gives the eager search's translations and n-best scores (the
rows-leaving tolerance)."""

import pytest
import torch
from conftest import SENTENCES

from vaswani_mt.cli import compile_step_of
from vaswani_mt.inference import compiled
from vaswani_mt.inference.options import TranslationOptions
from vaswani_mt.inference.translator import Translator

pytestmark = [pytest.mark.usefixtures("one_thread")]


def test_compile_step_takes_on_or_none():
    assert TranslationOptions(compile_step="on").compile_step == "on"
    with pytest.raises(ValueError, match=r"compile_step must be one of on .*not 'frozen'"):  # merged into "on"
        TranslationOptions(compile_step="frozen")
    with pytest.raises(ValueError, match=r"compile_step must be one of on .*not 'auto'"):
        TranslationOptions(compile_step="auto")  # translate.py resolves auto before the options are made


@pytest.mark.parametrize("step", [None, "on"])
def test_the_search_gets_the_compile_config_and_freezing_only_while_it_runs(fitted, step, monkeypatch, tmp_path):
    from torch._inductor import config as inductor
    from torch.fx.experimental import _config as shapes

    model, tokenizer = fitted
    seen = []

    def generate(**kwargs):
        seen.append((kwargs.get("compile_config"), inductor.freezing, shapes.use_duck_shape))
        return kwargs["input_ids"]

    monkeypatch.setattr(model, "generate", generate)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    Translator(model, tokenizer, compile_step=step).translate([en for en, _ in SENTENCES[:2]])
    ((config, freezing, duck_shape),) = seen
    assert inductor.freezing is False and shapes.use_duck_shape is True
    if step is None:
        assert config is None and freezing is False and duck_shape is True
        return
    assert duck_shape is False  # else 64 rows took the head size's symbol, and a second graph followed
    assert config.dynamic is True and config.mode is None  # dynamic: sentences still leave the batch
    assert freezing is compiled.FREEZING
    assert (config.options or {}).get("freezing", False) is freezing  # keys the frozen step apart from others
    assert torch._inductor.runtime.cache_dir_utils.cache_dir() == str(tmp_path / "vaswani_mt" / "inductor")


def test_the_kept_cache_is_the_users_unless_torchinductor_cache_dir_is_set(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what inductor writes there itself
    assert compiled.compile_cache_dir() == tmp_path / "xdg" / "vaswani_mt" / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compiled.keep_compile_cache() == tmp_path / "mine"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compiled.compile_cache_dir() == tmp_path / "home" / ".cache" / "vaswani_mt" / "inductor"


def test_auto_compiles_an_input_long_enough_of_one_model_of_ours_on_the_cpu(fitted_folder, monkeypatch, tmp_path):
    from types import SimpleNamespace

    monkeypatch.setattr(compiled, "COMPILE_FROM_LINES", 5)
    long, short = tmp_path / "long.en", tmp_path / "short.en"
    long.write_text("a line\n" * 5)
    short.write_text("a line\n" * 4)
    model = [str(fitted_folder)]
    assert compile_step_of(SimpleNamespace(compile_step="auto", model=model, input=str(long))) == "on"
    assert compile_step_of(SimpleNamespace(compile_step="auto", model=model, input=str(short))) is None
    assert compile_step_of(SimpleNamespace(compile_step="auto", model=model, input=None)) is None  # a stream
    assert compile_step_of(SimpleNamespace(compile_step="auto", model=model * 2, input=str(long))) is None
    assert compile_step_of(SimpleNamespace(compile_step="off", model=model, input=str(long))) is None
    assert compile_step_of(SimpleNamespace(compile_step="on", model=model, input=str(short))) == "on"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # measured on CPUs: a GPU stays eager
    assert compile_step_of(SimpleNamespace(compile_step="auto", model=model, input=str(long))) is None


@pytest.mark.slow  # ~60-100 s: inductor compiles the step, its weights frozen
def test_the_compiled_step_with_frozen_weights_gives_the_eager_translations_and_scores(fitted, monkeypatch, tmp_path):
    model, tokenizer = fitted
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    lines = [en for en, _ in SENTENCES] * 3  # batches of 4 over lines of different lengths: sentences leave
    options = TranslationOptions(batch_size=4, nbest=2)
    eager = Translator(model, tokenizer, options).translate(lines)
    torch._dynamo.reset()
    try:
        frozen = Translator(model, tokenizer, options.replace(compile_step="on")).translate(lines)
        counts = dict(torch._dynamo.utils.counters["inductor"])
    finally:
        torch._dynamo.reset()
    assert not compiled.FREEZING or counts.get("mkldnn_linear_weight_pack_matcher_count", 0) > 0  # frozen, packed
    same = sum([h.text for h in a] == [h.text for h in b] for a, b in zip(eager, frozen, strict=True))
    assert same >= 0.995 * len(lines)
    for a, b in zip(eager, frozen, strict=True):
        if [h.text for h in a] == [h.text for h in b]:
            assert max(abs(x.score - y.score) + abs(x.log_prob - y.log_prob) for x, y in zip(a, b, strict=True)) < 1e-5
