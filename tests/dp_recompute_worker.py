"""Run by tests/test_deeplabv3.py under `paddle.distributed.launch --nproc_per_node 2`: one
data-parallel backward of a ResNet with and without stage recompute; each rank writes its gradients'
largest difference and whether the ranks' all-reduced gradients agree."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from models.vision.resnet import ResNet  # noqa: E402


def main(out_dir):
    dist.init_parallel_env()
    rank = dist.get_rank()
    grads = {}
    for recompute in (False, True):
        paddle.seed(0)
        model = ResNet(depth=18, output_stride=16, out_indices=[3], recompute=recompute)
        net = paddle.DataParallel(model)
        model.train()
        x = np.random.default_rng(rank).standard_normal((2, 3, 32, 32)).astype("float32")
        (net(paddle.to_tensor(x))[0] ** 2).mean().backward()
        grads[recompute] = {n: p.grad.numpy() for n, p in model.named_parameters() if not p.stop_gradient}
    diff = max(float(np.abs(grads[True][k] - grads[False][k]).max()) for k in grads[False])
    gathered = []
    dist.all_gather_object(gathered, {k: v.sum().item() for k, v in grads[True].items()})
    same = all(abs(gathered[0][k] - gathered[1][k]) <= 1e-6 * (1 + abs(gathered[0][k])) for k in gathered[0])
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"num_grads": len(grads[True]), "max_diff": diff, "ranks_agree": same}, f)


if __name__ == "__main__":
    main(sys.argv[1])
