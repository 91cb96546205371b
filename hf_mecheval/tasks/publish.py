"""Materialise presets as a Hub-style dataset folder: parquet per (preset, split) plus a dataset
card whose ``configs:`` YAML lets ``datasets.load_dataset(folder, "atr_easy")`` read it offline —
and the same folder, uploaded, serves ``load_dataset("<owner>/<name>", "atr_easy")``.

Layout::

    FOLDER/README.md                                            the card, for every preset in FOLDER
    FOLDER/<preset>/{train,validation,test}-00000-of-00001.parquet
    FOLDER/<preset>/card.json                                   that preset's section of the card

Publishing is all or nothing: the whole new folder (presets published earlier and not now
hard-linked in, the new ones generated, the card) is staged beside it (``.FOLDER.XXXXXXXX.tmp``)
and swapped in at once (Linux's atomic RENAME_EXCHANGE; elsewhere two renames, see
``_swap_folders``). An interrupted publish leaves the previous data whole, never splits of two
publishes, and a card that describes exactly the data beside it. The dataset folder holds only
what publish writes (anything else is refused), and only the staged folders publish marks as its
own are ever removed (never through a link). The folder is locked while it is written, so two
publishes never mix either. A folder named through a symbolic link is published where the link
points: the folder there is replaced, atomically, and the link stays as it was.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml

from ..errors import MechEvalError
from ..atomic_files import is_temporary, temporary_beside, write_parquet_atomic, write_text_atomic
from ..locks import locked_folder
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
    repo_id: str | None = None,
) -> Path:
    """Write every split of every preset, then the dataset card, which lists every preset in the
    folder (those published here earlier too: each preset keeps what its card section says in
    ``<preset>/card.json``); returns the folder. A README.md that this command did not write is
    replaced only with ``overwrite``; a preset folder holding anything else than what this
    command writes is never replaced. All or nothing (see the module docstring). ``repo_id``: the
    Hub repository the folder is pushed to, which the card's loading example names."""
    from tqdm.auto import tqdm

    folder = Path(folder)
    tasks, sizes = {}, {}
    for name in presets:                  # every value checked before the folder is touched
        preset = get_preset(name)
        tasks[name] = build_task(name, **({} if grammar_seed is None or preset.task != "atr" else {"grammar_seed": grammar_seed}))
        sizes[name] = {
            "train": preset.train_size if train_size is None else train_size,
            "validation": preset.eval_size if eval_size is None else eval_size,
            "test": preset.eval_size if eval_size is None else eval_size,
        }
        for n in set(sizes[name].values()):
            tasks[name].check_size(n)
    if folder.is_symlink():          # the folder it points to is replaced; the link stays a link
        if not folder.is_dir():
            raise MechEvalError(f"{folder} is a link to {os.readlink(folder)}, which is not a folder; publish into "
                                "a folder")
        folder = folder.resolve()
    if folder.resolve() == Path.cwd().resolve() or folder.resolve() in Path.cwd().resolve().parents:
        raise MechEvalError(f"{folder} holds the current folder; publish into a folder of its own")
    with locked_folder(folder):
        card_path = folder / "README.md"
        if card_path.exists() and not overwrite and not _is_our_card(card_path):
            raise MechEvalError(f"{card_path} exists and is not a card written by mecheval data publish; "
                                "pass --overwrite to replace it")
        _check_publish_folder(folder)
        for name in presets:
            _check_preset_folder(folder / name, name, overwrite)
        _recover(folder)
        stage = temporary_beside(folder)       # the whole new folder, swapped in at once
        try:
            stage.mkdir()
            write_text_atomic(stage / STAGE_MARK, json.dumps({"role": "stage"}) + "\n")
            for kept in sorted(folder.iterdir()):
                if _is_preset_folder(kept) and kept.name not in tasks:   # published earlier, not now: kept as it is
                    _link_copy(kept, stage / kept.name)
            for name, task in tasks.items():
                (stage / name).mkdir()
                split_stats = {}
                for split in tqdm(SPLITS, desc=name, disable=not progress):
                    data = task.generate(sizes[name][split], split, seed, workers)
                    write_parquet_atomic(data.to_arrow(), stage / split_file(name, split))
                    split_stats[split] = task_statistics(data) if len(data) else {}
                preset = get_preset(name)
                entry = {"preset": name, "description": preset.description, "generator_version": GENERATOR_VERSION,
                         "seed": seed, "grammar_seed": getattr(task.config, "grammar_seed", None),
                         "vocab_size": task.vocab_size, "config": task.config.to_dict(), "sizes": sizes[name],
                         "stats": split_stats}
                write_text_atomic(stage / name / CARD_ENTRY, json.dumps(entry, indent=2) + "\n")
            write_text_atomic(stage / "README.md", dataset_card(_card_entries(stage, presets), repo_id))
            _swap_folders(stage, folder)           # the stage now holds the previous data
        finally:
            if stage.exists() and not stage.is_symlink():
                shutil.rmtree(stage)
    return folder


STAGE_MARK = ".mecheval-publish.json"       # in a staged folder: which role the temporary plays


def _check_publish_folder(folder: Path) -> None:
    """The dataset folder holds only what publish writes (the card, preset folders, its
    temporaries): it is replaced as a whole."""
    foreign = sorted(p.name for p in folder.iterdir()
                     if not (p.name in ("README.md", STAGE_MARK) and p.is_file()) and not is_temporary(p.name)
                     and not _is_preset_folder(p))
    if foreign:
        raise MechEvalError(f"{folder} holds {', '.join(foreign[:3])}, which mecheval data publish does not write; "
                            "publish into a folder of its own")


def _is_preset_folder(path: Path) -> bool:
    from .presets import PRESETS

    return path.name in PRESETS and path.is_dir() and not path.is_symlink()


def _link_copy(source: Path, target: Path) -> None:
    """``target``: the files of ``source`` (a preset's folder), hard-linked where the file system
    allows (no data copied; the files are only ever replaced, never changed in place)."""
    target.mkdir()
    for path in source.iterdir():
        if is_temporary(path.name) or path.is_symlink() or not path.is_file():
            continue
        try:
            os.link(path, target / path.name)
        except OSError:
            shutil.copy2(path, target / path.name)


def _swap_folders(stage: Path, folder: Path) -> None:
    """Put ``stage`` in place of ``folder`` in one step where Linux allows (renameat2's
    RENAME_EXCHANGE: the two names trade places atomically, so a reader or a kill sees the old
    folder or the new one). Elsewhere two renames, each folder marked with its role until its
    rename is done, so that the next publish (``_recover``) finishes or undoes a swap a kill cut
    short, and removes the copy left over: a kill before the stage is renamed puts the previous
    folder back; one after keeps the new folder and removes the previous one. Between the two
    renames no folder stands at the name: POSIX renames replace only an empty folder and never
    exchange two, so without RENAME_EXCHANGE that window can be made short, not closed (closing it
    would need the dataset folder to be a link to versioned copies, which is not what a user hands
    ``load_dataset``)."""
    if _exchange(stage, folder):
        (folder / STAGE_MARK).unlink()
        return
    previous = temporary_beside(folder)
    write_text_atomic(folder / STAGE_MARK, json.dumps({"role": "previous"}) + "\n")
    os.rename(folder, previous)
    os.rename(stage, folder)                   # the new folder keeps its "stage" mark until here
    (folder / STAGE_MARK).unlink()
    os.rename(previous, stage)                 # removed by the caller, as the exchange leaves it


def _exchange(a: Path, b: Path) -> bool:
    import ctypes
    import errno

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):      # not on this kernel or file system
        return False
    raise OSError(code, os.strerror(code), str(b))


def _role(folder: Path) -> str | None:
    """The role publish marked ``folder`` with ("stage", "previous"), or None (never through a link)."""
    mark = folder / STAGE_MARK
    if folder.is_symlink() or not folder.is_dir() or mark.is_symlink() or not mark.is_file():
        return None
    try:
        role = json.loads(mark.read_text()).get("role")
    except (OSError, ValueError, AttributeError):
        return None
    return role if role in ("stage", "previous") else None


def _recover(folder: Path) -> None:
    """Before publishing, finish or undo what a killed publish left (see ``_swap_folders``): the
    folder's own mark is removed (a complete staged folder swapped in, or a previous one never
    moved); a previous folder is put back where the folder is empty, and removed where a new one
    stands; staged folders beside it are removed. Temporaries without a mark, and links, are left
    alone."""
    if _role(folder) is not None:
        (folder / STAGE_MARK).unlink()
    for candidate in sorted(folder.parent.glob(f".{folder.name}.*.tmp")):
        role = _role(candidate) if is_temporary(candidate.name) else None
        if role == "previous" and not any(folder.iterdir()):
            (candidate / STAGE_MARK).unlink()
            for entry in candidate.iterdir():
                os.rename(entry, folder / entry.name)
            candidate.rmdir()
        elif role is not None:
            shutil.rmtree(candidate)


def _check_preset_folder(path: Path, name: str, overwrite: bool) -> None:
    """A preset's folder may be replaced (with ``overwrite``) only if it holds what publish writes."""
    if not path.exists():
        return
    ours = {split_file(name, split).split("/", 1)[1] for split in SPLITS} | {CARD_ENTRY}
    if not path.is_dir() or path.is_symlink():
        raise MechEvalError(f"{path} is not a folder of {name}'s splits; move it away to publish {name} here")
    foreign = sorted(p.name for p in path.iterdir() if p.name not in ours and not is_temporary(p.name))
    if foreign:
        raise MechEvalError(f"{path} holds {', '.join(foreign[:3])}, which mecheval data publish does not write; "
                            f"move it away to publish {name} here")
    for split in SPLITS:
        if (path.parent / split_file(name, split)).exists() and not overwrite:
            raise MechEvalError(f"{path.parent / split_file(name, split)} already exists; pass --overwrite to "
                                "replace it")


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
        if is_temporary(name) or not all((folder / split_file(name, split)).exists() for split in SPLITS):
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


def dataset_card(entries: list[dict], repo_id: str | None = None) -> str:
    """README.md with the ``configs:`` YAML that ``load_dataset(folder, preset)`` reads; ``entries``
    as written to ``<preset>/card.json``; ``repo_id``: the Hub repository its example loads from
    (else the folder's path or a repository, in words)."""
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
        + (["associative-recall"] if "ar" in tasks else []) + (["associative-treecall", "pcfg"] if "atr" in tasks else [])
        + (["multi-query-associative-recall", "zoology"] if "mqar" in tasks else []),
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
    ]
    if "mqar" in tasks:
        lines += [
            "MQAR (multi-query associative recall, the layout and sampling rules of Zoology's `multiquery_ar`): a "
            "document is its key-value pairs (keys at even positions from 0, no BOS) then a query region where every "
            "key comes back once, at a slot drawn from a power law, among filler tokens; the model answers at each "
            "query. `answer`, `key_pos`, `value_pos`, `query_pos` and `answer_pos` are lists there, one entry per "
            "query in the order the queries occur (no `divider_pos`), `labels` carries every answer (at "
            "`answer_pos = query_pos + 1`; the input token there is filler, the value is never shown), and "
            "`num_pairs` and `seq_len` are the document's setting (Zoology's slices). Token ids: 3 is the blank, "
            "keys are 4 .. V/2 - 1, values V/2 .. V - 1; the filler is drawn uniformly from ids 3 .. V - 1 (the "
            "blank, keys and values: Zoology's `random_non_queries`), or is the blank alone in the presets whose "
            "`random_filler` is false (Zoology's single settings `mqar_64_4`, `mqar_128_8`, `mqar_256_16`).",
            "",
        ]
    lines += [
        "```python",
        "from datasets import load_dataset",
        f"ds = load_dataset(\"{repo_id or 'path/or/repo'}\", \"{entries[0]['preset']}\")",
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


def push_to_hub(folder: str | Path, repo_id: str, private: bool = False, api=None) -> str:
    """Upload a materialised folder as a dataset repository (``api``: from ``hub.create_repo``,
    which ``mecheval data publish`` calls before building anything). Temporaries left by an
    interrupted writer are never uploaded."""
    from ..hub import create_repo, upload_folder

    api = api or create_repo(repo_id, repo_type="dataset", private=private)
    upload_folder(api, folder, repo_id, repo_type="dataset")
    return f"https://huggingface.co/datasets/{repo_id}"
