"""The Hub model card: `model_card.md` (top level of the repository, shipped in the package) rendered with a
run's measured values."""

from __future__ import annotations

import json
import re
from importlib import resources

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def model_card_template() -> str:
    return resources.files("vaswani_mt").joinpath("model_card.md").read_text(encoding="utf-8")


def widget_yaml(examples: list[str]) -> str:
    """The `widget:` list of the card's YAML front matter; JSON strings are valid YAML scalars."""
    return "\n".join(f"- text: {json.dumps(text, ensure_ascii=False)}" for text in examples)


def render_model_card(values: dict, template: str | None = None) -> str:
    """Fills every `{{name}}` of the template; a placeholder without a value is an error, not a blank."""
    template = model_card_template() if template is None else template
    missing = sorted({name for name in _PLACEHOLDER.findall(template) if name not in values})
    if missing:
        raise ValueError(f"model card values missing: {', '.join(missing)}")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


__all__ = ["model_card_template", "render_model_card", "widget_yaml"]
