"""What tools/infer.py writes: one output writer (OUTPUTS) per task family, and the colour palettes.

COMPONENTS: the modules that register (engine/components.py); palettes.py and report.py (tools/eval.py
--report) register nothing.
"""
COMPONENTS = ("youtube8m", "classification", "segmentation", "detection", "translation", "glue")
