"""Materialise presets as a Hub-style dataset folder: parquet per (preset, split) plus a dataset
card whose ``configs:`` YAML lets ``datasets.load_dataset(folder, "atr_easy")`` read it offline —
and the same folder, uploaded, serves ``load_dataset("<owner>/<name>", "atr_easy")``.

Layout::

    FOLDER/README.md                                            the card, for every preset in FOLDER
    FOLDER/<preset>/{train,validation,test}-00000-of-00001.parquet
    FOLDER/<preset>/card.json                                   that preset's section of the card
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from ..errors import MechEvalError
from ..io_utils import write_parquet_atomic, write_text_atomic
from .base import GENERATOR_VERSION
from .presets import get_preset, build_task
from .seeding import SPLITS
from .stats import task_statistics


def split_file(preset: str, split: str) -> str:
    return f"{preset}/{split}-00000-of-00001.parquet"


def materialize(
    presets: list[str],
    folder: str | Path,
    train_size: int | None = None,
    eval_size: int | None = None,
    seed: int = 0,
    grammar_seed: int | None = None,
    overwrite: bool = False,
    workers: int = 1,
    progress: bool = True,
) -> Path:
    """Write every split of every preset, then the dataset card, which lists every preset in the
    folder (those published here earlier too: each preset keeps what its card section says in
    ``<preset>/card.json``); returns the folder. A README.md that this command did not write is
    replaced only with ``overwrite``."""
    from tqdm.auto import tqdm

    folder = Path(folder)
    card_path = folder / "README.md"
    if card_path.exists() and not overwrite and not _is_our_card(card_path):
        raise MechEvalError(f"{card_path} exists and is not a card written by mecheval data publish; "
                            "pass --overwrite to replace it")
    tasks = {}
    for name in presets:
        preset = get_preset(name)
        tasks[name] = build_task(name, **({} if grammar_seed is None or preset.task != "atr" else {"grammar_seed": grammar_seed}))
        for split in SPLITS:
            if (folder / split_file(name, split)).exists() and not overwrite:
                raise MechEvalError(f"{folder / split_file(name, split)} already exists; pass --overwrite to replace it")
    for name, task in tasks.items():
        preset = get_preset(name)
        sizes = {
            "train": preset.train_size if train_size is None else train_size,
            "validation": preset.eval_size if eval_size is None else eval_size,
            "test": preset.eval_size if eval_size is None else eval_size,
        }
        split_stats = {}
        for split in tqdm(SPLITS, desc=name, disable=not progress):
            data = task.generate(sizes[split], split, seed, workers)
            write_parquet_atomic(data.to_arrow(), folder / split_file(name, split), overwrite=overwrite)
            split_stats[split] = task_statistics(data) if len(data) else {}
        entry = {"preset": name, "description": preset.description, "generator_version": GENERATOR_VERSION,
                 "seed": seed, "grammar_seed": getattr(task.config, "grammar_seed", None),
                 "vocab_size": task.vocab_size, "config": task.config.to_dict(), "sizes": sizes, "stats": split_stats}
        write_text_atomic(folder / name / CARD_ENTRY, json.dumps(entry, indent=2) + "\n", overwrite=True)
    write_text_atomic(card_path, dataset_card(_card_entries(folder, presets)), overwrite=True)
    return folder


CARD_ENTRY = "card.json"


def _is_our_card(path: Path) -> bool:
    text = path.read_text(errors="replace")
    if not text.startswith("---"):
        return False
    try:
        meta = yaml.safe_load(text.split("---")[1])
    except yaml.YAMLError:
        return False
    return isinstance(meta, dict) and "hf-mecheval" in (meta.get("tags") or [])


def _card_entries(folder: Path, first: list[str]) -> list[dict]:
    """The card sections of every preset with all its splits in the folder: ``first`` in order,
    then the others by name."""
    entries = {}
    for path in sorted(folder.glob(f"*/{CARD_ENTRY}")):
        name = path.parent.name
        if not all((folder / split_file(name, split)).exists() for split in SPLITS):
            continue
        try:
            entries[name] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            raise MechEvalError(f"{path} is damaged; publish {name} again with --overwrite") from None
    order = [n for n in first if n in entries] + sorted(n for n in entries if n not in first)
    return [entries[n] for n in order]


def regenerate_command(preset: str, seed: int, grammar_seed: int | None) -> str:
    """The ``mecheval data generate`` command that writes one split of this data again."""
    return (f"mecheval data generate {preset} --split SPLIT -n N --seed {seed}"
            + ("" if grammar_seed is None else f" --grammar-seed {grammar_seed}") + " --out FILE.parquet")


# the Hub's size categories (dataset cards' `size_categories`): upper bounds and names
SIZE_CATEGORIES = [(10**3, "n<1K"), (10**4, "1K<n<10K"), (10**5, "10K<n<100K"), (10**6, "100K<n<1M"),
                   (10**7, "1M<n<10M"), (10**8, "10M<n<100M"), (10**9, "100M<n<1B"), (10**10, "1B<n<10B"),
                   (10**11, "10B<n<100B"), (10**12, "100B<n<1T")]


def size_category(rows: int) -> str:
    """The Hub's size category of a dataset of ``rows`` rows (its largest configuration here)."""
    return next((name for bound, name in SIZE_CATEGORIES if rows < bound), "n>1T")


def dataset_card(entries: list[dict]) -> str:
    """README.md with the ``configs:`` YAML that ``load_dataset(folder, preset)`` reads; ``entries``
    as written to ``<preset>/card.json``."""
    configs = [
        {
            "config_name": e["preset"],
            "data_files": [{"split": s, "path": f"{e['preset']}/{s}-*.parquet"} for s in SPLITS],
            **({"default": True} if i == 0 else {}),
        }
        for i, e in enumerate(entries)
    ]
    tasks = sorted({get_preset(e["preset"]).task for e in entries})
    meta = {
        "license": "apache-2.0",
        "pretty_name": "hf-mecheval " + " / ".join(t.upper() for t in tasks),
        "task_categories": ["text-generation"],
        "tags": ["synthetic", "mechanistic-interpretability", "hf-mecheval"]
        + (["associative-recall"] if "ar" in tasks else []) + (["associative-treecall", "pcfg"] if "atr" in tasks else []),
        "size_categories": [size_category(max(sum(e["sizes"].values()) for e in entries))],
        "configs": configs,
    }
    lines = ["---", yaml.safe_dump(meta, sort_keys=False).rstrip(), "---", ""]
    lines += [
        f"# {meta['pretty_name']}",
        "",
        "Synthetic in-context retrieval data made by hf-mecheval. Regenerate any split byte for byte with",
        "the command given under its configuration below.",
        "",
        "Each row is one document. Token ids: PAD=0, BOS=1, EOS=2. Columns: `input_ids`; `labels` "
        "(-100 except the answer token: the loss is on the answer only); `answer`; positions `key_pos` "
        "(the cue in the context), `value_pos` (the answer in the context), `divider_pos` (the EOS before "
        "the query), `query_pos` (where the answer is predicted) and `answer_pos`; plus task metadata "
        "(`num_pairs` for AR; `tree_parent` for ATR: each token's tree parent position, -1 for none).",
        "",
        "```python",
        "from datasets import load_dataset",
        f"ds = load_dataset(\"path/or/repo\", \"{entries[0]['preset']}\")",
        "```",
        "",
    ]
    for e in entries:
        lines += [f"## `{e['preset']}`", "", e["description"], "",
                  f"- vocabulary size: {e['vocab_size']}",
                  "- sizes: " + ", ".join(f"{s} {n}" for s, n in e["sizes"].items()),
                  f"- data seed {e['seed']}, generator version {e['generator_version']}",
                  f"- regenerate a split: `{regenerate_command(e['preset'], e['seed'], e['grammar_seed'])}`",
                  f"- configuration: `{json.dumps(e['config'])}`", ""]
        stats = {s: v for s, v in e["stats"].items() if v}
        if stats:
            keys = list(next(iter(stats.values())))
            lines += ["| statistic | " + " | ".join(stats) + " |", "|---" * (len(stats) + 1) + "|"]
            lines += [f"| {k} | " + " | ".join(f"{stats[s][k]:.4g}" for s in stats) + " |" for k in keys]
            lines.append("")
    return "\n".join(lines) + "\n"


def push_to_hub(folder: str | Path, repo_id: str, private: bool = False) -> str:
    """Upload a materialised folder as a dataset repository."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="dataset")
    return f"https://huggingface.co/datasets/{repo_id}"
