"""The term's schedule: one file (``grading/course.yml``) that every date of the course comes from.

::

    term: Spring 2027
    start: 2027-02-01            # the Monday of week 1
    timezone: "+01:00"
    release: "09:00"             # a lab opens at this time on the Monday of its first week
    due: "Friday 23:59"          # and is due on this day of its last week
    variant: full                # the one setting that picks a shorter course (variants below)
    labs:
      01_single_node: {week: 1, weeks: 1, lecture: "Training on one node: SGD, batches, throughput"}
      02_ps_async: {week: 2, weeks: 2, lecture: "...", due: 2027-02-19T23:59:00+01:00}   # a date of its own
    variants:
      full: {}
      7-weeks: {02_ps_async: {week: 2, weeks: 1}, ...}
      without-lab-6: {06_communication: null}                # null: the lab is not part of the term

From it come, with no second place to type a date:

- the hand-in service's open labs and due times (:class:`lab_utils.grading.late.DueFile` reads a
  schedule as it reads a due file; a lab the variant leaves out is closed), on one machine
  (``LABS_DUE_FILE``) and on Kubernetes (a ConfigMap of this file, ``deploy/jupyterhub/handin.yaml``);
- the grader's late flags (``due_file`` in ``grading/settings.yml``);
- the course map's schedule table (``python -m lab_utils.grading schedule --render``,
  ``labs/README.md``);
- the LMS export's assignment columns (:mod:`lab_utils.grading.lms`): the term's labs, in order
  (Moodle's with their due dates), late by its due times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from pathlib import Path

__all__ = [
    "SCHEDULE",
    "MARKER",
    "Entry",
    "Schedule",
    "course_schedule",
    "is_schedule",
    "load",
    "parse",
    "parse_due",
    "render",
    "table",
]

#: The course's grading folder (``lab_utils.grading.layout.GRADING_ROOT``: not imported, which would
#: make a cycle through the settings that read the schedule)
GRADING_ROOT = Path(__file__).resolve().parents[2] / "grading"
#: The course's schedule
SCHEDULE = GRADING_ROOT / "course.yml"
#: The marker of the generated table in ``labs/README.md``
MARKER = "schedule"
_LAB_NAME = re.compile(r"^[0-9]{2}_[a-z0-9_]+$")
_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_TOP = {"term", "start", "timezone", "release", "due", "variant", "labs", "variants"}
_ENTRY = {"week", "weeks", "lecture", "reading", "due"}


@dataclass(frozen=True)
class Entry:
    """One lab of the term: its weeks, its lecture, when it opens and when it is due."""

    lab: str
    week: int
    weeks: int
    lecture: str
    reading: str
    release: datetime
    due: datetime | None

    @property
    def number(self) -> int:
        return int(self.lab[:2])


@dataclass(frozen=True)
class Schedule:
    """A term: its labs in order, as :func:`load` read them for one variant."""

    term: str
    variant: str
    variants: tuple[str, ...]
    entries: tuple[Entry, ...]

    @property
    def labs(self) -> list[str]:
        return [e.lab for e in self.entries]

    def due(self) -> dict[str, datetime | None]:
        """Each lab of the term and its due time: what the hand-in service opens."""
        return {e.lab: e.due for e in self.entries}

    def entry(self, lab: str) -> Entry:
        for e in self.entries:
            if e.lab == lab or e.lab[:2] == lab:
                return e
        raise KeyError(f"{lab} is not part of the term ({self.term}, {self.variant}): {', '.join(self.labs)}")

    def weeks(self) -> int:
        return max((e.week + e.weeks - 1 for e in self.entries), default=0)


def is_schedule(raw) -> bool:
    """Whether a YAML document is a schedule (else a due file of ``lab: due time`` lines)."""
    return isinstance(raw, dict) and "labs" in raw and "start" in raw


def _fail(path, what: str) -> ValueError:
    return ValueError(f"{path}: {what}")


def _zone(path, value) -> timezone:
    m = re.fullmatch(r"([+-])(\d{2}):(\d{2})|Z|UTC", str(value or "Z"))
    if not m:
        raise _fail(path, f"timezone is an offset like +01:00 (or Z), got {value!r}")
    if not m.group(1):
        return UTC
    minutes = int(m.group(2)) * 60 + int(m.group(3))
    return timezone(timedelta(minutes=minutes if m.group(1) == "+" else -minutes))


def _clock(path, what: str, value) -> time:
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", str(value))
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise _fail(path, f"{what} is a time like 09:00, got {value!r}")
    return time(int(m.group(1)), int(m.group(2)))


def _due_rule(path, value) -> tuple[int, time]:
    parts = str(value).split()
    if len(parts) != 2 or parts[0].lower() not in _DAYS:
        raise _fail(path, f"due is a day and a time like 'Friday 23:59', got {value!r}")
    return _DAYS.index(parts[0].lower()), _clock(path, "due", parts[1])


def parse_due(value) -> datetime | None:
    """A due time from the settings: ISO 8601 with a zone (a string, or the datetime YAML makes
    of one), or None. ValueError for anything else, naming what was given."""
    if value is None:
        return None
    if isinstance(value, datetime):
        when = value
    elif isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"due must be ISO 8601 like 2026-12-04T23:59:00+01:00, got {value!r}") from None
    else:
        raise ValueError(f"due must be ISO 8601 like 2026-12-04T23:59:00+01:00, got {value!r}")
    if when.tzinfo is None:
        raise ValueError(f"due needs a time zone (like 2026-12-04T23:59:00+01:00 or ...Z), got {value!r}")
    return when


def _explicit_due(path, lab: str, value) -> datetime | None:
    try:
        return parse_due(value.isoformat() if isinstance(value, datetime) else value)
    except ValueError as exc:
        raise _fail(path, f"{lab}: {exc}") from None


def _read(path: Path) -> dict:
    import yaml

    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise _fail(path, str(exc)) from None
    if not is_schedule(raw):
        raise _fail(path, "a schedule has `start` and `labs` (see lab_utils.grading.schedule)")
    return raw


def parse(raw: dict, path: str | Path = "course.yml", variant: str | None = None) -> Schedule:
    """The :class:`Schedule` of a schedule document ``raw`` (the YAML read), for ``variant``
    (default: the file's own ``variant``). ValueError naming the file and the entry for anything
    wrong: an unknown key, a lab name, a week, a date without a zone, two labs due at once."""
    unknown = set(raw) - _TOP
    if unknown:
        raise _fail(path, f"unknown keys {sorted(unknown)}; a schedule has {sorted(_TOP)}")
    start = raw["start"]
    if isinstance(start, datetime) or not isinstance(start, date):
        raise _fail(path, f"start is the Monday of week 1, like 2027-02-01, got {start!r}")
    if start.weekday() != 0:
        raise _fail(path, f"start is the Monday of week 1; {start} is a {_DAYS[start.weekday()].title()}")
    zone = _zone(path, raw.get("timezone"))
    opens = _clock(path, "release", raw.get("release", "09:00"))
    due_day, due_at = _due_rule(path, raw.get("due", "Friday 23:59"))
    variants = raw.get("variants") or {}
    if not isinstance(variants, dict):
        raise _fail(path, "variants is a mapping: name -> the labs it changes")
    chosen = variant or raw.get("variant") or "full"
    if chosen != "full" and chosen not in variants:
        raise _fail(path, f"variant {chosen!r} is not one of {['full', *sorted(set(variants) - {'full'})]}")
    labs = raw.get("labs")
    if not isinstance(labs, dict) or not labs:
        raise _fail(path, "labs is a mapping: lab -> {week, weeks, lecture}")
    changes = variants.get(chosen) or {}
    entries = []
    for lab, spec in labs.items():
        if not isinstance(lab, str) or not _LAB_NAME.match(lab):
            raise _fail(path, f"lab names look like 02_ps_async, got {lab!r}")
        if lab in changes and changes[lab] is None:
            continue  # the variant leaves it out of the term
        spec = {**(spec or {}), **(changes.get(lab) or {})}
        if set(spec) - _ENTRY:
            raise _fail(path, f"{lab}: unknown keys {sorted(set(spec) - _ENTRY)}; a lab has {sorted(_ENTRY)}")
        week, weeks = spec.get("week"), spec.get("weeks", 1)
        if not isinstance(week, int) or not isinstance(weeks, int) or week < 1 or weeks < 1:
            raise _fail(path, f"{lab}: week and weeks are whole numbers from 1, got {week!r} and {weeks!r}")
        first = start + timedelta(weeks=week - 1)
        release = datetime.combine(first, opens, tzinfo=zone)
        if "due" in spec:  # the instructor's own date (an extension, a test of the hand-in): taken as it is
            due = _explicit_due(path, lab, spec["due"])
        else:
            due = datetime.combine(first + timedelta(weeks=weeks - 1, days=due_day), due_at, tzinfo=zone)
            if due <= release:
                raise _fail(path, f"{lab}: due {due.isoformat()} is not after its release {release.isoformat()}")
        entries.append(
            Entry(lab, week, weeks, str(spec.get("lecture", "")), str(spec.get("reading", "")), release, due)
        )
    unknown_labs = set(changes) - set(labs)
    if unknown_labs:
        raise _fail(path, f"variant {chosen!r} changes labs the term does not have: {sorted(unknown_labs)}")
    entries.sort(key=lambda e: (e.week, e.lab))
    return Schedule(
        term=str(raw.get("term", "")),
        variant=chosen,
        variants=("full", *sorted(set(variants) - {"full"})),
        entries=tuple(entries),
    )


def load(path: str | Path = SCHEDULE, variant: str | None = None) -> Schedule:
    """The schedule in ``path`` for ``variant`` (default: the one the file picks)."""
    return parse(_read(Path(path)), path, variant)


def _when(t: datetime | None) -> str:
    return "open, no due time" if t is None else f"{t:%a %Y-%m-%d %H:%M} (UTC{t.isoformat()[-6:]})"


def table(schedule: Schedule) -> str:
    """The course map's schedule table (markdown)."""
    rows = [
        f"The schedule of {schedule.term or 'this term'} ({schedule.variant}: {schedule.weeks()} weeks):",
        "",
        "| week | lab | the lecture before it | opens | due |",
        "|---|---|---|---|---|",
    ]
    for e in schedule.entries:
        weeks = str(e.week) if e.weeks == 1 else f"{e.week}–{e.week + e.weeks - 1}"
        lecture = e.lecture + (f" (reading: {e.reading})" if e.reading else "")
        rows.append(f"| {weeks} | {e.number} | {lecture} | {e.release:%a %Y-%m-%d} | {_when(e.due)} |")
    return "\n".join(rows)


def render(text: str, schedule: Schedule) -> str:
    """``text`` (the course map) with its schedule block replaced by :func:`table`."""
    begin = f"<!-- {MARKER}: generated from the term's schedule (lab_utils.grading.schedule); edit that, not this -->"
    pattern = re.compile(rf"<!-- {MARKER}:.*?-->\n.*?<!-- /{MARKER} -->", re.S)
    if not pattern.search(text):
        raise ValueError(f"no <!-- {MARKER}: ... --> ... <!-- /{MARKER} --> block to fill")
    return pattern.sub(lambda _: f"{begin}\n{table(schedule)}\n<!-- /{MARKER} -->", text, count=1)


def course_schedule(root: str | Path = GRADING_ROOT) -> Path:
    """The course's schedule: the file ``due_file`` in ``root``'s ``settings.yml`` names when it is a
    schedule (a class on one machine: the setup's copy, which the hand-in service reads), else
    ``root/course.yml``."""
    import yaml

    root = Path(root)
    try:
        settings = yaml.safe_load((root / "settings.yml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        settings = {}
    named = settings.get("due_file") if isinstance(settings, dict) else None
    if named:
        path = (root / str(named)).resolve()
        try:
            if is_schedule(yaml.safe_load(path.read_text())):
                return path
        except (OSError, yaml.YAMLError):
            pass
    return root / "course.yml"
