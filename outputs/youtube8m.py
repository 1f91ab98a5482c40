"""YouTube-8M: the inference output (`YouTube8MTopK`: TopK's predictions.json + the Kaggle CSV)."""
import os

from engine.errors import ConfigError
from engine.registry import OUTPUTS
from metrics.base import top_k
from outputs.classification import TopK


@OUTPUTS.register("YouTube8MTopK")
class YouTube8MTopK(TopK):
    """TopK's `predictions.json` plus the Kaggle YouTube-8M submission `submission.csv`
    (`VideoId,LabelConfidencePairs`, the `csv_top_k` best classes per video, ties to the lower id).

    Args:
        top_k: the best-scored classes per video in predictions.json (>= 1).
        csv_top_k: the classes per video in submission.csv (>= 1; 20, what the Kaggle GAP@20 scores).
    """

    def __init__(self, top_k: int = 5, csv_top_k: int = 20):
        super().__init__(top_k)
        if csv_top_k < 1:
            raise ConfigError(f"infer YouTube8MTopK: csv_top_k must be >= 1, got {csv_top_k}")
        self.csv_top_k = csv_top_k

    def close(self):
        paths = super().close()
        path = os.path.join(self.output_dir, "submission.csv")
        with open(path + ".tmp", "w") as f:
            f.write("VideoId,LabelConfidencePairs\n")
            for vid, row in zip(self.ids, self.probs):
                cols, vals = top_k(row[None], self.csv_top_k)
                f.write(vid + "," + " ".join(f"{c} {v:.6f}" for c, v in zip(cols[0], vals[0])) + "\n")
        os.replace(path + ".tmp", path)
        return paths + [path]
