"""Serve an export over HTTP: python tools/serve.py --model EXPORT_DIR [--port 8000] [...]

The Open Inference Protocol (KServe v2 REST: /v2/health/live, /v2/health/ready, /v2/models/NAME,
POST /v2/models/NAME/infer with JSON tensors), a task endpoint (POST /v2/models/NAME/task: a file
upload or text, answered as tools/infer.py answers it), /metrics for Prometheus and a page at /.
Requests arriving within --max-delay-ms of each other run as one model call of up to --max-batch
samples; at most --queue wait, the next ones get 503. SIGTERM or Ctrl-C: no new connections, every
accepted request answered, then exit 0. Needs the packages of requirements-serve.txt.
docs/deployment.md, "Serving", has the endpoints with a curl example each.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import os
import signal
import socket
import sys

from engine import cli
from engine.errors import ConfigError


def _parser():
    p = cli.parser(__doc__, config_required=False)
    p.add_argument("--model", required=True, help="an export directory of tools/export.py (or tools/quantize.py)")
    p.add_argument("--name", default=None, help="the model's name in the URLs (default: the export's model, lower-case)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one, said in the 'serving' line)")
    p.add_argument("--max-batch", type=int, default=8, help="most samples in one model call (1: no batching)")
    p.add_argument("--max-delay-ms", type=float, default=5.0,
                   help="how long the first request of a batch waits for others to join it")
    p.add_argument("--queue", type=int, default=64, help="requests that may wait for the model; more get 503")
    p.add_argument("--max-request-mb", type=float, default=32.0, help="largest request body (413 above)")
    p.add_argument("--max-video-s", type=float, default=60.0,
                   help="longest video upload, by its container's frame count and rate (413 above)")
    p.add_argument("--max-image-mp", type=float, default=40.0,
                   help="largest image upload in megapixels, by its header (413 above): a small file can "
                        "decode to gigabytes")
    p.add_argument("--decode-timeout-s", type=float, default=10.0,
                   help="longest a video upload's metadata may take to read (408 above)")
    cli.backend_args(p)
    return p


def _version():
    """The zoo's version: the newest released heading of CHANGELOG.md, "0" before any release."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "CHANGELOG.md")
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("## [") and not line.startswith("## [Unreleased]"):
                    return line[4:].split("]")[0]
    except OSError:
        pass
    return "0"


def main():
    args = _parser().parse_args()
    if args.max_batch < 1 or args.queue < 1 or args.max_delay_ms < 0 or args.max_request_mb <= 0:
        raise ConfigError("--max-batch and --queue take 1 or more, --max-delay-ms 0 or more, --max-request-mb "
                          "more than 0")
    try:   # the optional stack: one line naming what to install
        import starlette  # noqa: F401
        import multipart  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise ConfigError(f"tools/serve.py needs {e.name}: pip install -r requirements-serve.txt") from None

    from deploy.record import read_infer_cfg   # after parsing: --help stays fast
    from serving.app import Limits, create_app
    from serving.worker import ModelProcess
    read_infer_cfg(args.model)   # not an export: one line before a model process starts
    # the model (paddle) runs in its own process (serving/worker.py says why); this one serves HTTP
    model = ModelProcess(args.model, backend=args.backend, precision=args.precision, ov_hint=args.ov_hint,
                         mkldnn=not args.no_mkldnn, tensorrt=args.trt, overrides=args.override,
                         batch_size=args.max_batch, trust_weights=args.trust_weights)
    name = args.name or str(model.record["model"]).lower()
    app = create_app(model, name, args.max_batch, args.max_delay_ms, args.queue,
                     Limits(args.max_request_mb, args.max_video_s, args.decode_timeout_s, args.max_image_mp), _version())

    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        model.close()
        raise ConfigError(f"--host {args.host} --port {args.port}: cannot bind ({e.strerror})") from None
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if not self.should_exit:
                print(f"serving {name} on {url}", flush=True)

    server = Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                   timeout_graceful_shutdown=None))
    # uvicorn re-raises the signal that stopped it once it has shut down; with these handlers in place
    # that re-raise is a no-op, so a graceful stop exits 0 rather than dying of the signal
    stopped = []
    previous = {sig: signal.signal(sig, lambda s, f: stopped.append(s)) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        sys.exit(1)
    print(f"stopped {name}" + (f" ({signal.Signals(stopped[0]).name})" if stopped else ""), flush=True)


if __name__ == "__main__":
    cli.run(main)
