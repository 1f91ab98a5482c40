"""An export folder as a run: the Session of the recipe it records (eval and infer on an export need
no -c) and what eval and infer run, its programs on its backend or the recipe's model.

Here rather than in engine/session.py: training builds the same Session, and the engine would then
load Paddle Inference, ONNX Runtime's and OpenVINO's wrappers for a run that uses none of them."""
import os

from deploy.predictor import Predictor
from deploy.record import BACKEND_OF, INFER_CFG, read_infer_cfg
from engine import config
from engine.components import load_all
from engine.errors import ConfigError
from engine.session import Session


def is_export(path):
    """Whether `path` is a directory written by tools/export.py (or tools/quantize.py)."""
    return bool(path) and os.path.isfile(os.path.join(path, INFER_CFG))


class ExportSession(Session):
    """A Session on the recipe an export recorded: the class names come from the record where the
    recipe has no `labels:` file here, and a metric the record lacks is the export's age, said so."""

    def __init__(self, cfg, trust_weights=False, path="<config>", label_names=None):
        super().__init__(cfg, trust_weights, path)
        self._recorded_names = label_names

    def metric(self, dataset=None):
        if not self.cfg.get("metric"):
            raise ConfigError(f"{self.path} records no metric (an export older than evaluation of exports): "
                              f"give the recipe with -c")
        return super().metric(dataset)

    def label_names(self, required=False):
        if not self.cfg.get("labels") and self._recorded_names:
            return list(self._recorded_names)
        return super().label_names(required)


def from_export(export_dir, overrides=(), trust_weights=False):
    """The ExportSession of the recipe an export recorded (model, readers of val/test, infer writer,
    runtime, class names)."""
    load_all()
    record = read_infer_cfg(export_dir)
    where = os.path.join(export_dir, INFER_CFG)
    if not record.get("config"):
        raise ConfigError(f"{where} records no config (an older export): give the recipe with -c")
    return ExportSession(config.from_data(record["config"], where, list(overrides)), trust_weights, where,
                         label_names=record.get("label_names"))


def from_args(args):
    """The Session of the flags of engine.cli.parser (-c, -o, --trust-weights); without -c, the recipe
    that an export directory given as --weights records (eval, infer)."""
    if args.config:
        return Session.from_file(args.config, args.override, args.trust_weights)
    weights = getattr(args, "weights", None)
    if weights and is_export(weights):
        return from_export(weights, args.override, args.trust_weights)
    raise ConfigError(f"-c CONFIG is needed: --weights {weights} is not an export directory (with "
                      f"{INFER_CFG}), which records its recipe" if weights else "-c CONFIG is needed")


def runnable(session, weights, weights_format=None, backend=None, mkldnn=True, tensorrt=None, args=None):
    """What eval and infer run: an export directory's programs (deploy.predictor.Predictor) on
    `backend`, by default the one its infer_cfg.yml records (said in one line); else the session's
    model with `weights` loaded (backend None or "dynamic"). `tensorrt`: Predictor's (None: on a GPU
    where the export records it). `args`: the flags of engine.cli.backend_args, which set all of these.
    `session` is set up (its runtime gives the Predictor's threads and device)."""
    options = {}
    if args is not None:
        backend, mkldnn, tensorrt = args.backend, not args.no_mkldnn, args.trt
        options = {"precision": args.precision, "ov_hint": args.ov_hint}
    if is_export(weights) and backend in (None, "dynamic"):
        if backend == "dynamic":
            raise ConfigError(f"--weights {weights} is an export of tools/export.py, which --backend dynamic "
                              f"cannot run; leave --backend out (its {INFER_CFG} says which backend runs it)")
        record = read_infer_cfg(weights)
        backend = BACKEND_OF[record.get("format", "paddle")]
        fmt = record.get("format", "paddle")
        print(f"note: {weights} is {'an' if fmt[0] in 'aeiou' else 'a'} {fmt} export of {record.get('model')}: "
              f"running it with --backend {backend}", flush=True)
    if backend in (None, "dynamic"):
        if options.get("precision"):
            raise ConfigError("--precision sets how an export runs; for weights use -o eval.amp=...")
        return session.model(weights, weights_format)
    return Predictor(weights, mkldnn=mkldnn, threads=session.rt["threads"], device=session.rt["device"],
                     model_name=session.cfg["model"]["name"], backend=backend, tensorrt=tensorrt, **options)
