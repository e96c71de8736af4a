#!/usr/bin/env python
"""Train vaswani_mt with the paper's recipe (§5) through Seq2SeqTrainer.

The same as the command `vaswani-mt-train` (`vaswani_mt.cli.train.main`); `--help` says the rest.
"""

from vaswani_mt.cli.train import main

if __name__ == "__main__":
    main()
