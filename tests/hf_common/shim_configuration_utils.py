"""``config_common_kwargs`` for transformers' ``ConfigTester`` (its ``tests/utils/
test_configuration_utils.py`` is not in the release's source distribution): every argument of
``PreTrainedConfig.__init__`` in the pinned release, each with a value other than its default, so
that ``check_config_arguments_init`` sees whether a config keeps them."""
config_common_kwargs = {
    "architectures": ["BertModel"],
    "output_hidden_states": True,
    "return_dict": False,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "is_encoder_decoder": True,
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "problem_type": "regression",
}
