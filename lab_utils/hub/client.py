"""Talking to the class's hand-in service (:mod:`lab_utils.hub.service`) from a Hub server.

A student, in a cell they add at the end of a lab (save first: the file on disk is what goes)::

    from lab_utils.hub import hand_in, feedback
    hand_in()                  # this notebook; prints the receipt (time, late or not)
    feedback("02_ps_async")    # once returned: ~/feedback/02_ps_async/*.html, theirs only

The instructor, from their own server (their Hub token has ``custom:handin:grade``)::

    python -m lab_utils.hub grade 02_ps_async                     # the class's grading service grades them
    python -m lab_utils.hub return 02_ps_async grading-02_ps_async/feedback   # each student's pages to them

Where the service is: ``$LABS_HANDIN_URL`` (the Hub's spawner sets it); who you are: the
server's ``$JUPYTERHUB_API_TOKEN``. Without them (Binder, a laptop) there is no service, and
the error says so.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

from .. import config
from .store import Receipt, write_submission

__all__ = ["HandInRefused", "hand_in", "feedback", "collect", "return_feedback", "whoami", "grade", "grader_url"]


class HandInRefused(RuntimeError):
    """The service refused a call (its message says why), or cannot be reached."""


def _endpoint(url: str | None, token: str | None) -> tuple[str, str]:
    url = url or config.get(config.HANDIN_URL)
    token = token or os.environ.get("JUPYTERHUB_API_TOKEN")
    if not url or not token:
        missing = " and ".join(n for n, v in (("LABS_HANDIN_URL", url), ("JUPYTERHUB_API_TOKEN", token)) if not v)
        raise HandInRefused(
            f"no hand-in service here ({missing} unset): this is not a class Hub server. "
            "Hand your notebook in as your instructor says."
        )
    return url.rstrip("/") + "/", token


def _call(method: str, path: str, *, data: bytes | None = None, url=None, token=None, timeout=60.0):
    """(body bytes, headers) of ``method path`` on the service; HandInRefused on any refusal."""
    base, token = _endpoint(url, token)
    req = urllib.request.Request(base + "api/" + path, data=data, method=method)
    req.add_header("Authorization", f"token {token}")
    if data is not None:
        req.add_header("Content-Type", "application/octet-stream")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            why = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            why = body.decode("utf-8", "replace")[:300] or exc.reason
        raise HandInRefused(f"the hand-in service refused {method} {path} ({exc.code}): {why}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise HandInRefused(f"the hand-in service at {base} cannot be reached: {exc}") from None


def whoami(*, url=None, token=None) -> dict:
    """``{"user", "instructor", "labs": {lab: due or None}}`` as the service sees this token."""
    return json.loads(_call("GET", "labs", url=url, token=token)[0])


def _this_notebook() -> Path:
    # jupyter-server gives a notebook's kernel its path: absolute (cwd + name, as JupyterLab opens
    # it) or the server-relative one; the kernel's working folder is the notebook's
    path = os.environ.get("JPY_SESSION_NAME") or ""
    if path.endswith(".ipynb"):
        for candidate in (Path(path), Path.cwd() / Path(path).name):
            if candidate.is_file():
                return candidate
    raise HandInRefused(
        "which notebook? Run hand_in() in the lab's notebook, or give its path: hand_in('02_ps_async.ipynb')"
    )


def hand_in(
    notebook: str | os.PathLike | None = None, *, lab: str | None = None, url=None, token=None
) -> Receipt | None:
    """Hand in ``notebook`` (default: the one this kernel runs) as saved on disk, for ``lab``
    (default: its file name); prints and returns the service's receipt. Where there is no
    hand-in service (Binder, a laptop, the grader) it says so and returns None."""
    try:
        _endpoint(url, token)
    except HandInRefused as exc:
        print(exc)
        return None
    path = Path(notebook) if notebook is not None else _this_notebook()
    if not path.is_file():
        raise HandInRefused(f"no notebook {path}")
    lab = lab or path.stem
    data = path.read_bytes()
    saved_ago = time.time() - path.stat().st_mtime
    receipt = Receipt.from_json(json.loads(_call("POST", f"hand-ins/{quote(lab)}", data=data, url=url, token=token)[0]))
    when = receipt.time.strftime("%Y-%m-%d %H:%M:%S UTC")
    print(
        f"Handed in {path.name} for {lab} as {receipt.student} at {when}"
        f"{' (LATE)' if receipt.late else ''}: {receipt.size / 1024:.0f} kB, sha256 {receipt.sha256[:12]}."
    )
    if saved_ago > 60:
        print(
            f"It was last saved {saved_ago / 60:.0f} min ago: changes since then are not in it. "
            "Save (Ctrl-S) and run this again to hand in the newer version; the last hand-in is the one graded."
        )
    return receipt


def feedback(lab: str, dest: str | os.PathLike | None = None, *, url=None, token=None) -> list[Path]:
    """The feedback pages returned to you for ``lab``, written to ``dest`` (default
    ``~/feedback/<lab>``); [] when none has been returned yet."""
    files = json.loads(_call("GET", f"feedback/{quote(lab)}", url=url, token=token)[0])["files"]
    if not files:
        print(f"No feedback for {lab} yet.")
        return []
    folder = Path(dest) if dest is not None else Path.home() / "feedback" / lab
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, html in files.items():
        (folder / name).write_text(html, encoding="utf-8")
        out.append(folder / name)
    print(f"Feedback for {lab}: " + ", ".join(str(p) for p in out))
    return out


def collect(lab: str, dest: str | os.PathLike, *, url=None, token=None) -> list[Receipt]:
    """Instructor: each student's last hand-in of ``lab`` into ``dest/<student>/<lab>/<lab>.ipynb``
    (with nbgrader's ``timestamp.txt``: the service's arrival time), for ``make autograde``."""
    index = json.loads(_call("GET", f"collect/{quote(lab)}", url=url, token=token)[0])["hand_ins"]
    _writable(Path(dest), "collect writes each student's hand-in there")
    out = []
    for entry in index:
        data, headers = _call("GET", f"collect/{quote(lab)}/{quote(entry['key'], safe='')}", url=url, token=token)
        receipt = Receipt.from_json(json.loads(headers["X-Handin-Receipt"]))
        write_submission(Path(dest), receipt, data)
        out.append(receipt)
    late = sum(r.late for r in out)
    print(f"collected {lab}: {len(out)} hand-in(s) into {dest}" + (f", {late} late" if late else ""))
    return out


def return_feedback(lab: str, feedback_root: str | os.PathLike, *, url=None, token=None) -> list[str]:
    """Instructor: every page under ``feedback_root/<key>/<lab>/`` (``make feedback``'s
    layout, with the folder names ``collect`` wrote) to that student; returns the folders it
    reached."""
    root, done = Path(feedback_root), []
    pages_of = {f: sorted(p for p in f.glob("*.html") if p.is_file()) for f in sorted(root.glob(f"*/{lab}"))}
    if not any(pages_of.values()):
        raise HandInRefused(
            f"no feedback for {lab} under {root}{'' if root.is_dir() else ' (no such folder)'}: return sends "
            f"{root}/<student>/{lab}/*.html, which `make feedback LABS={lab[:2]}` (or `python -m lab_utils.hub "
            f"grade {lab}`, into grading-{lab}/feedback) writes"
        )
    for folder in sorted(root.glob(f"*/{lab}")):
        pages = sorted(p for p in folder.glob("*.html") if p.is_file())
        if not pages:
            continue
        key = folder.parent.name
        for page in pages:
            _call(
                "PUT",
                f"feedback/{quote(lab)}/{quote(key, safe='')}/{quote(page.name, safe='')}",
                data=page.read_bytes(),
                url=url,
                token=token,
            )
        done.append(key)
    print(f"returned {lab} feedback to {len(done)} student(s)")
    return done


def _writable(folder: Path, why: str) -> None:
    """Make ``folder`` (and its parents), or say why it cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HandInRefused(f"cannot make {folder} ({exc.strerror}): {why}") from None
    if not os.access(folder, os.W_OK):
        raise HandInRefused(f"{folder} is not writable by you: {why}; give a folder of your own")


def grader_url(url: str | None = None) -> str:
    """The class's grading service: ``url``, ``$LABS_GRADER_URL``, or beside the hand-in service."""
    found = url or os.environ.get("LABS_GRADER_URL")
    if not found:
        handin = config.get(config.HANDIN_URL)
        if not handin:
            raise HandInRefused("no grading service here (LABS_GRADER_URL and LABS_HANDIN_URL unset)")
        found = handin.rstrip("/").rsplit("/", 1)[0] + "/grader/"
    return found.rstrip("/") + "/"


def grade(lab: str, into: str | os.PathLike | None = None, *, url=None, token=None, poll_s: float = 1.0) -> Path:
    """Instructor: have the class's grading service grade ``lab`` (it collects the hand-ins, and
    grades each in its sandbox, as root), print its progress, and fetch its results into
    ``into`` (default ``grading-<lab>``): ``results/``, ``feedback/``, ``autograded/``, the
    layout ``make autograde`` and ``make feedback`` write. Returns ``into``."""
    base = grader_url(url)
    dest = Path(into) if into is not None else Path(f"grading-{lab}")
    _writable(dest, "grade fetches the results there")  # before the grading, not after it
    job = json.loads(_call("POST", f"grade/{quote(lab)}", data=b"", url=base, token=token)[0])
    print(f"grading {lab}: job {job['id']}", flush=True)
    since = 0
    while True:
        state = json.loads(_call("GET", f"jobs/{job['id']}?since={since}", url=base, token=token)[0])
        for line in state["lines"]:
            print(line, flush=True)
        since = state["next"]
        if state["state"] != "running":
            break
        time.sleep(poll_s)  # the grading's progress, read again
    if state["state"] != "done":
        raise HandInRefused(f"grading {lab} failed; its output is above")
    data = _call("GET", f"results/{quote(lab)}", url=base, token=token, timeout=300)[0]
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        _extract_plain(tar, dest)
    print(f"graded {lab}: results in {dest}/results, feedback in {dest}/feedback", flush=True)
    return dest


def _extract_plain(tar: tarfile.TarFile, dest: Path) -> None:
    """Files and folders of ``tar`` under ``dest``, nothing else: no link, no device, no path
    that leaves ``dest`` (tarfile's "data" filter too, where this Python has it: 3.11.4+)."""
    root = dest.resolve()
    plain = [
        m
        for m in tar.getmembers()
        if (m.isfile() or m.isdir())
        and (root / m.name).resolve().is_relative_to(root)
        and not Path(m.name).is_absolute()
    ]
    for m in plain:
        m.mode = 0o644 if m.isfile() else 0o755
    kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    tar.extractall(dest, members=plain, **kw)
