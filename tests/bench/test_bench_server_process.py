"""minivllm/bench/server_process.py: the one server launcher of `bench policies` and the
benchmarks starts a server, waits for /health and stops everything the server started."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from minivllm.bench.server_process import free_port, session_peak_rss, start_server, stop_server

# A server that answers /health and starts a child that would outlive it.
SERVER = """
import http.server, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[2], "w").write(str(child.pid))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_start_waits_for_health_and_stop_ends_the_servers_children(tmp_path):
    port = free_port()
    proc, ready_s = start_server([sys.executable, "-c", SERVER, str(port),
                                  str(tmp_path / "child")], tmp_path / "server.log",
                                 f"http://127.0.0.1:{port}", timeout=60)
    child = int((tmp_path / "child").read_text())
    assert proc.poll() is None and ready_s > 0 and not gone(child)
    stop_server(proc, timeout=10)
    deadline = time.monotonic() + 10
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is not None and gone(child)


def test_a_server_that_exits_is_reported_with_its_log(tmp_path):
    with pytest.raises(RuntimeError, match=r"code 3:\n.*no model here"):
        start_server([sys.executable, "-c", "print('no model here'); raise SystemExit(3)"],
                      tmp_path / "server.log", f"http://127.0.0.1:{free_port()}", timeout=60)


def test_session_peak_rss_sums_the_sessions_processes():
    """A parent and the child it starts, each holding 64 MB: both counted, and nothing of
    this (test) process, which is in another session."""
    hold = "import time; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)"
    code = (f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {hold!r}]); "
            f"{hold}")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while session_peak_rss(proc) < 128 << 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert 128 << 20 <= session_peak_rss(proc) < 256 << 20
    finally:
        stop_server(proc, timeout=5)
    assert session_peak_rss(proc) == 0  # nothing left of the session
