"""Output files and folders: atomic writes with the umask's mode, no clobbering, one writer per
output, all-or-nothing publishing, temporaries never uploaded, Arrow tables of any size."""
import fcntl
import json
import os
import stat
from pathlib import Path

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest

from hf_mecheval.cli import main as mecheval
from hf_mecheval.errors import MechEvalError
from hf_mecheval.atomic_files import atomic_path, write_text_atomic
from hf_mecheval.tasks import TaskData, build_task
from hf_mecheval.tasks.publish import materialize, push_to_hub


@pytest.fixture
def umask():
    def set_umask(mask):
        os.umask(mask)
    old = os.umask(0o022)
    yield set_umask
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_writes_respect_the_umask_and_keep_a_files_mode(tmp_path, umask):
    write_text_atomic(tmp_path / "a.txt", "a")
    assert mode(tmp_path / "a.txt") == 0o644
    umask(0o077)
    write_text_atomic(tmp_path / "b.txt", "b")
    assert mode(tmp_path / "b.txt") == 0o600
    umask(0o022)
    os.chmod(tmp_path / "a.txt", 0o640)              # a document whose mode its owner chose
    write_text_atomic(tmp_path / "a.txt", "again", overwrite=True)
    assert mode(tmp_path / "a.txt") == 0o640 and (tmp_path / "a.txt").read_text() == "again"
    folder = materialize(["ar_32"], tmp_path / "pub", train_size=8, eval_size=4, progress=False)
    assert {mode(p) for p in folder.rglob("*") if p.is_file()} == {0o644}


def test_a_file_that_appears_meanwhile_is_not_clobbered(tmp_path):
    target = tmp_path / "out.txt"
    with pytest.raises(MechEvalError, match="already exists"):
        with atomic_path(target) as tmp:
            tmp.write_text("new")
            target.write_text("someone else's")
    assert target.read_text() == "someone else's" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_two_writers_of_one_parquet_file(tmp_path, capsys):
    out = tmp_path / "same.parquet"
    with open(tmp_path / ".same.parquet.lock", "w") as held:     # another `data generate` at work
        fcntl.flock(held, fcntl.LOCK_EX)
        assert mecheval(["data", "generate", "ar_32", "-n", "8", "--out", str(out)]) == 2
        assert "in use by another mecheval process" in capsys.readouterr().err
    assert not out.exists()
    assert mecheval(["data", "generate", "ar_32", "-n", "8", "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same.parquet"]      # the lock file is gone
    assert mecheval(["data", "generate", "ar_32", "-n", "8", "--seed", "1", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_an_interrupted_publish_leaves_the_previous_data_whole(tmp_path, monkeypatch):
    folder = materialize(["ar_32"], tmp_path / "pub", train_size=16, eval_size=8, seed=0, progress=False)
    before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    from hf_mecheval.tasks import base

    real = base.Task.generate

    def fail_on_validation(self, n, split="train", seed=0, workers=1):
        if split == "validation":
            raise KeyboardInterrupt           # a kill after the new train split was written
        return real(self, n, split, seed, workers)

    monkeypatch.setattr(base.Task, "generate", fail_on_validation)
    with pytest.raises(KeyboardInterrupt):
        materialize(["ar_32"], folder, train_size=16, eval_size=8, seed=1, overwrite=True, progress=False)
    after = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert after == before
    # a kill leaves no clean-up: a stale staged folder is ignored by load_dataset, removed by the
    # next publish, and never uploaded
    monkeypatch.setattr(base.Task, "generate", real)
    stale = folder / ".ar_32.0123abcd.tmp"
    stale.mkdir()
    (stale / "train-00000-of-00001.parquet").write_bytes(b"half")
    (folder / "ar_32" / ".card.json.0a1b2c3d.tmp").write_text("{")
    uploaded = []

    class FakeApi:
        def upload_folder(self, folder_path, repo_id, repo_type, allow_patterns, ignore_patterns):
            import fnmatch
            for path in Path(folder_path).rglob("*"):
                rel = str(path.relative_to(folder_path))
                if path.is_file() and not any(fnmatch.fnmatch(rel, p) for p in ignore_patterns):
                    uploaded.append(rel)

    push_to_hub(folder, "me/data", api=FakeApi())
    assert sorted(uploaded) == sorted(str(p) for p in before)
    train = datasets.load_dataset(str(folder), "ar_32", split="train", cache_dir=str(tmp_path / "cache"))
    assert train.to_list() == build_task("ar_32").generate(16, "train", 0).to_dataset().to_list()
    materialize(["ar_32"], folder, train_size=16, eval_size=8, seed=1, overwrite=True, progress=False)
    assert not stale.exists() and not (folder / "ar_32" / ".card.json.0a1b2c3d.tmp").exists()
    assert json.loads((folder / "ar_32" / "card.json").read_text())["seed"] == 1
    # the card loads from where the folder goes: the Hub repository named, else a path in words
    assert 'load_dataset("path/or/repo", "ar_32")' in (folder / "README.md").read_text()
    materialize(["ar_32"], folder, train_size=16, eval_size=8, overwrite=True, progress=False, repo_id="me/data")
    assert 'load_dataset("me/data", "ar_32")' in (folder / "README.md").read_text()


def test_publish_never_replaces_a_preset_folder_with_other_files(tmp_path):
    folder = materialize(["ar_32"], tmp_path / "pub", train_size=8, eval_size=4, progress=False)
    (folder / "ar_32" / "notes.md").write_text("mine")
    with pytest.raises(MechEvalError, match="notes.md"):
        materialize(["ar_32"], folder, train_size=8, eval_size=4, overwrite=True, progress=False)
    assert (folder / "ar_32" / "notes.md").read_text() == "mine"


def test_publish_is_refused_while_another_writes_the_folder(tmp_path):
    from hf_mecheval.locks import locked_folder

    with locked_folder(tmp_path / "pub"):
        pid = os.fork()
        if pid == 0:                              # another process
            try:
                materialize(["ar_32"], tmp_path / "pub", train_size=8, eval_size=4, progress=False)
                os._exit(0)
            except MechEvalError as exc:
                os._exit(3 if "in use" in str(exc) else 4)
            except BaseException:
                os._exit(5)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 3
        assert list((tmp_path / "pub").iterdir()) == []


def test_arrow_tables_are_chunked_below_the_list_offset_limit(tmp_path, monkeypatch):
    from hf_mecheval.tasks import data as data_module

    # the real limit (2^31 - 1 tokens, ~58 M ar_32 documents) on offsets alone
    offsets = np.arange(0, 37 * 60_000_000 + 1, 37, dtype=np.int64)
    bounds = data_module.chunk_bounds(offsets, data_module.MAX_LIST_TOKENS)
    assert len(bounds) == 2 and bounds[0][0] == 0 and bounds[-1][1] == 60_000_000
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert all(offsets[hi] - offsets[lo] <= 2**31 - 1 for lo, hi in bounds)
    # the same on real data with a small limit
    data = build_task("atr_easy").generate(200, "train", 0)
    whole = data.to_arrow()
    monkeypatch.setattr(data_module, "MAX_LIST_TOKENS", 300)
    table = data.to_arrow()
    assert table.column("input_ids").num_chunks > 3 and table.equals(whole) and table.schema == whole.schema
    back = TaskData.from_arrow(table)
    assert np.array_equal(back.tokens, data.tokens) and np.array_equal(back.offsets, data.offsets)
    assert np.array_equal(back.token_columns["tree_parent"], data.token_columns["tree_parent"])
    pq.write_table(table, tmp_path / "train.parquet")
    loaded = datasets.load_dataset("parquet", data_files=str(tmp_path / "train.parquet"), split="train",
                                   cache_dir=str(tmp_path / "cache"))
    assert loaded.features == data.features()
    assert loaded[150]["input_ids"] == data.document(150)["input_ids"]
    assert data.to_dataset()[199]["labels"] == data.document(199)["labels"]


def test_multi_query_arrow_tables_are_chunked_with_their_query_lists(monkeypatch):
    from hf_mecheval.tasks import data as data_module

    data = build_task("mqar_cpu").generate(100, "test", 0)         # documents of 64 to 256 tokens
    whole = data.to_arrow()
    monkeypatch.setattr(data_module, "MAX_LIST_TOKENS", 1000)
    table = data.to_arrow()
    assert table.column("answer_pos").num_chunks > 10 and table.equals(whole)
    back = TaskData.from_arrow(table)
    assert np.array_equal(back.query_offsets, data.query_offsets)
    assert all(np.array_equal(back.query_columns[k], data.query_columns[k]) for k in data.query_columns)
    assert np.array_equal(back.labels(), data.labels())


def test_a_device_or_fifo_is_never_replaced_by_a_file(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for target in (fifo, Path(os.devnull)):
        assert mecheval(["data", "generate", "ar_32", "-n", "4", "--out", str(target), "--overwrite"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "not a regular file" in err[0], err
        with pytest.raises(MechEvalError, match="not a regular file"):
            write_text_atomic(target, "x", overwrite=True)
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and stat.S_ISCHR(os.lstat(os.devnull).st_mode)


def _published(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_multi_preset_publish_is_one_swap(tmp_path, monkeypatch):
    """Killed at the swap, the folder is all old (both presets and the card); a publish of one
    preset keeps the other one's files and its card section."""
    from hf_mecheval.tasks import publish

    folder = materialize(["ar_32", "atr_easy"], tmp_path / "pub", train_size=8, eval_size=4, seed=0, progress=False)
    before = _published(folder)

    def killed(a, b):
        raise KeyboardInterrupt

    monkeypatch.setattr(publish, "_exchange", killed)
    with pytest.raises(KeyboardInterrupt):
        materialize(["ar_32", "atr_easy"], folder, train_size=8, eval_size=4, seed=1, overwrite=True, progress=False)
    assert _published(folder) == before
    assert not list(tmp_path.glob(".pub.*.tmp"))          # the staged folder went with the failure
    monkeypatch.undo()
    materialize(["ar_32"], folder, train_size=8, eval_size=4, seed=1, overwrite=True, progress=False)
    after = _published(folder)
    assert {k: v for k, v in after.items() if k.startswith("atr_easy/")} == \
        {k: v for k, v in before.items() if k.startswith("atr_easy/")}
    assert json.loads(after["ar_32/card.json"])["seed"] == 1 and "atr_easy" in after["README.md"].decode()


def test_a_publish_killed_between_two_renames_is_put_back_by_the_next(tmp_path, monkeypatch):
    """Where the atomic exchange is missing: killed after the previous folder was moved aside,
    the next publish puts it back first, and a stranger's temporary beside it is left alone."""
    from hf_mecheval.tasks import publish

    folder = materialize(["ar_32", "atr_easy"], tmp_path / "pub", train_size=8, eval_size=4, seed=0, progress=False)
    before = _published(folder)
    stranger = tmp_path / ".pub.0123abcd.tmp"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("not publish's")
    monkeypatch.setattr(publish, "_exchange", lambda a, b: False)
    real_rename, calls = os.rename, []

    def rename(a, b):
        calls.append((a, b))
        if len(calls) == 2:                   # the stage would go in place of the folder now
            raise KeyboardInterrupt
        real_rename(a, b)

    monkeypatch.setattr(publish.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        materialize(["ar_32"], folder, train_size=8, eval_size=4, seed=1, overwrite=True, progress=False)
    assert not folder.exists() or not any(folder.iterdir())     # the previous data sits aside
    monkeypatch.setattr(publish.os, "rename", real_rename)
    materialize(["ar_32"], folder, train_size=8, eval_size=4, seed=1, overwrite=True, progress=False)
    after = _published(folder)
    assert {k: v for k, v in after.items() if k.startswith("atr_easy/")} == \
        {k: v for k, v in before.items() if k.startswith("atr_easy/")}
    assert json.loads(after["ar_32/card.json"])["seed"] == 1
    assert (stranger / "keep.txt").read_text() == "not publish's"


def test_publish_refuses_a_folder_with_other_files_or_the_current_one(tmp_path, monkeypatch):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.md").write_text("mine")
    with pytest.raises(MechEvalError, match="notes.md, which mecheval data publish does not write"):
        materialize(["ar_32"], tmp_path / "mine", train_size=8, eval_size=4, overwrite=True, progress=False)
    monkeypatch.chdir(tmp_path / "mine")
    with pytest.raises(MechEvalError, match="holds the current folder"):
        materialize(["ar_32"], ".", train_size=8, eval_size=4, overwrite=True, progress=False)
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.md"]


@pytest.mark.parametrize("kill_at", [1, 2, 3, 4])
def test_a_publish_killed_at_any_step_of_the_two_renames_leaves_one_whole_folder_and_no_copy(tmp_path, monkeypatch,
                                                                                              kill_at):
    """Where the atomic exchange is missing, a kill at each step of the swap (before the first
    rename, between the two, after the second, before the previous copy is cleared): the next
    publish finishes or undoes it, leaves one whole folder at the name, and no copy beside it."""
    from hf_mecheval.tasks import publish

    folder = materialize(["ar_32"], tmp_path / "pub", train_size=8, eval_size=4, seed=0, progress=False)
    monkeypatch.setattr(publish, "_exchange", lambda a, b: False)
    real_rename, real_unlink, steps = os.rename, Path.unlink, []

    def step(kind, real):
        def wrapped(*args, **kwargs):
            steps.append(kind)
            if len(steps) == kill_at:
                raise KeyboardInterrupt
            return real(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(publish.os, "rename", step("rename", real_rename))
    monkeypatch.setattr(publish.Path, "unlink", step("unlink", real_unlink))
    with pytest.raises(KeyboardInterrupt):
        materialize(["ar_32"], folder, train_size=8, eval_size=4, seed=1, overwrite=True, progress=False)
    monkeypatch.setattr(publish.os, "rename", real_rename)
    monkeypatch.setattr(publish.Path, "unlink", real_unlink)
    materialize(["ar_32"], folder, train_size=8, eval_size=4, seed=2, overwrite=True, progress=False)
    assert json.loads((folder / "ar_32" / "card.json").read_text())["seed"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pub"], "a copy was left beside the folder"
    assert not (folder / publish.STAGE_MARK).exists()


def test_publishing_through_a_link_replaces_the_folder_it_points_to(tmp_path):
    """--out LINK: the folder the link points to is replaced (atomically), the link stays a link
    to it, and nothing is left beside either."""
    real = materialize(["ar_32"], tmp_path / "real", train_size=8, eval_size=4, seed=0, progress=False)
    (tmp_path / "link").symlink_to(real)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert mecheval(["data", "publish", "ar_32", "--out", str(tmp_path / "link"), "--train-size", "8", "--eval-size", "4",
                 "--seed", "1", "--overwrite"]) == 0
    assert (tmp_path / "link").is_symlink() and (tmp_path / "link").resolve() == real
    assert json.loads((real / "ar_32" / "card.json").read_text())["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "link", "real"]
    assert mecheval(["data", "publish", "ar_32", "--out", str(tmp_path / "dangling"), "--train-size", "8",
                 "--eval-size", "4", "--overwrite"]) == 2
    assert not (tmp_path / "nowhere").exists() and (tmp_path / "dangling").is_symlink()


def test_publish_over_planted_links_changes_nothing_outside(tmp_path):
    """A dataset folder whose split files are links out of it, and links named like publish's
    own temporaries and marked as its copies: --overwrite replaces the links (never writes through
    them) and leaves the planted temporaries alone; the files they point to stay as they were."""
    from hf_mecheval.tasks.publish import STAGE_MARK

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.parquet").write_text("precious")
    (outside / STAGE_MARK).write_text(json.dumps({"role": "stage"}))
    folder = materialize(["ar_32"], tmp_path / "pub", train_size=8, eval_size=4, seed=0, progress=False)
    split = folder / "ar_32" / "train-00000-of-00001.parquet"
    split.unlink()
    split.symlink_to(outside / "precious.parquet")
    (tmp_path / ".pub.0123abcd.tmp").symlink_to(outside)
    materialize(["ar_32"], folder, train_size=8, eval_size=4, seed=1, overwrite=True, progress=False)
    assert (outside / "precious.parquet").read_text() == "precious" and (outside / STAGE_MARK).is_file()
    assert (tmp_path / ".pub.0123abcd.tmp").is_symlink() and not split.is_symlink()
    assert json.loads((folder / "ar_32" / "card.json").read_text())["seed"] == 1
