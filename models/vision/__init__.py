"""Vision models: the shared ResNet backbone (also TSN's and StNet's), DeepLabV3, Mask R-CNN."""
COMPONENTS = ("resnet", "deeplabv3", "mask_rcnn")
