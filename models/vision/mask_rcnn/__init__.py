"""Mask R-CNN (FPN): the model and its entries in model.py, its parts beside it."""
COMPONENTS = ("model",)
