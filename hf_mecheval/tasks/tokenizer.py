"""A tokenizer over a task's vocabulary, so that documents read as text, as in the paper::

    <bos> k12 v7 k3 v41 ... <eos> k3 v41 <eos>          (AR)
    <bos> t4 t17 t4 ... <eos> t17 t9 <eos>              (ATR)

One word per token id (``Task.token_names``), split on whitespace; a word outside the vocabulary
is an error. Batches are padded on the left (``<pad>``, with the attention mask), which is what
generation needs and what the models honour. Training runs save it beside the model, so
``AutoTokenizer.from_pretrained(RUN_DIR)`` and ``pipeline("text-generation", model=RUN_DIR)`` work
after ``import hf_mecheval``. Without it, a run of ours needs ``trust_remote_code=True`` for the
tokenizer as for the model: AutoTokenizer reads the run's config.json to learn its model type, and
a config whose class is remote code it may not run makes transformers fall back to its bare
``PreTrainedConfig`` (model_type ""), which warns "You are using a model of type `mecheval-...` to
instantiate a model of type ``" (``tests/models/test_remote_code.py``).
"""
from __future__ import annotations


def build_tokenizer(task):
    """A ``PreTrainedTokenizerFast`` whose id i is ``task.token_names()[i]``, whose
    ``model_max_length`` is the task's longest document (transformers warns about longer input)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {name: i for i, name in enumerate(task.token_names())}
    backend = Tokenizer(models.WordLevel(vocab))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # every word but <bos> (which starts a document) decodes with its leading space, so that
    # tokens decoded on their own continue a text: the text-generation pipeline returns the prompt
    # followed by the decoded new tokens ("... <eos> k12" + " v5")
    backend.decoder = decoders.Replace(Regex("^(?!<bos>)"), " ")
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", padding_side="left",
                                   model_max_length=task.max_document_length())
