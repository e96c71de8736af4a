"""transformers' own model tests (`ModelTesterMixin` of its tests/test_modeling_common.py) run on the model.

The test file is not in the transformers wheel: it comes from the sdist of the installed version on PyPI, fetched at
test time with `pip download` (so the configured index and its hash checks apply), and the sdist's top-level tests/
files are kept under `~/.cache/vaswani_mt/transformers-tests/<version>/`, so later runs do not download again; they
are never committed. The sdist lacks tests/generation/ and tests/exporters/, from which test_modeling_common.py
imports `GenerationTesterMixin` and `ExportTesterMixin`: empty stand-ins take their place, so the generate() tests
of the one and the torch.export tests of the other do not run here (the paper's search is tested in
test_generation.py). `parameterized`, which the file imports, is fetched the same way when it is not installed.
Without network the module is skipped.

Tests of the mixin that cannot apply are skipped, each with its reason: those that untie the embeddings (§3.4 ties
the source embedding, the target embedding and the pre-softmax projection: the tie is the architecture, and the
config refuses `tie_word_embeddings=False`), and those that need hardware or packages this machine lacks.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import tarfile
import tempfile
import types
import unittest
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
import transformers

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel

pytestmark = pytest.mark.transformers_internals

CACHE = Path.home() / ".cache" / "vaswani_mt" / "transformers-tests" / transformers.__version__
PACKAGE = "transformers_common_tests"  # the sdist's tests/ folder, imported under this name
PARAMETERIZED = "0.9.0"


def _pip_download(requirement: str, folder: Path, *options: str) -> Path:
    """The one file `pip download` fetches into `folder` for `requirement` (no dependencies) from the configured
    index."""
    command = [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "-d", str(folder), *options]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    found = [path for path in folder.iterdir() if path.is_file()] if result.returncode == 0 else []
    if len(found) != 1:
        raise OSError(f"pip download {requirement} failed: {(result.stderr or result.stdout).strip()[-500:]}")
    return found[0]


def _fetch_once(folder: Path, fill) -> None:
    """Makes `folder` with `fill(staging)` unless it exists: filled in a folder of its own and renamed, so that it is
    complete or absent, whatever another run or an interruption does meanwhile."""
    if folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as work:
        staging = Path(work, "staging")
        staging.mkdir()
        fill(staging, Path(work))
        try:
            staging.rename(folder)
        except OSError:
            if not folder.is_dir():  # not another run that got there first
                raise


def _fetch_test_files(staging: Path, work: Path) -> None:
    """The sdist's tests/*.py, as a package."""
    sdist = _pip_download(f"transformers=={transformers.__version__}", work, "--no-binary", ":all:")
    with tarfile.open(sdist, mode="r:gz") as archive:
        for member in archive.getmembers():
            parts = Path(member.name).parts  # transformers-<version>/tests/<name>.py
            if member.isfile() and len(parts) == 3 and parts[1] == "tests" and parts[2].endswith(".py"):
                (staging / parts[2]).write_bytes(archive.extractfile(member).read())
    (staging / "__init__.py").touch()


def _fetch_parameterized(staging: Path, work: Path) -> None:
    """The `parameterized` package (pure Python) from its wheel."""
    wheel = _pip_download(f"parameterized=={PARAMETERIZED}", work, "--only-binary", ":all:")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(staging, [name for name in archive.namelist() if name.startswith("parameterized/")])


def _stand_in(name: str, **classes) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(classes)
    sys.modules[name] = module


try:
    _fetch_once(CACHE / PACKAGE, _fetch_test_files)
    sys.path.insert(0, str(CACHE))
    if importlib.util.find_spec("parameterized") is None:
        _fetch_once(CACHE.parent / f"parameterized-{PARAMETERIZED}", _fetch_parameterized)
        sys.path.insert(0, str(CACHE.parent / f"parameterized-{PARAMETERIZED}"))
except (OSError, subprocess.SubprocessError) as error:  # no network, no pip, a timeout
    pytest.skip(
        f"transformers {transformers.__version__}'s test files could not be fetched from PyPI ({error})",
        allow_module_level=True,
    )
# Not in the sdist; test_modeling_common.py imports one class from each.
_stand_in(f"{PACKAGE}.exporters", __path__=[])
_stand_in(f"{PACKAGE}.exporters.test_export", ExportTesterMixin=type("ExportTesterMixin", (), {}))
_stand_in(f"{PACKAGE}.generation", __path__=[])
_stand_in(f"{PACKAGE}.generation.test_utils", GenerationTesterMixin=type("GenerationTesterMixin", (), {}))
with warnings.catch_warnings():  # its pytest marks (flash_attn_test, ...) are registered in transformers' conftest
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    common = importlib.import_module(f"{PACKAGE}.test_modeling_common")
ModelTesterMixin, ids_tensor = common.ModelTesterMixin, common.ids_tensor
# The mixin knows a model's role by its class name in transformers' Auto mappings (a base model has no loss; a
# sequence-to-sequence LM gets `labels`). The model is named in the copies that this test module's import of the
# file sees, as an in-tree model is in the originals; transformers' own mappings are left alone.
common.MODEL_MAPPING_NAMES = {**common.MODEL_MAPPING_NAMES, "vaswani_mt": "VaswaniModel"}
common.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES = {
    **common.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    "vaswani_mt": "VaswaniForConditionalGeneration",
}


class VaswaniModelTester:
    """A tiny model and batch for the mixin: vocabulary 99, d_model 32, 2 + 2 layers, 4 heads, 7 tokens."""

    def __init__(self, parent, batch_size=3, seq_length=7, vocab_size=99, hidden_size=32, num_hidden_layers=2,
                 num_attention_heads=4, intermediate_size=37, is_training=True):  # fmt: skip
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = self.encoder_seq_length = self.decoder_seq_length = seq_length
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.is_training = is_training
        self.attn_implementation = None  # the default (sdpa)
        self.label_smoothing = 0.1  # epsilon_ls, the default (§5.4)
        self.imported = {}  # config fields of an imported checkpoint (ImportedVaswaniModelTest)

    def get_config(self) -> VaswaniConfig:
        return VaswaniConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            d_ff=self.intermediate_size,
            num_heads=self.num_attention_heads,
            num_encoder_layers=self.num_hidden_layers,
            num_decoder_layers=self.num_hidden_layers,
            max_position_embeddings=64,
            label_smoothing=self.label_smoothing,
            attn_implementation=self.attn_implementation,
            **self.imported,
        )

    def prepare_config_and_inputs(self):
        config = self.get_config()
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(4)
        input_ids[:, -1] = config.eos_token_id
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(4)
        decoder_input_ids[:, 0] = config.decoder_start_token_id
        inputs = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": torch.ones_like(decoder_input_ids),
        }
        return config, inputs

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()


class VaswaniModelTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (VaswaniModel, VaswaniForConditionalGeneration)
    is_encoder_decoder = True
    # The model files carry no copyright year, which the mixin reads as "added before 2023": check `_init_weights`.
    test_can_init_all_missing_weights_before_2023 = True

    def setUp(self):
        self.model_tester = VaswaniModelTester(self)
        # Tiny matrices: one thread is several times faster than two on a busy 2-core machine.
        self.addCleanup(torch.set_num_threads, torch.get_num_threads())
        torch.set_num_threads(1)

    @unittest.skip("GenerationTesterMixin is in tests/generation/, which the sdist lacks; see test_generation.py")
    def test_generation_tester_mixin_inheritance(self):
        pass

    @unittest.skip("the embeddings are tied by the architecture (§3.4); the config refuses to untie them")
    def test_load_save_without_tied_weights(self):
        pass

    @unittest.skipUnless(
        hasattr(ModelTesterMixin, "test_bc_cache_name_forward"),
        f"transformers {transformers.__version__}'s mixin has no test of the cache's old name (it came with "
        "transformers' renaming of `past_key_values` to `cache`)",
    )
    @pytest.mark.filterwarnings("always::FutureWarning")
    def test_bc_cache_name_forward(self):
        """It records the FutureWarning that `past_key_values=` gives, which the project's pytest settings ignore."""
        super().test_bc_cache_name_forward()

    def test_model_outputs_equivalence(self):
        """Under eager attention: with `output_attentions=True` the model refuses sdpa with a clear error (it has no
        weights to return) instead of transformers' warning and missing attentions."""
        self.model_tester.attn_implementation = "eager"
        super().test_model_outputs_equivalence()

    def test_encoder_decoder_loss_no_double_shift(self):
        """With epsilon_ls = 0, where §5.4's label-smoothed loss is the plain cross-entropy the test compares with;
        what it checks, that the labels are not shifted a second time, does not depend on the smoothing."""
        self.model_tester.label_smoothing = 0.0
        super().test_encoder_decoder_loss_no_double_shift()


class ImportedVaswaniModelTest(VaswaniModelTest):
    """The mixin again on the config an imported OPUS-MT checkpoint gets (`export.marian.from_marian`): swish, biases
    in every projection, a logits bias, LayerNorm eps 1e-5, Marian's tokens (`</s>` 0, `<pad>` last and the decoder's
    start)."""

    def setUp(self):
        super().setUp()
        pad = self.model_tester.vocab_size - 1
        self.model_tester.imported = dict(
            activation_function="swish", attention_bias=True, logits_bias=True, layer_norm_eps=1e-5, eos_token_id=0,
            bos_token_id=None, pad_token_id=pad, decoder_start_token_id=pad,
        )  # fmt: skip
