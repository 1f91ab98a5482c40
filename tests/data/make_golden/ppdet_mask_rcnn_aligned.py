"""Make tests/data/ppdet_mask_rcnn_r50_fpn_aligned.npz (+ .json): PaddleDetection's own Mask R-CNN
R50-FPN with RoIAlign aligned=True, on the golden weights and the inputs stored in the aligned=False
golden (tests/data/ppdet_mask_rcnn_r50_fpn.npz).

NOT run by the tests (they read only the files it writes). It needs a PaddleDetection checkout at
commit 666f597fd0 (the commit of the aligned=False golden) on PYTHONPATH, with its dependencies:

    PYTHONPATH=<ppdet checkout>:<its deps> python tests/data/make_golden/ppdet_mask_rcnn_aligned.py \
        --expect-aligned true --out tests/data/ppdet_mask_rcnn_r50_fpn_aligned.npz

Why a patched checkout: at that commit ppdet/modeling/heads/roi_extractor.py's RoIAlign.__init__
ignores its `aligned` argument (`self.aligned = False`, an NPU workaround from commit abeaad7), while
the config (configs/mask_rcnn/_base_/mask_rcnn_r50_fpn.yml) and the released weights use True. The
checkout for this file has that one line back to `self.aligned = aligned`. Both checkouts also carry
the aligned=False golden's post-processing patch (ppdet/modeling/post_process.py, `bbox_num[i:i + 1]`
-> `bbox_num[i]` in the two `paddle.expand` shapes), which only the informational final detections
need.

Check of the pipeline: first run it on a checkout WITHOUT the aligned patch,
    --expect-aligned false --full --compare tests/data/ppdet_mask_rcnn_r50_fpn.npz --check-out check.json
every array of the existing golden must come out equal (max differences printed and written); then
pass `--record-check "NOTE=check.json"` to the aligned run so the sidecar records that check (and
likewise a --compare of a fresh OMP_NUM_THREADS=1 rerun against the written file).
"""
import argparse
import hashlib
import json
import os
import platform
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.dirname(HERE)
sys.path.insert(0, DATA)
from golden_weights import golden_state_dict  # noqa: E402

CONFIG = "configs/mask_rcnn/mask_rcnn_r50_fpn_1x_coco.yml"
TABLE = os.path.join(DATA, "keys_ppdet_mask_rcnn_r50_fpn_1x_coco.json")
BASE_GOLDEN = os.path.join(DATA, "ppdet_mask_rcnn_r50_fpn.npz")
INPUT_KEYS = ["image", "im_shape", "scale_factor", "box.rois", "box.rois_num", "box.levels",
              "mask.rois", "mask.classes", "mask.rois6"]


def stats(x):
    x = np.asarray(x, "float64")
    return np.array([x.mean(), x.std(), np.sqrt((x ** 2).sum()), x.min(), x.max(), np.abs(x).mean()])


def numpy_roi_align(feat, roi, scale, out, aligned):
    """An independent float64 RoIAlign of one RoI on one level [C, H, W] with adaptive sampling
    (sampling_ratio 0), written from the kernel's definition: `aligned` shifts the scaled corners by
    -0.5 px and lets the RoI be smaller than 1 px; samples outside [-1, H] x [-1, W] count 0."""
    C, H, W = feat.shape
    off = 0.5 if aligned else 0.0
    x1, y1, x2, y2 = [float(v) * scale - off for v in roi]
    rw, rh = x2 - x1, y2 - y1
    if not aligned:
        rw, rh = max(rw, 1.0), max(rh, 1.0)
    bw, bh = rw / out, rh / out
    gw, gh = int(np.ceil(rw / out)), int(np.ceil(rh / out))
    res = np.zeros((C, out, out))

    def sample(y, x):
        if y < -1.0 or y > H or x < -1.0 or x > W:
            return 0.0
        y, x = max(y, 0.0), max(x, 0.0)
        y0, x0 = int(y), int(x)
        y1_, x1_ = min(y0 + 1, H - 1), min(x0 + 1, W - 1)
        if y0 >= H - 1:
            y0 = y1_ = H - 1
            y = float(y0)
        if x0 >= W - 1:
            x0 = x1_ = W - 1
            x = float(x0)
        ly, lx = y - y0, x - x0
        return ((1 - ly) * (1 - lx) * feat[:, y0, x0] + (1 - ly) * lx * feat[:, y0, x1_]
                + ly * (1 - lx) * feat[:, y1_, x0] + ly * lx * feat[:, y1_, x1_])

    for i in range(out):
        for j in range(out):
            acc = 0.0
            for iy in range(gh):
                for ix in range(gw):
                    acc = acc + sample(y1 + i * bh + (iy + 0.5) * bh / gh, x1 + j * bw + (ix + 0.5) * bw / gw)
            res[:, i, j] = acc / max(gh * gw, 1)
    return res


def numpy_roi_feats(fpn, rois, levels, out, aligned):
    return np.stack([numpy_roi_align(fpn[lv - 2].numpy()[0].astype("float64"), r, 1.0 / 2 ** lv, out, aligned)
                     for r, lv in zip(rois, levels)])


def build(root):
    """The official architecture from its own config, in eval mode, every parameter set to the
    golden value (and read back to check)."""
    import paddle
    from ppdet.core.workspace import create, load_config
    cfg = load_config(os.path.join(root, CONFIG))
    model = create(cfg.architecture)
    model.eval()
    with open(TABLE) as f:
        table = json.load(f)
    state = golden_state_dict(table["params"])
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
    after = model.state_dict()
    unequal = [k for k, v in state.items() if not np.array_equal(after[k].numpy(), v)]
    assert not missing and not unexpected and not unequal, (missing, unexpected, unequal)
    return model, {"filled": len(state), "missing_keys": missing, "unexpected_keys": unexpected}


def roi_aligned_flags(model):
    return [bool(model.bbox_head.roi_extractor.aligned), bool(model.mask_head.roi_extractor.aligned)]


def run(model, ref, full):
    """The arrays of the golden file, by the submodule calls its sidecar names (`full`: also the
    backbone, FPN and RPN arrays, which RoIAlign does not touch)."""
    import paddle
    import paddle.nn.functional as F
    out = {k: ref[k] for k in INPUT_KEYS}
    image = paddle.to_tensor(ref["image"])
    inputs = {"image": image, "im_shape": paddle.to_tensor(ref["im_shape"]),
              "scale_factor": paddle.to_tensor(ref["scale_factor"])}
    with paddle.no_grad():
        body = model.backbone({"image": image})
        fpn = model.neck(body)
        if full:
            for i, f in enumerate(body):
                out[f"backbone.res{i + 2}.slice"] = f.numpy()[:, :8, :8, :8]
                out[f"backbone.res{i + 2}.stats"] = stats(f.numpy())
            for i, f in enumerate(fpn):
                out[f"fpn.P{i + 2}.slice"] = f.numpy()[:, :8, :8, :8]
                out[f"fpn.P{i + 2}.stats"] = stats(f.numpy())
            feats = model.rpn_head.rpn_feat(fpn)
            anchors = model.rpn_head.anchor_generator(feats)
            for i, feat in enumerate(feats):
                obj = model.rpn_head.rpn_rois_score(feat).numpy()
                dl = model.rpn_head.rpn_rois_delta(feat).numpy()
                out[f"rpn.P{i + 2}.objectness"] = obj
                out[f"rpn.P{i + 2}.objectness.stats"] = stats(obj)
                out[f"rpn.P{i + 2}.deltas.slice"] = dl[:, :, :8, :8]
                out[f"rpn.P{i + 2}.deltas.stats"] = stats(dl)
                out[f"rpn.P{i + 2}.anchors.first48"] = anchors[i].numpy()[:48]

        rois = paddle.to_tensor(ref["box.rois"])
        rois_num = paddle.to_tensor(ref["box.rois_num"])
        head = model.bbox_head
        roi_feat = head.roi_extractor(fpn, [rois], rois_num)
        fc7 = head.head(roi_feat)
        scores = head.bbox_score(fc7)
        deltas = head.bbox_delta(fc7)
        (fwd_deltas, fwd_probs), _ = head(fpn, [rois], rois_num, None)
        checks = {"bbox_head_forward_deltas_vs_manual": float(np.abs(fwd_deltas.numpy() - deltas.numpy()).max()),
                  "bbox_head_forward_probs_vs_softmax(manual scores)":
                      float(np.abs(fwd_probs.numpy() - F.softmax(scores, -1).numpy()).max())}
        # the same extractor with the other setting, full tensors: how much `aligned` moves them
        for name, ext, args_ in (("box", head.roi_extractor, (fpn, [rois], rois_num)),
                                 ("mask", model.mask_head.roi_extractor,
                                  (fpn, [paddle.to_tensor(ref["mask.rois"])],
                                   paddle.to_tensor(np.array([4], "int32"))))):
            ext.aligned = not ext.aligned
            other = ext(*args_).numpy()
            ext.aligned = not ext.aligned
            this = (roi_feat if name == "box" else None)
            this = ext(*args_).numpy() if this is None else this.numpy()
            checks[f"{name}.roi_feat full tensor: max |this run - other aligned setting|"] = float(
                np.abs(this - other).max())
        levels = ref["box.levels"]
        for flag in (True, False):
            checks[f"box_roi_feat_vs_numpy_roialign(aligned={flag})"] = float(np.abs(
                roi_feat.numpy() - numpy_roi_feats(fpn, ref["box.rois"], levels, 7, flag)).max())
        out["box.roi_feat.slice"] = roi_feat.numpy()[:, :8]
        out["box.roi_feat.stats"] = stats(roi_feat.numpy())
        out["box.fc7"] = fc7.numpy()
        out["box.scores"] = scores.numpy()
        out["box.probs"] = fwd_probs.numpy()
        out["box.deltas"] = deltas.numpy()

        mh = model.mask_head
        rois6 = paddle.to_tensor(ref["mask.rois6"])
        mrois_num = paddle.to_tensor(np.array([rois6.shape[0]], "int32"))
        mask_feat = mh.roi_extractor(fpn, [rois6[:, 2:]], mrois_num)
        logits = mh.mask_fcn_logits(mh.head(mask_feat)).numpy()
        cls = ref["mask.classes"].astype("int64")
        selected = logits[np.arange(len(cls)), cls]
        probs = mh(fpn, rois6, mrois_num, {"scale_factor": inputs["scale_factor"]}).numpy()
        checks["mask_head_forward_probs_vs_sigmoid(manual logits[i, class_i])"] = float(
            np.abs(probs - 1 / (1 + np.exp(-selected.astype("float64")))).max())
        mask_levels = levels[[0, 2, 4, 5]]      # mask.rois = box.rois[[0, 2, 4, 5]]
        assert np.array_equal(ref["mask.rois"], ref["box.rois"][[0, 2, 4, 5]])
        for flag in (True, False):
            checks[f"mask_roi_feat_vs_numpy_roialign(aligned={flag})"] = float(np.abs(
                mask_feat.numpy() - numpy_roi_feats(fpn, ref["mask.rois"], mask_levels, 14, flag)).max())
        out["mask.roi_feat.slice"] = mask_feat.numpy()[:, :4]
        out["mask.roi_feat.stats"] = stats(mask_feat.numpy())
        out["mask.logits_selected"] = selected
        out["mask.logits_all.first8cls"] = logits[:, :8]
        out["mask.logits_all.stats"] = stats(logits)
        out["mask.probs"] = probs

        # informational only: NMS / top-k dependent
        rpn_rois, rpn_num, _ = model.rpn_head(fpn, inputs)
        out["info.rpn_rois_top16"] = rpn_rois[0].numpy()[:16]
        out["info.rpn_rois_num"] = rpn_num.numpy().astype("int64")
        model.inputs = inputs
        pred = model.get_pred()
        out["info.final_bbox"] = pred["bbox"].numpy()
        out["info.final_bbox_num"] = pred["bbox_num"].numpy()
        out["info.final_mask.stats"] = stats(pred["mask"].numpy())
    return out, checks


def max_diffs(out, ref):
    return {k: float(np.abs(np.asarray(out[k], "float64") - np.asarray(ref[k], "float64")).max())
            if out[k].shape == ref[k].shape else "shape differs" for k in ref.files if k in out}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--expect-aligned", choices=["true", "false"], required=True,
                    help="what the checkout's RoIAlign must run (refuses to write a mislabeled file)")
    ap.add_argument("--out", help="npz to write (its .json sidecar beside it)")
    ap.add_argument("--compare", help="an npz to compare every common array with (max abs diffs printed)")
    ap.add_argument("--full", action="store_true", help="also the backbone / FPN / RPN arrays")
    ap.add_argument("--check-out", help="write the --compare result to this JSON file")
    ap.add_argument("--record-check", action="append", default=[],
                    help="NOTE=FILE (split at the last =): a --check-out JSON to record in the sidecar under NOTE (repeatable)")
    args = ap.parse_args()

    import paddle
    import ppdet
    paddle.set_device("cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(ppdet.__file__)))
    model, load = build(root)
    flags = roi_aligned_flags(model)
    assert flags == [args.expect_aligned == "true"] * 2, f"RoIAlign runs aligned={flags}"
    ref = np.load(BASE_GOLDEN)
    out, checks = run(model, ref, args.full)
    again, _ = run(model, ref, args.full)
    checks["max_abs_diff_two_runs_same_process"] = max(float(np.abs(out[k] - again[k]).max()) for k in out)
    base_diff = max_diffs(out, ref)
    derived = [k for k in base_diff if k not in INPUT_KEYS]
    if args.compare:
        other = np.load(args.compare)
        diffs = max_diffs(out, other)
        not_made = sorted(set(other.files) - set(out))
        result = {"checkout": root, "aligned": flags, "compared_with": os.path.basename(args.compare),
                  "max_abs_diff": diffs, "largest": max(v for v in diffs.values() if isinstance(v, float)),
                  "not_produced": not_made, "checks": checks}
        print(json.dumps(result, indent=1))
        if args.check_out:
            with open(args.check_out, "w") as f:
                json.dump(result, f, indent=1)
    if not args.out:
        return
    # backbone / FPN / RPN arrays are checked above (against the aligned=False golden), not stored again
    out = {k: v for k, v in out.items() if not k.startswith(("backbone.", "fpn.", "rpn."))}
    np.savez(args.out, **out)
    with open(args.out, "rb") as f:
        blob = f.read()
    recorded = {}
    for item in args.record_check:
        note, path = item.rsplit("=", 1)
        with open(path) as f:
            recorded[note] = json.load(f)
    sidecar = {
        "model": "PaddleDetection Mask R-CNN, ResNet-50 (variant b, frozen BN) + FPN (P2-P6), 80 classes, "
                 "RoIAlign aligned=True (box and mask RoI extractors)",
        "source": "PaddlePaddle/PaddleDetection@666f597fd00d3157e84dd9fb2dd3f40bf9918ebc",
        "changed": {
            "ppdet/modeling/heads/roi_extractor.py (RoIAlign.__init__)":
                "`self.aligned = False # TODO: npu kernel do not support aligned=True` -> `self.aligned = aligned` "
                "(undoes commit abeaad7's NPU workaround; the config's `aligned: True` then takes effect for "
                "both BBoxHead and MaskHead RoIAlign)",
            "ppdet/modeling/post_process.py (as for ppdet_mask_rcnn_r50_fpn.npz)":
                "`bbox_num[i:i + 1]` -> `bbox_num[i]` in the two paddle.expand shapes of BBoxPostProcess.get_pred; "
                "affects only info.final_*",
        },
        "generator": "tests/data/make_golden/ppdet_mask_rcnn_aligned.py --expect-aligned true "
                     "--out tests/data/ppdet_mask_rcnn_r50_fpn_aligned.npz",
        "class": "ppdet/modeling/architectures/mask_rcnn.py:MaskRCNN via ppdet.core.workspace.create(cfg.architecture)",
        "config_file": CONFIG,
        "build": "cfg = load_config(yml); model = create(cfg.architecture); model.eval()",
        "roi_extractor_aligned_after_build": {"bbox_head": flags[0], "mask_head": flags[1]},
        "table": "keys_ppdet_mask_rcnn_r50_fpn_1x_coco.json",
        "weights": f"golden_state_dict(table['params']) via model.set_state_dict(); all {load['filled']} entries "
                   "verified equal afterwards",
        "missing_keys": load["missing_keys"], "unexpected_keys": load["unexpected_keys"],
        "eval_mode": "model.eval(); paddle.no_grad(); CPU; float32",
        "inputs": "image, im_shape, scale_factor, box.rois (+ rois_num, levels), mask.rois / mask.classes / "
                  "mask.rois6: copied from ppdet_mask_rcnn_r50_fpn.npz (its sidecar says how they were drawn); "
                  "equal to it by construction",
        "call_semantics": {
            "features": "body = model.backbone({'image': image}); fpn = model.neck(body) -> P2..P6",
            "box": "roi_feat = model.bbox_head.roi_extractor(fpn, [rois], rois_num) [8,256,7,7]; "
                   "fc7 = model.bbox_head.head(roi_feat) [8,1024]; scores = model.bbox_head.bbox_score(fc7) [8,81] "
                   "logits (background last); deltas = model.bbox_head.bbox_delta(fc7) [8,320]; "
                   "(deltas, probs), _ = model.bbox_head(fpn, [rois], rois_num, None) gives box.probs",
            "mask": "roi_feat = model.mask_head.roi_extractor(fpn, [rois6[:, 2:]], [4]) [4,256,14,14]; "
                    "logits = model.mask_head.mask_fcn_logits(model.mask_head.head(roi_feat)) [4,80,28,28]; "
                    "probs = model.mask_head(fpn, rois6, [4], {'scale_factor': sf}) (eval) [4,28,28]",
            "roi_align": "paddle.vision.ops.roi_align(..., sampling_ratio=0, aligned=True) per level P2..P5 "
                         "(spatial scales 1/4..1/32), levels by distribute_fpn_proposals (refer level 4, scale 224) "
                         "exactly as in the aligned=False golden: aligned=True subtracts 0.5 from the scaled RoI "
                         "corners and does not clamp the RoI size to >= 1",
            "info": "model.rpn_head(fpn, inputs) proposals; model.get_pred() final detections (inputs as above)",
        },
        "outputs": {
            "box.roi_feat.slice / .stats": "[:, :8] of [8,256,7,7] + stats of the full tensor",
            "box.fc7, box.scores, box.probs, box.deltas": "full [8,1024], [8,81], [8,81], [8,320]",
            "mask.roi_feat.slice / .stats": "[:, :4] of [4,256,14,14] + stats",
            "mask.logits_selected": "full [4,28,28] = logits[i, class_i] (pre-sigmoid)",
            "mask.logits_all.first8cls / .stats": "[4,8,28,28] = logits[:, :8]; stats over [4,80,28,28]",
            "mask.probs": "full [4,28,28]: the official mask_head eval output",
            "info.*": "INFORMATIONAL ONLY (NMS / top-k dependent): final detections, final mask stats, "
                      "the first 16 RPN proposals and their count",
            "not stored": "backbone.*, fpn.*, rpn.*: RoIAlign does not reach them; this run's values are "
                          "bit-identical to ppdet_mask_rcnn_r50_fpn.npz (see checks), use that file",
        },
        "checks": dict(checks, **{
            "backbone_fpn_rpn_vs_aligned_false_golden (max abs diff, all those arrays)":
                max(base_diff[k] for k in derived if k.startswith(("backbone.", "fpn.", "rpn."))) if args.full
                else "not run (--full off)",
            "aligned_true_minus_aligned_false_golden (max abs diff per array)":
                {k: base_diff[k] for k in derived if k.startswith(("box.", "mask.")) and not k.endswith(".stats")},
        }),
        "recorded_checks": recorded,
        "environment": {"python": platform.python_version(), "numpy": np.__version__, "paddle": paddle.__version__,
                        "machine": platform.machine(), "cpu_count": os.cpu_count()},
        "npz": os.path.basename(args.out),
        "npz_sha256": hashlib.sha256(blob).hexdigest(),
        "npz_bytes": len(blob),
        "npz_keys": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in out.items()},
        "stats_legend": "<name>.stats = float64 [mean, std, l2_norm, min, max, mean_abs] of the FULL float32 "
                        "tensor (std is population std, ddof=0)",
        "tolerance_recommendation": {
            "float_arrays": "as ppdet_mask_rcnn_r50_fpn.json and the golden README: abs(ours - ref) <= "
                            "1e-4 * max(1, max|ref|) + 1e-4 * |ref| per array; stats rtol 1e-4, mean within 1e-4*std",
            "integers": "box.levels, mask.classes, rois_num: exact",
            "info.*": "do NOT use for equivalence",
        },
    }
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(sidecar, f, indent=1)
        f.write("\n")
    print("wrote", args.out, sidecar["npz_sha256"])


if __name__ == "__main__":
    main()
