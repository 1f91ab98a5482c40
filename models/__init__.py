"""The networks (engine.model.ZooModel, MODELS) and their pretrained entries, one file per family.

COMPONENTS: the sub-packages, each listing the modules of its own that register (engine/components.py).
"""
COMPONENTS = ("vision", "video", "nlp")
