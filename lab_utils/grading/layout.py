"""Where the course lives and what ``labs/params.yml`` says: paths, per-lab parameters, lab names.

::

    from lab_utils.grading.layout import lab_settings, source_notebook
    lab_settings("01")["ci"]                    # papermill's CI parameters of Lab 1
    source_notebook("02")                       # grading/source/02_ps_async/02_ps_async.ipynb

Pure layout: no nbgrader here (that is :mod:`lab_utils.grading.nbapi`), so ``run_labs``,
``grading/nbgrader_config.py`` and the reference scripts read the course without it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "REPO_ROOT",
    "GRADING_ROOT",
    "SOURCE_DIR",
    "LABS_DIR",
    "PARAMS_FILE",
    "load_params",
    "lab_settings",
    "cell_timeout",
    "source_labs",
    "resolve_labs",
    "select_labs",
    "source_notebook",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
GRADING_ROOT = REPO_ROOT / "grading"
SOURCE_DIR = GRADING_ROOT / "source"
LABS_DIR = REPO_ROOT / "labs"
PARAMS_FILE = LABS_DIR / "params.yml"


# -------------------------------------------------------------- course settings
def load_params(path: Path | str | None = None) -> dict[str, dict]:
    """``labs/params.yml`` (or ``path``) as ``{lab: {"ci": ..., "full": ..., "cell_timeout": ...}}``.

    The one reader of that file: ``lab_settings``, ``run_labs`` and
    ``grading/nbgrader_config.py`` all call it. An empty entry reads as ``{}``."""
    import yaml

    path = Path(path) if path is not None else PARAMS_FILE
    with open(path) as f:
        table = yaml.safe_load(f) or {}
    if not isinstance(table, dict):
        raise ValueError(f"{path}: expected a mapping of lab name -> settings, got {type(table).__name__}")
    bad = [lab for lab, entry in table.items() if entry is not None and not isinstance(entry, dict)]
    if bad:
        raise ValueError(f"{path}: the entries of {bad} must be mappings (keys ci, full, cell_timeout)")
    return {str(lab): dict(entry or {}) for lab, entry in table.items()}


def lab_settings(lab: str, params_file: Path | str | None = None) -> dict:
    """The entry for ``lab`` (``"01"`` or ``"01_single_node"``) in ``labs/params.yml``
    (keys: ci, full, cell_timeout), with its full name under ``"name"``."""
    table = load_params(params_file)
    matches = [name for name in table if name == lab or name.split("_", 1)[0] == lab]
    if len(matches) != 1:
        raise ValueError(
            f"lab {lab!r} not found (or ambiguous) in {params_file or PARAMS_FILE}; known: {sorted(table)}"
        )
    return {**table[matches[0]], "name": matches[0]}


def cell_timeout(lab: str | None = None, settings_file: Path | str | None = None) -> int:
    """nbgrader's per-cell timeout for ``lab`` from ``grading/settings.yml``; with no
    lab, the largest of all labs (what a plain ``nbgrader`` command gets)."""
    from lab_utils.grading.settings import grading_settings, load_settings

    if lab:
        return int(grading_settings(lab, settings_file)["cell_timeout"])
    table = load_settings(settings_file)
    return int(max([table["defaults"], *table["labs"].values()], key=lambda e: e["cell_timeout"])["cell_timeout"])


# ---------------------------------------------------------------- lab selection
def source_labs(root: Path | str = GRADING_ROOT) -> list[str]:
    """The labs of the course at ``root``: the folders of ``root/source``."""
    src = Path(root) / "source"
    if not src.is_dir():
        return []
    return sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def resolve_labs(labs, known: list[str]) -> list[str]:
    """Full lab names for what a user typed (``01``, ``01_single_node``); all of ``known`` when empty."""
    if not labs:
        return list(known)
    chosen = []
    for lab in labs:
        hits = [k for k in known if k == lab or k.split("_", 1)[0] == lab]
        if len(hits) != 1:
            raise ValueError(f"unknown lab {lab!r}; known labs: {', '.join(known) or 'none'}")
        chosen.append(hits[0])
    return chosen


def select_labs(labs, root: Path | str = GRADING_ROOT) -> list[str]:
    """:func:`resolve_labs` against the labs of the course at ``root`` (all of them when ``labs`` is empty)."""
    return resolve_labs(labs, source_labs(root))


def source_notebook(lab: str, root: Path | str = GRADING_ROOT) -> Path:
    """``root/source/<lab>/<lab>.ipynb`` for ``lab`` (``"02"`` or ``"02_ps_async"``)."""
    name = select_labs([lab], root)[0]
    return Path(root) / "source" / name / f"{name}.ipynb"
