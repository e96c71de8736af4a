#!/usr/bin/env python
"""Publish a trained model on the Hugging Face Hub: build the exact folder the Hub gets, check it, upload it.

The same as the command `vaswani-mt-publish` (`vaswani_mt.cli.publish.main`); `--help` says the rest.
"""

from vaswani_mt.cli.publish import main

if __name__ == "__main__":
    main()
