"""Fetch transformers' common model tests for ``tests/models/test_transformers_common.py``.

``tests/test_modeling_common.py`` and ``tests/test_configuration_common.py`` are not in the
transformers wheel; they are in the release's source distribution. This downloads that
distribution for the pinned release (from the package index pip is configured with), checks its
sha256, and assembles an importable package ``transformers_common`` from the two files and
hf-mecheval's shims for the modules they import that the distribution lacks (``shim_*.py``
beside this file)::

    python tests/hf_common/fetch.py          # make test runs it; idempotent

The package goes to ``.venv/transformers-common/`` (or $MECHEVAL_HF_COMMON).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

RELEASE = "5.24.0"
SHA256 = "906cb8c3cb2123575e263962586a4d21a979ce97feeb95fe6aaf66fe6ae88bf3"
FILES = ("test_modeling_common.py", "test_configuration_common.py")
# module of the package -> the shim that stands in for it
SHIMS = {"generation/test_utils.py": "shim_generation.py", "exporters/test_export.py": "shim_export.py",
         "utils/test_configuration_utils.py": "shim_configuration_utils.py"}
HERE = Path(__file__).resolve().parent
ROOT = Path(os.environ.get("MECHEVAL_HF_COMMON", HERE.parents[1] / ".venv" / "transformers-common"))


def installed_release() -> str:
    from importlib.metadata import version

    return version("transformers")


def common_tests_package() -> Path | None:
    """The folder holding ``transformers_common`` (put on sys.path), shims refreshed; None where the
    files have not been fetched. Refuses a package fetched for another release than the installed."""
    package = ROOT / "transformers_common"
    if not all((package / name).exists() for name in FILES):
        return None
    fetched = (package / "RELEASE").read_text().strip()
    if fetched != installed_release():
        raise RuntimeError(f"transformers' common tests were fetched for {fetched}, but transformers "
                           f"{installed_release()} is installed: pin {fetched} or update RELEASE and SHA256 in {__file__}")
    _write_shims(package)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return ROOT


def _write_shims(package: Path) -> None:
    for target, shim in SHIMS.items():
        path = package / target
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        if not path.exists() or path.read_bytes() != (HERE / shim).read_bytes():
            shutil.copyfile(HERE / shim, path)


def fetch() -> Path:
    if installed_release() != RELEASE:
        raise SystemExit(f"transformers {installed_release()} is installed, the common tests are pinned to {RELEASE}")
    package = ROOT / "transformers_common"
    if all((package / name).exists() for name in FILES) and (package / "RELEASE").read_text().strip() == RELEASE:
        _write_shims(package)
        return ROOT
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        "--dest", tmp, f"transformers=={RELEASE}"], check=True)
        archive = next(Path(tmp).glob("transformers-*.tar.gz"))
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != SHA256:
            raise SystemExit(f"{archive.name}: sha256 {digest}, expected {SHA256}")
        staging = Path(tmp) / "transformers_common"
        staging.mkdir()
        with tarfile.open(archive) as tar:
            for name in FILES:
                member = tar.getmember(f"transformers-{RELEASE}/tests/{name}")
                (staging / name).write_bytes(tar.extractfile(member).read())
        (staging / "__init__.py").touch()
        (staging / "RELEASE").write_text(RELEASE + "\n")
        _write_shims(staging)
        ROOT.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(package, ignore_errors=True)
        shutil.move(str(staging), package)
    return ROOT


if __name__ == "__main__":
    print(f"transformers {RELEASE} common tests in {fetch() / 'transformers_common'}")
