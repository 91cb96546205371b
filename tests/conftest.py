"""Test environment: never reach the Hub; keep every cache in a temporary HF_HOME."""
import os
import tempfile

_HF_HOME = tempfile.mkdtemp(prefix="mecheval-test-hf-")
os.environ["HF_HOME"] = _HF_HOME
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
