"""Multi-node data parallel across a real network stack: two hosts (network namespaces joined by a veth
pair, tests/netns.py), one `tools/launch.py --nnodes 2 --master 10.77.0.1:PORT --nproc_per_node 1` per
host (paddle.distributed.launch under our supervisor), gloo on the CPU. Each host writes to its own
output and log folders, as hosts without a shared disk do; they read the same data and weights, of
which real hosts would each hold a copy."""
import errno
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from engine import config, distributed, launch
from engine.components import load_all
from engine.errors import ConfigError
from tests import netns
from tests.conftest import DP_RECIPE, HALF_BATCH
from tests.helpers import ENV, ROOT, logged_losses, max_weight_difference, read_metrics
from tests.test_distributed import LOSS_TOLERANCE

PORTS = iter(range(49178, 49278))   # a fresh rendezvous port per job
PEER_TIMEOUT = 10                   # the jobs' --peer_timeout (seconds)
JOIN_TIMEOUT = 5                    # --join_timeout where a node is missing on purpose
WAIT = 240                          # no job here runs longer (seconds)


@pytest.fixture(scope="module")
def hosts():
    made, error = None, None
    try:
        made = netns.Hosts()
    except RuntimeError as e:
        error = str(e)
    if error:   # a failure of its own, outside the except (no chained traceback)
        pytest.fail(f"the two test hosts could not be made: {error} (network namespaces need root, as CI has)",
                    pytrace=False)
    try:
        yield made
    finally:
        made.close()


class Job:
    """`tools/launch.py LAUNCH tools/<tool>.py ARGS --output OUT` on each host of `on`, with --host
    unless `host=False`; OUT is `outputs[i]` (default <root>/out<i>; `outputs=False`: none); `env[i]`
    adds to host i's environment."""

    def __init__(self, hosts, root, tool, *args, on=(0, 1), launch=(), host=True, outputs=None, env=None):
        self.hosts, self.root = hosts, root
        self.outputs = {i: root / f"out{i}" for i in on} if outputs is None else outputs
        self.master = f"{hosts.ips[0]}:{next(PORTS)}"
        self.procs, self.files = {}, {}
        os.makedirs(root, exist_ok=True)
        for i in on:
            cmd = [sys.executable, "tools/launch.py", "--nnodes", "2", "--master", self.master, "--nproc_per_node",
                   "1", "--log_dir", self.log_dir(i), "--peer_timeout", PEER_TIMEOUT, *launch,
                   *(["--host", hosts.ips[i]] if host else []), f"tools/{tool}.py", *args,
                   *(["--output", self.outputs[i]] if self.outputs else [])]
            self.files[i] = open(root / f"stdout{i}.txt", "w"), open(root / f"stderr{i}.txt", "w")
            self.procs[i] = hosts.start(i, *cmd, stdout=self.files[i][0], stderr=self.files[i][1],
                                        env={**ENV, **(env or {}).get(i, {})}, cwd=ROOT)

    def out(self, i):
        return self.outputs[i]

    def log_dir(self, i):
        return self.root / f"log{i}"

    def wait(self, i, timeout=WAIT):
        """(exit code, stdout, stderr) of host i's launcher."""
        code = self.procs[i].wait(timeout=timeout)
        for f in self.files[i]:
            f.close()
        return code, (self.root / f"stdout{i}.txt").read_text(), (self.root / f"stderr{i}.txt").read_text()

    def finish(self):
        """Every host's (0, stdout, stderr): each must exit 0."""
        results = {i: self.wait(i) for i in self.procs}
        for i, (code, out, err) in results.items():
            assert code == 0, f"host {i} exited {code}:\n{err}\n{out[-3000:]}"
        return results

    def worker_log(self, i):
        path = self.log_dir(i) / "workerlog.0"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for(self, i, pattern, timeout=120):
        """Until host i's trainer has logged `pattern` (paddle's launcher runs it unbuffered)."""
        end = time.monotonic() + timeout
        while not re.search(pattern, self.worker_log(i)):
            assert time.monotonic() < end, f"no {pattern!r} within {timeout} s:\n{self.worker_log(i)[-2000:]}"
            assert self.procs[i].poll() is None, f"host {i} ended before {pattern!r}: {self.wait(i)}"
            time.sleep(0.02)


def one_line(result):
    """The single `error:` line of a launcher that failed as a user should see it fail."""
    code, _, err = result
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code != 0 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, result
    return lines[0]


@pytest.fixture(scope="module")
def two_host_run(hosts, yt8m_demo, tmp_path_factory):
    """DP_RECIPE uninterrupted on 2 hosts x 1 process at 16 per card: (the job, its results)."""
    job = Job(hosts, tmp_path_factory.mktemp("two_hosts"), "train", *DP_RECIPE, *HALF_BATCH)
    return job, job.finish()


def test_the_hosts_reach_each_other_and_nothing_else(hosts):
    for host in hosts.isolated():
        assert host["links"] == ["lo", netns.IFACE], host
        assert host["routes"] and all(r.startswith(f"{netns.NET}.0/24 dev {netns.IFACE} ") for r in host["routes"]), host
        assert host["outside"] == str(errno.ENETUNREACH), host   # a send to 192.0.2.1: "Network is unreachable"


def test_the_harness_removes_what_a_killed_run_left_and_says_why_it_cannot_make_hosts(hosts):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = f"{netns.PREFIX}{gone}-a"          # a namespace of a run whose process is gone
    subprocess.run(["ip", "netns", "add", stale], check=True)
    netns.remove_stale()
    assert stale not in netns.namespaces()
    assert set(hosts.names) <= set(netns.namespaces())   # this run's stay
    # root without capabilities cannot make namespaces, as a user cannot: the fixture fails in one line
    proc = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-m", "pytest", "-q",
                           "-p", "no:cacheprovider", f"{__file__}::test_the_hosts_reach_each_other_and_nothing_else"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "1 error" in proc.stdout and "skipped" not in proc.stdout, proc.stdout
    failure = [ln for ln in proc.stdout.splitlines() if ln.startswith("the two test hosts could not be made")]
    assert len(failure) == 1 and "ip netns add" in failure[0] and "not permitted" in failure[0], proc.stdout
    assert "During handling" not in proc.stdout, proc.stdout


def test_two_hosts_train_exactly_as_two_processes_on_one_host(two_host_run, two_process_run, one_process_run):
    job, results = two_host_run
    # the trainer bound gloo to the interface of the address the launcher was given: the host name
    # resolves to 127.0.0.1 here, and gloo's own choice would send the other host to its loopback
    assert f"GLOO_SOCKET_IFNAME={netns.IFACE} ({netns.NET}.1)" in results[0][1]
    assert max_weight_difference(job.out(0), two_process_run) <= 1e-6   # measured: 0.0
    assert max_weight_difference(job.out(1), job.out(0)) == 0.0         # host 1's own copy (save_on_each_node)
    # against 1 process at batch 32: the losses, within the loopback test's tolerance (test_distributed.py)
    two, one = logged_losses(job.out(0)), logged_losses(one_process_run)
    assert len(two) == len(one) == 50
    assert np.abs(two - one).max() <= LOSS_TOLERANCE, np.abs(two - one).max()
    load_all()
    for i in (0, 1):
        assert config.load(str(job.out(i) / "config.yaml"))["runtime"]["world_size"] == 2
    # rank 0 logs; the other node writes its own checkpoints (and no log)
    assert (job.out(0) / "train.log").exists() and (job.out(0) / "vdl").exists()
    assert not (job.out(1) / "train.log").exists() and not (job.out(1) / "vdl").exists()
    assert sorted(os.listdir(job.out(1) / "checkpoints")) == sorted(os.listdir(job.out(0) / "checkpoints"))


def test_a_killed_node_stops_the_other_with_one_line_and_both_resume_exactly(hosts, two_host_run, tmp_path):
    job = Job(hosts, tmp_path / "run", "train", *DP_RECIPE, *HALF_BATCH)
    job.wait_for(0, r"step 1 ")                    # host 1's trainer is running by now
    everything = hosts.pids(1)                     # host 1's supervisor, launcher and trainer
    # rank 0 logs step 32 only after rank 1 joined step 32's all-reduce, by when it had written step_30
    # (epoch 2, batch 5): the newest checkpoint both hold is mid-epoch (step_40 if the kill came late)
    job.wait_for(0, r"step 32 ")
    killed = time.monotonic()
    hosts.kill(1, pids=everything)                 # kill -9
    result = job.wait(0, timeout=PEER_TIMEOUT + 30)
    took = time.monotonic() - killed
    line = one_line(result)
    assert line.startswith(f"error: lost node {hosts.ips[1]} (rank 1): "), line
    assert line.endswith("continue with --resume auto on every node"), line
    assert took <= PEER_TIMEOUT + 5, took          # measured: ~2 s (gloo sees the connection reset)
    job.wait(1)

    # host 1 looking for checkpoints where it wrote none (no shared disk): one line on both hosts
    stray = Job(hosts, tmp_path / "stray", "train", *DP_RECIPE, *HALF_BATCH, "--resume", "auto",
                outputs={0: job.out(0), 1: tmp_path / "elsewhere"})
    for i in (0, 1):
        line = one_line(stray.wait(i))
        assert "--resume auto: no checkpoint" in line and f"rank 1 ({hosts.ips[1]}) has none" in line, line
        assert "train.save_on_each_node" in line, line

    # both resume from the newest checkpoint they both hold, and end as the uninterrupted run did
    results = Job(hosts, tmp_path / "resume", "train", *DP_RECIPE, *HALF_BATCH, "--resume", "auto",
                  outputs={i: job.out(i) for i in (0, 1)}).finish()
    assert re.search(r"resumed from \S+/step_(30|40) \(epoch 2, batch (5|15), step \1\)", results[0][1]), \
        results[0][1][-3000:]
    reference, _ = two_host_run
    for i in (0, 1):
        assert max_weight_difference(job.out(i), reference.out(0)) <= 1e-6   # measured: 0.0


@pytest.mark.parametrize("frozen", [1, 0], ids=["a node", "the master node"])
def test_a_node_that_stops_answering_is_lost_after_the_peer_timeout(hosts, yt8m_demo, tmp_path, frozen):
    job = Job(hosts, tmp_path, "train", *DP_RECIPE, *HALF_BATCH)
    job.wait_for(0, r"step 10 ")
    stopped = time.monotonic()
    hosts.kill(frozen, signal.SIGSTOP)             # frozen: its connections stay open, nothing answers
    try:
        line = one_line(job.wait(1 - frozen, timeout=PEER_TIMEOUT + 30))
        took = time.monotonic() - stopped
    finally:
        hosts.kill(frozen)
    assert line.startswith(f"error: lost node {hosts.ips[1]}: no heartbeat for " if frozen else
                           f"error: lost the master node {hosts.ips[0]}: its rendezvous server stopped answering"), line
    # after --peer_timeout, before gloo's own 30 s (measured: 11.5 s, and 12.9 s for the master: its store times out)
    assert PEER_TIMEOUT <= took <= PEER_TIMEOUT + 8, took


def test_a_trainer_error_on_one_node_ends_both_in_one_line(hosts, tmp_path):
    job = Job(hosts, tmp_path, "train", "-c", DP_RECIPE[1], env={1: {"GLOO_SOCKET_IFNAME": "eth7"}})
    own = one_line(job.wait(1, timeout=60))
    assert own == (f"error: rank 1 ({hosts.ips[1]}): GLOO_SOCKET_IFNAME=eth7: no such interface with an IPv4 "
                   f"address on this host (its interfaces: lo 127.0.0.1, {netns.IFACE} {hosts.ips[1]})"), own
    other = one_line(job.wait(0, timeout=PEER_TIMEOUT + 30))   # rank 0 waited for it in the set-up
    assert other.startswith(f"error: node {hosts.ips[1]} failed (its own output says why)"), other


def test_two_host_evaluation_equals_one_process_on_an_odd_set(hosts, odd_eval, tmp_path):
    args, one = odd_eval
    job = Job(hosts, tmp_path, "eval", *args)
    job.finish()
    two = read_metrics(job.out(0))
    assert one["num_samples"] == two["num_samples"] == 99
    for k in ("gap", "hit_at_1", "perr"):
        assert one[k] == two[k], (k, one[k], two[k])


def test_launches_that_cannot_work_end_with_one_line_in_bounded_time(hosts, tmp_path):
    def alone(i, name, **kwargs):
        """(the one error line, seconds taken) of host i launched without the other."""
        begun = time.monotonic()
        job = Job(hosts, tmp_path / name, "train", "-c", DP_RECIPE[1], on=(i,), **kwargs)
        return one_line(job.wait(i, timeout=60)), time.monotonic() - begun

    # no --host: in the test hosts the host name resolves to 127.0.0.1
    line, took = alone(1, "nohost", host=False)
    assert "--host" in line and hosts.ips[1] in line and took < 30, (line, took)
    # the master's host never starts: host 1 alone
    line, took = alone(1, "nomaster", launch=("--join_timeout", JOIN_TIMEOUT))
    assert line.startswith(f"error: no rendezvous server answered at {hosts.ips[0]}:"), line
    assert f"within {JOIN_TIMEOUT} s" in line and JOIN_TIMEOUT <= took <= JOIN_TIMEOUT + 15, (line, took)
    # the other node never joins: host 0 alone
    line, took = alone(0, "alone", launch=("--join_timeout", JOIN_TIMEOUT))
    assert line.startswith(f"error: 1 of 2 nodes joined at {hosts.ips[0]}:"), line
    assert f"({hosts.ips[0]})" in line and JOIN_TIMEOUT <= took <= JOIN_TIMEOUT + 15, (line, took)
    # paddle's launcher restarts nothing without an etcd master: --max_restart is refused, not ignored
    line, _ = alone(0, "restart", launch=("--max_restart", "2"))
    assert "--max_restart" in line and "--resume auto" in line, line


# The address checks themselves, on given interfaces and host names (no namespaces needed)

IFACES = {"lo": "127.0.0.1", "eth1": "10.0.0.2"}


def test_the_node_address_is_checked_before_anything_starts():
    assert distributed.node_address("10.0.0.2", True, IFACES) == "10.0.0.2"
    assert distributed.node_address(None, True, IFACES, ("n2", "10.0.0.2")) == "10.0.0.2"
    assert distributed.node_address(None, False, IFACES, ("n2", "127.0.0.1")) == "127.0.0.1"   # one node
    for host, resolved, says in [
            ("10.0.0.9", None, "--host 10.0.0.9 is not an address of this host (its interfaces: lo 127.0.0.1, "
                               "eth1 10.0.0.2)"),
            ("127.0.0.1", None, "--host 127.0.0.1 is loopback"),
            (None, ("n2", "127.0.1.1"), "this host's name 'n2' resolves to 127.0.1.1 (loopback), which the other "
                                        "nodes cannot reach; pass --host with this node's address (10.0.0.2)"),
            (None, ("n2", "192.0.2.7"), "this host's name 'n2' resolves to 192.0.2.7, which is not an address of "
                                        "this host"),
            (None, ("n2", None), "this host's name 'n2' does not resolve")]:
        with pytest.raises(ConfigError) as e:
            distributed.node_address(host, True, IFACES, resolved)
        assert says in str(e.value)


def test_the_launch_plan_passes_paddles_flags_on_and_refuses_what_cannot_work():
    settings, cmd = launch.plan(["--nnodes", "2", "--master", "10.0.0.1:49178", "--nproc_per_node=1",
                                 "--peer_timeout", "7", "tools/train.py", "-c", "x.yaml", "--host", "kept"],
                                IFACES, ("n2", "10.0.0.2"))
    assert cmd[1:3] == ["-m", "paddle.distributed.launch"]
    assert cmd[3:] == ["--nnodes", "2", "--master", "10.0.0.1:49178", "--nproc_per_node=1", "--host", "10.0.0.2",
                       "tools/train.py", "-c", "x.yaml", "--host", "kept"]   # the script's own args untouched
    assert (settings.node, settings.master, settings.peer_timeout) == ("10.0.0.2", ("10.0.0.1", 49178), 7.0)
    for argv, says in [
            (["--nnodes", "2", "t.py"], "--nnodes 2 needs --master IP:PORT"),
            (["--nnodes", "2", "--master", "10.0.0.2:1", "--host", "10.0.0.2", "--ips", "a,b", "t.py"], "--ips"),
            (["--nnodes", "2:4", "--master", "10.0.0.1:1", "t.py"], "elastic runs"),
            (["--nnodes", "2", "--master", "127.0.0.1:1", "--host", "10.0.0.2", "t.py"], "loopback"),
            (["--nnodes", "2", "--master", "10.0.0.1", "--host", "10.0.0.2", "t.py"], "expected IP:PORT"),
            (["--nnodes", "2", "--master", "10.0.0.1:1", "--join_timeout", "0", "t.py"], "--join_timeout 0.0"),
            (["--max_restart", "1", "t.py"], "--max_restart")]:
        with pytest.raises(ConfigError) as e:
            launch.plan(argv, IFACES, ("n2", "10.0.0.2"))
        assert says in str(e.value), (argv, str(e.value))
    # the master's address is this host's, under another name than --host: paddle would start no master
    with pytest.raises(ConfigError) as e:
        launch.plan(["--nnodes", "2", "--master", "10.0.0.2:1", "--host", "10.0.0.3", "t.py"],
                    {**IFACES, "eth2": "10.0.0.3"})
    assert "pass --host 10.0.0.2" in str(e.value)


def test_the_trainer_binds_gloo_or_nccl_to_the_interface_of_its_address():
    two_hosts = {"PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6071", "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6070,10.0.0.2:6071"}
    env = dict(two_hosts)
    assert distributed.socket_interface("cpu", env, IFACES) == ("GLOO_SOCKET_IFNAME", "eth1", "10.0.0.2")
    assert env["GLOO_SOCKET_IFNAME"] == "eth1"
    env = dict(two_hosts)
    assert distributed.socket_interface("gpu", env, IFACES)[:2] == ("NCCL_SOCKET_IFNAME", "eth1")
    env = {**two_hosts, "GLOO_SOCKET_IFNAME": "lo"}   # the user's choice stands
    assert distributed.socket_interface("cpu", env, IFACES) == ("GLOO_SOCKET_IFNAME", "lo", "127.0.0.1")
    for env, says in [({**two_hosts, "GLOO_SOCKET_IFNAME": "eth9"}, "GLOO_SOCKET_IFNAME=eth9: no such interface"),
                      ({**two_hosts, "PADDLE_CURRENT_ENDPOINT": "10.0.0.7:6071"}, "10.0.0.7 (the launcher's --host")]:
        with pytest.raises(ConfigError) as e:
            distributed.socket_interface("cpu", env, IFACES)
        assert says in str(e.value)
    one_host = {"PADDLE_CURRENT_ENDPOINT": "172.17.0.5:6071", "PADDLE_TRAINER_ENDPOINTS": "172.17.0.5:6070,172.17.0.5:6071"}
    assert distributed.socket_interface("cpu", dict(one_host), IFACES) is None   # gloo's default serves one host
