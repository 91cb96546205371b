"""The tokenizer over a task's vocabulary: documents as text, and back."""
import numpy as np
import pytest

from hf_mecheval.tasks import build_task
from hf_mecheval.tasks.tokenizer import build_tokenizer


def test_token_names_follow_the_task_vocabulary():
    ar = build_task("ar_32", num_kv=8, num_pairs=2)          # keys 3..6, values 7..10, one unused id (11)
    assert ar.token_names() == ["<pad>", "<bos>", "<eos>", "k0", "k1", "k2", "k3", "v0", "v1", "v2", "v3",
                                "<unused0>"]
    atr = build_task("atr_easy")
    names = atr.token_names()
    assert len(names) == atr.vocab_size == 23 and names[3] == "t0" and names[22] == "t19"


@pytest.mark.parametrize("preset", ["ar_32", "atr_easy"])
def test_documents_round_trip_through_text(preset):
    task = build_task(preset)
    tokenizer = build_tokenizer(task)
    assert len(tokenizer) == task.vocab_size
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    data = task.generate(5, "test", seed=0)
    for i in range(len(data)):
        ids = data.document(i)["input_ids"]
        text = tokenizer.decode(ids)
        assert text.startswith("<bos> ") and text.endswith(" <eos>")
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    if preset == "ar_32":
        doc = data.document(0)
        # the query token is the cue key, written k<index>: id 3 + index; decoded alone it keeps
        # its leading space, so that it continues a decoded prompt as a new word
        assert tokenizer.decode([doc["input_ids"][doc["query_pos"]]]) == f" k{doc['input_ids'][doc['query_pos']] - 3}"


def test_batches_are_left_padded_and_saved_tokenizers_load_with_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    build_tokenizer(build_task("atr_easy")).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    batch = tokenizer(["<bos> t1 t2 <eos> t1", "<bos> t5 <eos> t5"], padding=True)
    assert batch["input_ids"][1][:1] == [0] and batch["attention_mask"][1] == [0, 1, 1, 1, 1]
    assert np.array(batch["input_ids"]).shape == (2, 5)
    # its longest input is the task's longest document (ATR easy: sentences of up to 1 024 tokens and
    # 5 more), saved with it
    assert tokenizer.model_max_length == build_task("atr_easy").max_document_length() == 1029
