"""timeline.html: a run's requests as the dashboard's Gantt timeline, in one self-contained
file (the dashboard's timeline.js and the events inlined: no server, no network).

Where the events come from:
- `minivllm sim`: the simulator's LifecycleTracer, on the virtual clock;
- `minivllm bench serve / policies` against a minivllm server: the server's own lifecycle
  events, recorded from GET /v1/engine/events while the run lasts (EngineEventsRecorder);
- against a server without that endpoint: what the client saw (client_events): waiting
  for the first token, then decoding, then finished or failed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from html import escape
from pathlib import Path

import aiohttp

from minivllm.bench.client import RequestResult
from minivllm.core.lifecycle import LifecycleEvent

TIMELINE_JS = (Path(__file__).parent.parent / "entrypoints" / "dashboard" / "static"
               / "timeline.js")
MAX_ROWS = 5000  # a larger run shows its last requests

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 13px system-ui, sans-serif; margin: 16px; color: #212529; }}
h1 {{ font-size: 16px; }} .note {{ color: #868e96; }}
.legend {{ display: flex; flex-wrap: wrap; gap: 12px; margin: 6px 0; font-size: 12px; }}
.legend-item i {{ display: inline-block; width: 10px; height: 10px; margin-right: 4px; }}
svg.timeline text.label {{ font: 10px ui-monospace, monospace; fill: #495057; }}
svg.timeline text.axis {{ font-size: 10px; fill: #868e96; }}
svg.timeline g.request:hover rect {{ stroke: #212529; stroke-width: 0.5; }}
#tooltip {{ display: none; position: absolute; white-space: pre; background: #212529;
  color: #f8f9fa; font: 11px ui-monospace, monospace; padding: 6px 8px; border-radius: 4px;
  pointer-events: none; }}
</style></head><body>
<h1>{title}</h1>
<p class="note">{source}; {count} requests; hover a bar for its details.</p>
<div id="legend" class="legend"></div><div id="timeline"></div><div id="tooltip"></div>
<script>{script}</script>
<script>
const EVENTS = {events};
const log = new RequestLog({max_rows});
log.add(EVENTS);
const end = EVENTS.length ? Math.max(...EVENTS.map((e) => e.t)) : 0;
timelineLegend(document.getElementById("legend"));
const draw = () => renderTimeline(document.getElementById("timeline"), log,
  {{now: end, maxRows: {max_rows}, tooltip: document.getElementById("tooltip")}});
draw();
window.addEventListener("resize", draw);
</script></body></html>
"""


def write_timeline(path: Path, events: list[dict], title: str, source: str) -> Path:
    """`events`: lifecycle events as GET /v1/engine/events sends them, oldest first."""
    events = sorted(events, key=lambda e: e["t"])
    page = _PAGE.format(
        title=escape(title), source=escape(source),
        count=len({e["request_id"] for e in events}), script=TIMELINE_JS.read_text(),
        # "</" would end the script element early
        events=json.dumps(events, separators=(",", ":")).replace("</", "<\\/"),
        max_rows=MAX_ROWS)
    path.write_text(page)
    return path


def client_events(results: list[RequestResult]) -> list[dict]:
    """A client's view of each request, for servers that do not send their own: 'queued'
    until the first token (queue and prefill, which a client cannot tell apart), 'decode'
    until the last, then finished or (failed) aborted. Times from the replay's start."""
    events = []
    for r in results:
        rid = f"request-{r.index}"
        events.append({"t": r.start, "request_id": rid, "state": "queued",
                       "tokens": r.prompt_tokens, "priority": r.priority,
                       "user": f"user-{r.user}"})
        if r.ttft is not None:
            events.append({"t": r.start + r.ttft, "request_id": rid, "state": "decode"})
        end = r.start + (r.e2e if r.e2e is not None else r.ttft or 0.0)
        state = "finished" if r.success else "aborted"
        events.append({"t": end, "request_id": rid, "state": state, "tokens": r.output_tokens,
                       **({"reason": "length"} if r.success else {})})
    return events


async def record_engine_events(run, base_url: str, headers: dict | None = None) -> tuple:
    """(what the coroutine `run` returns, the server's lifecycle events or None)."""
    async with EngineEventsRecorder(base_url, headers) as recorder:
        value = await run
    return value, recorder.events


def write_run_timeline(out_dir: Path, title: str, results: list[RequestResult],
                       engine_events: list[dict] | None) -> Path:
    """A bench run's timeline.html: the server's own events, else the client's view."""
    if engine_events is None:
        return write_timeline(Path(out_dir) / "timeline.html", client_events(results), title,
                              "as the client saw it (the server sends no lifecycle events): "
                              "queued = waiting for the first token")
    return write_timeline(Path(out_dir) / "timeline.html", engine_events, title,
                          "the server's lifecycle events (GET /v1/engine/events)")


def write_sim_timeline(out_dir: Path, title: str, events: list[LifecycleEvent]) -> Path:
    """A simulated run's timeline.html, from the simulator's tracer."""
    rows = [{k: v for k, v in dataclasses.asdict(e).items() if v is not None} for e in events]
    return write_timeline(Path(out_dir) / "timeline.html", rows, title,
                          "simulated: the scheduler's lifecycle events, in simulated seconds")


class EngineEventsRecorder:
    """Records a minivllm server's lifecycle events (GET /v1/engine/events) while a run
    lasts. `events` is None when the server has no such endpoint (another engine)."""

    def __init__(self, base_url: str, headers: dict | None = None) -> None:
        self.url = base_url.rstrip("/") + "/v1/engine/events"
        self.headers = headers or {}
        self.events: list[dict] | None = None
        self._task: asyncio.Task | None = None
        self._connected = asyncio.Event()
        self._interval = 1.0  # the server's, from its config event

    async def __aenter__(self) -> EngineEventsRecorder:
        self._task = asyncio.get_running_loop().create_task(self._record())
        # Wait for the stream to open (or fail), so that the first request is on it.
        await asyncio.wait([self._task, asyncio.ensure_future(self._connected.wait())],
                           timeout=10, return_when=asyncio.FIRST_COMPLETED)
        return self

    async def __aexit__(self, *exc) -> None:
        if self.events is not None:  # the last events come with the next snapshot
            await asyncio.sleep(2 * self._interval + 0.2)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _record(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, \
                    session.get(self.url, headers=self.headers) as response:
                if response.status != 200:
                    return
                self.events = []
                self._connected.set()
                event = None
                async for raw in response.content:
                    line = raw.decode().rstrip("\n")
                    if line.startswith("event: "):
                        event = line[len("event: "):]
                    elif line.startswith("data: ") and event == "lifecycle":
                        self.events += json.loads(line[len("data: "):])["events"]
                    elif line.startswith("data: ") and event == "config":
                        self._interval = json.loads(line[len("data: "):])["interval"]
        except aiohttp.ClientError:
            return
        finally:
            self._connected.set()
