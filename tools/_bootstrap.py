"""Imported first by every tool: environment that must be set before paddle is imported.

MKL_DEBUG_CPU_TYPE=5 on AMD CPUs only (engine/cpu.py says why); it is read once when paddle loads,
so it cannot be set later.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from engine.cpu import before_paddle  # noqa: E402  (no paddle import)

before_paddle()
