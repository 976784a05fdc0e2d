"""The code location as the daemon and the webserver load it: every sensor, schedule and job
finds the resources it needs (transitively) among the Definitions' top-level resources.

The sensor daemon resolves a sensor's resources, and the resources those need, from the
repository; a resource that needs one the Definitions do not bind (e.g. an input manager that
reads through `io_manager`) fails every tick there, while a test that builds the sensor's
context by hand never sees it.
"""

import pytest
from dagster._core.execution.resources_init import get_transitive_required_resource_keys

from pipelines.definitions import defs

REPO = defs.get_repository_def()
RESOURCES = REPO.get_top_level_resources()


@pytest.mark.parametrize("sensor", REPO.sensor_defs, ids=lambda s: s.name)
def test_every_sensor_resolves_its_resources(sensor):
    get_transitive_required_resource_keys(sensor.required_resource_keys, RESOURCES)


@pytest.mark.parametrize("schedule", REPO.schedule_defs, ids=lambda s: s.name)
def test_every_schedule_resolves_its_resources(schedule):
    get_transitive_required_resource_keys(schedule.required_resource_keys, RESOURCES)


def test_the_io_manager_is_bound_where_the_upstream_reader_needs_it():
    assert "optional_upstream" in RESOURCES and "io_manager" in RESOURCES
