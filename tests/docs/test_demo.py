"""The worked example (examples/demo.py) opens with a verdict that matches what it says: the
rounding-noise target passes, the two bugs fail."""

from __future__ import annotations

import pytest

from examples import demo


def _verdicts(output: str) -> dict[str, str]:
    """Each case's title -> the first verdict line printed under it."""
    verdicts, title = {}, None
    for line in output.splitlines():
        if line.startswith("== "):
            title = line[3:]
        elif title is not None and title not in verdicts and "standard:" in line:
            verdicts[title] = line.split()[0] + " " + line.split()[2]
    return verdicts


def test_the_demo_leads_with_the_right_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    demo.judge()
    verdicts = _verdicts(capsys.readouterr().out)
    assert verdicts == {
        "target run (rounding noise)": "reference PASS",
        "target with a softmax scale bug": "reference FAIL,",
        "target with one corrupted element": "reference FAIL,",
    }
