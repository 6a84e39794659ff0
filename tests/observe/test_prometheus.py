"""fsdp-train --metrics-port, scraped by real HTTP clients while runs train.

  python3 test_prometheus.py --train build/apps/fsdp-train --source . --work build/test-tmp/prometheus

Each check prints one line; the script exits 1 when one fails. The text the
endpoint serves is parsed by the Prometheus project's own Python client
(prometheus_client.parser, Debian's python3-prometheus-client), so a format
error fails here as it would fail a Prometheus server.

 1. Rank 0 on a free port (--metrics-port 0, the port read from the log):
    while 2 processes train, scrapes (urllib) see the steps advance; for every
    step scraped, each served metric equals the --metrics-file record of that
    step (the table's key <-> name), value for value; the labels are rank="0";
    HELP and TYPE are there (counter for *_total).
 2. --metrics-every-rank: rank 0 and rank 1 serve on PORT and PORT+1, labelled
    rank="0" and rank="1", with the same global loss for the same step.
 3. A port in use (a socket of this test listening on it): exit 2 and one line
    naming --metrics-port and the address, before anything trains.
 4. Hostile clients during a run: a request that is not HTTP gets 400, a POST
    405, another path 404; a client that sends half a request and then
    nothing, and one that never reads the answer, hold their connections while
    scrapes from others go on answering and the run trains to its last step
    (exit 0, every record in the metrics file).
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

FAILED = []


def check(ok, what, detail=""):
    print(f"[{'ok' if ok else 'FAIL'}] {what}" + (f"\n    {detail}" if detail and not ok else ""), flush=True)
    if not ok:
        FAILED.append(what)
    return ok


def table(train):
    """[(scope, json key, prometheus name, type)] from fsdp-train --list-metrics."""
    out = subprocess.run([train, "--list-metrics"], check=True, stdout=subprocess.PIPE, text=True).stdout
    rows = []
    for line in out.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        key = re.match(r"`([a-z0-9_]+)`", cells[1])
        name = re.match(r"`(fsdp_[a-z0-9_]+)`", cells[3])
        if key and name:
            rows.append((cells[0], key.group(1), name.group(1), cells[4]))
    return rows


def scrape(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read().decode()
        return r.status, r.headers.get("Content-Type", ""), body


def samples(text):
    """{name: {rank: value}} and {name: type} from the exposition text."""
    values, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            values.setdefault(s.name, {})[s.labels.get("rank")] = s.value
    return values, types


def free_ports(n):
    """A base port with n consecutive ports free now."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        socks = []
        try:
            for i in range(n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no consecutive free ports")


class Run:
    """fsdp-train in the background, its output collected line by line."""

    def __init__(self, cmd):
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)

    def output(self):
        return "".join(self.lines)

    def url(self, deadline=120):
        end = time.time() + deadline
        while time.time() < end and self.p.poll() is None:
            m = re.search(r"Prometheus metrics on (http://\S+/metrics)", self.output())
            if m:
                return m.group(1)
            time.sleep(0.05)
        return None

    def wait(self, timeout=300):
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        self.t.join(10)
        return rc


def train_cmd(a, work, steps, extra):
    return [a.train, "--model", "tiny", "--data", os.path.join(a.source, "data", "fallback_corpus.jsonl"),
            "--seq-len", "32", "--batch-size", "2", "--max-steps", str(steps), "--log-every", "1",
            "--nproc-per-node", "2", "--metrics-file", os.path.join(work, "m.jsonl"), "--metrics-host",
            "127.0.0.1"] + extra


def records(path):
    out = {}
    for line in open(path):
        j = json.loads(line)
        if "loss" in j:
            out[j["step"]] = j
    return out


def scrape_during(run, urls, until_steps=None):
    """Scrapes every URL until the run ends; returns [(url, values, types)] of the scrapes that had a step."""
    seen = []
    while run.p.poll() is None:
        for u in urls:
            try:
                status, ctype, body = scrape(u)
            except (urllib.error.URLError, ConnectionError, socket.timeout):
                continue  # the run ended between poll and connect
            values, types = samples(body)
            if "fsdp_train_step" in values:
                seen.append((u, values, types, ctype))
        time.sleep(0.02)
    return seen


def test_rank0_values(a, rows):
    work = os.path.join(a.work, "rank0")
    os.makedirs(work)
    run = Run(train_cmd(a, work, a.steps, ["--metrics-port", "0"]))
    url = run.url()
    check(url is not None and url.startswith("http://127.0.0.1:"), "the log names the endpoint (--metrics-port 0)",
          run.output()[-2000:])
    seen = scrape_during(run, [url]) if url else []
    rc = run.wait()
    check(rc == 0, f"the run trains {a.steps} steps while scraped (exit {rc})", run.output()[-2000:])
    steps = sorted({int(v["fsdp_train_step"]["0"]) for _, v, _, _ in seen})
    check(len(steps) >= 2, f"scrapes during the run saw the steps advance ({len(seen)} scrapes, {len(steps)} "
          f"distinct steps)", str(steps))
    if not seen:
        return
    check(all(c.startswith("text/plain; version=0.0.4") for *_, c in seen), "Content-Type text/plain; version=0.0.4")
    recs = records(os.path.join(work, "m.jsonl"))
    step_rows = [r for r in rows if r[0] == "step"]
    mismatches, compared = [], 0
    for _, values, types, _ in seen:
        s = int(values["fsdp_train_step"]["0"])
        rec = recs.get(s)
        if rec is None:
            mismatches.append(f"step {s}: no metrics-file record")
            continue
        for _, key, name, typ in step_rows:
            series = values.get(name)  # by sample name: a counter's sample keeps its _total
            if key not in rec:
                if series is not None:
                    mismatches.append(f"step {s}: {name} served but {key} not in the file")
                continue
            want = float(rec[key])  # a flag (skipped) is 1.0 or 0.0 as Prometheus serves it
            got = None if series is None else series.get("0")
            compared += 1
            if got != want:
                mismatches.append(f"step {s}: {name} = {got}, the file's {key} = {rec[key]!r}")
            if series is not None and set(series) != {"0"}:
                mismatches.append(f"{name} labels {set(series)}, want rank=0 only")
    check(not mismatches and compared > 0,
          f"every scraped value equals the metrics file's for the same step ({compared} values in {len(seen)} scrapes)",
          "; ".join(mismatches[:8]))
    _, _, types, _ = seen[-1]
    want_types = {r[2].removesuffix("_total"): ("counter" if r[2].endswith("_total") else "gauge")
                  for r in step_rows if r[2].removesuffix("_total") in types}
    check(all(types[n] == t for n, t in want_types.items()) and len(want_types) >= 10,
          f"TYPE lines: {len(want_types)} families, gauges and counters as the table says",
          str({n: types[n] for n in want_types}))


def test_every_rank(a):
    work = os.path.join(a.work, "every")
    os.makedirs(work)
    base = free_ports(2)
    run = Run(train_cmd(a, work, a.steps, ["--metrics-port", str(base), "--metrics-every-rank"]))
    url = run.url()
    urls = [f"http://127.0.0.1:{base}/metrics", f"http://127.0.0.1:{base + 1}/metrics"]
    seen = scrape_during(run, urls) if url else []
    rc = run.wait()
    check(rc == 0 and url == urls[0], f"--metrics-every-rank: rank 0 logs {urls[0]} (exit {rc})",
          run.output()[-2000:])
    by_rank = {}
    for u, values, _, _ in seen:
        for rank, step in values["fsdp_train_step"].items():
            loss = values["fsdp_train_loss"][rank]
            by_rank.setdefault(rank, {})[int(step)] = (loss, values["fsdp_world_size"][rank], u)
    check(set(by_rank) == {"0", "1"} and all(u == urls[int(r)] for r in by_rank for *_, u in by_rank[r].values()),
          "rank 0 serves on PORT labelled rank=0, rank 1 on PORT+1 labelled rank=1", str(sorted(by_rank)))
    common = set(by_rank.get("0", {})) & set(by_rank.get("1", {}))
    check(all(by_rank["0"][s][0] == by_rank["1"][s][0] for s in common) and
          all(v[1] == 2 for r in by_rank.values() for v in r.values()),
          f"both ranks serve the same global loss for the same step ({len(common)} steps) and world size 2")


def test_port_in_use(a):
    work = os.path.join(a.work, "busy")
    os.makedirs(work)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run(train_cmd(a, work, 3, ["--metrics-port", str(port)]), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
    lines = [l for l in p.stdout.splitlines() if "error" in l]
    check(p.returncode == 2 and any(f"--metrics-port {port}: 127.0.0.1:{port} is in use" in l for l in lines)
          and "Batch " not in p.stdout and not os.path.exists(os.path.join(work, "m.jsonl")),
          f"a port in use: exit {p.returncode}, one line naming it, nothing trained", p.stdout[-1500:])


def raw(port, data, read=True, timeout=10):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.sendall(data)
        if not read:
            return b""
        out = b""
        while True:
            try:
                chunk = c.recv(4096)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
        return out


def test_hostile_clients(a):
    work = os.path.join(a.work, "hostile")
    os.makedirs(work)
    run = Run(train_cmd(a, work, a.steps, ["--metrics-port", "0"]))
    url = run.url()
    if not check(url is not None, "hostile clients: the endpoint is up", run.output()[-2000:]):
        run.wait()
        return
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    # Half a request, then silence; and a full request whose answer is never read.
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(b"GET /metr")
    deaf = socket.create_connection(("127.0.0.1", port))
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    deaf.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    garbage = raw(port, b"\x16\x03\x01\x02\x00 not http at all\r\n\r\n")
    post = raw(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    other = raw(port, b"GET /secrets HTTP/1.1\r\nHost: x\r\n\r\n")
    steps = []
    while run.p.poll() is None:
        try:
            values, _ = samples(scrape(url)[2])
            if "fsdp_train_step" in values:
                steps.append(int(values["fsdp_train_step"]["0"]))
        except (urllib.error.URLError, ConnectionError, socket.timeout):
            pass
        time.sleep(0.02)
    rc = run.wait()
    stalled.close()
    deaf.close()
    check(garbage.startswith(b"HTTP/1.1 400") or garbage.startswith(b"HTTP/1.0 400"),
          "a request that is not HTTP gets 400", repr(garbage[:80]))
    check(post.startswith(b"HTTP/1.1 405"), "POST /metrics gets 405", repr(post[:80]))
    check(other.startswith(b"HTTP/1.1 404"), "GET /secrets gets 404", repr(other[:80]))
    recs = records(os.path.join(work, "m.jsonl"))
    check(rc == 0 and len(recs) == a.steps and len(set(steps)) >= 2,
          f"with a stalled and a deaf client connected the run trains all {a.steps} steps (exit {rc}, "
          f"{len(recs)} records) and other scrapes go on ({len(set(steps))} distinct steps seen)",
          run.output()[-1500:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=120)
    a = ap.parse_args()
    if os.path.exists(a.work):
        shutil.rmtree(a.work)
    os.makedirs(a.work)
    rows = table(a.train)
    check(len(rows) >= 15, f"the metrics table names {len(rows)} Prometheus metrics")
    test_rank0_values(a, rows)
    test_every_rank(a)
    test_port_in_use(a)
    test_hostile_clients(a)
    if not FAILED:
        shutil.rmtree(a.work)
    print(f"{'FAILED: ' + ', '.join(FAILED) if FAILED else 'all checks passed'}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
