"""Metrics (METRICS), one file per task family. COMPONENTS: the modules that register (engine/components.py)."""
COMPONENTS = ("youtube8m", "classification", "segmentation", "detection", "translation", "glue")
