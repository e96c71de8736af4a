"""The demo web app: `python app.py` (for a Hugging Face Space, this file is the entry point).

The model is VASWANI_MODEL (a folder or a Hub id; default outputs/ding-cpu) or the first argument:
    python app.py outputs/ding-cpu
then open http://127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT change the address).
"""

import os
import sys

from vaswani_mt.demo import launch

if __name__ == "__main__":
    launch(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("VASWANI_MODEL", "outputs/ding-cpu"))
