"""Warnings a run prints on every use of something the project chose on purpose are silenced
where that choice is made, once; each is checked in a fresh interpreter (a warning is shown once
per process), with every warning shown (-W always)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from onboarding.common.paths import PROJECT_ROOT


def _stderr(code: str) -> str:
    proc = subprocess.run([sys.executable, "-W", "always", "-c", code], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=300, check=True)
    return proc.stderr


@pytest.mark.slow
def test_dagsters_beta_warnings_for_the_two_beta_apis_we_use_are_silenced_and_no_other():
    err = _stderr("import pipelines.definitions, dagster as dg\n"
                  "dg.Output(1, data_version=dg.DataVersion('x'))\n"
                  "import warnings\n"
                  "warnings.warn('Function `other` is currently in beta', dg.BetaWarning)\n")
    assert "observable_source_asset" not in err and "`data_version`" not in err
    assert "BetaWarning: Function `other` is currently in beta" in err  # any other still shows


@pytest.mark.slow
def test_model_optimizers_transformers_version_warning_is_silenced():
    err = _stderr("import resources.quantizer, modelopt.torch.quantization")
    assert "is not tested with current version of modelopt" not in err
