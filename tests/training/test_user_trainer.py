"""hf-mecheval's pieces in a user's own Trainer: the published datasets, the padding collator and the
restoration callback (validated when made, logging through Trainer.log)."""
import datasets
import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from hf_mecheval.errors import MechEvalError
from hf_mecheval.models import build_model
from hf_mecheval.tasks import build_task
from hf_mecheval.tasks.publish import materialize
from hf_mecheval.training.callbacks import RestorationCallback
from hf_mecheval.training.data import PaddingCollator


@pytest.fixture(scope="module")
def atr(tmp_path_factory):
    root = tmp_path_factory.mktemp("user")
    folder = materialize(["atr_easy"], root / "data", train_size=64, eval_size=24, seed=0, progress=False)
    return datasets.load_dataset(str(folder), "atr_easy", cache_dir=str(root / "cache"))


def model_for(task="atr_easy"):
    torch.manual_seed(0)
    return build_model("based", vocab_size=build_task(task).vocab_size, hidden_size=16, feature_dim=4)


def trainer_for(model, atr, tmp_path, **args):
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=8,
                             report_to="none", save_strategy="no", logging_steps=2, disable_tqdm=True,
                             use_cpu=True, **args)
    return Trainer(model=model, args=args, train_dataset=atr["train"], data_collator=PaddingCollator())


def test_padding_collator_gives_each_document_its_own_loss(atr):
    model = model_for().double().eval()
    docs = [atr["validation"][i] for i in range(6)]
    assert len({len(d["input_ids"]) for d in docs}) > 1                     # ATR: lengths differ
    batch = PaddingCollator()(docs)
    width = max(len(d["input_ids"]) for d in docs)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (6, width)
    with torch.no_grad():
        loss = model(**batch).loss
        alone = [model(input_ids=torch.tensor([d["input_ids"]]), labels=torch.tensor([d["labels"]])).loss
                 for d in docs]
    torch.testing.assert_close(loss, torch.stack(alone).mean())


def test_restoration_callback_in_a_users_trainer_logs_through_trainer_log(atr, tmp_path, capsys):
    trainer = trainer_for(model_for(), atr, tmp_path)
    seen = []

    class Reporter(TrainerCallback):          # what a report_to integration receives
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(dict(logs))

    trainer.add_callback(Reporter())
    trainer.add_callback(RestorationCallback(trainer, "atr_easy", atr["validation"].select(range(16)),
                                             every_n_steps=2))
    trainer.train()
    measured = [e for e in trainer.state.log_history if "restoration_accuracy" in e]
    assert [e["step"] for e in measured] == [2, 4]
    # the Trainer's own entries at the same steps are still written
    own = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["step"] for e in own] == [2, 4] and all("grad_norm" in e and "learning_rate" in e for e in own)
    assert sum("restoration_accuracy" in logs for logs in seen) == 2
    assert "restoration_accuracy" in capsys.readouterr().out                 # the console
    assert (tmp_path / "out" / "restoration_history.json").exists()


def test_restoration_callback_checks_everything_when_made(atr, tmp_path):
    trainer = trainer_for(model_for(), atr, tmp_path)
    validation = atr["validation"].select(range(8))
    with pytest.raises(MechEvalError, match="every_n_steps"):
        RestorationCallback(trainer, "atr_easy", validation, every_n_steps=0)
    with pytest.raises(MechEvalError, match="key_pos"):
        RestorationCallback(trainer, "atr_easy", validation.remove_columns(["key_pos"]))
    ar_docs = build_task("ar_32").dataset(8, "validation")
    with pytest.raises(MechEvalError, match="another task"):
        RestorationCallback(trainer, "atr_easy", ar_docs)
    with pytest.raises(MechEvalError, match="not built for this task"):
        RestorationCallback(trainer_for(model_for("ar_32"), atr, tmp_path), "atr_easy", validation)
    with pytest.raises(MechEvalError, match="at least one document"):
        RestorationCallback(trainer, "atr_easy", validation.select([]))
