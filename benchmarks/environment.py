"""The environment a benchmark process runs in: what tools/_bootstrap.py gives every tool, written here
because benchmarks/ never imports tools/ (engine/cpu.py says why MKL needs it before paddle loads).
"""
import os
import warnings

from engine.cpu import mkl_environment


def settings(env):
    """`env` with engine/cpu.py's MKL settings and paddle's C++ log level (values already there win), so
    that both sides of a comparison run under the same environment: for a child process, os.environ's copy."""
    mkl_environment(env)
    env.setdefault("GLOG_minloglevel", "2")
    return env


def before_paddle():
    """This process's settings, called before paddle is imported (MKL_DEBUG_CPU_TYPE is read once, when it
    loads), and the two warnings a tool does not show: paddle's build-tool hint at import and the BatchNorm
    notice printed on every training forward."""
    settings(os.environ)
    warnings.filterwarnings("ignore", message="No ccache found")
    warnings.filterwarnings("ignore", message="When training, we now always track global mean")
