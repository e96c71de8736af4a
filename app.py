"""The demo web app: `python app.py` (for a Hugging Face Space, this file is the entry point).

The same as the command `vaswani-mt-demo` (`vaswani_mt.cli.demo.main`); `--help` says the rest.
"""

from vaswani_mt.cli.demo import main

if __name__ == "__main__":
    main()
