"""The demo web app (Gradio, `demo.py`): above inference, whose translation and attention it shows; only the
commands (`cli/demo.py`, which `app.py` runs) import it."""
