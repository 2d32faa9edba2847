"""``grading/settings.yml``: how submissions are graded, per lab (timeouts, limits, timing).

::

    from lab_utils.grading.settings import grading_settings
    grading_settings("02")["cell_timeout"]      # 300

The one reader of that file. ``defaults`` apply to every lab and an entry under
``labs`` overrides any key for one lab; unknown keys and bad values raise
``ValueError`` naming the file, so a typo never grades a class with the wrong limits.
"""

from __future__ import annotations

from pathlib import Path

from .late import DueFile, parse_due

__all__ = ["SETTINGS_FILE", "DEFAULTS", "load_settings", "grading_settings"]

SETTINGS_FILE = Path(__file__).resolve().parents[2] / "grading" / "settings.yml"

#: Used when the file, or a key in it, is absent.
DEFAULTS = {
    "cell_timeout": 300,
    "interrupt_grace": 20,
    "notebook_timeout": 1800,
    "memory_mb": 4096,
    "cpus": 2.0,
    "max_processes": 512,
    "disk_mb": 512,
    "file_mb": 5,
    "network": "loopback",
    "timing": {"rounds": 2, "max_rounds": 4, "noise": 0.10},
    "due": None,  # ISO 8601 with a zone: a submission that arrived later is flagged late (lab_utils.grading.late)
}
_POSITIVE = (
    "cell_timeout",
    "interrupt_grace",
    "notebook_timeout",
    "memory_mb",
    "cpus",
    "max_processes",
    "disk_mb",
    "file_mb",
)
_NETWORK = ("loopback", "host")


def _merge(base: dict, over: dict, where: str) -> dict:
    unknown = sorted(set(over) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {unknown}; allowed: {sorted(DEFAULTS)}")
    merged = {**base, **over}
    merged["timing"] = {**base["timing"], **(over.get("timing") or {})}
    return merged


def _validate(entry: dict, where: str) -> dict:
    for key in _POSITIVE:
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{where}: {key} must be a positive number, got {value!r}")
    try:
        due = parse_due(entry["due"])
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    entry["due"] = None if due is None else due.isoformat()  # a string: settings are hashed and kept as JSON
    if entry["network"] not in _NETWORK:
        raise ValueError(f"{where}: network must be one of {_NETWORK}, got {entry['network']!r}")
    timing = entry["timing"]
    if set(timing) - set(DEFAULTS["timing"]):
        raise ValueError(f"{where}: unknown timing setting(s) {sorted(set(timing) - set(DEFAULTS['timing']))}")
    if not 1 <= int(timing["rounds"]) <= int(timing["max_rounds"]):
        raise ValueError(f"{where}: timing needs 1 <= rounds <= max_rounds, got {timing}")
    if not 0 < float(timing["noise"]) < 1:
        raise ValueError(f"{where}: timing noise must be in (0, 1), got {timing['noise']!r}")
    return entry


def load_settings(path: Path | str | None = None) -> dict:
    """``{"defaults": {...}, "labs": {lab: {...merged...}}}`` from ``path``
    (default ``grading/settings.yml``; built-in defaults when it does not exist)."""
    import yaml

    path = Path(path) if path is not None else SETTINGS_FILE
    raw = {}
    if path.is_file():
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict) or set(raw) - {"defaults", "labs", "due_file"}:
            raise ValueError(f"{path}: expected the mappings `defaults` and `labs` (and due_file), got {sorted(raw)}")
    defaults = _validate(_merge(DEFAULTS, raw.get("defaults") or {}, f"{path} defaults"), f"{path} defaults")
    labs = {
        str(lab): _validate(_merge(defaults, entry or {}, f"{path} labs.{lab}"), f"{path} labs.{lab}")
        for lab, entry in (raw.get("labs") or {}).items()
    }
    if raw.get("due_file"):
        _due_from_file(path, raw, defaults, labs)
    return {"defaults": defaults, "labs": labs}


def _due_from_file(path: Path, raw: dict, defaults: dict, labs: dict) -> None:
    """Each lab's ``due`` from the class's due file (``due_file``, relative to ``path``'s
    folder), the one the hand-in service reads too: a ``due`` here as well would be a second."""
    twice = ["defaults"] if (raw.get("defaults") or {}).get("due") is not None else []
    twice += [f"labs.{lab}" for lab, entry in (raw.get("labs") or {}).items() if (entry or {}).get("due") is not None]
    if twice:
        raise ValueError(
            f"{path}: due is set in {', '.join(twice)} and due_file names the class's due file: "
            "keep the due times in the due file alone (the hand-in service reads it too)"
        )
    file = (path.parent / str(raw["due_file"])).resolve()
    for lab, when in DueFile(file).read().items():
        entry = labs.setdefault(lab, {**defaults, "timing": dict(defaults["timing"])})
        entry["due"] = None if when is None else when.isoformat()


def grading_settings(lab: str | None = None, path: Path | str | None = None) -> dict:
    """The settings for ``lab`` (``"02"`` or ``"02_ps_async"``): its entry merged over
    the defaults; the defaults alone for a lab the file does not name (or no lab)."""
    table = load_settings(path)
    if lab is None:
        return dict(table["defaults"])
    hits = [name for name in table["labs"] if name == lab or name.split("_", 1)[0] == lab]
    if len(hits) > 1:
        raise ValueError(f"lab {lab!r} is ambiguous in the grading settings: {hits}")
    return dict(table["labs"][hits[0]]) if hits else dict(table["defaults"])
