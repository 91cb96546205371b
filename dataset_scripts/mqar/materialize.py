"""Materialise every MQAR preset (all splits) as parquet with a dataset card; see ../materialize.py.
Extra flags (--train-size, --eval-size, --seed, --overwrite, --workers, --push-to-hub REPO) go to
`mecheval data publish`."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from materialize import run  # noqa: E402

if __name__ == "__main__":
    sys.exit(run("mqar", sys.argv[1:]))
