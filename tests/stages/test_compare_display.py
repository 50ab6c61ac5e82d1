"""The loss comparison's notebook display: the cosine matrix says what its numbers are, and both tables fit a
notebook's width (a scrolling box, one column per loss, compact cells, cut labels). Built from stored values:
the display does no compute, so no policy is needed."""

import re

from rlkit.policy.per_token import TokenLoss
from rlkit.stages.compare import LossComparison

METRICS = {f"metric_{i}": 0.123456789 * i for i in range(20)}  # a loss reports many metrics


def comparison(*names):
    losses = {n: TokenLoss(dict(METRICS, loss=0.5), {}) for n in names}
    cosines = {(a, b): 0.987654321 for i, a in enumerate(names) for b in names[i + 1:]}
    return LossComparison(None, losses, {n: 1.0 for n in names}, cosines)


def test_the_cosine_matrix_has_a_caption_compact_cells_and_fits_the_notebook():
    html = comparison("ppo_clip", "gspo", "a_loss_with_a_very_long_name").cosine_matrix()._repr_html_()
    caption = re.search(r"<caption[^>]*>(.*?)</caption>", html).group(1)
    assert "cosine of the gradients of each pair of losses at the current weights" in caption
    assert "overflow-x:auto" in html and "max-width:100%" in html
    assert "0.988" in html and "0.98765" not in html  # 3 decimals
    assert "a_loss_with\u2026" in html and "a_loss_with_a_very_long_name" not in html


def test_the_comparisons_summary_has_one_column_per_loss_not_per_metric():
    html = comparison("ppo_clip", "gspo", "cispo")._repr_html_()
    first = html.split("</table>")[0]
    header = re.search(r"<tr>(.*?)</tr>", first).group(1)
    assert header.count("<th") == 4  # the metric names' column and one per loss
    assert first.count("<tr>") == 1 + len(METRICS) + 2  # header, the metrics, loss and grad_norm
    assert html.count("overflow-x:auto") == 2 and "cosine of the gradients" in html


def test_the_cosine_matrix_is_still_a_dataframe():
    cos = comparison("ppo_clip", "gspo").cosine_matrix()
    assert cos.shape == (2, 2) and cos.loc["ppo_clip", "gspo"] == 0.987654321 and float(cos.values.diagonal().sum()) == 2
