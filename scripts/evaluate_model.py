#!/usr/bin/env python
"""sacreBLEU, chrF and the paper's tokenized compound-split BLEU of a model on a test set, with the paper's search

The same as the command `vaswani-mt-evaluate` (`vaswani_mt.cli.evaluate.main`); `--help` says the rest.
"""

from vaswani_mt.cli.evaluate import main

if __name__ == "__main__":
    main()
