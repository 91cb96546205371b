"""runs.code_version: the digest names the sources, the git state says where they came from."""
import hashlib
import subprocess

from hf_mecheval.runs.code_version import PACKAGE, code_version, git_state, source_digest, source_files


def write(folder, files):
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def test_digest_is_the_sources_by_hand(tmp_path):
    write(tmp_path, {"a.py": "x = 1\n", "models/k.cpp": "int f();\n", "notes.md": "not code", "sweeps/s.yaml": "a: 1"})
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.py").write_text("cached")      # never a source, whatever its name
    expected = hashlib.sha256()
    for name, data in (("a.py", b"x = 1\n"), ("models/k.cpp", b"int f();\n")):       # sorted by path
        expected.update(len(name).to_bytes(8, "little") + name.encode() + len(data).to_bytes(8, "little") + data)
    assert source_digest(tmp_path) == expected.hexdigest()[:16]
    assert [p.relative_to(tmp_path).as_posix() for p in source_files(tmp_path)] == ["a.py", "models/k.cpp"]


def test_digest_changes_with_any_source_and_not_with_docs(tmp_path):
    write(tmp_path, {"a.py": "x = 1\n", "b.h": "", "notes.md": "a"})
    first = source_digest(tmp_path)
    (tmp_path / "notes.md").write_text("b")
    assert source_digest(tmp_path) == first
    (tmp_path / "b.h").write_text(" ")
    assert source_digest(tmp_path) != first
    (tmp_path / "b.h").write_text("")
    (tmp_path / "b.h").rename(tmp_path / "c.h")                    # same bytes under another name
    assert source_digest(tmp_path) != first


def git(folder, *args):
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(folder), "PATH": "/usr/bin:/bin"})


def test_git_state(tmp_path):
    package = tmp_path / "repo" / "pkg"
    write(package, {"a.py": "x = 1\n", "sweeps/s.yaml": "a: 1"})
    assert git_state(package) == (None, None)                      # not a checkout
    git(tmp_path / "repo", "init", "-q")
    git(tmp_path / "repo", "add", ".")
    git(tmp_path / "repo", "commit", "-qm", "first")
    head = subprocess.run(["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert git_state(package) == (head, False)
    (package / "sweeps" / "s.yaml").write_text("a: 2")             # not a source
    (tmp_path / "repo" / "other.py").write_text("")                 # outside the package
    assert git_state(package) == (head, False)
    (package / "new.py").write_text("")                             # a source git does not know
    assert git_state(package) == (head, True)
    (package / "new.py").unlink()
    (package / "a.py").write_text("x = 2\n")
    assert git_state(package) == (head, True)


def test_this_process_code():
    code = code_version()
    assert code["source_sha256"] == source_digest(PACKAGE) and len(code["source_sha256"]) == 16
    # the commit is git's own HEAD where the package is in a checkout, else none and no git state
    head = subprocess.run(["git", "-C", str(PACKAGE), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert code["git_commit"] == (head.stdout.strip() if head.returncode == 0 else None)
    assert code["git_modified"] in ((True, False) if head.returncode == 0 else (None,))
