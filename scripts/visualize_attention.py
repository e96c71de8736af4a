#!/usr/bin/env python
"""Draw a translation's attention weights as heatmaps, like the paper's appendix figures.

The same as the command `vaswani-mt-visualize` (`vaswani_mt.cli.visualize.main`); `--help` says the rest.
"""

from vaswani_mt.cli.visualize import main

if __name__ == "__main__":
    main()
