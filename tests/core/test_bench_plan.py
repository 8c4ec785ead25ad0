"""The bench's first line counts what runs: contenders, the settings they cover, cells, rounds."""

from specstrat.bench._contenders import plan
from specstrat.bench.rows import Cell


def _cell(algorithm: str, category: str, draft_tokens: int) -> Cell:
    return Cell(
        name=algorithm,
        algorithm=algorithm,
        category=category,
        batch_size=1,
        draft_tokens=draft_tokens,
        requests=[],
        rule_lossless=True,
        baseline="NONE",
        spec=None,
    )


def test_five_contenders_over_six_categories_are_thirty_cells() -> None:
    """5 contenders x 6 categories: 5 contenders, 30 cells, 60 runs at 1 + 1 rounds."""
    names = ["NONE", "NGRAM", "EAGLE", "EAGLE3", "hf-generate"]
    cells = [_cell(n, f"c{i}", 0 if n == "NONE" else 4) for n in names for i in range(6)]
    line = plan(cells, warmup=1, repeats=1, overlap=False)
    assert line == (
        "60 runs: 5 contenders over 6 categories, 1 batch size, 1 draft width = 30 cells "
        "(NONE 6, NGRAM 6, EAGLE 6, EAGLE3 6, hf-generate 6) x (1 warm-up + 1 counted round)"
    )
