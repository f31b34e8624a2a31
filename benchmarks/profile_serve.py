"""Profile `minivllm serve` under the standard `bench serve` trace with py-spy: where the engine
loop's time goes, and who holds the GIL.

    make profile-serve                                   # installs py-spy (extra "profile")
    python benchmarks/profile_serve.py [--scenario greedy --num-prompts 32 --rate 100]
    python benchmarks/profile_serve.py --engine-mode thread   # the engine on a server thread

Model: random weights in SmolLM-135M's shape, fp32 (the model of compare_serving.py). The
server is started, timed until /health, then `py-spy record --nonblocking` samplers attach at
the same rate while compare_serving.py's scenario trace is replayed. On the process that runs
the engine loop (the engine-core process by default; the server with --engine-mode thread):

    active  default mode: a thread's samples while it runs (idle threads left out)
    idle    --idle: every thread at every tick (the tick count)
    gil     --gil: only the thread holding the GIL at each tick

and, with the engine in its own process, `server-idle` and `server-gil` on the server (each
process has a GIL of its own). They are stopped (SIGINT) when the trace is done. Printed: each
GIL's share of ticks by holder, the engine loop's time as running with the GIL / running with
it released (torch kernels, C code) / idle, the top functions (inclusive) and lines (self) of
its running samples and of its GIL-holding samples, and the top GIL-holding lines of the
server's event loop. Nonblocking, because blocking samplers stop
the process at each sample (ptrace), which skews the GIL picture and cannot be done by three
samplers at once; the price is an occasional torn stack (counted as py-spy's errors).

py-spy reads another process's memory: it needs ptrace permission (root, or
kernel.yama.ptrace_scope = 0, or CAP_SYS_PTRACE in a container). Results go to --output:
the raw stacks (active.txt, idle.txt, gil.txt: "frame;frame;... count", flamegraph.pl
input), the server and bench logs, and profile.md (what is printed).
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from minivllm.bench.models import save_random_model
from minivllm.bench.server_process import stop_server
from minivllm.bench.serving_scenarios import (
    SCENARIOS,
    bench,
    describe,
    one_scenario,
    start_named,
)
from minivllm.bench.timing import timed

ROOT = Path(__file__).resolve().parents[1]

MAIN_THREAD = "MainThread"
# The thread that runs the engine loop: the core process's main thread, or a server thread.
ENGINE_THREAD = {"process": MAIN_THREAD, "thread": "minivllm-engine"}
_LINE = re.compile(r"^thread \((\d+)\): ([^;]*);(.*) (\d+)$")
_FRAME = re.compile(r"^(.*) \((.*?)(?::(\d+))?\)$")
_BOOTSTRAP = re.compile(r"[(/](threading\.py|multiprocessing/[^:]*|<string>)(:\d+)?\)$")


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install -e '.[profile]' (or make "
                         "profile-serve, which does)")
    return found


def start_sampler(pid: int, mode: str, rate: int, out: Path) -> subprocess.Popen:
    """mode: active, idle or gil, optionally prefixed "server-" (the file's name)."""
    flags = {"active": [], "idle": ["--idle"], "gil": ["--gil"]}[mode.removeprefix("server-")]
    command = [py_spy(), "record", "--pid", str(pid), "--format", "raw", "--threads",
               "--nonblocking", "--rate", str(rate), "--output", str(out / f"{mode}.txt"),
               *flags]
    return subprocess.Popen(command, stdout=(out / f"py-spy-{mode}.log").open("w"),
                            stderr=subprocess.STDOUT)


def stop_sampler(proc: subprocess.Popen, mode: str, out: Path) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if not (out / f"{mode}.txt").exists():
        log = (out / f"py-spy-{mode}.log").read_text(errors="replace")[-2000:]
        raise SystemExit(f"py-spy ({mode}) wrote nothing (exit {proc.returncode}):\n{log}\n"
                         "py-spy needs ptrace permission: run as root, or set "
                         "kernel.yama.ptrace_scope=0, or add CAP_SYS_PTRACE to the container")


def read_stacks(path: Path) -> list[tuple[str, list[str], int]]:
    """(thread name, frames root first, samples) per line of py-spy's raw output."""
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        m = _LINE.match(line.strip())
        if m:
            stacks.append((m.group(2), m.group(3).split(";"), int(m.group(4))))
    return stacks


def _function(frame: str) -> str:
    """'step (minivllm/engine/llm_engine.py:210)' -> 'step (minivllm/engine/llm_engine.py)'."""
    m = _FRAME.match(frame)
    return f"{m.group(1)} ({m.group(2)})" if m else frame


def per_thread(stacks) -> Counter:
    counts: Counter = Counter()
    for thread, _, n in stacks:
        counts[thread] += n
    return counts


def top(stacks, thread: str, inclusive: bool, limit: int) -> list[tuple[str, int, int]]:
    """The thread's top functions (inclusive: any frame, once per stack) or lines (self:
    the innermost frame): (name, samples, of total)."""
    counts: Counter = Counter()
    total = 0
    for name, frames, n in stacks:
        if name != thread:
            continue
        total += n
        if inclusive:  # the thread's or process's bootstrap frames are in every stack
            for function in dict.fromkeys(_function(f) for f in frames
                                          if not _BOOTSTRAP.search(f)):
                counts[function] += n
        else:
            counts[frames[-1]] += n
    return [(name, n, total) for name, n in counts.most_common(limit)]


def sampler_counts(out: Path) -> str:
    """py-spy's own 'Samples: N Errors: M' of each sampler (errors: torn reads)."""
    parts = []
    for log_path in sorted(out.glob("py-spy-*.log")):
        mode = log_path.stem.removeprefix("py-spy-")
        log = log_path.read_text(errors="replace")
        m = re.findall(r"Samples: (\d+) Errors: (\d+)", log)
        parts.append(f"{mode} {m[-1][0]} samples / {m[-1][1]} errors" if m else f"{mode} ?")
    return ", ".join(parts)


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f} %" if whole else "  n/a"


def gil_shares(idle, gil, ticker: str, named: dict[str, str]) -> tuple[int, list[str]]:
    """One process's GIL: the share of ticks (samples of `ticker` with --idle) held by each
    named thread, by other threads, and by nobody."""
    ticks = per_thread(idle).get(ticker, 0)
    held = per_thread(gil)
    lines = [f"- held by {label}: {pct(held.get(thread, 0), ticks)}"
             for thread, label in named.items()]
    others = sum(n for t, n in held.items() if t not in named)
    lines += [f"- held by other threads: {pct(others, ticks)}",
              f"- free (nobody, or a thread in C code that released it): "
              f"{pct(ticks - sum(held.values()), ticks)}"]
    return ticks, lines


def report(out: Path, limit: int, header: str, engine_mode: str) -> str:
    engine = ENGINE_THREAD[engine_mode]
    active, idle, gil = (read_stacks(out / f"{m}.txt") for m in ("active", "idle", "gil"))
    loop = "uvicorn's event loop: HTTP, SSE, detokenized outputs"
    if engine_mode == "thread":
        named = {engine: "the engine thread", MAIN_THREAD: f"the main thread ({loop})"}
        server_gil = gil
    else:
        named = {engine: "the engine loop (the core process's main thread)"}
        server_gil = read_stacks(out / "server-gil.txt")
    ticks, engine_lines = gil_shares(idle, gil, engine, named)
    if not ticks:
        raise SystemExit(f"no samples of the engine loop's thread in {out / 'idle.txt'}")
    where = "the server process" if engine_mode == "thread" else "the engine-core process"
    lines = [header, "", f"ticks: {ticks} (samples of the engine loop with --idle); py-spy: "
             f"{sampler_counts(out)}", "", f"## The GIL of {where} (--gil samples / ticks)",
             "", *engine_lines]
    if engine_mode == "process":
        server_ticks, server_lines = gil_shares(
            read_stacks(out / "server-idle.txt"), server_gil, MAIN_THREAD,
            {MAIN_THREAD: f"the main thread ({loop})"})
        lines += ["", f"## The GIL of the server process ({server_ticks} ticks)", "",
                  *server_lines]
    running = per_thread(active).get(engine, 0)
    engine_gil = per_thread(gil).get(engine, 0)
    lines += ["", "## The engine loop (share of ticks)", "",
              f"- running: {pct(running, ticks)}",
              f"  - holding the GIL (Python, and C code that keeps it): "
              f"{pct(engine_gil, ticks)}",
              f"  - GIL released (torch kernels, sleeps excluded): "
              f"{pct(max(running - engine_gil, 0), ticks)}",
              f"- idle (waiting for work or the GIL): {pct(max(ticks - running, 0), ticks)}",
              "(samplers at one rate but not in step: shares are estimates)"]
    sections = [
        ("engine loop, running: top functions (inclusive)", active, engine, True),
        ("engine loop, running: top lines (self)", active, engine, False),
        ("engine loop, holding the GIL: top lines (self)", gil, engine, False),
        ("server's event loop, holding the GIL: top lines (self)", server_gil, MAIN_THREAD,
         False),
    ]
    for title, stacks, thread, inclusive in sections:
        rows = top(stacks, thread, inclusive, limit)
        lines += ["", f"## {title}", "", "| share | samples | frame |", "|---|---|---|"]
        lines += [f"| {pct(n, total)} | {n} | `{name}` |" for name, n, total in rows]
    return "\n".join(lines)


def engine_core_pid(server_pid: int) -> int:
    """The engine-core process: the server's child started by multiprocessing's spawn (its
    other child, if any, is multiprocessing's resource tracker)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # a process that ended while we looked
        if ppid == server_pid and b"spawn_main" in cmdline:
            return int(stat.parent.name)
    raise SystemExit(f"no engine-core child of the server (pid {server_pid}); see server.log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=str(ROOT / "results" / "smollm-135m-random"))
    parser.add_argument("--scenario", choices=list(SCENARIOS), default="greedy",
                        help="compare_serving.py's trace (default: greedy, 128 requests, "
                             "128 in / 128 out, Poisson 4 req/s)")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help="keep the scenario's arrivals, fewer requests (a shorter run)")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples/s (default 100)")
    parser.add_argument("--top", type=int, default=15, help="rows per table (default 15)")
    parser.add_argument("--engine-mode", choices=["process", "thread"], default="process",
                        help="minivllm serve's --engine-mode (default: process, its default)")
    parser.add_argument("--port", type=int, default=8199)
    parser.add_argument("--output", default=str(ROOT / "results" / "profile_serve"))
    args = parser.parse_args()
    py_spy()  # fail before building anything
    model = save_random_model("smollm-135m", Path(args.model_dir))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    spec, max_model_len = one_scenario(args.scenario, args.num_prompts)
    print(f"starting minivllm serve ({args.scenario}: {describe(spec)}) ...", flush=True)
    server, ready_s = start_named("minivllm", ROOT, model, args.port, max_model_len,
                                  out / "server.log", ("--engine-mode", args.engine_mode))
    samplers = {}
    try:
        engine_pid = (server.pid if args.engine_mode == "thread"
                      else engine_core_pid(server.pid))
        targets = {m: engine_pid for m in ("active", "idle", "gil")}
        if args.engine_mode == "process":
            targets.update({"server-idle": server.pid, "server-gil": server.pid})
        for path in [*out.glob("*.txt"), *out.glob("py-spy-*.log")]:
            path.unlink()  # an earlier run's stacks must not be read as this run's
        samplers = {m: start_sampler(pid, m, args.rate, out) for m, pid in targets.items()}
        time.sleep(1.0)  # let the samplers attach
        for mode, proc in samplers.items():
            if proc.poll() is not None:
                stop_sampler(proc, mode, out)  # raises with py-spy's message
        print(f"ready in {ready_s:.1f} s; py-spy x{len(samplers)} at {args.rate} Hz on "
              f"{sorted(set(targets.values()))}; replaying the trace ...", flush=True)
        summary, elapsed = timed(bench, ROOT, args.port, model, spec, "completions",
                                 out / "bench")
    finally:
        for mode, proc in samplers.items():
            stop_sampler(proc, mode, out)
        stop_server(server)
    header = (f"# minivllm serve --engine-mode {args.engine_mode} under py-spy: "
              f"{args.scenario} ({describe(spec)})\n\n"
              f"{elapsed:.1f} s profiled; {summary['completed']} requests completed, "
              f"{summary['failed']} failed, {summary['output_token_throughput']:.1f} output "
              f"tok/s, TPOT p50 {summary['tpot_ms']['median']:.1f} ms (py-spy's samplers "
              "share the cores: compare with an unprofiled compare_serving.py run)")
    text = report(out, args.top, header, args.engine_mode)
    (out / "profile.md").write_text(text + "\n")
    print("\n" + text + f"\n\nraw stacks, logs and profile.md in {out}/")


if __name__ == "__main__":
    main()
