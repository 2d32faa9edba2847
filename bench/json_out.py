"""What every bench ends with: its JSON on stdout, and in the file ``--out`` names."""

from __future__ import annotations

import json
from pathlib import Path


def emit(out: dict, path: str | None, indent: int = 1) -> None:
    """The JSON on stdout, and in ``path`` when given."""
    text = json.dumps(out, indent=indent)
    print(text)
    if path:
        Path(path).write_text(text + "\n")
