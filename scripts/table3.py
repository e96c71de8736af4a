#!/usr/bin/env python
"""Table 3 of the paper as runnable variants: train and score chosen rows at a chosen scale

The same as the command `vaswani-mt-table3` (`vaswani_mt.cli.table3.main`); `--help` says the rest.
"""

from vaswani_mt.cli.table3 import main

if __name__ == "__main__":
    main()
