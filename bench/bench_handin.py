"""A deadline at the hand-in service, through a real JupyterHub and its proxy; JSON out.

    python bench/bench_handin.py [--students 100] [--hand-ins 300] [--size-mb 1] [--attackers 10] [--out F]

The Hub is ``deploy/single-machine/jupyterhub_config.py`` as the tests start it
(tests/support/hub.py: real Unix users, configurable-http-proxy, the service as its own
account). ``--students`` clients hand in at once, ``--hand-ins`` notebooks of ``--size-mb`` in
all (each student a few, well under the rate limit), through the proxy with their own Hub
tokens; meanwhile ``--attackers`` anonymous clients (a process each) send 60 MB bodies, again and again,
until the honest ones are done.

Reports: hand-ins answered with a receipt, refused (by status) and lost (a receipt whose
notebook the store does not hold, with that hash); the service's peak memory (its ``VmHWM``,
from /proc) and its memory before; the receipts' latency (p50, p99, max, from the request's
start to the receipt, as the student waits); what the attackers got. Needs root (the Hub
starts servers as other users) and configurable-http-proxy (``make setup``). The clients run on
this machine's cores too, beside the Hub, the proxy and the service.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import multiprocessing
import selectors
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from json_out import emit  # noqa: E402
from support import hub as local_hub  # noqa: E402

LAB = "01_single_node"
ATTACK_BYTES = 60 * 2**20


def notebook(size_mb: float, seed: int) -> bytes:
    """A lab-like notebook of about ``size_mb``: code cells, a stream output, and figures."""
    png = base64.b64encode(hashlib.sha256(str(seed).encode()).digest() * 2048).decode()  # 64 kB a figure
    cells = []
    while sum(len(json.dumps(c)) for c in cells) < size_mb * 2**20:
        cells.append(
            {
                "cell_type": "code",
                "execution_count": len(cells),
                "metadata": {},
                "source": [f"run = train(steps={len(cells)})\n", "plot(run)\n"],
                "outputs": [
                    {
                        "output_type": "stream",
                        "name": "stdout",
                        "text": [f"step {i} loss 0.{i:04d}\n" for i in range(50)],
                    },
                    {"output_type": "display_data", "metadata": {}, "data": {"image/png": png}},
                ],
            }
        )
    return json.dumps({"cells": cells, "metadata": {"seed": seed}, "nbformat": 4, "nbformat_minor": 5}).encode()


def _service_pid(hub) -> int:
    for line in hub.processes_of(hub.service_user):
        if "lab_utils.hub.service" in line:
            return int(line.split(":")[0])
    raise RuntimeError("the hand-in service is not running")


def _roles(hub, service: int) -> dict[str, list[psutil.Process]]:
    """The processes whose CPU the bench reports: the service, the proxy, the Hub, this bench."""
    hub_proc = psutil.Process(hub.proc.pid)
    proxy = [p for p in hub_proc.children(recursive=True) if "configurable-http-proxy" in " ".join(p.cmdline())]
    return {"service": [psutil.Process(service)], "proxy": proxy, "hub": [hub_proc], "bench": [psutil.Process()]}


def _cpu_s(procs: dict[str, list[psutil.Process]]) -> dict[str, float]:
    out = {}
    for role, ps in procs.items():
        total = 0.0
        for p in ps:
            t = p.cpu_times()
            total += t.user + t.system + (t.children_user + t.children_system if role == "bench" else 0)
        out[role] = total
    return out


def _vm(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no {field} for pid {pid}")


def _attack(url: str, stop, got: dict, lock: threading.Lock, mbit: float | None = None) -> None:
    """Anonymous 60 MB bodies, one after another, until ``stop``: each connection sends until it
    is answered or closed, as fast as the other side reads (``mbit`` None: loopback's speed,
    gigabytes a second) or at ``mbit`` Mbit/s (a client's link)."""
    rate = mbit * 1e6 / 8 if mbit else None
    where = urlparse(url)
    chunk = b"x" * 2**16
    head = f"POST {where.path}api/hand-ins/{LAB} HTTP/1.1\r\nHost: x\r\nContent-Length: {ATTACK_BYTES}\r\n\r\n"
    while not stop.is_set():
        sent, answer = 0, b""
        try:
            with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
                sock.sendall(head.encode())
                sock.setblocking(False)
                t0 = time.monotonic()
                with selectors.DefaultSelector() as sel:
                    sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
                    while not answer and not stop.is_set():
                        ahead = (sent - rate * (time.monotonic() - t0)) / rate if rate else 0.0
                        want = selectors.EVENT_READ | (
                            selectors.EVENT_WRITE if ahead <= 0 and sent < ATTACK_BYTES else 0
                        )
                        sel.modify(sock, want)
                        events = sel.select(timeout=max(ahead, 0.0) if ahead > 0 else 30)
                        if not events:
                            if ahead > 0:
                                continue  # the link's pace: send again now
                            break
                        if events[0][1] & selectors.EVENT_READ:
                            answer = sock.recv(4096) or b"closed"
                        else:
                            sent += sock.send(chunk[: ATTACK_BYTES - sent])
        except OSError:
            pass
        status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else "closed"
        with lock:
            got["bodies"] += 1
            got["statuses"][status] = got["statuses"].get(status, 0) + 1
            got["max_sent_mb"] = max(got["max_sent_mb"], round(sent / 2**20, 2))


def _attacker(url: str, stop, results, mbit: float | None) -> None:
    """One anonymous client, in a process of its own (its loop takes no turn from the honest
    clients' threads); what it got goes to ``results``."""
    got = {"bodies": 0, "statuses": {}, "max_sent_mb": 0.0}
    _attack(url, stop, got, threading.Lock(), mbit)
    got["cpu_s"] = time.process_time()  # this process's whole life: the attack
    results.put(got)


def _hand_in(url: str, token: str, data: bytes) -> tuple[float, int, dict | str]:
    req = urllib.request.Request(f"{url}api/hand-ins/{LAB}", data=data, method="POST")
    req.add_header("Authorization", f"token {token}")
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            body = json.loads(resp.read())
            return time.monotonic() - t0, resp.status, body
    except urllib.error.HTTPError as exc:
        return time.monotonic() - t0, exc.code, exc.read().decode("utf-8", "replace")[:200]
    except (urllib.error.URLError, OSError) as exc:
        return time.monotonic() - t0, 0, str(exc)


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else float("nan")


def run(students: int, hand_ins: int, size_mb: float, attackers: int, attack_mbit: float | None = None) -> dict:
    hub = local_hub.start(students=students)
    if isinstance(hub, str):
        raise SystemExit(f"bench_handin: {hub}")
    try:
        url = f"{hub.url}/services/{local_hub.SERVICE}/"
        pid = _service_pid(hub)
        before = _vm(pid, "VmRSS")
        roles = _roles(hub, pid)
        names = hub.students
        jobs = [(names[i % len(names)], notebook(size_mb, i)) for i in range(hand_ins)]
        ctx = multiprocessing.get_context("fork")
        stop, results = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_attacker, args=(url, stop, results, attack_mbit)) for _ in range(attackers)]
        for p in procs:
            p.start()
        t0, cpu0 = time.monotonic(), _cpu_s(roles)
        with ThreadPoolExecutor(max_workers=students) as pool:
            answers = list(pool.map(lambda job: (job, _hand_in(url, hub.users[job[0]].token, job[1])), jobs))
        wall, cpu1 = time.monotonic() - t0, _cpu_s(roles)
        stop.set()
        attacked = {"bodies": 0, "statuses": {}, "max_sent_mb": 0.0, "cpu_s": 0.0}
        for _ in procs:
            got = results.get(timeout=60)
            attacked["bodies"] += got["bodies"]
            attacked["cpu_s"] = round(attacked["cpu_s"] + got["cpu_s"], 2)
            attacked["max_sent_mb"] = max(attacked["max_sent_mb"], got["max_sent_mb"])
            for status, n in got["statuses"].items():
                attacked["statuses"][status] = attacked["statuses"].get(status, 0) + n
        for p in procs:
            p.join(60)
        peak = _vm(pid, "VmHWM")
        proxy = [
            p
            for p in psutil.process_iter(["cmdline"])
            if "configurable-http-proxy" in " ".join(p.info["cmdline"] or [])
        ]
        receipts = [(name, data, ans[2]) for (name, data), ans in answers if ans[1] == 201]
        refused: dict[str, int] = {}
        for _, ans in answers:
            if ans[1] != 201:
                refused[str(ans[1])] = refused.get(str(ans[1]), 0) + 1
        lost = 0
        for name, data, receipt in receipts:  # the receipt names what was sent, and the store holds it
            kept = hub.store / "submitted" / receipt["key"] / LAB / receipt["stamp"] / f"{LAB}.ipynb"
            sent = hashlib.sha256(data).hexdigest()
            if receipt["student"] != name or receipt["sha256"] != sent or not kept.is_file():
                lost += 1
            elif hashlib.sha256(kept.read_bytes()).hexdigest() != sent:
                lost += 1
        latency = [ans[0] for _, ans in answers if ans[1] == 201]
        return {
            "students": students,
            "hand_ins": hand_ins,
            "notebook_mb": round(sum(len(d) for _, d in jobs) / len(jobs) / 2**20, 2),
            "anonymous_clients": attackers,
            "anonymous_mbit_each": attack_mbit,  # None: as fast as loopback takes it
            "receipts": len(receipts),
            "refused": refused,
            "lost": lost,
            "wall_s": round(wall, 1),
            "receipt_latency_s": {
                "p50": _quantile(latency, 0.5),
                "p99": _quantile(latency, 0.99),
                "max": round(max(latency), 3) if latency else None,
            },  # fmt: skip
            "service_rss_before_mb": before,
            "service_peak_rss_mb": peak,
            "proxy_rss_after_mb": round(sum(p.memory_info().rss for p in proxy) / 2**20, 1) if proxy else None,
            "anonymous": attacked,
            # CPU seconds each spent while the honest clients handed in ("bench": the honest clients'
            # threads; the attackers' processes are counted once they have ended, with the bench)
            "cpu_s": {role: round(cpu1[role] - cpu0[role], 2) for role in cpu0},
            "cores": psutil.cpu_count(),
        }
    finally:
        left = hub.close()
        if left:
            print(f"bench_handin: left behind: {left}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--students", type=int, default=100)
    ap.add_argument("--hand-ins", type=int, default=300)
    ap.add_argument("--size-mb", type=float, default=1.0)
    ap.add_argument("--attackers", type=int, default=10)
    ap.add_argument("--attack-mbit", type=float, default=None, help="each attacker's link (default: loopback's speed)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    emit(run(args.students, args.hand_ins, args.size_mb, args.attackers, args.attack_mbit), args.out)


if __name__ == "__main__":
    main()
