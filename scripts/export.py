#!/usr/bin/env python
"""Export a trained model as a native MarianMTModel folder or as a CTranslate2 model.

The same as the command `vaswani-mt-export` (`vaswani_mt.cli.export.main`); `--help` says the rest.
"""

from vaswani_mt.cli.export import main

if __name__ == "__main__":
    main()
