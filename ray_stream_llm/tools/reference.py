"""The configuration reference (docs/configuration.md), generated from the config models.

``python -m ray_stream_llm.tools.reference`` prints it; ``--write docs/configuration.md``
replaces the part between the markers. tests/unit/project/test_docs.py fails when it drifts
from the code.
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Any

START = "<!-- config-reference:start -->"
END = "<!-- config-reference:end -->"


def _type(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:  # sorted: Ray builds some from sets
        return "Literal[" + ", ".join(sorted(repr(a) for a in typing.get_args(annotation))) + "]"
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation)
    for noise in ("typing.", "pydantic.types.", "ray_stream_llm.stores.settings.", "NoneType"):
        text = text.replace(noise, "" if noise != "NoneType" else "None")
    return text.replace("|", "\\|")


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return f"`{field.default_factory()!r}`"
    return f"`{field.default!r}`"


def _table(model: Any, title: str) -> list[str]:
    rows = [f"### {title}", "", "| field | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        description = " ".join((field.description or "").split()).replace("|", "\\|")
        rows.append(f"| `{name}` | {_type(field.annotation)} | {_default(field)} | {description} |")
    return [*rows, ""]


def config_reference() -> str:
    from ray_stream_llm.config import StreamingvLLMEngineProcessorConfig
    from ray_stream_llm.stores.settings import ObjectStoreConfig

    lines = _table(StreamingvLLMEngineProcessorConfig, "StreamingvLLMEngineProcessorConfig")
    lines += _table(ObjectStoreConfig, "ObjectStoreConfig")
    return "\n".join(lines)


def render(readme: str) -> str:
    head, _, rest = readme.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{config_reference()}\n{END}{tail}"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        path = Path(sys.argv[2])
        path.write_text(render(path.read_text()))
    else:
        print(config_reference())
