"""transformers' own common model tests (``ModelTesterMixin`` and ``ConfigTester`` of the pinned
release), run over a tiny tester of every built-in architecture, as transformers' own
``tests/models/mamba/test_modeling_mamba.py`` runs them over Mamba.

The two test files come from the release's source distribution, fetched and checked against its
pinned hash by ``tests/hf_common/fetch.py`` (``make test`` runs it). What that distribution lacks,
and ``test_modeling_common.py`` imports, are hf-mecheval's shims beside it
(``tests/hf_common/shim_*.py``): ``GenerationTesterMixin`` is our own equivalents of its tests
that apply. A test that does not apply to these models is skipped below with its reason."""
from __future__ import annotations

import sys
import unittest

import pytest
import torch

import hf_mecheval  # noqa: F401  (registers the Auto classes)
from hf_mecheval.models import ARCHITECTURES, MODEL_CLASSES

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "hf_common"))
from fetch import common_tests_package  # noqa: E402

common = common_tests_package()
if common is None:
    pytest.skip("transformers' common test files are not fetched: run `python tests/hf_common/fetch.py` "
                "(make test does)", allow_module_level=True)

import transformers_common.test_modeling_common as modeling_common  # noqa: E402
from transformers_common.generation.test_utils import GenerationTesterMixin  # noqa: E402
from transformers_common.test_configuration_common import ConfigTester  # noqa: E402
from transformers_common.test_modeling_common import ModelTesterMixin, ids_tensor  # noqa: E402

BUILTIN = [name for name, spec in ARCHITECTURES.items() if spec.builtin]

# The common tests tell a base model from a causal LM by its class name in transformers' static
# tables of its own models (a base model is not trained; a causal LM gets labels): our classes
# join copies of those tables, as seen from the common tests' module only.
for _table, _index in (("MODEL_MAPPING_NAMES", 1), ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", 2)):
    setattr(modeling_common, _table, {**getattr(modeling_common, _table),
                                      **{ARCHITECTURES[a].model_type: MODEL_CLASSES[a][_index].__name__ for a in BUILTIN}})


class MechEvalModelTester:
    """Tiny models of one architecture (its spec's tiny fields) and a batch for them, in the shape
    transformers' model testers give."""

    def __init__(self, parent, architecture: str, batch_size: int = 3, seq_length: int = 7):
        self.parent, self.architecture = parent, architecture
        self.batch_size, self.seq_length = batch_size, seq_length
        # transformers' testers' vocabulary (99): its resizing tests shrink it by 15
        self.fields = ARCHITECTURES[architecture].tiny_fields(vocab_size=99)
        self.vocab_size = self.fields["vocab_size"]
        self.hidden_size = self.fields["hidden_size"]
        self.num_hidden_layers = self.fields["num_hidden_layers"]
        self.num_attention_heads = self.fields.get("num_attention_heads", 1)
        self.is_training = True

    def get_config(self):
        return MODEL_CLASSES[self.architecture][0](**self.fields)

    def prepare_config_and_inputs(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        return self.get_config(), input_ids, torch.ones_like(input_ids)

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, attention_mask = self.prepare_config_and_inputs()
        return config, {"input_ids": input_ids, "attention_mask": attention_mask}


def expected_cache(config, B: int, L: int) -> list[dict]:
    """Each layer's generation cache after B rows of L tokens, as ``recurrent_cache.py`` describes
    it, from the config's own fields: a key/value layer's {"keys", "values"}, else a linear-attention
    layer's {"conv", "recurrent", "history"} (a part left out: the mixer has none)."""
    D, layers = config.hidden_size, []
    for index, mixer in enumerate(config.layer_mixers()):
        if mixer == "attention":
            H = config.num_attention_heads
            layers.append({"keys": (B, H, L, D // H), "values": (B, H, L, D // H)})
        elif mixer == "mamba":
            E = config.expand * D
            layers.append({"conv": (B, E, config.conv_kernel - 1), "recurrent": (B, E, config.d_state)})
        elif mixer == "mamba2":
            E, N, P = config.expand * D, config.d_state, config.head_dim
            layers.append({"conv": (B, E + 2 * config.n_groups * N, config.conv_kernel - 1), "recurrent": (B, E // P, P, N)})
        elif mixer == "deltanet":
            H = config.num_attention_heads
            layers.append({"conv": (B, 3 * D, config.conv_kernel - 1), "recurrent": (B, H, D // H, D // H)})
        elif mixer == "gated_deltanet":
            H, dk, dv = config.num_attention_heads, config.key_head_dim, config.value_head_dim
            layers.append({"conv": (B, H * (2 * dk + dv), config.conv_kernel - 1), "recurrent": (B, H, dk, dv)})
        elif mixer == "based":                  # [S | z]: 1 + F + F^2 features, head_dim + 1 columns
            H, F_ = config.num_attention_heads, config.feature_dim
            layers.append({"recurrent": (B, H, 1 + F_ + F_ * F_, D // H + 1)})
        elif mixer == "baseconv":
            kernel = config.conv_kernel_for_layer(index)
            layers.append({"history": (B, L, D)} if kernel == "long" else {"conv": (B, D, kernel - 1)})
        elif mixer == "h3":                     # the shift register; the diagonal SSM in real coordinates
            N = config.d_state
            layers.append({"conv": (B, D, N), "recurrent": (B, D * config.head_dim, N // 2, 2)})
        elif mixer == "hyena":
            layers.append({"conv": (B, 3 * D, config.short_conv_kernel - 1), "history": (B, L, D)})
        else:
            raise AssertionError(f"no expected cache written for the mixer {mixer!r}")
    return layers


def _test_case(architecture: str) -> type:
    config_class, model_class, lm_class = MODEL_CLASSES[architecture]

    class Case(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
        all_model_classes = (model_class, lm_class)
        has_attentions = architecture == "transformer"
        # it dates models by a copyright line, which our files do not have: every weight initialised, checked
        test_can_init_all_missing_weights_before_2023 = True

        def setUp(self):
            self.model_tester = MechEvalModelTester(self, architecture)
            self.config_tester = ConfigTester(self, config_class=config_class,
                                              common_properties=["hidden_size", "num_hidden_layers", "vocab_size"],
                                              **ARCHITECTURES[architecture].tiny_fields(vocab_size=99))

        def test_config(self):
            self.config_tester.run_common_tests()

        def _expected_cache(self, config, B, L):
            return expected_cache(config, B, L)

    Case.__name__ = Case.__qualname__ = f"Test{model_class.__name__.removesuffix('Model')}Common"
    return Case


for _arch in BUILTIN:
    _case = _test_case(_arch)
    globals()[_case.__name__] = _case
del _case
