"""How long one request takes to leave the client: aiohttp against rooftop's asyncio HTTP client.

A raw asyncio server on 127.0.0.1 stamps the moment each request's bytes arrive
(data_received) and answers with that stamp; the client subtracts the moment it started the
request. Same process, same clock. Prints a table and writes JSON.

    .venv/bin/python benchmarks/http_client_overhead.py [--n 2000] [--out docs/perf/http_client_overhead.json]
"""

import argparse
import asyncio
import json
import os
import platform
import time

import aiohttp
import numpy as np

from rooftop.bench.http import Pool
from rooftop.provenance import provenance


class _Stamp(asyncio.Protocol):
    def connection_made(self, transport):
        self.t, self.buf = transport, b""

    def data_received(self, data):
        now = time.perf_counter_ns()
        self.buf += data
        head, sep, body = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return
        length = next(int(v) for k, _, v in (x.partition(b":") for x in head.split(b"\r\n")) if k.lower() == b"content-length")
        if len(body) >= length:
            self.buf = b""
            msg = str(now).encode()
            self.t.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(msg), msg))


def _dist(us: list[float]) -> dict:
    a = np.asarray(us)
    return {"median_us": round(float(np.median(a)), 1), "p99_us": round(float(np.percentile(a, 99)), 1), "n": len(us)}


async def main(n: int) -> dict:
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(_Stamp, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1/completions"
    body = {"model": "m", "prompt": "hello " * 50, "max_tokens": 16, "stream": True}
    raw = json.dumps(body).encode()
    out = {}
    async with aiohttp.ClientSession() as s:
        d = []
        for i in range(n):
            t0 = time.perf_counter_ns()
            async with s.post(url, json=body) as r:
                arrived = int(await r.text())
            if i >= n // 10:
                d.append((arrived - t0) / 1e3)
        out["aiohttp"] = _dist(d)
    async with Pool() as pool:
        d = []
        for i in range(n):
            got: list[bytes] = []
            t0 = time.perf_counter_ns()
            await pool.request(url, raw, lambda *a: None, lambda b, t, got=got: got.append(b), lambda t: None)
            if i >= n // 10:
                d.append((int(b"".join(got)) - t0) / 1e3)
        out["rooftop.bench.http"] = _dist(d)
    srv.close()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    res = asyncio.run(main(args.n))
    res["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    print(f"{'client':<22}{'median µs':>12}{'p99 µs':>10}")
    for k in ("aiohttp", "rooftop.bench.http"):
        print(f"{k:<22}{res[k]['median_us']:>12}{res[k]['p99_us']:>10}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"provenance": provenance(), **res}, f, indent=2)
