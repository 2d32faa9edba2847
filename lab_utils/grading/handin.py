"""Plain values a hidden test hands to the grader, which judges them outside the kernel.

In a test cell's hidden part (introduced in Lab 1, Exercise 1's test cell)::

    v = hand_in(loss=float_value, shape=logits.shape.as_list(), table=df)   # in the kernel
    ### JUDGE
    assert v.shape == [None, 10]                                             # in the grader

Everything after the ``### JUDGE`` line runs in the grader (:mod:`lab_utils.grading.judge`),
never in the student's kernel: it sees only ``v``, the values as plain data, so no object the
student's code made takes part in a comparison, and the expected answers never reach the
kernel. Outside grading (an instructor running the notebook) the judge runs in the kernel
on the same plain copies, so it behaves as it will when graded.

Plain means exactly (no subclass): ``bool``, ``int``, ``float``, ``str``, ``None``; lists,
tuples and dicts of plain values (string keys); NumPy's numeric and boolean scalars and
arrays; and pandas ``DataFrame``, ``Series`` and ``Index`` of such values (strings too). Any
other object is *refused*: the judge's first use of it raises :class:`NotPlain`, and the
grader flags the submission ``not a plain value``.
"""

from __future__ import annotations

import base64
import json
import math
import sys

__all__ = ["MIME", "NotPlain", "Values", "hand_in", "encode", "decode", "MAX_BYTES"]

#: the display bundle's type: what the grader takes out of a test cell's outputs
MIME = "application/vnd.labgrade.handin+json"
#: the most a test cell may hand in (encoded)
MAX_BYTES = 32 * 2**20
_SCALARS = (bool, int, float, str, type(None))
_NUMERIC = "biuf"  # NumPy dtype kinds: bool, signed, unsigned, float


class NotPlain(TypeError):
    """A handed-in value that was not plain data (see the module doc)."""


class _Refused:
    def __init__(self, name: str, what: str):
        self.name, self.what = name, what


def _kind(obj) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _np():
    return sys.modules.get("numpy")


def _pd():
    return sys.modules.get("pandas")


def _array(a) -> dict:
    np = _np()
    if type(a) is not np.ndarray:
        raise NotPlain(f"an array of type {_kind(a)}")
    if a.dtype.kind in _NUMERIC:
        data = np.ascontiguousarray(a)
        return {
            "$": "nd",
            "dtype": data.dtype.str,
            "shape": list(data.shape),
            "b64": base64.b64encode(data.tobytes()).decode(),
        }
    if a.dtype.kind == "M":  # datetimes: their integer ticks
        return {"$": "dt", "unit": str(a.dtype), "v": _array(a.view("int64"))}
    if a.dtype.kind in "OUS":
        return {"$": "ol", "shape": list(a.shape), "v": [_plain(x) for x in a.ravel().tolist()]}
    raise NotPlain(f"an array of dtype {a.dtype}")


def _plain(obj):
    """``obj`` as JSON-able data, tagged where JSON has no type of its own; NotPlain otherwise."""
    t = type(obj)
    if t is float and not math.isfinite(obj):  # JSON has no NaN or infinity
        return {"$": "f", "v": repr(obj)}
    if t in _SCALARS:
        return obj
    if t is list:
        return [_plain(x) for x in obj]
    if t is tuple:
        return {"$": "t", "v": [_plain(x) for x in obj]}
    if t is dict:
        if not all(type(k) is str for k in obj):
            raise NotPlain("a dict with keys that are not str")
        return {"$": "d", "k": list(obj), "v": [_plain(x) for x in obj.values()]}
    np, pd = _np(), _pd()
    if np is not None:
        if t in np.sctypeDict.values() and obj.dtype.kind in _NUMERIC:  # NumPy's own scalar types only
            return {"$": "np", "dtype": obj.dtype.str, "b64": base64.b64encode(obj.tobytes()).decode()}
        if t is np.ndarray:
            return _array(obj)
    if pd is not None:
        if t is pd.DataFrame:
            return {
                "$": "df",
                "columns": _index(obj.columns),
                "index": _index(obj.index),
                "data": [_array(obj.iloc[:, i].to_numpy()) for i in range(obj.shape[1])],
            }
        if t is pd.Series:
            return {"$": "s", "name": _plain(obj.name), "index": _index(obj.index), "v": _array(obj.to_numpy())}
        if t in (pd.Index, pd.RangeIndex):
            return _index(obj)
    raise NotPlain(f"an object of type {_kind(obj)}")


def _index(ix) -> dict:
    pd = _pd()
    if type(ix) not in (pd.Index, pd.RangeIndex):
        raise NotPlain(f"an index of type {_kind(ix)}")
    return {"$": "ix", "name": _plain(ix.name), "v": _array(ix.to_numpy())}


def encode(values: dict) -> dict:
    """``{name: plain data}``: a value that is not plain becomes a refusal naming its type."""
    out = {}
    for name, value in values.items():
        try:
            out[name] = _plain(value)
        except (NotPlain, RecursionError) as exc:
            out[name] = {"$": "refused", "what": str(exc) if isinstance(exc, NotPlain) else "a nested structure"}
    return out


def _decode(x):
    if type(x) is list:
        return [_decode(v) for v in x]
    if type(x) is not dict:
        return x
    tag = x.get("$")
    if tag == "f":
        return float(x["v"])
    if tag == "t":
        return tuple(_decode(v) for v in x["v"])
    if tag == "d":
        return dict(zip(x["k"], [_decode(v) for v in x["v"]], strict=True))
    import numpy as np

    if tag == "np":
        return np.frombuffer(base64.b64decode(x["b64"]), dtype=np.dtype(x["dtype"]))[0]
    if tag == "nd":
        data = np.frombuffer(base64.b64decode(x["b64"]), dtype=np.dtype(x["dtype"]))
        return data.reshape(x["shape"]).copy()
    if tag == "dt":
        return _decode(x["v"]).view(x["unit"])
    if tag == "ol":
        out = np.empty(len(x["v"]), dtype=object)
        out[:] = [_decode(v) for v in x["v"]]
        return out.reshape(x["shape"])
    import pandas as pd

    if tag == "ix":
        return pd.Index(_decode(x["v"]), name=_decode(x["name"]))
    if tag == "s":
        return pd.Series(_decode(x["v"]), index=_decode(x["index"]), name=_decode(x["name"]))
    if tag == "df":
        columns = _decode(x["columns"])
        data = {i: _decode(col) for i, col in enumerate(x["data"])}
        frame = pd.DataFrame(data, index=_decode(x["index"]))
        frame.columns = columns
        return frame
    raise ValueError(f"unknown tag {tag!r} in handed-in data")


class Values:
    """The handed-in values, by attribute (``v.loss``) or by key (``v["loss"]``); a refused
    one raises :class:`NotPlain` where it is used."""

    def __init__(self, encoded: dict):
        self._values = {}
        for name, x in encoded.items():
            refused = type(x) is dict and x.get("$") == "refused"
            self._values[name] = _Refused(name, x["what"]) if refused else _decode(x)

    def __getitem__(self, name: str):
        value = self._values[name]
        if isinstance(value, _Refused):
            raise NotPlain(f"{name} was {value.what}, not a plain value")
        return value

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"nothing named {name!r} was handed in") from None

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def refused(self) -> dict[str, str]:
        return {n: v.what for n, v in self._values.items() if isinstance(v, _Refused)}

    def __repr__(self):
        return f"<handed-in values: {', '.join(self._values)}>"


def decode(encoded: dict) -> Values:
    return Values(encoded)


def hand_in(**values) -> Values:
    """Hand ``values`` to the grader (while nbgrader grades) and return them as the judge will
    see them: plain copies (see the module doc). Call it once, at the end of a test cell's
    hidden part, just before its ``### JUDGE`` line."""
    encoded = encode(values)
    from lab_utils.grading.cells import is_grading

    if is_grading():
        payload = json.dumps({"values": encoded}, allow_nan=False)
        if len(payload) > MAX_BYTES:
            raise ValueError(f"hand_in: {len(payload):,} bytes is more than the {MAX_BYTES:,} a test cell may hand in")
        from IPython.display import publish_display_data

        publish_display_data({MIME: {"values": encoded}})
    return decode(encoded)
