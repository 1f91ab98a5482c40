"""Shared test plumbing: run the tools as a user would, in a subprocess from the repo root."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, GLOG_minloglevel="2", PYTHONUNBUFFERED="1")  # conftest set the MKL choice


def tool(name, *args, check=True, timeout=600, env=None):
    """Run tools/<name>.py with args; returns the CompletedProcess (text)."""
    cmd = [sys.executable, os.path.join(ROOT, "tools", name + ".py"), *map(str, args)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env or ENV)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def launch(nproc, name, *args, log_dir, timeout=600):
    """python -m paddle.distributed.launch --nproc_per_node N tools/<name>.py ... (CPU, gloo)."""
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--log_dir", str(log_dir), os.path.join(ROOT, "tools", name + ".py"), *map(str, args)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=ENV)
    if proc.returncode != 0:
        logs = ""
        for f in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
            with open(os.path.join(log_dir, f)) as fh:
                logs += f"--- {f}\n" + fh.read()[-3000:]
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}\n{logs}")
    return proc


def read_metrics(output_dir):
    with open(os.path.join(output_dir, "metrics.json")) as f:
        return json.load(f)


def assert_one_line_error(proc, *fragments):
    """A user error: non-zero exit, one `error:` line on stderr naming what is wrong, no traceback."""
    assert proc.returncode != 0, proc.stdout[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    return lines[0]
