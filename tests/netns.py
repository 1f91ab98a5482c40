"""Two hosts on one machine, for the multi-node tests: two network namespaces joined by a veth pair,
10.77.0.1 and 10.77.0.2/24 (a private range used only inside them), each with its own loopback and no
route to anything else. A process started in one (`Hosts.start`) sees only its own interfaces and
reaches the other host only across the veth pair, through both kernels' network stacks.

Namespace names carry this run's prefix (`zoomn-<pid>-`); ones a killed run left behind are removed
first. `close()` kills what runs inside and deletes them (the veth pair goes with them), also after a
failed test. Creating namespaces needs root (CI runs as root): without the rights, one line says so.
"""
import os
import re
import shutil
import subprocess
import sys

PREFIX = "zoomn-"
NET = "10.77.0"
IFACE = "zoo0"


def _ip(*args, check=True):
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {(proc.stderr or proc.stdout).strip()}")
    return proc


def _alive(pid):
    return os.path.exists(f"/proc/{pid}")


def namespaces():
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _kill_inside(ns):
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    return pids


def remove_stale():
    """Namespaces of earlier runs whose process is gone (a run killed before its clean-up)."""
    for ns in namespaces():
        m = re.match(re.escape(PREFIX) + r"(\d+)-", ns)
        if m and not _alive(int(m.group(1))):
            _kill_inside(ns)
            _ip("netns", "del", ns, check=False)


class Hosts:
    """hosts.names[i], hosts.ips[i] for host i in (0, 1)."""

    def __init__(self):
        if shutil.which("ip") is None:
            raise RuntimeError("the multi-node tests need `ip` (iproute2): apt-get install iproute2")
        remove_stale()
        self.names = [f"{PREFIX}{os.getpid()}-{c}" for c in "ab"]
        self.ips = [f"{NET}.1", f"{NET}.2"]
        self.procs = []
        try:
            for ns in self.names:
                _ip("netns", "add", ns)
            _ip("link", "add", IFACE, "netns", self.names[0], "type", "veth", "peer", "name", IFACE,
                "netns", self.names[1])
            for ns, ip in zip(self.names, self.ips):
                _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", IFACE)
                _ip("-n", ns, "link", "set", IFACE, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except RuntimeError:
            self.close()
            raise

    def run(self, host, *cmd, **kwargs):
        """Run `cmd` inside host `host` to completion (bounded by `timeout`, default 60 s)."""
        kwargs.setdefault("timeout", 60)
        return subprocess.run(["ip", "netns", "exec", self.names[host], *map(str, cmd)], capture_output=True,
                              text=True, **kwargs)

    def start(self, host, *cmd, stdout, stderr, env=None, cwd=None):
        """Start `cmd` inside host `host` (in a session of its own); close() kills it if still running."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.names[host], *map(str, cmd)], stdout=stdout,
                                stderr=stderr, env=env, cwd=cwd, start_new_session=True, text=True)
        self.procs.append(proc)
        return proc

    def pids(self, host):
        """What runs in host `host` now."""
        return _ip("netns", "pids", self.names[host], check=False).stdout.split()

    def kill(self, host, signal=9, pids=None):
        """kill -<signal> of everything running in host `host` (its launcher and trainers), or of `pids`
        listed before (no `ip` to wait for at the moment of the kill); returns the pids."""
        pids = self.pids(host) if pids is None else pids
        for pid in pids:
            try:
                os.kill(int(pid), signal)
            except (ProcessLookupError, ValueError):
                pass
        return pids

    def isolated(self):
        """Each host's routes (there must be no default route) and what a send to an outside address
        gives (it must fail: the network is unreachable)."""
        probe = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                 "try:\n    s.connect(('192.0.2.1', 53)); s.send(b'x'); print('sent')\n"
                 "except OSError as e:\n    print(e.errno)")
        out = []
        for host, ns in enumerate(self.names):
            routes = _ip("-n", ns, "route", "show").stdout.strip().splitlines()
            links = _ip("-n", ns, "-o", "link", "show").stdout
            sent = self.run(host, sys.executable, "-c", probe).stdout.strip()
            out.append({"routes": routes, "links": re.findall(r"^\d+: ([^:@]+)", links, re.M), "outside": sent})
        return out

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
        for ns in getattr(self, "names", []):
            if ns in namespaces():
                _kill_inside(ns)
                _ip("netns", "del", ns, check=False)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
