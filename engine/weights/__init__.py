"""Weights: pretrained entries and layouts (pretrained), reading weight files as data (weightfile), downloads and the cache (download)."""
