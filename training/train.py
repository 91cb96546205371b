"""Entry point for ``python training/train.py ...`` and ``accelerate launch training/train.py ...``.

Every argument of hf_mecheval.training.run (model, task, recipe, transformers TrainingArguments);
``--help`` lists them. A leading CONFIG.yaml supplies defaults that later flags override.
"""
import sys

from hf_mecheval.training.run import main

if __name__ == "__main__":
    sys.exit(main())
