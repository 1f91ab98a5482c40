"""Deployment, a floor above the engine: the export format (record), writing it (export, onnx,
tensorrt), running it (predictor on Paddle Inference, ONNX Runtime or OpenVINO), INT8 (quantize) and an
export folder as a run (load). Nothing under engine/ imports it, so training loads no inference backend."""
