"""House rules of ``lab_utils``, checked by reading its source with ``ast`` (no lab_utils
module is imported here: many import TensorFlow lazily). "Imports" means every import
statement, at module level *and* inside functions; ``importlib.import_module`` calls are
not seen.

1. Task side and kernel side (``lab_utils/training/``, packages at any depth). A module's
   side follows from its file name:

   - kernel side (the notebook kernel): ``runs.py``, ``*_runs.py`` and ``KERNEL_SHARED``;
   - ``__init__.py``: lazy (see below);
   - task side (a launched process): everything else, ``__main__.py`` included.

   A *pure helper* is a task-side module that imports nothing in ``TENSORFLOW``
   (argument parsers, settings, loading a student's file).

   - Task side never imports ``TASK_FORBIDDEN`` (pandas, matplotlib, lab_utils.metrics,
     lab_utils.plots, lab_utils.cluster) except the names in ``TASK_SIDE_CLUSTER``, nor any
     kernel-side module.
   - Kernel side never imports ``TENSORFLOW`` (tensorflow, horovod, lab_utils.models), nor
     a task-side module that is not a pure helper.
   - ``__init__.py`` runs in both processes (importing ``p.task`` runs ``p/__init__.py``),
     so at module level it obeys both sides' rules: nothing in ``TENSORFLOW`` or
     ``TASK_FORBIDDEN`` (but ``TASK_SIDE_CLUSTER``), no kernel-side module, no task-side
     module but pure helpers. It hands out ``runs`` and ``task`` lazily, with a PEP 562
     ``__getattr__`` (imports inside functions are free).

2. Layers: ``GENERIC_LAYERS`` never import ``lab_utils.training`` or ``lab_utils.grading``;
   ``lab_utils.training`` never imports ``lab_utils.grading``.

3. No import cycle among lab_utils modules, counting imports inside functions too (a lazy
   import hides a cycle from the interpreter, not from the design). An edge goes to the
   module an import loads: ``from p import x`` loads ``p.x`` if that is a module, else
   ``p``'s ``__init__`` (so a submodule taking a name from its own package's ``__init__``,
   which imports that submodule, IS a cycle); importing ``a.b.c`` also loads ``a`` and
   ``a.b``, except packages that contain the importer (already loading when it runs).

4. Sizes: a module at most ``MAX_MODULE_LINES`` lines; a function or method at most
   ``MAX_FUNCTION_LINES`` (``def`` line to last line, decorators excluded; a nested function
   counts in its parent and on its own).

5. What a grading kernel imports: its copy of ``lab_utils`` holds ``lab_utils.grading``'s
   ``KERNEL_GRADING`` modules only, and no ``lab_utils.hub`` (``lab_utils/grading/view.py``). So
   no module of ``lab_utils`` outside ``grading`` and ``hub``, and none of those kernel modules,
   imports a ``lab_utils.grading`` module outside them, or ``lab_utils.hub`` (the autograder's own
   modules are not importable where student code runs).

6. Private names stay in their module: no module reads another module's ``_name`` (a
   function, class or variable whose name starts with one underscore), whether by
   ``from m import _name`` or as ``m._name`` through an imported module. What one module
   needs from another is public there. A private *module* (``lab_utils._guard``) is not a
   name: importing it is not this rule's business. ``PRIVATE_CROSSINGS`` lists the
   crossings still allowed, each with its reason.

Each rule is a pure checker over a package directory, shown to fail on a deliberate
violation in a temporary tree (the ``test_checker_*`` tests at the end).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path
from typing import NamedTuple

import pytest

LAB_UTILS = Path(__file__).resolve().parents[2] / "lab_utils"

# --- rule 1: task side / kernel side --------------------------------------------------
TRAINING = "lab_utils.training"
#: Kernel-side modules of lab_utils/training/ whose name is not runs.py / *_runs.py.
KERNEL_SHARED = frozenset({"lab_utils.training.runs", "lab_utils.training.tables"})
#: How a module gets TensorFlow: ``lab_utils.models`` is its front door (import_tensorflow,
#: the model builders). Never on the kernel side.
TENSORFLOW = ("tensorflow", "horovod", "lab_utils.models")
#: Never imported by the task side, anywhere (notebook-only libraries and layers)...
TASK_FORBIDDEN = ("pandas", "matplotlib", "lab_utils.metrics", "lab_utils.plots", "lab_utils.cluster")
#: ...except these: the task side of lab_utils/cluster/tf.py, imported as its docstring
#: shows (``from lab_utils.cluster import start_server, task_config``). That runs
#: lab_utils/cluster/__init__.py, which imports every cluster submodule;
#: test_task_side_cluster_names_are_light checks that none of them loads pandas,
#: matplotlib, metrics, plots or TensorFlow at import.
TASK_SIDE_CLUSTER = frozenset(
    {"lab_utils.cluster.task_config", "lab_utils.cluster.start_server", "lab_utils.cluster.TaskConfig"}
)

# --- rule 2: layers ---------------------------------------------------------------------
#: Generic layers, as paths under lab_utils/ (the layers lab_utils/__init__.py lists before
#: training, and data_cache, data's cache): never import UPPER_LAYERS.
GENERIC_LAYERS = (
    "cluster/",
    "metrics/",
    "config.py",
    "resources.py",
    "_guard.py",
    "report.py",
    "plots.py",
    "data.py",
    "data_files.py",
    "options.py",
    "standins.py",
    "data_cache.py",
    "models.py",
    "display.py",
    "doctor.py",
)
UPPER_LAYERS = ("lab_utils.training", "lab_utils.grading")

# --- rule 5: what a grading kernel imports ------------------------------------------------
#: the modules of lab_utils.grading a grading kernel holds (lab_utils/grading/view.py's list)
KERNEL_GRADING = ("__init__", "cells", "handin", "late", "layout", "safefiles", "schedule", "scripts", "selfcheck",
                  "settings", "throughput")  # fmt: skip

# --- rule 4: sizes ----------------------------------------------------------------------
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


# --- rule 6: private names ----------------------------------------------------------------
#: ``(importer, "module._name")`` crossings still allowed, each with why.
PRIVATE_CROSSINGS: dict[tuple[str, str], str] = {}


class Import(NamedTuple):
    line: int
    module: str  # absolute: "a.b" for both ``import a.b`` and ``from a.b import c``
    name: str | None  # "c" for ``from a.b import c``; None for ``import a.b``
    top_level: bool  # runs when the module is imported (not inside a function)

    @property
    def target(self) -> str:
        return f"{self.module}.{self.name}" if self.name and self.name != "*" else self.module

    @property
    def where(self) -> str:
        return "at module level" if self.top_level else "inside a function"


class Violation(NamedTuple):
    path: Path
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message} [{self.rule}]"


def matches(target: str, prefixes: tuple[str, ...] | frozenset[str]) -> bool:
    """``target`` is one of ``prefixes`` or inside one (``matplotlib.pyplot`` is ``matplotlib``)."""
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` in ``package`` names, a relative one made absolute."""
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        parent = ".".join(parts[: len(parts) - node.level + 1])
        base = f"{parent}.{base}" if base else parent
    return base


def parse_imports(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import statement of ``module``'s source, relative ones made absolute."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, top_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend(Import(child.lineno, a.name, None, top_level) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = absolute(child, package)
                found.extend(Import(child.lineno, base, a.name, top_level) for a in child.names)
            visit(child, top_level and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(ast.parse(source), True)
    return found


class Module(NamedTuple):
    name: str  # "lab_utils.cluster" for lab_utils/cluster/__init__.py
    path: Path
    source: str
    imports: list[Import]


def load_package(root: Path) -> dict[str, Module]:
    """Every ``.py`` file under ``root`` (a package directory), by dotted module name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        source = path.read_text(encoding="utf-8")
        modules[name] = Module(name, path, source, parse_imports(source, name, is_package))
    return modules


def loaded(imp: Import, modules: dict[str, Module]) -> str | None:
    """The package module an import loads: ``p.x`` if it is a module, else the nearest
    existing ``p``; None for a module outside the package."""
    if imp.name and imp.target in modules:
        return imp.target
    name = imp.module
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _shown(path: Path, root: Path) -> Path:
    return path.relative_to(root.parent)


# --- rule 1 ------------------------------------------------------------------------------


def side(module: Module) -> str | None:
    """'kernel', 'task' or 'lazy' (an ``__init__.py``) for a module of lab_utils.training."""
    if not matches(module.name, (TRAINING,)):
        return None
    if module.path.name == "__init__.py":
        return "lazy"
    leaf = module.name.rpartition(".")[2]
    return "kernel" if leaf == "runs" or leaf.endswith("_runs") or module.name in KERNEL_SHARED else "task"


def is_pure_helper(module: Module) -> bool:
    return side(module) == "task" and not any(matches(i.target, TENSORFLOW) for i in module.imports)


def side_problem(kind: str | None, imp: Import, dep: Module | None) -> str | None:
    """What is wrong with a ``kind``-side module importing ``imp`` (which loads ``dep``)."""
    task_forbidden = matches(imp.target, TASK_FORBIDDEN) and imp.target not in TASK_SIDE_CLUSTER
    dep_side = side(dep) if dep else None
    impure_task = dep_side == "task" and not is_pure_helper(dep)
    if kind == "task" and task_forbidden:
        return "task-side module imports a notebook-side library or layer"
    if kind == "task" and dep_side == "kernel":
        return "task-side module imports a kernel-side module"
    if kind == "kernel" and matches(imp.target, TENSORFLOW):
        return "kernel-side module imports TensorFlow/Horovod (or lab_utils.models)"
    if kind == "kernel" and impure_task:
        return f"kernel-side module imports {dep.name}, a task-side module that imports TensorFlow (move what it needs to a pure helper)"
    if kind == "lazy" and imp.top_level and (matches(imp.target, TENSORFLOW) or task_forbidden):
        return "__init__.py imports a heavy module eagerly; hand it out with a PEP 562 __getattr__"
    if kind == "lazy" and imp.top_level and (dep_side == "kernel" or impure_task):
        return "__init__.py imports a runs/task module eagerly; hand it out with a PEP 562 __getattr__"
    return None


def check_sides(root: Path) -> list[Violation]:
    """Rule 1 over the package at ``root``: one violation per statement and problem."""
    modules = load_package(root)
    found: dict[tuple[Path, int, str], list[Import]] = {}
    for mod in modules.values():
        for imp in mod.imports:
            problem = side_problem(side(mod), imp, modules.get(loaded(imp, modules) or ""))
            if problem:
                found.setdefault((_shown(mod.path, root), imp.line, problem), []).append(imp)
    return [
        Violation(path, line, "rule 1: task/kernel side", f"{problem}: {statement(imps)} ({imps[0].where})")
        for (path, line, problem), imps in found.items()
    ]


def statement(imps: list[Import]) -> str:
    """The import statement as written (names of one ``from`` statement joined)."""
    if imps[0].name is None:
        return "import " + ", ".join(i.module for i in imps)
    return f"from {imps[0].module} import " + ", ".join(str(i.name) for i in imps)


def check_module_level_closure(root: Path, start: str, forbidden: tuple[str, ...]) -> list[Violation]:
    """Imports in ``forbidden`` that importing ``start`` runs: module-level imports of
    ``start`` and of every package module it loads at module level, transitively."""
    modules = load_package(root)
    out, seen, todo = [], {start}, deque([start])
    while todo:
        mod = modules[todo.popleft()]
        for imp in (i for i in mod.imports if i.top_level):
            if matches(imp.target, forbidden):
                message = f"importing {start} imports {imp.target} (via {mod.name})"
                out.append(Violation(_shown(mod.path, root), imp.line, "rule 1: task-side cluster names", message))
            for dep in _loads(mod.name, imp, modules):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
    return out


# --- rule 2 ------------------------------------------------------------------------------


def check_layers(root: Path, generic: tuple[str, ...] = GENERIC_LAYERS) -> list[Violation]:
    """Rule 2: ``generic`` (paths under ``root``; a trailing / for a subpackage) never import
    ``UPPER_LAYERS``; training never imports grading."""
    lower = tuple("lab_utils." + g.rstrip("/").removesuffix(".py").replace("/", ".") for g in generic)
    training, grading = UPPER_LAYERS
    out = []
    for mod in load_package(root).values():
        banned = UPPER_LAYERS if matches(mod.name, lower) else (grading,) if matches(mod.name, (training,)) else ()
        for imp in mod.imports:
            if matches(imp.target, banned):
                layer = "a generic layer" if banned == UPPER_LAYERS else "training"
                message = (
                    f"{layer} imports {statement([imp])} ({imp.where}): pass what it needs in, or move the code up"
                )
                out.append(Violation(_shown(mod.path, root), imp.line, "rule 2: layers", message))
    return out


# --- rule 3 ------------------------------------------------------------------------------


def _loads(importer: str, imp: Import, modules: dict[str, Module]) -> list[str]:
    """Package modules one import loads: the one it names, plus its parent packages that do
    not contain ``importer`` (those are already being imported when it runs)."""
    target = loaded(imp, modules)
    if target is None:
        return []
    parts = target.split(".")
    parents = [".".join(parts[:n]) for n in range(1, len(parts))]
    parents = [p for p in parents if p in modules and not matches(importer, (p,))]
    return [d for d in [*parents, target] if d != importer]


def import_graph(modules: dict[str, Module]) -> dict[str, dict[str, Import]]:
    """``{importer: {imported: the first import statement that loads it}}``."""
    graph: dict[str, dict[str, Import]] = {name: {} for name in modules}
    for mod in modules.values():
        for imp in mod.imports:
            for dep in _loads(mod.name, imp, modules):
                graph[mod.name].setdefault(dep, imp)
    return graph


def strongly_connected(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def shortest_cycle(graph: dict[str, dict[str, Import]], start: str, within: set[str]) -> list[str]:
    """The shortest ``start -> ... -> start`` path inside ``within`` (breadth first)."""
    came_from: dict[str, str] = {}
    todo = deque([start])
    while todo:
        v = todo.popleft()
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if w in within and w not in came_from:
                came_from[w] = v
                todo.append(w)
    raise AssertionError(f"{start} is on no cycle")


def _rotated(cycle: list[str]) -> tuple[str, ...]:
    """The same cycle, starting at its smallest module (so rotations compare equal)."""
    i = cycle.index(min(cycle))
    return tuple(cycle[i:] + cycle[:i])


def check_cycles(root: Path) -> list[Violation]:
    """Rule 3: one violation per set of modules that import each other (a strongly connected
    component), showing its shortest cycle through each member and the lines to look at."""
    modules = load_package(root)
    graph = import_graph(modules)
    out = []
    for component in strongly_connected(graph):
        members = set(component)
        cycles = {_rotated(shortest_cycle(graph, m, members)[:-1]) for m in component}
        lines = []
        for cycle in sorted(cycles, key=len):
            cycle = (*cycle, cycle[0])
            hops = []
            for a, b in zip(cycle, cycle[1:], strict=False):
                imp = graph[a][b]
                hops.append(f"{_shown(modules[a].path, root)}:{imp.line} `{statement([imp])}` loads {b} ({imp.where})")
            lines.append(" -> ".join(cycle) + "\n        " + "\n        ".join(hops))
        first = modules[component[0]]
        message = "import cycle; make one of these imports go the other way:\n    " + "\n    ".join(lines)
        out.append(Violation(_shown(first.path, root), 1, "rule 3: no import cycle", message))
    return out


# --- rule 4 ------------------------------------------------------------------------------


def check_sizes(
    source: str, shown: Path | str, max_module: int = MAX_MODULE_LINES, max_function: int = MAX_FUNCTION_LINES
) -> list[Violation]:
    """Rule 4 over one module's source."""
    out = []
    if (n := len(source.splitlines())) > max_module:
        message = f"module has {n} lines (at most {max_module}): split it by job"
        out.append(Violation(Path(shown), 1, "rule 4: sizes", message))

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}."
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := child.end_lineno - child.lineno + 1) > max_function:
                    message = f"function {name[:-1]} has {n} lines (at most {max_function}): extract helpers"
                    out.append(Violation(Path(shown), child.lineno, "rule 4: sizes", message))
            visit(child, name)

    visit(ast.parse(source), "")
    return out


def check_kernel_imports(root: Path, kernel_grading: tuple[str, ...] = KERNEL_GRADING) -> list[Violation]:
    """Rule 5: what a grading kernel's copy of lab_utils imports is in it."""
    kept = {f"lab_utils.grading.{m}" if m != "__init__" else "lab_utils.grading" for m in kernel_grading}
    modules = load_package(root)
    out = []
    for module in modules.values():
        in_kernel = module.name in kept or not matches(module.name, ("lab_utils.grading", "lab_utils.hub"))
        if not in_kernel:
            continue
        for imp in module.imports:
            target = loaded(imp, modules)
            if target and matches(target, ("lab_utils.grading", "lab_utils.hub")) and target not in kept:
                message = f"{module.name} imports {target} {imp.where}, which no grading kernel holds"
                out.append(Violation(_shown(module.path, root), imp.line, "rule 5: kernel imports", message))
    return out


# --- rule 6 ------------------------------------------------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _module_aliases(tree: ast.AST, module: str, is_package: bool, modules: dict) -> dict[str, str]:
    """Local names bound to a package module anywhere in ``module`` (``import a.b as x``,
    ``from a import b``, and ``import a.b``, which binds ``a``)."""
    package = module if is_package else module.rpartition(".")[0]
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node, package)
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
    return {k: v for k, v in aliases.items() if v in modules}


def check_private_names(root: Path, allowed: dict[tuple[str, str], str] | None = None) -> list[Violation]:
    """Rule 6: every read of another module's private name, but the ``allowed`` ones."""
    allowed = PRIVATE_CROSSINGS if allowed is None else allowed
    modules = load_package(root)
    out = []

    def add(module: Module, line: int, target: str) -> None:
        if (module.name, target) not in allowed:
            message = f"{module.name} reads {target}, private to {target.rpartition('.')[0]}"
            out.append(Violation(_shown(module.path, root), line, "rule 6: private names", message))

    for module in modules.values():
        for imp in module.imports:
            if imp.name and _private(imp.name) and imp.target not in modules and imp.module != module.name:
                add(module, imp.line, imp.target)
        tree = ast.parse(module.source)
        aliases = _module_aliases(tree, module.name, module.path.name == "__init__.py", modules)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            base = _dotted(node.value)
            if base is None or base.split(".")[0] not in aliases:
                continue
            head, _, rest = base.partition(".")
            owner = f"{aliases[head]}.{rest}" if rest else aliases[head]
            target = f"{owner}.{node.attr}"
            if owner in modules and owner != module.name and target not in modules:
                add(module, node.lineno, target)
    return out


def _report(violations: list[Violation]) -> str:
    return f"{len(violations)} violation(s):\n" + "\n".join(map(str, violations))


# --- the rules, on lab_utils ---------------------------------------------------------------


def test_rule_1_task_side_and_kernel_side_import_what_their_process_can_afford():
    violations = check_sides(LAB_UTILS)
    assert not violations, _report(violations)


def test_task_side_cluster_names_are_light():
    """What ``from lab_utils.cluster import task_config`` runs loads no notebook-side module."""
    modules = load_package(LAB_UTILS)
    for allowed in TASK_SIDE_CLUSTER:
        package, _, name = allowed.rpartition(".")
        assert any(i.top_level and i.name == name for i in modules[package].imports), f"{allowed} is not exported"
    forbidden = (*TENSORFLOW, *(p for p in TASK_FORBIDDEN if p != "lab_utils.cluster"))
    violations = check_module_level_closure(LAB_UTILS, "lab_utils.cluster", forbidden)
    assert not violations, _report(violations)


@pytest.mark.parametrize("layer", GENERIC_LAYERS)
def test_generic_layers_exist(layer):
    assert (LAB_UTILS / layer).exists(), f"GENERIC_LAYERS names lab_utils/{layer}, which is gone: update the list"


def test_rule_2_generic_layers_never_import_training_or_grading():
    violations = check_layers(LAB_UTILS)
    assert not violations, _report(violations)


def test_rule_3_no_import_cycle():
    violations = check_cycles(LAB_UTILS)
    assert not violations, _report(violations)


def test_rule_5_a_grading_kernel_imports_only_what_its_copy_of_lab_utils_holds():
    from lab_utils.grading.view import KERNEL_GRADING as VIEWS

    assert sorted(f"{m}.py" for m in KERNEL_GRADING) == sorted(VIEWS), "keep the two lists the same"
    violations = check_kernel_imports(LAB_UTILS)
    assert not violations, _report(violations)


def test_rule_4_modules_and_functions_stay_small():
    violations = [v for m in load_package(LAB_UTILS).values() for v in check_sizes(m.source, _shown(m.path, LAB_UTILS))]
    assert not violations, _report(violations)


def test_rule_6_private_names_stay_in_their_module():
    violations = check_private_names(LAB_UTILS)
    assert not violations, _report(violations)


def test_rule_6_every_allowed_crossing_still_exists_and_says_why():
    found = {(v.message.split(" reads ")[0], v.message.split(" reads ")[1].split(",")[0])
             for v in check_private_names(LAB_UTILS, allowed={})}  # fmt: skip
    assert all(why.strip() for why in PRIVATE_CROSSINGS.values())
    assert set(PRIVATE_CROSSINGS) <= found, sorted(set(PRIVATE_CROSSINGS) - found)


# --- the checkers can fail -----------------------------------------------------------------


def write_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A fake ``lab_utils`` under ``tmp_path`` (the checkers' constants name ``lab_utils.*``)."""
    for rel, text in files.items():
        path = tmp_path / "lab_utils" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "lab_utils"


FAKE = {
    "__init__.py": "",
    "cluster/__init__.py": "from lab_utils.cluster.tf import TFCluster, task_config\n",
    "cluster/tf.py": "def task_config(): pass\nclass TFCluster: pass\n",
    "training/__init__.py": "",
    "training/ps/__init__.py": (
        "from lab_utils.training.ps.settings import parse\n"  # a pure helper: fine
        "def __getattr__(name):\n    from lab_utils.training.ps import runs\n    return runs\n"
    ),
    "training/ps/settings.py": "import argparse\ndef parse(): pass\n",
    "training/ps/task.py": (
        "from lab_utils.cluster import task_config\n"
        "from lab_utils.training.ps import settings\n"
        "def main():\n    import tensorflow as tf\n"
    ),
    "training/ps/runs.py": (
        "import pandas as pd\n"
        "from lab_utils.cluster import TFCluster\n"
        "from lab_utils.training.ps.settings import parse\n"
    ),
}


def lines(violations: list[Violation]) -> list[tuple[str, int]]:
    return [(v.path.as_posix(), v.line) for v in violations]


def test_checker_rule_1_passes_a_clean_tree(tmp_path):
    assert check_sides(write_tree(tmp_path, FAKE)) == []


def test_checker_rule_1_catches_each_kind_of_violation(tmp_path):
    root = write_tree(
        tmp_path,
        {
            **FAKE,
            "training/ps/task.py": (
                "from lab_utils.cluster import task_config\n"
                "def table():\n    import pandas as pd\n"  # line 3
                "from lab_utils.cluster import TFCluster\n"  # line 4
                "from lab_utils.training.ps import runs\n"  # line 5
                "def main():\n    import tensorflow as tf\n"
            ),
            "training/ps/runs.py": (
                "def f():\n    import tensorflow as tf\n"  # line 2
                "from lab_utils.training.ps.task import main\n"  # line 3: task imports TF
                "from lab_utils.training.ps import settings\n"  # pure helper: fine
            ),
            "training/ps/__init__.py": (
                "from lab_utils.training.ps.runs import run\n"  # line 1
                "from lab_utils.cluster import task_config, TFCluster\n"  # line 2: TFCluster
            ),
        },
    )
    found = check_sides(root)
    assert lines(found) == [
        ("lab_utils/training/ps/__init__.py", 1),
        ("lab_utils/training/ps/__init__.py", 2),
        ("lab_utils/training/ps/runs.py", 2),
        ("lab_utils/training/ps/runs.py", 3),
        ("lab_utils/training/ps/task.py", 3),
        ("lab_utils/training/ps/task.py", 4),
        ("lab_utils/training/ps/task.py", 5),
    ], _report(found)
    assert str(found[1]).endswith(
        "eagerly; hand it out with a PEP 562 __getattr__: from lab_utils.cluster import TFCluster (at module level) [rule 1: task/kernel side]"
    )
    assert "kernel-side module imports TensorFlow/Horovod" in str(found[2])
    assert "task-side module imports a notebook-side library or layer: import pandas (inside a function)" in str(
        found[4]
    )


def test_checker_rule_1_module_level_closure(tmp_path):
    root = write_tree(tmp_path, {**FAKE, "cluster/tf.py": "import matplotlib\ndef f():\n    import pandas\n"})
    found = check_module_level_closure(root, "lab_utils.cluster", ("pandas", "matplotlib"))
    assert lines(found) == [("lab_utils/cluster/tf.py", 1)], _report(found)


def test_checker_rule_2_catches_a_generic_layer_importing_training(tmp_path):
    root = write_tree(
        tmp_path,
        {
            **FAKE,
            "report.py": "def f():\n    from lab_utils.training import ps\n",
            "training/loop.py": "from lab_utils import grading\n",
            "grading/__init__.py": "from lab_utils.training import loop\n",  # grading may
        },
    )
    found = check_layers(root, ("cluster/", "report.py"))
    assert lines(found) == [("lab_utils/report.py", 2), ("lab_utils/training/loop.py", 1)], _report(found)


def test_checker_rule_3_catches_cycles(tmp_path):
    root = write_tree(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from lab_utils import b\n",
            "b.py": "def f():\n    from . import a\n",  # a lazy import is still an edge
            "pkg/__init__.py": "from lab_utils.pkg.sub import thing\nNAME = 1\n",
            "pkg/sub.py": "from lab_utils.pkg import NAME\nthing = NAME\n",  # a name from __init__: a cycle
            "pkg/other.py": "from lab_utils.pkg import sub\n",  # a submodule: no edge to __init__
            "c.py": "import lab_utils.pkg.other\n",  # loads pkg's __init__ too
        },
    )
    found = check_cycles(root)
    assert [v.path.as_posix() for v in found] == ["lab_utils/a.py", "lab_utils/pkg/__init__.py"], _report(found)
    assert "lab_utils/b.py:2 `from lab_utils import a` loads lab_utils.a (inside a function)" in str(found[0])
    assert "lab_utils.pkg -> lab_utils.pkg.sub -> lab_utils.pkg" in str(found[1])
    graph = import_graph(load_package(root))
    assert set(graph["lab_utils.pkg.other"]) == {"lab_utils.pkg.sub"}
    assert set(graph["lab_utils.c"]) == {"lab_utils.pkg", "lab_utils.pkg.other"}


def test_checker_rule_4_catches_long_modules_and_functions():
    assert check_sizes("x = 1\n" * 600, "m.py") == []
    assert lines(check_sizes("x = 1\n" * 601, "m.py")) == [("m.py", 1)]
    ok = "@decorator\ndef f():\n" + "    x = 1\n" * 79  # 80 lines: the decorator does not count
    long = "class C:\n    def g(self):\n        def inner():\n" + "            x = 1\n" * 80 + "        return inner\n"
    assert check_sizes(ok, "m.py") == []
    found = check_sizes(long, "m.py")
    assert [(v.line, v.message.split(" has")[0]) for v in found] == [(2, "function C.g"), (3, "function C.g.inner")]
    assert "function C.g has 83 lines (at most 80)" in str(found[0])


def test_checker_rule_5_catches_a_kernel_module_importing_the_autograder(tmp_path):
    root = write_tree(
        tmp_path,
        {
            "grading/__init__.py": "from lab_utils.grading.cells import credit\n",
            "grading/cells.py": "",
            "grading/batch.py": "from lab_utils.hub import client\n",  # the autograder: may import anything
            "hub/__init__.py": "",
            "hub/client.py": "",
            "notebook.py": "def f():\n    from lab_utils.grading import batch\n",
        },
    )
    assert check_kernel_imports(root, ("__init__", "cells")) == [
        Violation(Path("lab_utils/notebook.py"), 2, "rule 5: kernel imports",
                  "lab_utils.notebook imports lab_utils.grading.batch inside a function, which no grading kernel holds"),
    ]  # fmt: skip


def test_checker_rule_6_catches_private_names_read_across_modules(tmp_path):
    root = write_tree(
        tmp_path,
        {
            "__init__.py": "",
            "_guard.py": "",  # a private module: importing it is not a private name
            "a.py": "_x = 1\ndef _f(): pass\ndef g(): return _f()\n",  # its own: fine
            "b.py": "from lab_utils.a import _f, g\nfrom lab_utils import _guard\n",
            "c.py": "import lab_utils.a as m\nfrom lab_utils import a\nimport lab_utils.a\n"
            "y = m._x + a._x + lab_utils.a._x + m.g()\n",
        },
    )
    found = [(v.path.name, v.line, v.message.split(" reads ")[1].split(",")[0]) for v in check_private_names(root, {})]
    assert sorted(found) == [("b.py", 1, "lab_utils.a._f")] + [("c.py", 4, "lab_utils.a._x")] * 3
    assert (
        check_private_names(root, {("lab_utils.b", "lab_utils.a._f"): "why", ("lab_utils.c", "lab_utils.a._x"): "why"})
        == []
    )
