"""The diagram primitives place what they are told where they are told, and refuse nonsense."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from companion import diagrams  # noqa: E402


def test_a_box_is_drawn_where_asked_and_returns_its_centre():
    fig, ax = diagrams.canvas(10, 4)
    centre = diagrams.box(ax, 1, 2, 4, 1, "attention", color=diagrams.ATTENTION)
    assert centre == (3, 2.5)
    (patch,) = ax.patches
    assert patch.get_bbox().bounds == pytest.approx((1, 2, 4, 1))
    assert [t.get_text() for t in ax.texts] == ["attention"]
    plt.close(fig)


def test_canvas_keeps_to_the_page_width():
    fig, _ = diagrams.canvas(40, 10)
    assert fig.get_size_inches()[0] == pytest.approx(7.0)
    plt.close(fig)


def test_stack_draws_at_most_max_drawn_copies_and_labels_the_front_one():
    fig, ax = diagrams.canvas(10, 4)
    diagrams.stack(ax, 0, 0, 2, 1, 12, "12 heads", max_drawn=3)
    assert len(ax.patches) == 3 and [t.get_text() for t in ax.texts] == ["12 heads"]
    plt.close(fig)


def test_grid_fills_the_true_cells_and_returns_its_lower_right_corner():
    fig, ax = diagrams.canvas(5, 5)
    corner = diagrams.grid(ax, 1, 4, [[1, 0, 0], [1, 1, 0]], cell=0.5)
    assert corner == (2.5, 3.0)
    faces = [p.get_facecolor() for p in ax.patches]
    filled = [f == matplotlib.colors.to_rgba(diagrams.ATTENTION) for f in faces]
    assert filled == [True, False, False, True, True, False]
    plt.close(fig)


@pytest.mark.parametrize("call, message", [
    (lambda ax: diagrams.box(ax, 0, 0, 0, 1), "width and height must be positive"),
    (lambda ax: diagrams.stack(ax, 0, 0, 1, 1, 0), "n must be a positive int"),
    (lambda ax: diagrams.grid(ax, 0, 0, [[1, 0], [1]]), "non-empty rectangle"),
])
def test_bad_input_names_what_was_expected(call, message):
    fig, ax = diagrams.canvas(4, 4)
    with pytest.raises(ValueError, match=message):
        call(ax)
    plt.close(fig)


def test_canvas_refuses_a_size_that_is_not_positive():
    with pytest.raises(ValueError, match="height must be a positive number, got -1"):
        diagrams.canvas(3, -1)
