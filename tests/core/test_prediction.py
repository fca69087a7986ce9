"""Predicted run times: the mean of the user's last two jobs of the shape, never past the limit."""

from gpud.prediction import RuntimePredictor


def test_a_job_is_expected_to_run_as_long_as_its_users_last_two_of_its_shape():
    predictor = RuntimePredictor()
    assert predictor.predict("ann", 1.0, 1, 3600.0) is None  # nothing known: the estimate runs to the limit
    for runtime in (100.0, 300.0, 500.0):
        predictor.record("ann", 1.0, 1, runtime)
    assert predictor.predict("ann", 1.0, 1, 3600.0) == 400.0
    assert predictor.predict("ann", 1.0, 1, 200.0) == 200.0  # capped at the job's own limit
    assert predictor.predict("ann", 8.0, 1, 3600.0) is None  # another shape
    assert predictor.predict("bob", 1.0, 1, 3600.0) is None  # another user
