"""What tools/infer.py writes: one output writer (OUTPUTS) per task family, and the colour palettes."""
