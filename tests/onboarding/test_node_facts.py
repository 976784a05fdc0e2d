"""Parsers of nvidia-smi XML, `topo -m`, `dcgmi diag -j` and nccl-tests' busbw formula, on
crafted inputs in the tools' real layouts (recorded sets: test_acceptance_recorded.py)."""

from pathlib import Path

import pytest

from onboarding.nodes.facts import (
    FormatError,
    allreduce_algbw_gbps,
    allreduce_busbw_gbps,
    parse_dcgm_diag,
    parse_smi_xml,
    parse_topo_matrix,
    pcie_gen,
)

DATA = Path(__file__).parents[1] / "data" / "acceptance"

# The pre-550 layout a node with an older driver prints: power_readings with
# enforced_power_limit, clocks_throttle_reasons, single_bit/double_bit ECC with totals,
# retired pages instead of row remapping, no fabric section.
OLD_LAYOUT = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v11.dtd">
<nvidia_smi_log>
\t<timestamp>Mon Mar  6 09:12:44 2023</timestamp>
\t<driver_version>470.161.03</driver_version>
\t<cuda_version>11.4</cuda_version>
\t<attached_gpus>1</attached_gpus>
\t<gpu id="00000000:3B:00.0">
\t\t<product_name>Tesla V100-SXM2-32GB</product_name>
\t\t<persistence_mode>Disabled</persistence_mode>
\t\t<mig_mode>
\t\t\t<current_mig>N/A</current_mig>
\t\t\t<pending_mig>N/A</pending_mig>
\t\t</mig_mode>
\t\t<uuid>GPU-0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f</uuid>
\t\t<vbios_version>88.00.80.00.01</vbios_version>
\t\t<pci>
\t\t\t<pci_bus_id>00000000:3B:00.0</pci_bus_id>
\t\t\t<pci_gpu_link_info>
\t\t\t\t<pcie_gen>
\t\t\t\t\t<max_link_gen>3</max_link_gen>
\t\t\t\t\t<current_link_gen>3</current_link_gen>
\t\t\t\t</pcie_gen>
\t\t\t\t<link_widths>
\t\t\t\t\t<max_link_width>16x</max_link_width>
\t\t\t\t\t<current_link_width>16x</current_link_width>
\t\t\t\t</link_widths>
\t\t\t</pci_gpu_link_info>
\t\t\t<replay_counter>4</replay_counter>
\t\t</pci>
\t\t<clocks_throttle_reasons>
\t\t\t<clocks_throttle_reason_gpu_idle>Not Active</clocks_throttle_reason_gpu_idle>
\t\t\t<clocks_throttle_reason_sw_power_cap>Active</clocks_throttle_reason_sw_power_cap>
\t\t\t<clocks_throttle_reason_hw_slowdown>Active</clocks_throttle_reason_hw_slowdown>
\t\t</clocks_throttle_reasons>
\t\t<fb_memory_usage>
\t\t\t<total>32510 MiB</total>
\t\t</fb_memory_usage>
\t\t<ecc_mode>
\t\t\t<current_ecc>Enabled</current_ecc>
\t\t\t<pending_ecc>Enabled</pending_ecc>
\t\t</ecc_mode>
\t\t<ecc_errors>
\t\t\t<volatile>
\t\t\t\t<single_bit>
\t\t\t\t\t<device_memory>3</device_memory>
\t\t\t\t\t<register_file>0</register_file>
\t\t\t\t\t<total>3</total>
\t\t\t\t</single_bit>
\t\t\t\t<double_bit>
\t\t\t\t\t<device_memory>1</device_memory>
\t\t\t\t\t<register_file>0</register_file>
\t\t\t\t\t<total>1</total>
\t\t\t\t</double_bit>
\t\t\t</volatile>
\t\t\t<aggregate>
\t\t\t\t<single_bit>
\t\t\t\t\t<total>11</total>
\t\t\t\t</single_bit>
\t\t\t\t<double_bit>
\t\t\t\t\t<total>1</total>
\t\t\t\t</double_bit>
\t\t\t</aggregate>
\t\t</ecc_errors>
\t\t<retired_pages>
\t\t\t<multiple_single_bit_retirement>
\t\t\t\t<retired_count>0</retired_count>
\t\t\t</multiple_single_bit_retirement>
\t\t\t<double_bit_retirement>
\t\t\t\t<retired_count>1</retired_count>
\t\t\t</double_bit_retirement>
\t\t\t<pending_retirement>Yes</pending_retirement>
\t\t</retired_pages>
\t\t<temperature>
\t\t\t<gpu_temp>44 C</gpu_temp>
\t\t\t<gpu_temp_max_threshold>90 C</gpu_temp_max_threshold>
\t\t\t<gpu_temp_slow_threshold>87 C</gpu_temp_slow_threshold>
\t\t</temperature>
\t\t<power_readings>
\t\t\t<power_state>P0</power_state>
\t\t\t<power_draw>61.93 W</power_draw>
\t\t\t<power_limit>300.00 W</power_limit>
\t\t\t<default_power_limit>300.00 W</default_power_limit>
\t\t\t<enforced_power_limit>250.00 W</enforced_power_limit>
\t\t\t<max_power_limit>300.00 W</max_power_limit>
\t\t</power_readings>
\t\t<clocks>
\t\t\t<sm_clock>1530 MHz</sm_clock>
\t\t</clocks>
\t\t<max_clocks>
\t\t\t<sm_clock>1530 MHz</sm_clock>
\t\t</max_clocks>
\t</gpu>
</nvidia_smi_log>
"""


def test_current_layout_every_field_a_check_reads():
    smi = parse_smi_xml((DATA / "crafted-h200x2-faulty" / "nvidia-smi-q.xml").read_text())
    assert smi.driver_version == "580.95.05" and smi.cuda_version == "13.0"
    g0, g1 = smi.gpus
    assert (g0.index, g0.name, g0.bus_id, g0.memory_total_mib) == (0, "NVIDIA H200",
                                                                    "00000000:19:00.0", 143771)
    assert g0.ecc_mode == "Enabled" and g0.persistence_mode == "Enabled"
    assert g0.mig_mode == "Disabled" and g0.vbios == "96.00.AF.00.01"
    # dram + sram counters summed per scope; sram_threshold_exceeded (Yes/No) is not a count
    assert (g0.ecc_volatile_uncorrectable, g0.ecc_aggregate_uncorrectable) == (2, 2)
    assert (g0.ecc_volatile_correctable, g0.ecc_aggregate_correctable) == (14, 14)
    assert g0.remapped_rows_pending == "Yes" and g0.remapped_rows_uncorrectable == 1
    assert g0.retired_pages_double_bit is None and g0.retired_pages_pending is None  # N/A
    assert (g1.pcie_width_current, g1.pcie_width_max) == (8, 16)
    assert (g1.pcie_gen_current, g1.pcie_gen_max, g1.pcie_gen_host_max) == (1, 5, 5)
    assert (g0.power_limit_w, g0.power_limit_default_w, g0.power_limit_max_w) == (700, 700, 700)
    assert g0.sm_clock_max_mhz == 1980 and g0.sm_clock_mhz == 345
    assert g0.clock_reasons_active == ("gpu_idle",)
    assert (g0.fabric_state, g0.fabric_status) == ("Completed", "Success")


def test_older_layout_reads_the_same_facts():
    [g] = parse_smi_xml(OLD_LAYOUT).gpus
    assert g.power_limit_w == 250 and g.power_limit_default_w == 300  # the enforced one
    assert g.power_draw_w == pytest.approx(61.93)
    assert g.clock_reasons_active == ("sw_power_cap", "hw_slowdown")
    assert (g.ecc_volatile_correctable, g.ecc_volatile_uncorrectable) == (3, 1)
    assert (g.ecc_aggregate_correctable, g.ecc_aggregate_uncorrectable) == (11, 1)
    assert g.retired_pages_double_bit == 1 and g.retired_pages_pending == "Yes"
    assert g.mig_mode is None and g.fabric_state is None  # N/A and absent are both unknown
    assert g.pcie_gen_device_max is None and g.pcie_replay_count == 4
    assert (g.temp_slowdown_c, g.temp_shutdown_c) == (87, 90)


@pytest.mark.parametrize("text", ["", ("NVIDIA-SMI has failed because it couldn't "
                                       "communicate with the NVIDIA driver."), "<html></html>"])
def test_what_is_not_nvidia_smi_xml_is_refused(text):
    with pytest.raises(FormatError):
        parse_smi_xml(text)


def test_topology_matrix_with_nics_affinity_and_legend():
    topo = parse_topo_matrix((DATA / "crafted-h200x2-healthy" / "nvidia-smi-topo-m.txt")
                             .read_text())
    assert topo.gpus == ["GPU0", "GPU1"] and topo.devices[2:] == ("NIC0", "NIC1")
    assert topo.nvlinks("GPU0", "GPU1") == 18 and topo.links[("GPU0", "NIC0")] == "PXB"
    assert topo.cpu_affinity == {"GPU0": "0-55,112-167", "GPU1": "0-55,112-167"}
    assert topo.numa_affinity == {"GPU0": "0", "GPU1": "0"}
    assert topo.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}


def test_topology_as_a_terminal_prints_it_and_on_one_gpu():
    """nvidia-smi underlines the header on a terminal; a VM slice has one GPU and no NUMA."""
    tty = ("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
           "GPU0\t X \tNV18\t0-63,128-191\t0\t\tN/A\nGPU1\tNV18\t X \t0-63,128-191\t0\t\tN/A\n")
    assert parse_topo_matrix(tty).nvlinks("GPU1", "GPU0") == 18
    one = parse_topo_matrix("\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
                            "GPU0\t X \t0-15\tN/A\t\tN/A\n")
    assert one.gpus == ["GPU0"] and one.numa_affinity == {"GPU0": None}
    with pytest.raises(FormatError):
        parse_topo_matrix("Failed to initialize NVML: Driver/library version mismatch\n")


def test_dcgm_4_document_with_entities_and_metadata():
    diag = parse_dcgm_diag((DATA / "crafted-h200x2-healthy" / "dcgmi-diag.json").read_text())
    assert (diag.version, diag.driver_version) == ("4.2.3", "580.95.05")
    assert {(r.test, r.gpu, r.status) for r in diag.results} >= {("memory", "1", "pass"),
                                                                  ("pcie", "0", "pass")}
    assert not diag.failed() and not diag.not_run()


def test_dcgm_3_document_after_its_banner_with_a_failure():
    diag = parse_dcgm_diag((DATA / "crafted-h200x2-faulty" / "dcgmi-diag.json").read_text())
    assert diag.version == "3.3.9"
    [failed] = diag.failed()
    assert (failed.category, failed.test, failed.gpu) == ("Hardware", "GPU Memory", "0")
    assert "row remappings are pending" in failed.messages[0]


def test_dcgm_status_words_unknown_is_never_a_pass():
    doc = ('{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": ['
           '{"name": "memory", "results": [{"entity_id": 0, "status": "Skip"}, '
           '{"entity_id": 1, "status": "Not Run"}, {"entity_id": 2, "status": "Inconclusive"},'
           ' {"entity_id": 3, "status": "Warn", "warnings": [{"warning": "slow"}]}]}]}]}}')
    statuses = [r.status for r in parse_dcgm_diag(doc).results]
    assert statuses == ["skip", "not run", "unknown (inconclusive)", "warn"]
    assert len(parse_dcgm_diag(doc).not_run()) == 3
    with pytest.raises(FormatError):
        parse_dcgm_diag("Error: unable to connect to host engine at 127.0.0.1.")


def test_busbw_is_nccl_tests_formula():
    # nccl-tests: all-reduce busbw = algbw * 2(n-1)/n; 1 GiB in 5 ms over 8 ranks
    algbw = allreduce_algbw_gbps(1 << 30, 0.005)
    assert algbw == pytest.approx(214.748, rel=1e-4)
    assert allreduce_busbw_gbps(1 << 30, 0.005, 8) == pytest.approx(algbw * 14 / 8)
    assert allreduce_busbw_gbps(1 << 30, 0.005, 2) == pytest.approx(algbw)
    with pytest.raises(ValueError):
        allreduce_busbw_gbps(1 << 30, 0.005, 1)


@pytest.mark.parametrize(("speed", "gen"), [("32.0 GT/s PCIe", 5), ("16.0 GT/s PCIe", 4),
                                            ("8.0 GT/s", 3), ("2.5 GT/s PCIe", 1),
                                            ("Unknown", None), (None, None)])
def test_sysfs_link_speed_to_generation(speed, gen):
    assert pcie_gen(speed) == gen


def test_a_value_that_is_not_a_number_is_named_not_dropped_silently():
    """Inside otherwise valid XML, a field whose value is neither a number
    nor one of nvidia-smi's words for unavailable is taken as missing, and said to be."""
    xml = (DATA / "crafted-h200x2-healthy" / "nvidia-smi-q.xml").read_text()
    xml = xml.replace("<current_power_limit>700.00 W</current_power_limit>",
                      "<current_power_limit>seven hundred W</current_power_limit>", 1)
    smi = parse_smi_xml(xml)
    g0, g1 = smi.gpus
    assert g0.power_limit_w is None and g1.power_limit_w == 700
    assert g0.unreadable == ("gpu_power_readings/current_power_limit: 'seven hundred W'",)
    assert g1.unreadable == ()
    assert smi.unreadable == ("GPU0 gpu_power_readings/current_power_limit: 'seven hundred W'",)
    assert parse_smi_xml(OLD_LAYOUT).unreadable == ()  # N/A is unavailable, not unreadable
