"""paddle's own launcher (`python -m paddle.distributed.launch`, the same flags) under a supervisor that
turns what ends a multi-node run in a hang or a traceback into one line within a bound.

Before the launcher starts: this node's address (--host, or the host name's) must be an address of
this host and, with several nodes, not loopback; the master's address must not be this host's under
another name (paddle starts the rendezvous server only where the two are equal). Flags paddle's
collective mode ignores are refused (--max_restart: it restarts trainers only in its etcd elastic mode).

While it runs: the rendezvous must complete within --join_timeout (paddle waits for ever for a master
that is down or a node that never starts), and every supervised node heartbeats through the master's
key-value store (the one paddle's launcher serves at --master): a node silent for --peer_timeout is
lost, and this node stops. When the launcher fails, its trainers' logs say why: a connection to
another node that broke (gloo names the address), our tools' `error:` line, or an exit code.
"""
import argparse
import ctypes
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from engine import distributed
from engine.errors import ConfigError

LAUNCHER = [sys.executable, "-m", "paddle.distributed.launch"]
TICK = 0.5   # seconds between looks at the launcher and the store
PEER_FAILED_GRACE = 5.0   # seconds our trainer may take to end by itself after another node's failed
RESUME = "; continue with --resume auto on every node"


class LaunchError(ConfigError):
    """A run that cannot start, or that lost a node: one line, exit code 2."""


def parser():
    p = argparse.ArgumentParser(
        description="Run paddle.distributed.launch (its flags, e.g. --nnodes --master --host --nproc_per_node "
                    "--log_dir --job_id) under a supervisor: address checks first, a bounded rendezvous, "
                    "heartbeats between nodes, one line when the run fails.",
        usage="tools/launch.py [launcher flags] SCRIPT [script args]")
    p.add_argument("--join_timeout", type=float, default=300.0,
                   help="seconds for all --nnodes nodes to join at --master (default 300)")
    p.add_argument("--peer_timeout", type=float, default=60.0,
                   help="seconds without a heartbeat after which another node is lost and this one stops (default 60)")
    for flag, default in (("--master", None), ("--nnodes", "1"), ("--host", None), ("--ips", None),
                          ("--log_dir", "log"), ("--job_id", "default"), ("--max_restart", None),
                          ("--elastic_level", None)):
        p.add_argument(flag, default=default, help=argparse.SUPPRESS)
    return p


def _flag_chunks(argv):
    """The launcher flags that lead `argv`, each as its words (`--f v` or `--f=v`: every launcher flag
    takes a value; `-h` stands alone); the script begins after them."""
    chunks, i = [], 0
    while i < len(argv) and argv[i].startswith("-"):
        step = 1 if "=" in argv[i] or argv[i] in ("-h", "--help") else 2
        chunks.append(argv[i:i + step])
        i += step
    return chunks


def plan(argv, ifaces=None, resolved=None):
    """Parse and check a launch: (settings, the launcher's command line). One line for what cannot
    work, before anything starts."""
    argv = list(argv)
    chunks = _flag_chunks(argv)
    flags = [word for chunk in chunks for word in chunk]
    script = argv[len(flags):]
    p = parser()
    args, _ = p.parse_known_args(flags)
    if not script:
        raise LaunchError("no script to launch: give the launcher's flags, then the script and its arguments "
                          "(e.g. --nnodes 2 --master 10.0.0.1:49178 --host 10.0.0.1 tools/train.py -c CONFIG)")
    nnodes = _nodes(args)
    ifaces = distributed.interfaces() if ifaces is None else ifaces
    node = distributed.node_address(args.host, nnodes > 1, ifaces, resolved)
    master = _master(args.master, nnodes, node, ifaces)
    settings = argparse.Namespace(nnodes=nnodes, node=node, master=master, log_dir=args.log_dir,
                                  job_id=args.job_id, join_timeout=args.join_timeout,
                                  peer_timeout=args.peer_timeout)
    ours = {"--join_timeout", "--peer_timeout"}
    passed = [word for chunk in chunks if chunk[0].split("=", 1)[0] not in ours for word in chunk]
    return settings, LAUNCHER + passed + (["--host", node] if nnodes > 1 and not args.host else []) + script


def _nodes(args):
    """--nnodes, after refusing what paddle's collective launcher would ignore or what we cannot watch."""
    if args.max_restart is not None:
        raise LaunchError("--max_restart: paddle's launcher restarts a failed trainer only in its elastic mode "
                          "(an etcd:// master), which this zoo does not run; a run that loses a process stops, "
                          "and --resume auto on every node continues it from the newest checkpoint")
    if args.elastic_level is not None or ":" in args.nnodes or (args.master or "").startswith("etcd://"):
        raise LaunchError("elastic runs (--elastic_level, --nnodes MIN:MAX, an etcd:// master) are not supported: "
                          "give --nnodes N and --master IP:PORT")
    if not args.nnodes.isdigit() or int(args.nnodes) < 1:
        raise LaunchError(f"--nnodes {args.nnodes}: not a number of nodes")
    for name in ("join_timeout", "peer_timeout"):
        if getattr(args, name) <= 0:
            raise LaunchError(f"--{name} {getattr(args, name)}: must be > 0 seconds")
    nnodes = int(args.nnodes)
    if nnodes > 1 and args.ips:
        raise LaunchError("--ips: give --master IP:PORT (the first node's address and a free port) and --nnodes "
                          "instead; --ips has no rendezvous to supervise (paddle marks it deprecated)")
    if nnodes > 1 and not args.master:
        raise LaunchError(f"--nnodes {nnodes} needs --master IP:PORT: the first node's address and a free port, "
                          f"the same on every node")
    return nnodes


def _master(master, nnodes, node, ifaces):
    """(ip, port) of --master (None without one), checked against this node's address."""
    if not master:
        return None
    host, _, port = master.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchError(f"--master {master}: expected IP:PORT, e.g. 10.0.0.1:49178")
    if nnodes > 1 and distributed.is_loopback(host):
        raise LaunchError(f"--master {master}: loopback, which the other nodes cannot reach; give the first "
                          f"node's address")
    if host in ifaces.values() and host != node:
        raise LaunchError(f"--master {master} is an address of this host, but this node's address is {node}: "
                          f"paddle's launcher starts the rendezvous server only where the two are equal; pass "
                          f"--host {host}")
    return host, int(port)


def run(argv):
    """Launch and supervise; returns 0, or raises LaunchError with the one line."""
    settings, cmd = plan(argv)
    logs = _Logs(settings.log_dir)
    child = _Launcher(cmd)
    supervisor = _Supervisor(settings, child) if settings.nnodes > 1 else None
    try:
        if supervisor:
            supervisor.watch()
        code = child.wait()
        if supervisor:
            supervisor.record_exit(code)
        if code != 0:
            raise LaunchError(logs.why(code, supervisor))
        return 0
    finally:
        child.stop()


class _Launcher:
    """paddle's launcher in a child process; its output (and its rank-0 trainer's, which it copies)
    goes to our stdout, so that stderr holds only our one line."""

    def __init__(self, cmd):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                     preexec_fn=_die_with_parent)
        self.copier = threading.Thread(target=self._copy, daemon=True)
        self.copier.start()

    def _copy(self):
        for line in self.proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()

    def poll(self):
        return self.proc.poll()

    def wait(self):
        code = self.proc.wait()
        self.copier.join(timeout=5)
        return code

    def stop(self, grace=10.0):
        """SIGTERM (paddle's launcher then stops its trainers), SIGKILL to what is left after `grace`."""
        if self.proc.poll() is not None:
            return
        family = _descendants(self.proc.pid)
        if grace:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        for pid in [self.proc.pid] + family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.copier.join(timeout=5)


def _die_with_parent():
    """In the child: SIGTERM when the supervisor dies (even by kill -9), so no launcher is orphaned."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def _descendants(pid):
    """The processes under `pid` (paddle's trainers run in sessions of their own)."""
    children = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class _Store:
    """The key-value store paddle's launcher serves over HTTP at --master (its rendezvous)."""

    def __init__(self, master, timeout=2.0):
        self.url = f"http://{master[0]}:{master[1]}"
        self.timeout = timeout
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
        self.last_error = None

    def get(self, prefix):
        """{key: value} under `prefix`; None when the store does not answer."""
        try:
            with self.opener.open(self.url + prefix, timeout=self.timeout) as r:
                return json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            if e.code == 404:   # nothing under the prefix yet
                return {}
            self.last_error = e
            return None
        except (OSError, ValueError) as e:
            self.last_error = getattr(e, "reason", e)
            return None

    def put(self, key, value):
        try:
            request = urllib.request.Request(self.url + key, data=str(value).encode(), method="PUT")
            with self.opener.open(request, timeout=self.timeout):
                return True
        except OSError:
            return False


class _Supervisor:
    """The rendezvous within --join_timeout, then heartbeats through the store until the launcher
    exits: `/zoo/<job>/beat/<address>/<pid>` counts up every TICK, `/zoo/<job>/exit/<address>` says how
    a node's launcher ended (a node that finished is not lost; one that failed stops the others)."""

    def __init__(self, settings, child):
        self.s, self.child = settings, child
        self.store = _Store(settings.master, timeout=min(2.0, settings.peer_timeout / 4))
        self.me = f"{settings.node}/{os.getpid()}"
        self.beats = 0
        self.seen = {}   # peer -> (its last count, when that changed)

    def key(self, kind="", name=""):
        return f"/zoo/{self.s.job_id}/{kind}/{name}" if kind else f"/zoo/{self.s.job_id}/"

    def watch(self):
        self.join()
        answered, failed_at = time.monotonic(), None
        while self.child.poll() is None:
            now = time.monotonic()
            records = self.store.get(self.key())
            if records is None:
                # refused: the master's host answers and its launcher has ended (the job completed, or its
                # trainers died and ours see their connections reset): our launcher ends by itself.
                # Silence (a timeout, no route) is a host gone or cut off.
                if isinstance(self.store.last_error, ConnectionRefusedError):
                    answered = now
                elif now - answered > self.s.peer_timeout:
                    self.lost(f"lost the master node {self.s.master[0]}: its rendezvous server stopped answering "
                              f"for {self.s.peer_timeout:.0f} s ({self.store.last_error}){RESUME}")
            else:
                answered = now
                self.beat()
                ended = self.note(records, now)
                failed = [ip for ip, how in ended.items() if how == "failed"]
                # a run refused on every rank at once (e.g. --resume auto finding no checkpoint) fails on each
                # node within moments: our trainer's own error line is the better one, so it gets a few
                # seconds to end by itself before the generic line stops it
                failed_at = failed_at or (now if failed else None)
                if failed and now - failed_at >= PEER_FAILED_GRACE:
                    self.lost(f"node {failed[0]} failed (its own output says why), so this node stopped too{RESUME}")
                for ip, silent in self.silence().items():
                    if silent > self.s.peer_timeout and ip not in ended:
                        self.lost(f"lost node {ip}: no heartbeat for {silent:.0f} s (the node stopped, or the network "
                                  f"between the nodes is down){RESUME}")
            time.sleep(TICK)

    def note(self, records, now):
        """Take the peers' heartbeats from the store's records; returns {node: how its launcher ended}."""
        ended, prefix = {}, self.key()
        for key, value in records.items():
            kind, _, peer = key[len(prefix):].partition("/")
            if kind == "beat" and peer != self.me and self.seen.get(peer, (None,))[0] != value:
                self.seen[peer] = (value, now)
            elif kind == "exit" and peer != self.s.node:
                ended[peer] = value
        return ended

    def silence(self):
        """{node address: seconds since its heartbeat last changed}."""
        now, out = time.monotonic(), {}
        for peer, (_, when) in self.seen.items():
            ip = peer.split("/")[0]
            out[ip] = min(out.get(ip, float("inf")), now - when)
        return out

    def beat(self):
        self.beats += 1
        self.store.put(self.key("beat", self.me), self.beats)

    def record_exit(self, code):
        self.store.put(self.key("exit", self.s.node), "finished" if code == 0 else "failed")

    def exit_of(self, ip, wait=3.0):
        """How node `ip`'s launcher ended, as its supervisor recorded it ('' if not, or not within `wait`)."""
        end = time.monotonic() + wait
        while True:
            found = self.store.get(self.key("exit", ip))
            if found or found is None or time.monotonic() >= end:
                return next(iter(found.values())) if found else ""
            time.sleep(TICK)

    def join(self):
        start, said = time.monotonic(), 0.0
        where = f"{self.s.master[0]}:{self.s.master[1]}"
        while self.child.poll() is None:
            self.beat()
            info = self.store.get(f"/{self.s.job_id}/info")
            nodes = sorted({_candidate(v) for v in (info or {}).values()})
            if len(nodes) >= self.s.nnodes:
                print(f"launch: {len(nodes)} nodes joined at {where}: {', '.join(nodes)}", flush=True)
                return
            waited = time.monotonic() - start
            if waited > self.s.join_timeout:
                # before the rendezvous there is no trainer to stop: the launcher is killed (SIGTERM makes
                # paddle's waiting launcher fail with a traceback)
                if info is None:
                    self.lost(f"no rendezvous server answered at {where} within {self.s.join_timeout:.0f} s "
                              f"({self.store.last_error}): start the launcher on the node whose address is "
                              f"{self.s.master[0]} (--host {self.s.master[0]}) with the same --master, and check "
                              f"that this node reaches it", grace=0)
                self.lost(f"{len(nodes)} of {self.s.nnodes} nodes joined at {where} within {self.s.join_timeout:.0f} s "
                          f"({', '.join(nodes) or 'none'}): start the launcher on the other nodes with the same "
                          f"--master and --nnodes, and check that they reach {where}", grace=0)
            if waited - said >= 10:
                said = waited
                print(f"launch: waiting for nodes at {where}: {len(nodes)} of {self.s.nnodes} joined "
                      f"({waited:.0f} s of {self.s.join_timeout:.0f})", flush=True)
            time.sleep(TICK)

    def lost(self, message, grace=10.0):
        self.child.stop(grace)
        raise LaunchError(message)


def _candidate(value):
    """The node address in a rendezvous record of paddle's launcher ({"candidate": "ip:port", ...})."""
    try:
        return json.loads(value).get("candidate", "?").rsplit(":", 1)[0]
    except (ValueError, AttributeError):
        return "?"


# gloo's words when a connection to another rank fails: "[.../pair.cc:576] Read error [10.77.0.2]:2965:
# Connection reset by peer"; the address is the other rank's
_GLOO_PEER = re.compile(r"gloo/[\w/.]+:\d+\] ([^\n]*\[(\d{1,3}(?:\.\d{1,3}){3})\][^\n]*)")


class _Logs:
    """The trainers' logs (--log_dir/workerlog.N, appended to across runs): what this run wrote."""

    def __init__(self, log_dir):
        self.dir, self.start = log_dir, time.time()
        self.offsets = {path: os.path.getsize(path) for path in glob.glob(os.path.join(log_dir, "workerlog.*"))}

    def new_text(self):
        """{local rank: what this run's trainer wrote}."""
        out = {}
        for path in sorted(glob.glob(os.path.join(self.dir, "workerlog.*"))):
            with open(path, errors="replace") as f:
                f.seek(self.offsets.get(path, 0))
                out[int(path.rsplit(".", 1)[1])] = f.read()
        return out

    def ranks(self):
        """(the hosts of all ranks in rank order, {local rank: global rank}) from this run's env records."""
        hosts, ranks = [], {}
        for path in glob.glob(os.path.join(self.dir, "backup_env.*.json")):
            if os.path.getmtime(path) < self.start - 1:
                continue
            with open(path) as f:
                env = json.load(f)
            hosts = distributed.endpoint_hosts(env)
            ranks[int(env.get("PADDLE_LOCAL_RANK", 0))] = int(env.get("PADDLE_TRAINER_ID", 0))
        return hosts, ranks

    def why(self, code, supervisor):
        """The one line for a launcher that exited with `code`: a lost node, a trainer's `error:`
        line, or the code."""
        hosts, ranks = self.ranks()
        texts = self.new_text()
        for local, text in sorted(texts.items()):
            who = distributed.where(ranks.get(local, local), hosts)
            peer = _GLOO_PEER.search(text)
            if peer:
                what, ip = peer.groups()
                if distributed.is_loopback(ip):
                    return (f"{who}: gloo could not reach another rank at {ip} ({what.strip()}): a rank advertised a "
                            f"loopback address; set GLOO_SOCKET_IFNAME to the interface of the node's --host, or "
                            f"unset it")
                on = ", ".join(str(r) for r, h in enumerate(hosts) if h == ip)
                ended = supervisor.exit_of(ip) if supervisor else ""
                return (f"lost node {ip}{f' (rank {on})' if on else ''}: {who} saw gloo: {what.strip()}"
                        f"{f'; that node reports its run {ended} (its own output says why)' if ended else ''}"
                        f"{RESUME}")
            if "gloo" in text and "TIMEOUT" in text:
                silent = {ip: t for ip, t in (supervisor.silence() if supervisor else {}).items() if t > 10}
                if silent:
                    ip, t = max(silent.items(), key=lambda kv: kv[1])
                    return (f"lost node {ip}: no heartbeat for {t:.0f} s, and {who} timed out waiting for it at a "
                            f"collective (gloo waits 30 s){RESUME}")
                return (f"{who} timed out at a collective (gloo waits 30 s for the other ranks) while every node "
                        f"still answered: a rank was slower than that between two collectives; see "
                        f"{self.dir}/workerlog.{local}")
        for local, text in sorted(texts.items()):
            errors = [ln for ln in text.splitlines() if ln.startswith("error: ")]
            if errors:
                return f"{distributed.where(ranks.get(local, local), hosts)}: {errors[-1][len('error: '):]}"
        return f"the launcher exited with code {code}; see {self.dir}/workerlog.*"
