"""Profile `minivllm serve` under the standard `bench serve` trace with py-spy: where the engine
thread's time goes, and who holds the GIL.

    make profile-serve                                   # installs py-spy (extra "profile")
    python benchmarks/profile_serve.py [--scenario greedy --num-prompts 32 --rate 100]

Model: random weights in SmolLM-135M's shape, fp32 (the model of compare_serving.py). The
server is started, timed until /health, then three `py-spy record --nonblocking` samplers
attach to it at the same rate while compare_serving.py's scenario trace is replayed:

    active  default mode: a thread's samples while it runs (idle threads left out)
    idle    --idle: every thread at every tick (the tick count)
    gil     --gil: only the thread holding the GIL at each tick

They are stopped (SIGINT) when the trace is done. Printed: the GIL's share of ticks by holder
(the engine thread, the event loop on the main thread, nobody), the engine thread's time as
running with the GIL / running with it released (torch kernels, C code) / idle, and the top
functions (inclusive) and lines (self) of its running samples and of its GIL-holding samples,
plus the main thread's top GIL-holding lines. Nonblocking, because blocking samplers stop
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

from compare_serving import ROOT, SCENARIOS, bench, describe, start, stop
from random_model import save_random_model

ENGINE_THREAD = "minivllm-engine"
MAIN_THREAD = "MainThread"
_LINE = re.compile(r"^thread \((\d+)\): ([^;]*);(.*) (\d+)$")
_FRAME = re.compile(r"^(.*) \((.*?)(?::(\d+))?\)$")


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install -e '.[profile]' (or make "
                         "profile-serve, which does)")
    return found


def start_sampler(pid: int, mode: str, rate: int, out: Path) -> subprocess.Popen:
    flags = {"active": [], "idle": ["--idle"], "gil": ["--gil"]}[mode]
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
        if inclusive:  # the thread's bootstrap frames are in every stack: left out
            for function in dict.fromkeys(_function(f) for f in frames
                                          if "(threading.py:" not in f):
                counts[function] += n
        else:
            counts[frames[-1]] += n
    return [(name, n, total) for name, n in counts.most_common(limit)]


def sampler_counts(out: Path) -> str:
    """py-spy's own 'Samples: N Errors: M' of each sampler (errors: torn reads)."""
    parts = []
    for mode in ("active", "idle", "gil"):
        log = (out / f"py-spy-{mode}.log").read_text(errors="replace")
        m = re.findall(r"Samples: (\d+) Errors: (\d+)", log)
        parts.append(f"{mode} {m[-1][0]} samples / {m[-1][1]} errors" if m else f"{mode} ?")
    return ", ".join(parts)


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f} %" if whole else "  n/a"


def report(out: Path, limit: int, header: str) -> str:
    active, idle, gil = (read_stacks(out / f"{m}.txt") for m in ("active", "idle", "gil"))
    ticks = per_thread(idle).get(MAIN_THREAD, 0)  # the main thread is there at every tick
    if not ticks:
        raise SystemExit(f"no samples of the main thread in {out / 'idle.txt'}")
    held = per_thread(gil)
    running = per_thread(active).get(ENGINE_THREAD, 0)
    engine_gil = held.get(ENGINE_THREAD, 0)
    lines = [header, "",
             f"ticks: {ticks} (samples of the main thread with --idle); py-spy: "
             f"{sampler_counts(out)}", "",
             "## The GIL (--gil samples / ticks)", "",
             f"- held by the engine thread: {pct(engine_gil, ticks)}",
             f"- held by the main thread (uvicorn's event loop: HTTP, SSE, detokenized "
             f"outputs): {pct(held.get(MAIN_THREAD, 0), ticks)}"]
    others = sum(n for t, n in held.items() if t not in (ENGINE_THREAD, MAIN_THREAD))
    lines += [f"- held by other threads: {pct(others, ticks)}",
              f"- free (nobody, or a thread in C code that released it): "
              f"{pct(ticks - sum(held.values()), ticks)}", "",
              "## The engine thread (share of ticks)", "",
              f"- running: {pct(running, ticks)}",
              f"  - holding the GIL (Python, and C code that keeps it): "
              f"{pct(engine_gil, ticks)}",
              f"  - GIL released (torch kernels, sleeps excluded): "
              f"{pct(max(running - engine_gil, 0), ticks)}",
              f"- idle (waiting for work or the GIL): {pct(max(ticks - running, 0), ticks)}",
              "(three samplers at one rate but not in step: shares are estimates)"]
    sections = [
        ("engine thread, running: top functions (inclusive)", active, ENGINE_THREAD, True),
        ("engine thread, running: top lines (self)", active, ENGINE_THREAD, False),
        ("engine thread, holding the GIL: top lines (self)", gil, ENGINE_THREAD, False),
        ("main thread, holding the GIL: top lines (self)", gil, MAIN_THREAD, False),
    ]
    for title, stacks, thread, inclusive in sections:
        rows = top(stacks, thread, inclusive, limit)
        lines += ["", f"## {title}", "", "| share | samples | frame |", "|---|---|---|"]
        lines += [f"| {pct(n, total)} | {n} | `{name}` |" for name, n, total in rows]
    return "\n".join(lines)


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
    parser.add_argument("--port", type=int, default=8199)
    parser.add_argument("--output", default=str(ROOT / "results" / "profile_serve"))
    args = parser.parse_args()
    py_spy()  # fail before building anything
    model = save_random_model("smollm-135m", Path(args.model_dir))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    spec = dict(SCENARIOS[args.scenario])
    if args.num_prompts is not None:
        spec["num_prompts"] = args.num_prompts
    if spec["sampling"] is None:
        spec["sampling"] = {}
    max_model_len = spec["input_len"] + spec["output_len"] + 16
    print(f"starting minivllm serve ({args.scenario}: {describe(spec)}) ...", flush=True)
    server, ready_s = start("minivllm", model, args.port, max_model_len, out / "server.log")
    samplers = {}
    try:
        samplers = {m: start_sampler(server.pid, m, args.rate, out)
                    for m in ("active", "idle", "gil")}
        time.sleep(1.0)  # let the samplers attach
        for mode, proc in samplers.items():
            if proc.poll() is not None:
                stop_sampler(proc, mode, out)  # raises with py-spy's message
        print(f"ready in {ready_s:.1f} s; py-spy x3 at {args.rate} Hz on pid {server.pid}; "
              "replaying the trace ...", flush=True)
        started = time.perf_counter()
        summary = bench(args.port, model, spec, "completions", out / "bench")
        elapsed = time.perf_counter() - started
    finally:
        for mode, proc in samplers.items():
            stop_sampler(proc, mode, out)
        stop(server)
    header = (f"# minivllm serve under py-spy: {args.scenario} ({describe(spec)})\n\n"
              f"{elapsed:.1f} s profiled; {summary['completed']} requests completed, "
              f"{summary['failed']} failed, {summary['output_token_throughput']:.1f} output "
              f"tok/s, TPOT p50 {summary['tpot_ms']['median']:.1f} ms (py-spy's samplers "
              "share the cores: compare with an unprofiled compare_serving.py run)")
    text = report(out, args.top, header)
    (out / "profile.md").write_text(text + "\n")
    print("\n" + text + f"\n\nraw stacks, logs and profile.md in {out}/")


if __name__ == "__main__":
    main()
