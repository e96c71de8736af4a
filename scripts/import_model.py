#!/usr/bin/env python
"""Import a MarianMTModel checkpoint (OPUS-MT) exactly, as a vaswani_mt model folder.

The same as the command `vaswani-mt-import` (`vaswani_mt.cli.import_.main`); `--help` says the rest.
"""

from vaswani_mt.cli.import_ import main

if __name__ == "__main__":
    main()
