"""Reference runs on emulated links, shipped with the labs.

Where no emulated hosts can be made (no root, and user namespaces refused: Ubuntu's AppArmor
restriction, a container's seccomp profile, ``user.max_user_namespaces=0``), a network
lesson's runs fall back to loopback, where the network costs nothing. The experiment then
shows one of these next to the student's own figures, labelled as what it is: a run on
emulated links made with ``bench/`` on the course's machine, never the student's loopback
passed off as a network. Each file says what made it (``made_with``) and where (``machine``).

``what_if.json`` and the ``*.trace.json`` files beside it are runs' timelines, for the labs'
what-if predictions (:func:`timeline`; ``bench/ship_what_if.py``).

``yardsticks.json`` is of another kind: how long each lab's reference takes against its
throughput yardstick, per machine (``bench/bench_yardsticks.py``), for the self-check
students run before submitting (:mod:`lab_utils.grading.selfcheck`).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent


@cache
def load(name: str) -> dict:
    """The reference run ``name`` (``netexp_100mbit``, ...): its ``label``, ``what``,
    ``made_with``, ``machine`` and ``runs`` (the rows its experiment's table has)."""
    path = HERE / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in HERE.glob("*.json"))
        raise ValueError(f"no reference run {name!r}; known: {', '.join(known)}")
    return json.loads(path.read_text())


def table(name: str):
    """The reference run's rows as a pandas table, its ``label`` in ``.attrs``."""
    import pandas as pd

    ref = load(name)
    df = pd.DataFrame(ref["runs"])
    df.attrs.update(label=ref["label"], made_with=ref["made_with"], machine=ref["machine"])
    return df


def timeline(name: str):
    """A shipped run's timeline (``what_if_ps_100mbit``, ...; ``bench/ship_what_if.py`` made
    them): the labs' what-if predictions replay it where this machine has no emulated links,
    and their hidden tests' cases do everywhere."""
    from lab_utils import timeline as tl

    path = HERE / f"{name}.trace.json"
    if not path.is_file():
        known = sorted(p.name.removesuffix(".trace.json") for p in HERE.glob("*.trace.json"))
        raise ValueError(f"no shipped timeline {name!r}; known: {', '.join(known)}")
    return tl.load(path, label=f"{name} (shipped with the lab, not measured on this machine)")


#: what each reference run's one line says (its table is displayed below it)
_SAYS = {
    "compression_100mbit": lambda t: (
        "step time in ms: "
        + ", ".join(f"{r.method} {r.step_ms:.0f}" for r in t.itertuples())
        + "; the link carried "
        + ", ".join(f"{r.link_over_wire:.3f}x" for r in t.itertuples())
        + " the codec's bytes"
    ),
    "hybrid_100mbit": lambda t: "seconds per step: " + ", ".join(f"{r.mode} {r.step_s:.2f}" for r in t.itertuples()),
}


def beside(name: str, asked, emulated: bool):
    """Where emulated links were asked for (``asked``: a lab's ``HOSTS`` parameter) but the
    runs measured loopback (``emulated`` False): print one line naming the reference run
    ``name`` and what it shows, and return its table for display. Otherwise None (nothing
    printed): the student's own runs are on links, or loopback was what was asked for."""
    from lab_utils.cluster import netem

    if emulated or netem.as_spec(asked) is None:
        return None
    t = table(name)
    print(f"Your runs above are on loopback. {t.attrs['label']}: {_SAYS[name](t)}.", flush=True)
    return t
