"""One door for configuration: where the config files live, each read as a validated object.

Assets, sensors and the other resources ask this resource, never the environment or a path of
their own: local runs and a cluster (a ConfigMap mounted at ONBOARDING_CONFIG_DIR) differ only in
how it is built (pipelines/resources.py, from EnvVar). Files are read when asked, i.e. when a
step or a tick runs, so a broken YAML fails the runs that need it, naming file and field, and
never stops the code location from loading.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field, ValidationError

from onboarding.common.config import format_validation_error
from onboarding.common.errors import ConfigError
from onboarding.common.paths import DEFAULT_CONFIG_DIR, DEFAULT_DISCOVERED_DIR, PROJECT_ROOT
from onboarding.deploy.engine_choice import Measurement, load_measurements
from onboarding.deploy.kserve import DeployConfig, load_deploy
from onboarding.deploy.observability import OperationsConfig, load_operations
from onboarding.deploy.plan import NodesConfig, load_nodes
from onboarding.fetch.catalog import Catalog, ModelSpec, read_catalog
from onboarding.layouts.placement import LayoutsConfig, check_references, load_layouts
from onboarding.nodes.acceptance import AcceptanceConfig, NodeSetting, load_acceptance, node_setting
from onboarding.predictions.predict import (
    PointsFile,
    PredictConfig,
    load_points,
    load_predict_config,
)
from onboarding.quantize.accuracy_gate import AccuracyGates, load_accuracy_gates
from onboarding.quantize.config import QuantizationConfig, load_quantization_config
from onboarding.runs.automation import AutomationConfig, Discovery, load_automation
from onboarding.runs.cluster import ClusterConfig, NodeType, load_cluster_config, load_node_type
from onboarding.serving.profiles import (
    Profile,
    SloSection,
    load_profiles,
    load_slo_section,
    pick_profile,
)
from onboarding.serving.searched import SearchRecord, load_records
from onboarding.serving.stack import Stack, load_stack, read_stack_config


class ConfigFiles(dg.ConfigurableResource):
    """The project's declarative inputs (configs/), validated on every read."""

    config_dir: str = Field(default="", description="directory of the config files; empty = "
                            "the repository's configs/ (ONBOARDING_CONFIG_DIR)")
    discovered_dir: str = Field(default="", description="specs the sensor and the launchpad "
                                "wrote; empty = <repo>/.data/discovered-specs "
                                "(ONBOARDING_DISCOVERED_DIR)")
    serving_profile: str = Field(default="", description="traffic profile of scenarios.yaml; "
                                 "empty = `cpu` on the CPU engine, else `gpu` "
                                 "(ONBOARDING_SERVING_PROFILE)")
    discovery_bucket: str = Field(default="", description="overrides automation.yaml "
                                  "discovery.bucket (ONBOARDING_DISCOVERY_BUCKET)")
    discovery_prefix: str | None = Field(default=None, description="overrides automation.yaml "
                                         "discovery.prefix (ONBOARDING_DISCOVERY_PREFIX)")
    engine_python: str = Field(default="", description="the engine's Python, for the stack "
                               "fingerprint; empty = automation.yaml stack.engine_python "
                               "(ONBOARDING_ENGINE_PYTHON)")

    # ---- where ----

    @property
    def root(self) -> Path:
        return Path(self.config_dir) if self.config_dir else DEFAULT_CONFIG_DIR

    def path(self, name: str) -> Path:
        return self.root / name

    @property
    def models_path(self) -> Path:
        return self.root / "models"

    @property
    def discovered_path(self) -> Path:
        return Path(self.discovered_dir) if self.discovered_dir else DEFAULT_DISCOVERED_DIR

    def data_path(self, value: str) -> Path:
        """A dataset path from a config file: relative ones are relative to the config dir."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else self.root / p

    # ---- the model catalog ----

    def catalog(self) -> Catalog:
        """Catalog entries and discovered specs, per entry: broken files are listed, not fatal."""
        return read_catalog(self.models_path, self.discovered_path)

    def catalogued(self) -> Catalog:
        """What people wrote under models/, without the discovered specs."""
        return read_catalog(self.models_path, None)

    def discovered(self) -> Catalog:
        if not self.discovered_path.is_dir():
            return Catalog({})
        return read_catalog(self.discovered_path, None)

    def spec(self, model_id: str) -> ModelSpec:
        """One model's spec; a broken file elsewhere in the catalog does not matter here."""
        return self.catalog().resolve(model_id)

    # ---- the other files, each validated ----

    def accuracy_gates(self) -> AccuracyGates:
        return load_accuracy_gates(self.path("gates.yaml"))

    def slo_section(self) -> SloSection:
        return load_slo_section(self.path("gates.yaml"))

    def profiles(self) -> dict[str, Profile]:
        return load_profiles(self.path("scenarios.yaml"))

    def profile(self, requested: str | None, hardware: str) -> tuple[str, Profile]:
        """Run config > this resource's serving_profile > `cpu` on the CPU engine, else `gpu`."""
        name = requested or self.serving_profile or ("cpu" if hardware == "cpu" else "gpu")
        path = self.path("scenarios.yaml")
        return name, pick_profile(load_profiles(path), name, str(path))

    def stack(self) -> Stack:
        """stack.yaml, parsed once into the typed stack (versions, images, switches, every
        engine's template); `.data` is the parsed file the fingerprint covers."""
        return load_stack(self.path("stack.yaml"))

    def stack_config(self) -> dict:
        """stack.yaml parsed but not validated beyond `versions`, for its fingerprint (a stack
        that renders nothing is still observed)."""
        return read_stack_config(self.path("stack.yaml"))

    def deploy(self) -> DeployConfig:
        return load_deploy(self.path("deploy.yaml"))

    def nodes(self) -> NodesConfig:
        return load_nodes(self.path("nodes.yaml"))

    def operations(self) -> OperationsConfig:
        """How the day-two artifacts beside each manifest are evaluated (operations.yaml)."""
        return load_operations(self.path("operations.yaml"))

    def layouts(self) -> LayoutsConfig:
        """layouts.yaml, with its node types checked against nodes.yaml and its models against
        the catalog."""
        path = self.path("layouts.yaml")
        cfg = load_layouts(path)
        check_references(cfg, path, self.nodes(), set(self.catalog().specs))
        return cfg

    def predict(self) -> PredictConfig:
        return load_predict_config(self.path("predict.yaml"))

    def engine_measurements(self) -> list[Measurement]:
        """Measured goodput per engine and configuration, which serving_config chooses each
        node type's engine by (engine_measurements.json; absent: none, the stack's engine)."""
        return load_measurements(self.path("engine_measurements.json"))

    def searched_configs(self) -> list[SearchRecord]:
        """The measured configuration search's winners, which serving_config applies where
        the plan still gives the searched-from configuration (searched_configs.json; absent:
        none, the plan's configurations)."""
        return load_records(self.path("searched_configs.json"))

    def measured_points(self) -> PointsFile:
        """The measured points predict.yaml's calibration names (relative: to this dir)."""
        return load_points(self.data_path(self.predict().calibration.points))

    def acceptance(self) -> AcceptanceConfig:
        """Node acceptance: probe settings, thresholds per node type, the registered nodes
        (each node type checked against nodes.yaml)."""
        return load_acceptance(self.path("acceptance.yaml"), self.nodes())

    def node_setting(self, name: str) -> NodeSetting:
        """One registered node's acceptance setting (node type, GPUs, thresholds); an
        unregistered node is a ConfigError naming acceptance.yaml."""
        return node_setting(self.acceptance(), self.nodes(), name,
                            str(self.path("acceptance.yaml")))

    def quantization(self) -> QuantizationConfig:
        return load_quantization_config(self.path("quantization.yaml"))

    def cluster(self) -> ClusterConfig:
        return load_cluster_config(self.path("cluster.yaml"))

    def node_type(self, name: str) -> NodeType:
        return load_node_type(name, self.path("nodes.yaml"))

    def eval_tasks_dir(self) -> Path:
        return self.path("eval_tasks")

    def automation(self) -> AutomationConfig:
        cfg = load_automation(self.path("automation.yaml"))
        overrides = {k: v for k, v in (("bucket", self.discovery_bucket),
                                       ("prefix", self.discovery_prefix)) if v}
        if overrides:
            try:
                discovery = Discovery.model_validate({**cfg.discovery.model_dump(), **overrides})
            except ValidationError as exc:
                raise ConfigError("ONBOARDING_DISCOVERY_BUCKET/ONBOARDING_DISCOVERY_PREFIX",
                                  format_validation_error("environment", exc),
                                  "Fix the environment variable.") from None
            cfg = cfg.model_copy(update={"discovery": discovery})
        return cfg

    def engine_python_path(self) -> Path | None:
        """The engine virtualenv's Python whose packages the stack fingerprint reads."""
        raw = self.engine_python or self.automation().stack.engine_python
        if not raw:
            return None
        path = Path(raw)
        return path if path.is_absolute() else PROJECT_ROOT / path


class OutputDirs(dg.ConfigurableResource):
    """Where rendered files go: manifests and reports (a shared volume in a cluster)."""

    manifests_dir: str = Field(default="", description="empty = <repo>/.data/manifests "
                               "(ONBOARDING_OUTPUT_DIR)")
    reports_dir: str = Field(default="", description="empty = <repo>/.data/reports "
                             "(ONBOARDING_REPORTS_DIR)")

    @property
    def manifests(self) -> Path:
        return Path(self.manifests_dir) if self.manifests_dir else PROJECT_ROOT / ".data" / \
            "manifests"

    @property
    def reports(self) -> Path:
        return Path(self.reports_dir) if self.reports_dir else PROJECT_ROOT / ".data" / "reports"
