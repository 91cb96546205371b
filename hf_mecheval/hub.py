"""The Hugging Face Hub, as the commands that upload use it: a repository name checked before
anything is built, and every failure of the Hub (a bad name, no network, offline mode, refused
credentials) one clear error instead of a traceback."""
from __future__ import annotations

import contextlib

from .errors import MechEvalError
from .atomic_files import TEMPORARY_PATTERNS


def first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def check_repo_id(repo_id: str) -> None:
    from huggingface_hub import errors
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except errors.HFValidationError as exc:
        raise MechEvalError(f"bad repository name {repo_id!r}: {first_line(exc)}") from None


@contextlib.contextmanager
def hub_errors(what: str):
    """Turn the Hub's failures inside the block into one error: ``cannot {what}: ...``."""
    from huggingface_hub import errors

    # the Hub's HTTP errors are OSErrors, but a refused or failed connection is the HTTP
    # library's own error (requests' is an OSError too, httpx's is not)
    network_errors = (OSError, getattr(errors, "HTTPError", OSError))
    try:
        yield
    except network_errors as exc:
        raise MechEvalError(f"cannot {what}: {first_line(exc)}") from None


def create_repo(repo_id: str, repo_type: str = "model", private: bool = False, what: str | None = None):
    """Check the name and create (or find) the repository; returns the ``HfApi`` to upload with.
    Called before the work whose result is uploaded, so that no network, offline mode or refused
    credentials fail at once."""
    from huggingface_hub import HfApi

    check_repo_id(repo_id)
    api = HfApi()
    with hub_errors(what or f"create the {repo_type} repository {repo_id}"):
        api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
    return api


def upload_folder(api, folder, repo_id: str, repo_type: str = "model", allow_patterns=None) -> None:
    """Upload ``folder``, never the temporaries that an interrupted writer may have left in it."""
    with hub_errors(f"push {folder} to {repo_id}"):
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type=repo_type,
                          allow_patterns=allow_patterns, ignore_patterns=TEMPORARY_PATTERNS)
