"""Imported first by every tool: environment that must be set before paddle is imported.

MKL_DEBUG_CPU_TYPE=5 makes Paddle's bundled MKL take its fast path on AMD CPUs (about 2x on our
machines, see README); it is read once when paddle loads, so it cannot be set later.
"""
import os
import sys

os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
os.environ.setdefault("GLOG_minloglevel", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
