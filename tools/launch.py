"""Multi-node (and multi-process) runs: paddle.distributed.launch with its own flags, supervised.

    python tools/launch.py --nnodes 2 --master 10.0.0.1:49178 --host 10.0.0.1 tools/train.py -c CONFIG
    python tools/launch.py --nnodes 2 --master 10.0.0.1:49178 --host 10.0.0.2 tools/train.py -c CONFIG

The same line on every node (its own --host). Before starting it checks the addresses; it ends with
one `error:` line when the nodes do not all join within --join_timeout, when another node is silent
for --peer_timeout, or when a trainer fails (docs/multi-node.md).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import cli, launch  # noqa: E402  (neither loads paddle: the supervisor never does)


def main():
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        launch.parser().print_help()
        return
    launch.run(argv)


if __name__ == "__main__":
    cli.run(main)
