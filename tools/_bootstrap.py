"""Imported first by every tool: environment that must be set before paddle is imported.

MKL_DEBUG_CPU_TYPE=5 on AMD CPUs only (engine/cpu.py says why); it is read once when paddle loads,
so it cannot be set later.
"""
import os
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from engine.cpu import mkl_environment  # noqa: E402  (no paddle import)

mkl_environment()
os.environ.setdefault("GLOG_minloglevel", "2")
# noise that is not the user's business: paddle's build-tool hint at import, and a BatchNorm notice
# printed on every training forward
warnings.filterwarnings("ignore", message="No ccache found")
warnings.filterwarnings("ignore", message="When training, we now always track global mean")
