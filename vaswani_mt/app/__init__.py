"""What the page and `vaswani-mt-visualize` show: the demo web app (Gradio, `demo.py`) and the attention pictures
(`attention_plots.py`), above inference, whose translations and attention they draw; only the commands
(`cli/demo.py`, which `app.py` runs, and `cli/visualize.py`) import it."""
