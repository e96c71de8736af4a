#!/usr/bin/env python
"""Translate a file or standard input, one line per line, in batches (progress bar on stderr).

The same as the command `vaswani-mt-translate` (`vaswani_mt.cli.translate.main`); `--help` says the rest.
"""

from vaswani_mt.cli.translate import main

if __name__ == "__main__":
    main()
