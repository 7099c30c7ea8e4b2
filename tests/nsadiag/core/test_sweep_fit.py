"""Layer-range parsing and the growth fits of a sweep."""

import json

import pytest

from nsadiag.sweep import SweepRow, analyse, fit_quantity, parse_layers


@pytest.mark.parametrize("text,expected", [("1-4", [1, 2, 3, 4]), ("1,2,8", [1, 2, 8]),
                                           ("2-12:4", [2, 6, 10]), ("3", [3]),
                                           ("4-6,1", [1, 4, 5, 6])])
def test_parse_layers(text, expected):
    assert parse_layers(text) == expected


@pytest.mark.parametrize("text", ["0-3", "5-2", "a", "1-3:0", ""])
def test_parse_layers_rejects(text):
    with pytest.raises(ValueError, match=r"^layers: "):
        parse_layers(text)


def test_linear_growth_is_fitted_and_extrapolated():
    xs = [1, 2, 3, 4, 5, 6]
    fit = fit_quantity("step_s", xs, [0.5 + 0.25 * x for x in xs], [7, 8])
    assert fit.slope == pytest.approx(0.25) and fit.intercept == pytest.approx(0.5)
    assert fit.r2 == pytest.approx(1.0) and not fit.super_linear
    assert fit.extrapolated == {7: pytest.approx(2.25), 8: pytest.approx(2.5)}
    json.dumps(fit.to_dict())  # plain Python numbers only


def test_quadratic_growth_is_flagged_and_extrapolated_on_the_curve():
    xs = [1, 2, 3, 4, 5, 6]
    fit = fit_quantity("step_s", xs, [0.1 * x * x for x in xs], [7])
    assert fit.super_linear and fit.curvature == pytest.approx(0.1)
    assert fit.extrapolated[7] == pytest.approx(4.9)
    assert isinstance(fit.super_linear, bool)


def test_noise_around_a_line_is_not_super_linear():
    xs = [1, 2, 3, 4, 5, 6]
    ys = [1.0, 2.1, 2.9, 4.05, 4.95, 6.0]
    assert not fit_quantity("step_s", xs, ys, []).super_linear


def _row(n, verdict, step):
    return SweepRow("", n, verdict, step / 2, step / 2, step, 1000 * n, 100 * n, 2, f"t{n}")


def test_threshold_is_the_first_non_ok_count_and_fits_use_ok_rows_only():
    rows = [_row(1, "OK", 1.0), _row(2, "OK", 2.0), _row(3, "OK", 3.0), _row(4, "SLOW", 50.0)]
    result = analyse(rows)
    assert result["threshold"] == 4 and result["threshold_verdict"] == "SLOW"
    assert result["fits"]["step_s"].slope == pytest.approx(1.0)
    assert result["fits"]["step_s"].extrapolated == {4: pytest.approx(4.0),
                                                     5: pytest.approx(5.0)}


def test_two_points_are_no_fit():
    assert fit_quantity("step_s", [1, 2], [1.0, 2.0], [3]) is None
    assert fit_quantity("step_s", [1, 1, 2], [1.0, 1.1, 2.0], [3]) is None  # two counts
    assert analyse([_row(1, "OK", 1.0), _row(2, "OK", 2.0)])["fits"] == {}


def test_a_slope_within_its_error_is_a_poor_fit_with_no_growth_law_or_extrapolation():
    # three noisy single-sample timings: the "per layer" time is noise around zero
    fit = fit_quantity("step_s", [1, 2, 4], [1.30, 1.00, 1.25], [5, 6])
    assert fit.poor and fit.growth() == "no clear trend"
    assert fit.extrapolated == {} and not fit.super_linear
    assert abs(fit.slope) <= 2 * fit.slope_se


def test_the_slope_standard_error_is_the_textbook_one():
    # residuals +-0.1 around y = x: s^2 = 0.04 / (4 - 2), Sxx = 5, se = sqrt(0.02 / 5)
    fit = fit_quantity("step_s", [1, 2, 3, 4], [1.1, 1.9, 2.9, 4.1], [])
    assert fit.points == 4 and not fit.poor
    residuals = [y - (fit.slope * x + fit.intercept)
                 for x, y in zip([1, 2, 3, 4], [1.1, 1.9, 2.9, 4.1], strict=True)]
    expected = (sum(r * r for r in residuals) / 2 / 5) ** 0.5
    assert fit.slope_se == pytest.approx(expected)
