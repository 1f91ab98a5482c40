"""The Python API for use outside the tools: small functions over models/, engine/ and readers/,
which may import them (nothing below imports api/)."""
