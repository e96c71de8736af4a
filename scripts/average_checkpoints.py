#!/usr/bin/env python
"""Average the last K checkpoints of a run (§6.1: 5 for base, 20 for big) into a folder for from_pretrained.

The same as the command `vaswani-mt-average` (`vaswani_mt.cli.average.main`); `--help` says the rest.
"""

from vaswani_mt.cli.average import main

if __name__ == "__main__":
    main()
