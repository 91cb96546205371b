"""The datasets builders and the published parquet folder, all offline."""
import datasets
import numpy as np
import pytest

from hf_mecheval.errors import MechEvalError
from hf_mecheval.tasks import build_task
from hf_mecheval.tasks.builders import ARBuilder, ATRBuilder, MQARBuilder
from hf_mecheval.tasks.publish import materialize


def test_builder_matches_direct_generation(tmp_path):
    builder = ATRBuilder(config_name="atr_gen", train_size=300, eval_size=50, seed=4, cache_dir=str(tmp_path))
    builder.download_and_prepare()
    ds = builder.as_dataset()
    assert {k: len(v) for k, v in ds.items()} == {"train": 300, "validation": 50, "test": 50}
    task = build_task("atr_gen")
    for split in ("train", "test"):
        direct = task.dataset(len(ds[split]), split, seed=4)
        assert ds[split].features == direct.features
        assert ds[split][:] == direct[:]
    assert ds["train"].features["input_ids"] == datasets.List(datasets.Value("int32"))


def test_builder_configs_cover_the_presets():
    assert [c.name for c in ARBuilder.BUILDER_CONFIGS] == ["ar_32", "ar_32_value_first", "ar_32_gen"]
    assert [c.name for c in ATRBuilder.BUILDER_CONFIGS] == ["atr_easy", "atr_medium", "atr_8192", "atr_gen",
                                                            "atr_sibling"]
    assert [c.name for c in MQARBuilder.BUILDER_CONFIGS] == ["mqar", "mqar_cpu", "mqar_64_4", "mqar_128_8",
                                                             "mqar_256_16"]


def test_mqar_builder_and_published_folder(tmp_path):
    builder = MQARBuilder(config_name="mqar_cpu", train_size=30, eval_size=12, seed=3, cache_dir=str(tmp_path))
    builder.download_and_prepare()
    built = builder.as_dataset()
    task = build_task("mqar_cpu")
    want = task.dataset(12, "test", seed=3)
    assert built["test"].features == want.features and built["test"][:] == want[:]
    assert built["train"].features["answer_pos"] == datasets.List(datasets.Value("int32"))
    folder = materialize(["mqar_cpu"], tmp_path / "pub", train_size=30, eval_size=12, seed=3, progress=False)
    card = (folder / "README.md").read_text()
    assert "multi-query-associative-recall" in card and "one entry per query" in card
    assert "queries_per_document_mean" in card
    ds = datasets.load_dataset(str(folder), "mqar_cpu", cache_dir=str(tmp_path / "cache"))
    assert ds["test"][:] == want[:]
    for row in ds["train"]:
        labels = np.array(row["labels"])
        assert (labels != -100).sum() == row["num_pairs"] == len(row["answer"])
        assert labels[row["answer_pos"]].tolist() == row["answer"]


def test_builder_grammar_seed(tmp_path):
    b = ATRBuilder(config_name="atr_easy", train_size=20, eval_size=5, grammar_seed=3, cache_dir=str(tmp_path))
    b.download_and_prepare()
    got = b.as_dataset(split="train")[:]["input_ids"]
    want = build_task("atr_easy", grammar_seed=3).dataset(20)[:]["input_ids"]
    assert got == want


def test_published_folder_loads_with_load_dataset(tmp_path):
    folder = materialize(["ar_32", "atr_easy"], tmp_path / "pub", train_size=200, eval_size=40, seed=2,
                         progress=False)
    card = (folder / "README.md").read_text()
    assert "config_name: atr_easy" in card and "path: atr_easy/train-*.parquet" in card
    assert "size_categories:\n- n<1K\n" in card                # 280 rows per configuration
    for preset in ("ar_32", "atr_easy"):
        ds = datasets.load_dataset(str(folder), preset, cache_dir=str(tmp_path / "cache"))
        assert set(ds) == {"train", "validation", "test"}
        want = build_task(preset).dataset(40, "validation", seed=2)
        assert ds["validation"][:] == want[:]
        labels = np.array(ds["train"][0]["labels"])
        assert (labels != -100).sum() == 1
    # never overwrite without being asked
    with pytest.raises(MechEvalError, match="already exists"):
        materialize(["atr_easy"], folder, train_size=10, eval_size=10, progress=False)


def test_dataset_scripts_materialise_every_preset_of_a_task(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "dataset_scripts" / "ar" / "materialize.py"
    proc = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "ar"), "--train-size", "20",
                           "--eval-size", "5"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for preset in ("ar_32", "ar_32_value_first", "ar_32_gen"):
        ds = datasets.load_dataset(str(tmp_path / "ar"), preset, cache_dir=str(tmp_path / "cache"))
        assert len(ds["train"]) == 20 and len(ds["test"]) == 5
        # each preset's own documents (seed 0), not one preset's written under three names
        assert ds["test"].to_list() == build_task(preset).generate(5, "test", 0).to_dataset().to_list()


def test_dataset_card_command_regenerates_a_split_byte_for_byte(tmp_path):
    import re
    import shlex

    from hf_mecheval.cli import main

    folder = materialize(["ar_32", "atr_easy"], tmp_path / "pub", train_size=30, eval_size=10, seed=5,
                         grammar_seed=3, progress=False)
    card = (folder / "README.md").read_text()
    commands = dict(re.findall(r"regenerate a split: `(mecheval data generate (\S+) [^`]*)`", card)[i][::-1]
                    for i in range(2))
    assert "--grammar-seed 3" in commands["atr_easy"] and "--grammar-seed" not in commands["ar_32"]
    for preset, command in commands.items():
        out = tmp_path / f"{preset}.parquet"
        argv = shlex.split(command.replace("SPLIT", "test").replace("-n N", "-n 10").replace("FILE.parquet", str(out)))
        assert main(argv[1:]) == 0
        assert out.read_bytes() == (folder / preset / "test-00000-of-00001.parquet").read_bytes()


def test_publishing_more_presets_keeps_the_card_whole_and_never_replaces_a_foreign_readme(tmp_path):
    folder = tmp_path / "pub"
    folder.mkdir()
    (folder / "README.md").write_text("my own notes\n")
    with pytest.raises(MechEvalError, match="not a card written by"):
        materialize(["ar_32"], folder, train_size=8, eval_size=4, progress=False)
    assert (folder / "README.md").read_text() == "my own notes\n" and not (folder / "ar_32").exists()
    (folder / "README.md").unlink()
    materialize(["ar_32"], folder, train_size=8, eval_size=4, progress=False)
    materialize(["atr_easy"], folder, train_size=8, eval_size=4, seed=3, progress=False)   # a second call
    for preset in ("ar_32", "atr_easy"):
        assert len(datasets.load_dataset(str(folder), preset, split="train")) == 8
    card = (folder / "README.md").read_text()
    assert "## `ar_32`" in card and "## `atr_easy`" in card and "--seed 3 --grammar-seed 0" in card


def test_size_categories_are_the_hubs():
    from hf_mecheval.tasks.publish import size_category

    assert [size_category(n) for n in (999, 1_000, 50_000, 102_080, 120_064, 10**6, 10**13)] == [
        "n<1K", "1K<n<10K", "10K<n<100K", "100K<n<1M", "100K<n<1M", "1M<n<10M", "n>1T"]
