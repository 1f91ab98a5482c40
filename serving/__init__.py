"""The inference server behind tools/serve.py: deployment, not training, so it sits above engine/ and
api/ and nothing below imports it. app.py speaks HTTP (the Open Inference Protocol and the task
endpoint), batching.py owns the one thread that runs the model, page/ is the page served at `/`."""
