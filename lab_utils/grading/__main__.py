"""``python -m lab_utils.grading release|check-release|autograde|export|feedback|student-repo|schedule|ta-pages|walkthroughs`` (the make targets)."""

from __future__ import annotations

import argparse
import os
import signal
import stat
import sys
from pathlib import Path

from lab_utils.grading import course, leaks, nbapi, scripts, student_repo
from lab_utils.grading.layout import GRADING_ROOT


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab_utils.grading", description="nbgrader course operations")
    parser.add_argument("--root", default=str(GRADING_ROOT), help="course root (default: grading/)")
    parser.add_argument("--labs-dir", default=None, help="committed student releases (default: <root>/../labs)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "release",
        help="generate the student release of every lab into labs/, "
        "and extract the reference scripts into grading/reference/",
    )
    p.add_argument("--labs", default="", help="comma-separated labs, e.g. 01,03 (default: all)")
    p = sub.add_parser(
        "check-release",
        help="exit 1 when labs/ differs from a fresh release or the student environment holds a solution",
    )
    p.add_argument("--labs", default="")
    p = sub.add_parser(
        "autograde",
        help="autograde SUBMISSIONS/<student>/<lab>/<lab>.ipynb, each in its own sandbox, in parallel; "
        "resumes where an interrupted run stopped",
    )
    p.add_argument("submissions")
    p.add_argument("--labs", default="")
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="cores the notebooks being graded may use at once (default: all usable); "
        "each takes its lab's `cpus` from grading/settings.yml",
    )
    p.add_argument("--regrade", action="store_true", help="grade again even what is unchanged since its last grading")
    p.add_argument(
        "--slurm",
        action="store_true",
        help="grade on the Slurm cluster this machine submits to: a job array per lab, a submission per element "
        "(run it where sbatch works, with the course on the shared file system)",
    )
    p.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="with --slurm: an option for every sbatch, e.g. --sbatch-arg=--partition=labs (repeatable)",
    )
    p.add_argument(
        "--max-running",
        type=int,
        default=None,
        metavar="N",
        help="with --slurm: at most N submissions of a lab graded at once (sbatch --array=...%%N)",
    )
    p.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="grade even where no sandbox can be made (not root, no cgroups): each submission then runs as you, "
        "with your files and network. Only for submissions you trust",
    )
    p = sub.add_parser("export", help="write grades to CSV")
    p.add_argument("--csv", default=None, help="output file (default: grading/grades.csv, or grading/<lms>.csv)")
    p.add_argument("--lms", choices=["canvas", "moodle"], default=None, help="the gradebook CSV that LMS imports")
    p = sub.add_parser("feedback", help="generate feedback HTML for autograded submissions")
    p.add_argument("--labs", default="")
    p = sub.add_parser(
        "student-repo",
        help="write (or update) DEST, a git repository a class may see: labs/, lab_utils, binder/, the lock; "
        "no solution, hidden test or reference script",
    )
    p.add_argument("dest")
    p.add_argument("--message", default=None, help="the commit message (default: names this repository's commit)")
    p.add_argument(
        "--references",
        default="",
        help="comma-separated labs whose reference scripts to publish too, each past its due time in the "
        "schedule (refused before); those published before stay",
    )
    _term_tools(sub)
    return parser


def _term_tools(sub) -> None:
    """The commands that teach a term rather than grade it: TA pages, walkthroughs, the schedule."""
    p = sub.add_parser(
        "ta-pages",
        help="write grading/ta/: for each submission, its written answers beside the outputs they refer to, "
        "as handed in, and their rubrics (make grades links them)",
    )
    p.add_argument("--labs", default="")
    p = sub.add_parser(
        "walkthroughs",
        help="write grading/walkthrough/<lab>.md for instructors: each exercise's solution, its common "
        "mistakes (the mutation check's, with the message the visible test gives each), hints",
    )
    p.add_argument("--labs", default="")
    p = sub.add_parser(
        "slides",
        help="render the lecture decks (slides/<lab>.ipynb) to slides/build/ with reveal.js from an installed "
        "npm package (no internet); --figures-from takes the labs' figures from executed notebooks first",
    )
    p.add_argument("--labs", default="")
    p.add_argument("--figures-from", type=Path, default=None, help="a folder of executed lab notebooks (<lab>.ipynb)")
    p.add_argument("--tier", default="", help="with --figures-from: the run they come from, in words")
    p.add_argument("--out", type=Path, default=None, help="where the decks are written (default slides/build)")
    p = sub.add_parser(
        "schedule",
        help="print the term's schedule (grading/course.yml, or the class's copy settings.yml's due_file names); "
        "--render writes it into the course map (labs/README.md)",
    )
    p.add_argument("--variant", default=None, help="another of the schedule's variants (default: the one it picks)")
    p.add_argument("--render", action="store_true", help="write the table into labs/README.md")
    p.add_argument("--check", action="store_true", help="exit 1 when labs/README.md's table is not current")


def _schedule(args, root: Path, labs_dir: Path) -> int:
    from lab_utils.grading import schedule

    path = schedule.course_schedule(root)
    term = schedule.load(path, args.variant)
    readme = labs_dir / "README.md"
    if args.render or args.check:
        text = readme.read_text()
        new = schedule.render(text, term)
        if args.check:
            if new != text:
                print(f"{readme}: its schedule is not {path}'s: python -m lab_utils.grading schedule --render")
                return 1
            print(f"{readme}: its schedule is {path}'s ({term.variant})")
            return 0
        readme.write_text(new)
        print(f"wrote the schedule of {path} ({term.variant}) into {readme}")
        return 0
    print(f"{path}, variant {term.variant} (of {', '.join(term.variants)}):\n\n{schedule.table(term)}")
    return 0


def _slides(args) -> int:
    from lab_utils.grading import slides

    if args.figures_from is not None and not args.tier:
        raise ValueError("--figures-from needs --tier: the run the figures come from, in words")
    from lab_utils.grading.layout import resolve_labs

    typed = [x for x in args.labs.split(",") if x]
    labs = resolve_labs(typed, [deck.stem for deck in slides.decks()]) if typed else None  # 07: 07_model_parallel
    if args.figures_from is not None:  # with --labs, those labs' figures only (the others' kept)
        manifest = slides.take_figures(args.figures_from, tier=args.tier, labs=labs)
        print(f"took {len(manifest['figures'])} figure(s) from {args.figures_from} into {slides.FIGURES}")
    written = slides.build(args.out or slides.BUILD, labs=labs)
    print(f"{len(written)} deck(s); open {(args.out or slides.BUILD) / 'index.html'}")
    return 0


def _check_release(labs, root: Path, labs_dir: Path) -> int:
    problems = course.check_release(labs, root, labs_dir)
    problems += leaks.check_student_environment(labs_dir=labs_dir, source_dir=root / "source")
    for line in problems:
        print(line)
    if problems:
        return 1
    print("labs/ is up to date with grading/source/, and neither labs/ nor lab_utils holds a solution")
    return 0


#: what each command writes under the course root (checked before it starts)
_WRITES = {
    "release": ("release",),
    "autograde": ("gradebook.db", "autograded", "results"),
    "feedback": ("feedback",),
    "export": ("results",),
    "ta-pages": ("ta",),
    "walkthroughs": ("walkthrough",),
}
#: commands that write nothing under the course root (the decks go to slides/build or --out)
_WRITES_ELSEWHERE = frozenset({"slides"})


def require_writable(root: Path, command: str) -> None:
    """ValueError, naming the folder and who cannot write it, unless ``command`` can write what
    it writes under ``root`` (a course laid out for a class is its instructors' group's: an
    account outside it reads an error here, not 300 lines of a read-only gradebook)."""
    if not root.is_dir() or command in _WRITES_ELSEWHERE:
        return  # no course here (the command says so itself), or nothing of it is written
    for name in (".", *_WRITES.get(command, ())):
        path = (root / name).resolve()
        while not path.exists():
            path = path.parent  # what would be made there is made in the first folder that exists
        if not os.access(path, os.W_OK):
            import pwd

            who = pwd.getpwuid(os.geteuid()).pw_name
            raise ValueError(
                f"{path} is not writable by you ({who}): {command} writes there. Run it as an instructor "
                "of this course (the group that owns the course folder: `id` lists yours; a new "
                "group takes effect at your next login or server start), or give --root a course of your own"
            )


def _shared_gradebook(db: Path) -> None:
    """The gradebook of a course its instructors' group shares, writable by the group: SQLite
    makes a database file 0644 whatever the umask (a gradebook the grading service made as root
    was read-only to every instructor). An empty file is an empty database to SQLite."""
    try:
        fd = os.open(db, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o664)
    except OSError:
        return  # not ours to make or open: the command names what it cannot write
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and not st.st_mode & 0o020:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o060)
    finally:
        os.close(fd)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stopped as an interrupt is, and said so by the exit status (143)."""


def _terminated(signum, frame):
    raise Terminated(f"signal {signum}")


def stop_on_sigterm() -> None:
    """SIGTERM (kill, Slurm's scancel before its SIGKILL, a service manager) stops a batch as
    Ctrl-C does: its sandboxes killed and removed, what is graded kept. Python's default ends
    the process at once, and left each running sandbox's worker grading on, orphaned. For an
    entry point's main thread (the CLI's, a bench's)."""
    signal.signal(signal.SIGTERM, _terminated)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    # Ctrl-C (or kill -INT) always stops a batch. A command started in the background by a
    # non-interactive shell (nohup, a CI harness, `make autograde &`) inherits SIGINT *ignored*,
    # and Python keeps an inherited SIG_IGN: the interrupt was lost and the batch graded the
    # whole class. An entry point, not library code, so it may set the handler (as ipykernel does).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop_on_sigterm()
    labs = [s for s in getattr(args, "labs", "").split(",") if s]
    root = Path(args.root)
    if root.is_dir() and root.stat().st_mode & 0o2000:  # a course laid out for a class's instructors' group
        os.umask(os.umask(0) & ~0o070)  # what one instructor writes, the others may change
        _shared_gradebook(root / "gradebook.db")
    labs_dir = Path(args.labs_dir) if args.labs_dir else root.resolve().parent / "labs"
    try:
        require_writable(root, args.command)
        if args.command == "release":
            for path in course.release(labs, root, labs_dir):
                print(f"released {path}")
            for path in scripts.extract_references(labs, root):
                print(f"reference {path}")
        elif args.command == "check-release":
            return _check_release(labs, root, labs_dir)
        elif args.command == "autograde":
            if (args.sbatch_arg or args.max_running) and not args.slurm:
                raise ValueError("--sbatch-arg and --max-running need --slurm")
            course.autograde(
                args.submissions,
                labs,
                root,
                jobs=args.jobs,
                resume=not args.regrade,
                slurm=args.slurm,
                sbatch_args=args.sbatch_arg,
                max_running=args.max_running,
                unsafe_no_sandbox=args.unsafe_no_sandbox,
            )
        elif args.command == "export":
            if args.lms:
                from lab_utils.grading import lms

                print(f"wrote {lms.export(args.csv or root / f'{args.lms}.csv', args.lms, root)}")
            else:
                print(f"wrote {nbapi.export_grades(args.csv, root)}")
        elif args.command == "feedback":
            for path in course.feedback(labs, root):
                print(f"feedback {path}")
        elif args.command == "ta-pages":
            from lab_utils.grading import ta_pages

            pages = ta_pages.write(root, labs)
            print(f"wrote {len(pages) - 1} page(s) for the written answers; open {pages[-1]}")
        elif args.command == "walkthroughs":
            from lab_utils.grading import walkthrough

            for path in walkthrough.build(root=root, labs=labs, progress=lambda line: None):
                print(f"wrote {path}")
        elif args.command == "schedule":
            return _schedule(args, root, labs_dir)
        elif args.command == "slides":
            return _slides(args)
        elif args.command == "student-repo":
            publish = [x for x in args.references.split(",") if x]
            print(student_repo.write(args.dest, root.resolve().parent, message=args.message, publish=publish))
    except (RuntimeError, ValueError, LookupError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # autograde has said what is kept and how to resume
        return 128 + signal.SIGTERM if isinstance(exc, Terminated) else 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
