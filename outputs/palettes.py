"""Colour palettes of the output writers and the data scripts (numpy only: importable anywhere)."""
import numpy as np


def voc_palette(n=256):
    """The Pascal VOC colour map: class c's RGB bits come from c's bits, interleaved (c=1: dark red)."""
    palette = np.zeros((n, 3), np.uint8)
    for c in range(n):
        v, r, g, b = c, 0, 0, 0
        for shift in range(7, -1, -1):
            r |= (v & 1) << shift
            g |= ((v >> 1) & 1) << shift
            b |= ((v >> 2) & 1) << shift
            v >>= 3
        palette[c] = (r, g, b)
    return palette
