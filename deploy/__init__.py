"""Deployment: exporting Paddle Inference programs (export) and running them (predictor)."""
