#!/usr/bin/env python
"""The demo under load: N concurrent clients × M requests each against `vaswani_mt.app.demo` on loopback.

The demo runs in a process of its own (as `app.py` would), with its own bounds: `--workers` translations at a time,
at most `--queue_size` waiting (`demo.DEMO_WORKERS`, `demo.DEMO_QUEUE_SIZE` unless given). Each client sends its
requests one after another through Gradio's HTTP API (`POST /gradio_api/call/translate`, then the answer's event
stream), a mix of

- `short`: one sentence; `long`: a paragraph of about 600 characters;
- `over_long`: 105,000 characters (the demo cuts it to `DEMO_MAX_CHARACTERS`, then to 256 tokens, and says so);
- `hostile`: control characters and NUL, right-to-left overrides, emoji sequences, lone surrogates (as JSON
  escapes), HTML, blank and zero-width text, 300 combining accents;
- `limits`: a request the demo must refuse: a body over `DEMO_MAX_REQUEST_BYTES`, or a beam size of 100.

Every request ends one of three ways: `answered` (a translation), `refused` with a message (a full queue: HTTP 503;
an over-large body: 413; a value out of range: Gradio's validation error), or `error` (anything else: an exception
without a message, a 5xx, a timeout, a broken stream). Latency is from the POST to the last byte of the answer.
The server's RSS is read when it is ready, after one warm-up request, after the first round (as many requests done
as there are clients), after every round, every 0.2 s while the clients run (the peak) and at the end.

Memory's trend (`--waves W`): the load comes in W waves of clients × requests, and after each wave, with no request
in flight, the server's RSS is read again. Under load the RSS swings by hundreds of MiB with what is in flight; idle
between waves it shows what the server kept. `rss_trend` gives the median idle RSS of each quarter of the waves and
the least-squares slope over the second half, in MiB per 100 requests: a leak keeps a slope the size of what it
leaks per request, a bounded server's quarters level off and its slope is near 0.

    python benchmarks/demo_load.py                    # the tests' fitted tiny model, 8 clients × 20 requests
    python benchmarks/demo_load.py outputs/ding-cpu   # the main job's model
    python benchmarks/demo_load.py MODEL --clients 8 --requests 20 --queue_size 4 --json out.json
    python benchmarks/demo_load.py --clients 8 --requests 10 --waves 24   # 1,920 requests: memory's trend
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from speed_common import PAIRS, ROOT, MachineRecord, command_parser, free_port, tiny_model_folder

SHORT = [en for en, _ in PAIRS]
LONG = " ".join(SHORT * 3)
OVER_LONG = "The street is closed because of the snow. " * 2_500
HOSTILE = [
    "\x00\x01\x02\x1b[31mred\x1b[0m\x7f",
    "\u202eThe girl ate an apple.\u202c مرحبا بالعالم שלום",
    "😀👩‍👩‍👧‍👦🇩🇪" * 20,
    "The girl \ud800 ate \udfff an apple.",  # lone surrogates: only JSON escapes can carry them
    "<script>alert(1)</script><img src=x onerror=alert(1)>",
    " \t\r\n ",
    "\u200b\u200d\ufeff",
    "e\u0301" * 300,
    "\uffff\U0010ffff\ufdd0",
]
# Which kind request k of the run is: the cycle starts with one of each, so that a tiny run covers them all.
MIX = ["short", "hostile", "over_long", "limits", "long", "short", "hostile", "short", "long", "short"]
SEARCH = [4, 0.6, 50, 1, "", False]  # beam size, alpha, b of |X| + b, the heatmap's layer, no terms, no markup
# The demo, as app.py starts it, with the bounds given on the command line.
SERVE = (
    "import sys; from vaswani_mt.app.demo import launch; "
    "launch(sys.argv[1], '127.0.0.1', int(sys.argv[2]), workers=int(sys.argv[3]), queue_size=int(sys.argv[4]), "
    "quiet=True)"
)


def parse(argv=None) -> argparse.Namespace:
    from vaswani_mt.app.demo import DEMO_QUEUE_SIZE, DEMO_WORKERS

    parser = command_parser(__doc__)
    parser.add_argument(
        "model",
        nargs="?",
        help="the model folder (or Hub id) the demo serves (default: the tests' fitted tiny model, built here)",
    )
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=20, help="requests per client, one after another")
    parser.add_argument("--waves", type=int, default=1, help="waves of clients x requests, idle RSS after each")
    parser.add_argument("--workers", type=int, default=DEMO_WORKERS, help="the demo's translations at a time")
    parser.add_argument("--queue_size", type=int, default=DEMO_QUEUE_SIZE, help="the demo's longest queue")
    return parser.parse_args(argv)


def request_for(kind: str, number: int) -> dict:
    """The `number`-th request of `kind`: its JSON body (bytes) and what it is (a label for the results)."""
    if kind == "limits":
        if number % 2 == 0:
            from vaswani_mt.app.demo import DEMO_MAX_REQUEST_BYTES

            text = "x" * (DEMO_MAX_REQUEST_BYTES + 1)
            return {"label": "body over the byte limit", "data": [text, *SEARCH]}
        return {"label": "beam size 100", "data": [SHORT[0], 100, *SEARCH[1:]]}
    text = {"short": SHORT[number % len(SHORT)], "long": LONG, "over_long": OVER_LONG}.get(kind)
    text = HOSTILE[number % len(HOSTILE)] if kind == "hostile" else text
    return {"label": kind, "data": [text, *SEARCH]}


def call(client, url: str, data: list, timeout: float = 300.0) -> dict:
    """One request through Gradio's HTTP API: {"outcome", "status", "message", "seconds", "output"}; one that takes
    over `timeout` seconds is an error."""
    import httpx

    body = json.dumps({"data": data}).encode()  # ensure_ascii: lone surrogates travel as JSON escapes
    start = time.perf_counter()
    result = {"outcome": "error", "status": None, "message": None, "output": None}
    try:
        answer = client.post(f"{url}/gradio_api/call/translate", content=body, timeout=timeout,
                             headers={"Content-Type": "application/json"})  # fmt: skip
        result["status"] = answer.status_code
        if answer.status_code != 200:
            try:
                result["message"] = str(answer.json().get("detail"))
            except ValueError:
                result["message"] = answer.text
            result["outcome"] = "refused" if answer.status_code in (413, 503) and result["message"] else "error"
        else:
            event_id = answer.json()["event_id"]
            event, payload = None, None
            with client.stream("GET", f"{url}/gradio_api/call/translate/{event_id}", timeout=timeout) as stream:
                for line in stream.iter_lines():
                    if line.startswith("event: "):
                        event = line.removeprefix("event: ")
                    elif line.startswith("data: ") and event in ("complete", "error"):
                        payload = json.loads(line.removeprefix("data: "))
                        break
            if event == "complete" and isinstance(payload, list) and isinstance(payload[0], str):
                result["outcome"], result["output"] = "answered", payload
            elif event == "error" and isinstance(payload, dict) and payload.get("error"):
                # Gradio's own validation (a value out of range) or a gr.Error: a message for the user.
                result["outcome"], result["message"] = "refused", str(payload["error"])
            else:
                result["message"] = f"event {event!r}, data {str(payload)[:200]!r}"
    except (httpx.HTTPError, ValueError, KeyError) as error:
        result["message"] = f"{type(error).__name__}: {error}"
    result["seconds"] = time.perf_counter() - start
    return result


def start_server(args: argparse.Namespace, workdir: Path) -> tuple[subprocess.Popen, str, Path]:
    """The demo in a process of its own, on a free loopback port; returns it once its page answers."""
    import httpx

    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("GRADIO_SERVER_NAME", None)
    log = workdir / "server.log"
    model = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model  # the server runs in workdir
    with open(log, "w") as out:  # a file, not a pipe: a pipe nobody reads would fill and stall the server
        server = subprocess.Popen(
            [sys.executable, "-c", SERVE, model, str(port), str(args.workers),
             str(args.queue_size)],
            cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the demo exited ({server.returncode}): {log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/", timeout=2).status_code == 200:
                return server, url, log
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.kill()
    raise RuntimeError(f"the demo did not answer at {url} within 300 s: {log.read_text()[-3000:]}")


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 3)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 3)


def summarise(results: list[dict]) -> dict:
    """Counts of each outcome, latency percentiles of the answered requests, per kind and in all."""

    def block(rows: list[dict]) -> dict:
        seconds = [row["seconds"] for row in rows if row["outcome"] == "answered"]
        outcomes = {kind: sum(row["outcome"] == kind for row in rows) for kind in ("answered", "refused", "error")}
        return {"requests": len(rows), **outcomes, "p50_s": _percentile(seconds, 50), "p95_s": _percentile(seconds, 95),
                "max_s": round(max(seconds), 3) if seconds else None}  # fmt: skip

    refusals: dict[str, int] = {}
    for row in results:
        if row["outcome"] == "refused":
            refusals[row["message"]] = refusals.get(row["message"], 0) + 1
    return {
        **block(results),
        "by_kind": {kind: block([r for r in results if r["kind"] == kind]) for kind in dict.fromkeys(MIX)},
        "refusal_messages": refusals,
        "error_samples": [f"{r['label']}: {r['status']} {r['message']}" for r in results if r["outcome"] == "error"][
            :10
        ],
    }


def rss_trend(idle_mb: list[float], requests_per_wave: int) -> dict:
    """Whether the server keeps more memory the more requests it has served: the median idle RSS of each quarter of
    the waves, and the least-squares slope of idle RSS against requests served over the second half, in MiB per 100
    requests (a leak keeps a slope the size of what it leaks; a bounded server's is near 0)."""
    if len(idle_mb) < 8:
        return {"note": f"{len(idle_mb)} waves: too few to tell a trend (8 or more)"}
    quarter = len(idle_mb) // 4
    medians = [round(statistics.median(idle_mb[i * quarter : (i + 1) * quarter]), 1) for i in range(4)]
    start = len(idle_mb) // 2
    half = idle_mb[start:]
    served = [requests_per_wave * (start + i + 1) for i in range(len(half))]
    slope = statistics.linear_regression(served, half).slope
    return {
        "idle_quarter_medians_mb": medians,
        "second_half_slope_mb_per_100_requests": round(100 * slope, 2),
        "second_half_idle_range_mb": [round(min(half), 1), round(max(half), 1)],
    }


def run_load(args: argparse.Namespace) -> dict:
    import httpx
    import psutil

    with tempfile.TemporaryDirectory(prefix="demo_load_") as workdir:
        if args.model is None:
            args.model = str(tiny_model_folder(Path(workdir) / "tiny-model"))
        server, url, log = start_server(args, Path(workdir))
        process = psutil.Process(server.pid)
        rss = {"ready": process.memory_info().rss}
        try:
            with httpx.Client() as client:
                warm = call(client, url, [SHORT[0], *SEARCH])  # first-use imports (matplotlib) here
            if warm["outcome"] != "answered":
                raise RuntimeError(f"the warm-up request failed: {warm['message']}; {log.read_text()[-3000:]}")
            rss["warm"] = process.memory_info().rss
            peak, done = [rss["warm"]], threading.Event()

            def sample() -> None:
                while not done.wait(0.2):
                    peak.append(process.memory_info().rss)

            results: list[dict] = []
            rounds: list[int] = []  # the server's RSS after each round
            lock = threading.Lock()

            def client_loop(index: int, wave: int) -> None:
                with httpx.Client() as client:
                    for j in range(args.requests):
                        k = (wave * args.clients + index) * args.requests + j
                        kind = MIX[k % len(MIX)]
                        request = request_for(kind, k // len(MIX))
                        row = {
                            "kind": kind,
                            "label": request["label"],
                            **call(client, url, request["data"]),
                        }
                        if row["output"] is not None:
                            row["translation"], row["notes"] = row["output"][0], row["output"][2]
                        del row["output"]
                        with lock:
                            results.append(row)
                            if len(results) % args.clients == 0:  # a round: as many requests done as clients
                                rounds.append(process.memory_info().rss)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            started = time.perf_counter()
            idle: list[int] = []  # the server's RSS after each wave, nothing in flight
            for wave in range(args.waves):
                clients = [threading.Thread(target=client_loop, args=(i, wave)) for i in range(args.clients)]
                for thread in clients:
                    thread.start()
                for thread in clients:
                    thread.join()
                time.sleep(1.0)  # the last answers' buffers go back
                idle.append(process.memory_info().rss)
            wall = time.perf_counter() - started
            done.set()
            sampler.join()
            rss["end"] = process.memory_info().rss
            rss["peak"] = max(peak)
            rss["first_round"] = rounds[0]
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
    mib = 2**20
    model = args.model if not args.model.startswith(tempfile.gettempdir()) else "tests' fitted tiny model"
    notes = {r["notes"].splitlines()[0] for r in results if r["kind"] == "over_long" and r.get("notes")}
    return {"model": model, "clients": args.clients, "requests_per_client": args.requests * args.waves,
            "workers": args.workers, "queue_size": args.queue_size, **summarise(results), "wall_s": round(wall, 1),
            "requests_per_s": round(len(results) / wall, 2),
            "rss_mb": {key: round(value / mib, 1) for key, value in rss.items()},
            "rss_growth_mb": round((rss["end"] - rss["first_round"]) / mib, 1),
            "rss_by_round_mb": [round(value / mib) for value in rounds], "waves": args.waves,
            "rss_idle_by_wave_mb": [round(value / mib, 1) for value in idle],
            "rss_trend": rss_trend([value / mib for value in idle], args.clients * args.requests),
            "over_long_notes": sorted(notes)}  # fmt: skip


def main(argv=None) -> dict:
    args = parse(argv)
    record = MachineRecord()
    result = record.report(run_load(args), args.json)
    rss = result["rss_mb"]
    print(
        f"{result['requests']} requests ({args.waves} × {args.clients} clients × {args.requests}): "
        f"{result['answered']} answered, {result['refused']} refused, {result['error']} errors; p50 "
        f"{result['p50_s']} s, p95 {result['p95_s']} s; server RSS {rss['ready']} at start, {rss['first_round']} "
        f"after the first round, {rss['end']} at the end (peak {rss['peak']}) MiB; trend {result['rss_trend']}"
    )
    return result


if __name__ == "__main__":
    main()
