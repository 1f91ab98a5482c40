"""What tools/infer.py writes: one output writer (OUTPUTS) per task family, and the colour palettes.

COMPONENTS: the modules that register (engine/components.py); palettes.py registers nothing.
"""
COMPONENTS = ("youtube8m", "classification", "segmentation", "detection", "translation", "glue")
