"""configs/dagster.yaml, as scripts/dev.sh installs it into $DAGSTER_HOME, read by Dagster."""

from __future__ import annotations

import shutil

import dagster as dg

from onboarding.common.paths import PROJECT_ROOT


def test_the_ui_opens_without_dagsters_first_open_pop_up_and_sends_no_telemetry(tmp_path):
    shutil.copy(PROJECT_ROOT / "configs" / "dagster.yaml", tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.nux_enabled is False
        assert instance.telemetry_enabled is False
