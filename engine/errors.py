"""The error types every layer raises and the tools turn into one `error: ...` line (engine.cli.run).

ConfigError: a bad config, file or value, found before or during a run; SampleError: one sample
cannot be read (the loaders skip it and count it). A failure of one module's own kind subclasses them
beside the code that raises it (engine.training.trainer.NonFiniteLoss, engine.launch.LaunchError,
engine.weights.download.DownloadError, a reader's damaged record, ...).
"""
import difflib


class ConfigError(Exception):
    """A bad config, file or value; tools print it as one line and exit non-zero."""


class SampleError(Exception):
    """One sample cannot be read; the message names the file (and offset where it helps)."""


def did_you_mean(name, choices):
    """The hint " (did you mean 'x'?)" for the closest of `choices` to `name`, or an empty string.

    A choice that differs only in case comes first: difflib scores 'Red' as close to 'bed' as to 'red'."""
    choices = [str(c) for c in choices]
    same = [c for c in choices if c.casefold() == str(name).casefold()]
    close = same or difflib.get_close_matches(str(name), choices, n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def require_packages(what, modules, requirements):
    """Each of `modules` importable, or one line naming those that are not and the requirements file
    that installs them (the optional backends: ONNX, OpenVINO)."""
    missing = []
    for module in modules:
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ConfigError(f"{what} needs {', '.join(missing)}: pip install -r {requirements}")
