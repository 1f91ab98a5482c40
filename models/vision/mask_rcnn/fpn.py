"""Feature pyramid (FPN) on the ResNet stages res2..res5: P2..P5 plus P6 for the RPN.

As PaddleDetection's FPN (ppdet/modeling/necks/fpn.py, no norm, no extra convs): 1x1 lateral convs,
top-down nearest x2 upsampling (to the size below, which is
exactly x2 on inputs padded to a multiple of 32) added to the lateral below, a 3x3 output conv per level, and
P6 = max_pool2d(P5, kernel 1, stride 2). Weights: XavierUniform with fan_out = in channels
(laterals) or out channels x 9 (outputs), biases 0.
"""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

import ops


class FPN(nn.Layer):
    def __init__(self, in_channels, out_channels=256):
        super().__init__()
        self.out_channels = out_channels
        self.lateral_convs = nn.LayerList([
            nn.Conv2D(c, out_channels, 1, weight_attr=paddle.ParamAttr(
                initializer=nn.initializer.XavierUniform(fan_out=c))) for c in in_channels])
        self.output_convs = nn.LayerList([
            nn.Conv2D(out_channels, out_channels, 3, padding=1, weight_attr=paddle.ParamAttr(
                initializer=nn.initializer.XavierUniform(fan_out=out_channels * 9))) for _ in in_channels])

    def forward(self, feats):
        """[C2..C5] -> [P2..P6] (strides 4..64)."""
        # fp32 activations whatever ops.Precision.bf16_act says (the trunk's end there): the top-down adds,
        # the upsampling and P6's pooling are paddle's, which has no CPU bf16 kernel for them
        with ops.precision(bf16_act=False):
            laterals = [ops.conv2d(f, conv) for conv, f in zip(self.lateral_convs, feats)]
            for i in range(len(laterals) - 1, 0, -1):
                laterals[i - 1] = laterals[i - 1] + F.interpolate(
                    laterals[i], size=laterals[i - 1].shape[-2:], mode="nearest")
            outs = [ops.conv2d(x, conv) for conv, x in zip(self.output_convs, laterals)]
        outs.append(F.max_pool2d(outs[-1], kernel_size=1, stride=2))
        return outs
