"""Writes tests/data/ppdet_mask_rcnn_r50_fpn_train.npz + .json: PaddleDetection's Mask R-CNN in TRAIN mode.

Needs a PaddleDetection checkout (commit 666f597fd0) and its dependencies on PYTHONPATH; the tests never
run this file (they only read what it wrote):

    PYTHONPATH=/path/to/PaddleDetection:/path/to/deps:/path/to/deps/stubs python ppdet_mask_rcnn_train.py

What it does: builds configs/mask_rcnn/mask_rcnn_r50_fpn_1x_coco.yml, fills it with golden_state_dict(),
sets both RoIAlign extractors to aligned=True (the config's value; RoIAlign.__init__ at this commit
overwrites it with False, an NPU workaround; the released weights were trained when the flag was
honoured), puts the model in train mode and runs model(inputs) once on a batch of three images with
ground truth (one with several objects and a crowd region, one with a single object, one with only a
crowd region). No file of the
checkout is changed; at run time it wraps functions to record what they return:
  - paddle.randperm (the only random draw of the training targets, in subsample_labels) is replaced
    by a numpy permutation from default_rng(PERM_SEED); every draw is stored, in call order, so that
    our sampler can replay them;
  - proposal_generator.target.label_box (matching before sampling), rpn_anchor_target,
    generate_proposal_target, generate_mask_target (through target_layer's references) and the
    BBoxAssigner's input (the training proposals) are recorded.
"""
import hashlib
import json
import os
import platform
import subprocess
import sys

import numpy as np
import paddle

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.dirname(HERE)
sys.path.insert(0, DATA)
from golden_weights import golden_state_dict  # noqa: E402

import ppdet  # noqa: E402
from ppdet.core.workspace import create, load_config  # noqa: E402
from ppdet.modeling.proposal_generator import target as T  # noqa: E402
from ppdet.modeling.proposal_generator import target_layer as TL  # noqa: E402

PPDET = os.path.dirname(os.path.dirname(os.path.abspath(ppdet.__file__)))
CONFIG = "configs/mask_rcnn/mask_rcnn_r50_fpn_1x_coco.yml"
TABLE = os.path.join(DATA, "keys_ppdet_mask_rcnn_r50_fpn_1x_coco.json")
OUT = os.path.join(DATA, "ppdet_mask_rcnn_r50_fpn_train")
IMAGE_SEED, PERM_SEED = 7001, 7002
SMALL_TOP_N = (1000, 100)     # (pre, post) of the extra proposal run

# ground truth in input pixels: polygons (per instance, a list of parts [x0, y0, x1, y1, ...]);
# boxes are the polygons' bounds, except the crowd region (a box; ppdet's COCODataSet gives a crowd
# instance the dummy polygon [0] * 8, which is never rasterised: crowd boxes are never matched)
IM_SHAPE = [[256.0, 256.0], [224.0, 256.0], [192.0, 256.0]]
OBJECTS = [
    [  # image 0: three objects (one of two parts) and a crowd region overlapping two of them
        {"class": 0, "crowd": 0, "polygons": [[30.5, 40.0, 110.0, 35.25, 120.0, 130.0, 25.0, 120.5]]},
        {"class": 17, "crowd": 0, "polygons": [[140.0, 20.0, 230.5, 30.0, 220.0, 100.0, 150.0, 90.0],
                                                [160.0, 110.0, 200.0, 110.0, 190.25, 141.0]]},
        {"class": 56, "crowd": 0, "polygons": [[60.0, 160.0, 90.0, 150.5, 100.0, 190.0, 70.0, 200.0]]},
        {"class": 0, "crowd": 1, "box": [100.0, 110.0, 250.0, 250.0]},
    ],
    [  # image 1 (224 x 256 inside the 256 x 256 padding): one object
        {"class": 79, "crowd": 0, "polygons": [[50.0, 60.0, 180.0, 50.0, 200.5, 170.0, 60.0, 190.0]]},
    ],
    [  # image 2 (192 x 256): only a crowd region, so no foreground anchor or RoI (the mask loss's
        # fake RoI of weight 0)
        {"class": 5, "crowd": 1, "box": [20.0, 30.0, 140.0, 150.0]},
    ],
]
N = len(OBJECTS)


def gt_arrays(objs):
    boxes, polys = [], []
    for o in objs:
        if o["crowd"]:
            boxes.append(o["box"])
            polys.append([[0.0] * 8])
        else:
            xy = np.concatenate([np.asarray(p, np.float64).reshape(-1, 2) for p in o["polygons"]])
            boxes.append([xy[:, 0].min(), xy[:, 1].min(), xy[:, 0].max(), xy[:, 1].max()])
            polys.append([list(map(float, p)) for p in o["polygons"]])
    return (np.asarray(boxes, np.float32), np.array([[o["class"]] for o in objs], np.int32),
            np.array([[o["crowd"]] for o in objs], np.int32), polys)


def main():
    paddle.set_device("cpu")
    cwd = os.getcwd()
    os.chdir(PPDET)
    cfg = load_config(CONFIG)
    model = create(cfg.architecture)
    os.chdir(cwd)
    with open(TABLE) as f:
        table = json.load(f)
    golden = golden_state_dict(table["params"])
    missing, unexpected = model.set_state_dict(golden)
    state = model.state_dict()
    assert all(np.array_equal(state[k].numpy(), v) for k, v in golden.items())
    for head in (model.bbox_head, model.mask_head):
        head.roi_extractor.aligned = True          # undo RoIAlign.__init__'s `self.aligned = False`
    model.train()

    rng = np.random.default_rng(IMAGE_SEED)
    image = rng.standard_normal((N, 3, 256, 256)).astype(np.float32)
    gts = [gt_arrays(objs) for objs in OBJECTS]
    inputs = {
        "image": paddle.to_tensor(image),
        "im_shape": paddle.to_tensor(np.array(IM_SHAPE, np.float32)),
        "scale_factor": paddle.to_tensor(np.ones((N, 2), np.float32)),
        "gt_bbox": [paddle.to_tensor(g[0]) for g in gts],
        "gt_class": [paddle.to_tensor(g[1]) for g in gts],
        # float32: label_box's `is_crowd * ones` raises on int32 x float32 in paddle 3 (type promotion);
        # with the recipe's COCODataSet(load_crowd=False) that branch never runs (no crowd box is loaded)
        "is_crowd": [paddle.to_tensor(g[2].astype(np.float32)) for g in gts],
        "gt_poly": [g[3] for g in gts],
    }

    rec = {"draws": [], "label_box": [], "rpn": None, "proposals": None, "roi": None, "mask": None}
    perm_rng = np.random.default_rng(PERM_SEED)

    def randperm(n, dtype="int64", name=None):
        n = int(n)
        p = perm_rng.permutation(n)
        rec["draws"].append(p.astype(np.int64))
        return paddle.to_tensor(p.astype(dtype if isinstance(dtype, str) else "int64"))

    label_box = T.label_box

    def label_box_rec(*args, **kwargs):
        m, lab = label_box(*args, **kwargs)
        rec["label_box"].append((m.numpy().astype(np.int64), lab.numpy().astype(np.int8)))
        return m, lab

    rpn_anchor_target = TL.rpn_anchor_target

    def rpn_rec(*args, **kwargs):
        out = rpn_anchor_target(*args, **kwargs)
        rec["rpn"] = [[t.numpy() for t in part] for part in out]
        return out

    gpt = TL.generate_proposal_target

    def gpt_rec(rpn_rois, *args, **kwargs):
        rec["proposals"] = [r.numpy() for r in rpn_rois]
        out = gpt(rpn_rois, *args, **kwargs)
        rec["roi"] = [[t.numpy() for t in part] for part in out[:4]]
        return out

    gmt = TL.generate_mask_target

    def gmt_rec(*args, **kwargs):
        out = gmt(*args, **kwargs)
        rec["mask"] = [o.numpy() if hasattr(o, "numpy") else [t.numpy() for t in o] for o in out]
        return out

    class RecordingProposals:
        """The train ProposalGenerator, recording each (image, level) call's probabilities."""

        def __init__(self, gen):
            self.gen, self.calls = gen, []

        def __getattr__(self, name):
            return getattr(self.gen, name)

        def __call__(self, *args, **kwargs):
            out = self.gen(*args, **kwargs)
            self.calls.append(out[1].numpy().reshape(-1))
            return out

    head = model.rpn_head
    proposals = RecordingProposals(head.train_proposal)
    head.train_proposal = proposals
    gen_proposal = head._gen_proposal

    def gen_proposal_rec(scores, deltas, anchors, inputs_):
        out = gen_proposal(scores, deltas, anchors, inputs_)
        rec["level_probs"] = list(proposals.calls)
        # the same heads with smaller top-k settings, so that the per-image collection over the levels
        # (more candidates than post_nms_top_n) is exercised too
        gen = proposals.gen
        keep = gen.pre_nms_top_n, gen.post_nms_top_n
        gen.pre_nms_top_n, gen.post_nms_top_n = SMALL_TOP_N
        small_rois, _ = gen_proposal(scores, deltas, anchors, inputs_)
        rec["small"] = [r.numpy() for r in small_rois]
        rec["small_level_probs"] = list(proposals.calls[len(rec["level_probs"]):])
        gen.pre_nms_top_n, gen.post_nms_top_n = keep
        return out

    head._gen_proposal = gen_proposal_rec

    saved = (paddle.randperm, T.label_box, TL.rpn_anchor_target, TL.generate_proposal_target,
             TL.generate_mask_target)
    paddle.randperm, T.label_box = randperm, label_box_rec
    TL.rpn_anchor_target, TL.generate_proposal_target, TL.generate_mask_target = rpn_rec, gpt_rec, gmt_rec
    try:
        losses = model(inputs)
    finally:
        (paddle.randperm, T.label_box, TL.rpn_anchor_target, TL.generate_proposal_target,
         TL.generate_mask_target) = saved
    losses = {k: float(v.numpy().reshape(-1)[0]) for k, v in losses.items()}
    print(losses)

    arrays = {"image": image, "im_shape": np.array(IM_SHAPE, np.float32)}
    for i, (b, c, z, _) in enumerate(gts):
        arrays[f"gt.{i}.boxes"], arrays[f"gt.{i}.classes"], arrays[f"gt.{i}.crowd"] = b, c.reshape(-1), z.reshape(-1)
    # draws in call order: per image the RPN's (bg, then fg), then per image the RoI sampler's (bg, fg)
    for k, p in enumerate(rec["draws"]):
        arrays[f"draw.{k}"] = p
    # label_box calls: RPN image 0, 1, then RoI sampling image 0, 1
    names = [f"rpn.{i}" for i in range(N)] + [f"roi.{i}" for i in range(N)]
    assert len(rec["label_box"]) == 2 * N
    for name, (m, lab) in zip(names, rec["label_box"]):
        arrays[f"{name}.match_labels"] = lab
        arrays[f"{name}.matches"] = m
    labels, matched_boxes, deltas = rec["rpn"]
    for i in range(N):
        arrays[f"rpn.{i}.labels"] = labels[i].astype(np.int8)
        pos = np.flatnonzero(labels[i] == 1)
        arrays[f"rpn.{i}.pos_deltas"] = deltas[i][pos].astype(np.float32)
        arrays[f"rpn.{i}.pos_gt_boxes"] = matched_boxes[i][pos].astype(np.float32)
        arrays[f"proposals.{i}"] = rec["proposals"][i].astype(np.float32)
        # scores (objectness logits: ppdet sorts by them) of the proposals in their order (fewer than
        # 1000: the levels concatenated)
        probs = np.concatenate(rec["level_probs"][5 * i:5 * i + 5])
        assert len(probs) == len(rec["proposals"][i]) <= 1000
        arrays[f"proposals.{i}.probs"] = probs.astype(np.float32)
        small = np.concatenate(rec["small_level_probs"][5 * i:5 * i + 5])
        assert len(small) > SMALL_TOP_N[1]
        arrays[f"proposals_small.{i}"] = rec["small"][i].astype(np.float32)
        arrays[f"proposals_small.{i}.probs"] = -np.sort(-small)[:SMALL_TOP_N[1]].astype(np.float32)
    rois, roi_labels, roi_boxes, roi_gt = rec["roi"]
    for i in range(N):
        arrays[f"roi.{i}.rois"] = rois[i].astype(np.float32)
        arrays[f"roi.{i}.labels"] = roi_labels[i].astype(np.int64)
        arrays[f"roi.{i}.gt_inds"] = roi_gt[i].astype(np.int64)
        arrays[f"roi.{i}.gt_boxes"] = roi_boxes[i].astype(np.float32)
    mask_rois, mask_rois_num, mask_classes, mask_targets, mask_index, mask_weights = rec["mask"]
    arrays["mask.rois"] = np.concatenate(mask_rois).astype(np.float32)
    arrays["mask.rois_num"] = np.asarray(mask_rois_num).astype(np.int64)
    arrays["mask.classes"] = np.asarray(mask_classes).astype(np.int64)
    arrays["mask.targets"] = np.asarray(mask_targets).astype(np.uint8)
    arrays["mask.index"] = np.asarray(mask_index).reshape(-1).astype(np.int64)
    arrays["mask.weights"] = np.asarray(mask_weights).astype(np.float32)
    for k, v in losses.items():
        arrays[f"loss.{k}"] = np.array(v, np.float64)

    np.savez_compressed(OUT + ".npz", **arrays)
    with open(OUT + ".npz", "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    try:
        commit = subprocess.run(["git", "-C", PPDET, "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except Exception:  # an extracted snapshot without .git
        commit = "666f597fd00d3157e84dd9fb2dd3f40bf9918ebc"
    sidecar = {
        "model": "PaddleDetection Mask R-CNN R50-FPN 1x (ResNet-50 b, freeze_norm: BN with global stats "
                 "in train mode, freeze_at 0) in TRAIN mode, 80 classes",
        "source": f"PaddlePaddle/PaddleDetection@{commit}",
        "config_file": CONFIG,
        "build": "cfg=load_config(yml); model=create(cfg.architecture); model.set_state_dict(golden); "
                 "bbox_head/mask_head.roi_extractor.aligned = True; model.train(); losses = model(inputs)",
        "runtime_patches": {
            "aligned": "RoIAlign.__init__ (ppdet/modeling/heads/roi_extractor.py) sets self.aligned = False "
                       "whatever the config says; the attribute is set back to the config's True after the "
                       "build (no file changed)",
            "paddle.randperm": "replaced during the forward by np.random.default_rng(%d).permutation(n); "
                               "subsample_labels (proposal_generator/target.py) calls it for the background "
                               "candidates, then the foreground ones, per image, RPN first, then the RoI "
                               "sampler; every draw is stored as draw.<k> in call order" % PERM_SEED,
            "recorders": "train_proposal (per-level scores), rpn_head._gen_proposal (run a second "
                         "time with smaller top-k settings, see proposals_small), label_box, rpn_anchor_target, generate_proposal_target, generate_mask_target "
                         "wrapped to record their outputs (values unchanged)",
        },
        "weights": "golden_state_dict(table['params']) of %s; missing %s, unexpected %s; all equal after "
                   "loading" % (os.path.basename(TABLE), list(missing), list(unexpected)),
        "train_settings_from_config": {
            "rpn_target_assign": "batch_size_per_im 256, fg_fraction 0.5, positive_overlap 0.7, "
                                 "negative_overlap 0.3, use_random True, ignore_thresh -1 (default)",
            "train_proposal": "pre_nms_top_n 2000, post_nms_top_n 1000, nms_thresh 0.7, min_size 0, "
                              "topk_after_collect True (each level keeps 2000 after NMS, then the image its "
                              "best 1000 over the levels), per image",
            "BBoxAssigner": "batch_size_per_im 512, fg_fraction 0.25, fg_thresh 0.5, bg_thresh 0.5, use_random "
                            "True, ignore_thresh -1; every gt box (crowd included) appended to the proposals",
            "MaskAssigner": "mask_resolution 28",
            "roi_extractor": "box 7, mask 14, sampling_ratio 0, aligned True",
        },
        "inputs": {
            "image": "np.random.default_rng(%d).standard_normal((%d,3,256,256)).astype(float32)" % (IMAGE_SEED, N),
            "im_shape": IM_SHAPE,
            "scale_factor": [[1.0, 1.0]] * N,
            "objects": OBJECTS,
            "gt_bbox": "float32 [N,4]: each polygon instance's bounds (min/max of its points), the crowd "
                       "region's box as given",
            "gt_class": "int32 [N,1]",
            "is_crowd": "float32 [N,1] (not int32: label_box's `is_crowd * ones` raises on int32 x float32 in "
                        "paddle 3.3; the branch only runs when crowd boxes are loaded, which the recipe's "
                        "COCODataSet(load_crowd=False) never does)",
            "gt_poly": "per image, per instance, a list of flat [x0,y0,...] parts; the crowd region: "
                       "[[0]*8] (what ppdet's COCODataSet gives a crowd instance)",
        },
        "arrays": {
            "gt.<i>.boxes/classes/crowd": "the ground truth as fed (classes, crowd flattened)",
            "draw.<k>": "the k-th permutation handed to subsample_labels (int64)",
            "rpn.<i>.match_labels / .matches": "label_box on all 16368 anchors (P2..P6 concatenated, "
                                               "position-major then ratio) before sampling: 1/0/-1, best gt",
            "rpn.<i>.labels": "int8 [16368] after sampling (1 fg, 0 bg, -1 not sampled)",
            "rpn.<i>.pos_deltas / pos_gt_boxes": "regression targets (weights 1) and matched gt boxes of "
                                                 "the sampled positives, in anchor order",
            "proposals.<i>": "the training proposals of image i as the BBoxAssigner receives them (order kept)",
            "proposals.<i>.probs": "their objectness scores (the logits generate_proposals sorts by; for "
                                   "ties: rows of (nearly) equal score may come in either order)",
            "proposals_small.<i> / .probs": "proposals of the same heads with train_proposal pre_nms_top_n, "
                                           "post_nms_top_n = %s (each level keeps its pre best after NMS, "
                                           "the image its post best over the levels: paddle.topk), and their "
                                           "scores (best first)" % (SMALL_TOP_N,),
            "roi.<i>.match_labels / .matches": "label_box on proposals + all gt boxes before sampling",
            "roi.<i>.rois / labels / gt_inds / gt_boxes": "sampled RoIs (fg first, then bg), class (80 = "
                                                           "background), matched gt index and box",
            "mask.*": "generate_mask_target: fg RoIs of the images, rois_num, classes, 28x28 uint8 targets, "
                      "index into the sampled RoIs, weights (an image without foreground gets one fake "
                      "RoI, its sampled RoI 1, of class 0 and weight 0)",
            "loss.<name>": "the model's losses (float64 scalars of the float32 values)",
        },
        "tolerance": "integer arrays (labels, indices, masks) exactly; float arrays and losses within "
                     "1e-5 relative (rtol 1e-5, atol 1e-5 * max(1, max|ref|)); proposals: atol 1e-5 * 512 "
                     "(the largest anchor: a box is its anchor scaled by exp(delta)) + rtol 1e-5, and rows "
                     "whose scores are within 1e-4 may come in either order",
        "determinism": "a second run of this script in a fresh process wrote identical arrays (same npz "
                       "sha256); our model in the tests' MKL setting differs by float32 noise only "
                       "(proposals <= 1.8e-5 of the image size, losses <= 6e-7 relative)",
        "environment": {"python": platform.python_version(), "numpy": np.__version__,
                        "paddle": paddle.__version__, "machine": platform.machine()},
        "npz": os.path.basename(OUT) + ".npz",
        "npz_sha256": digest,
        "npz_keys": {k: {"shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype)} for k, v in arrays.items()},
        "losses": losses,
    }
    with open(OUT + ".json", "w") as f:
        json.dump(sidecar, f, indent=1)
    print("wrote", OUT + ".npz", digest)


if __name__ == "__main__":
    main()
