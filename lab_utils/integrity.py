"""What code in a process replaced of the lab's own: one check, as source text, run in the
grader's kernel after each test cell (:func:`lab_utils.grading.judge.probe_code`: it prints what
it found) and in a task that runs a student's code, before the task reports what it measured
(:func:`lab_utils.training.student.check_untouched`).

It finds a builtin or a clock of ``time`` that is no longer Python's own, IPython's traceback,
display or execution machinery (in a kernel), and a function of a ``lab_utils`` module or of one
of its classes whose code was not loaded from the ``trusted`` folders. It is text, and runs in a
namespace of its own, so that nothing it uses can be reached from the notebook's names."""

from __future__ import annotations

__all__ = ["PROBE", "replaced"]

#: defines ``_lab_found(trusted) -> sorted list`` and ``_lab_probe(nonce, lab_dir, trusted)``,
#: which prints ``nonce`` and that list as JSON
PROBE = r"""
def _lab_found(trusted):
    import sys, types, builtins as b
    bad = []
    cls = (1).__class__.__class__  # `type`, not looked up by name
    builtin = cls(len)
    names = ("isinstance", "type", "len", "abs", "all", "any", "sum", "min", "max", "round", "float", "int",
             "bool", "str", "list", "dict", "tuple", "set", "sorted", "print", "getattr", "hasattr", "range",
             "zip", "map", "filter", "repr", "iter", "next", "open", "__import__", "compile", "exec", "eval")
    for n in names:
        f = b.__dict__.get(n)
        if not (cls(f) in (builtin, cls) and getattr(f, "__name__", None) == n):
            bad.append("builtins." + n)
    import time
    for n in ("perf_counter", "monotonic", "time", "process_time", "perf_counter_ns", "monotonic_ns",
              "time_ns"):
        f = time.__dict__.get(n)
        if not (cls(f) is builtin and f.__name__ == n):
            bad.append("time." + n)
    def foreign(f, generated=False):
        code = getattr(f, "__code__", None)
        if code is None or code.co_filename.startswith(trusted):
            return False
        # a dataclass's or named tuple's own methods, which Python writes from a string
        name = getattr(f, "__name__", "")
        return not (generated and code.co_filename == "<string>" and name.startswith("__") and name.endswith("__"))
    ip = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    if ip is not None:
        for n in ("showtraceback", "_showtraceback", "showsyntaxerror", "run_cell", "run_cell_async",
                  "run_ast_nodes", "run_code", "transform_cell", "should_run_async", "init_traceback_handlers"):
            own = getattr(cls(ip), n, None)
            mine = ip.__dict__.get(n, own)  # ipykernel keeps its class's _showtraceback on the instance
            if foreign(own) or getattr(mine, "__func__", mine) is not own:
                bad.append("IPython shell." + n)
        if ip.custom_exceptions:
            bad.append("IPython shell.custom_exceptions")
        for fmt in ip.display_formatter.formatters.values():
            for t, f in list(fmt.type_printers.items()) + list(fmt.deferred_printers.items()):
                if foreign(f):
                    bad.append("IPython formatter for " + str(getattr(t, "__name__", t)))
        for n in ("displayhook", "excepthook"):
            if foreign(getattr(sys, n, None)):
                bad.append("sys." + n)
    for name, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType):
            continue
        name = getattr(getattr(mod, "__spec__", None), "name", None) or name  # a task run with -m: __main__
        if not (name == "lab_utils" or name.startswith("lab_utils.")):
            continue
        for attr, f in list(vars(mod).items()):
            if foreign(f):
                bad.append(name + "." + attr)
            elif cls(f) is cls and getattr(f, "__module__", "") == name:
                generated = "__dataclass_fields__" in vars(f) or "_fields" in vars(f)
                for m, g in list(vars(f).items()):
                    g = getattr(g, "__func__", g)
                    if foreign(g, generated):
                        bad.append(name + "." + attr + "." + m)
    return sorted(set(bad))


def _lab_probe(nonce, lab_dir, trusted):
    print(nonce + " " + __import__("json").dumps(_lab_found(trusted)))
"""


def replaced(trusted: tuple[str, ...]) -> list[str]:
    """What :data:`PROBE` finds in this process (``trusted``: the folders whose code is the lab's)."""
    namespace: dict = {}
    exec(compile(PROBE, "<lab_utils integrity probe>", "exec"), namespace)  # noqa: S102 (the probe's own text)
    return namespace["_lab_found"](tuple(trusted))
