"""Writes the crafted node-acceptance test sets (run once; the files are committed):

    python tests/data/acceptance/craft.py

- `crafted-h200x2-healthy/`: a 2-GPU H200 HGX slice that passes every check (a 3650 s burn);
  its GPUs' links idle at 2.5GT/s x16 (trained down to save power) and at 32GT/s under load.
- `crafted-h200x2-faulty/`: the same node with these faults: GPU1's PCIe link at
  x8 of x16, an uncorrectable ECC count and a pending row remap on GPU0, no NVLink between the
  GPUs, a DCGM memory test failure (DCGM 3.x JSON with a banner), and during the burn an XID 79
  on GPU1, two new uncorrectable ECC errors on GPU0, GPU1's SM clock collapsing under
  hw_thermal_slowdown at 92 C, wrong matmul results on GPU1, and a slow all-reduce. Its host
  tools' recordings (crafted, see below) add GPU1 at Gen3 x8 in `lspci -vvv` (idle and under
  the burn's load: `lspci-vvv-load`), 500 corrected AER from GPU0's port in `dmesg`, a retired page's Xid 63/64 pair, CRC errors on an NVLink, a
  correctable-ECC SEL event, a critical sensor, memory errors during the stress, nouveau loaded
  and NIC firmware that differs between the two ConnectX ports.

Both sets also hold the host tools' recordings (`<name>.txt`: `$ command`, the output, `# exit
N`, as scripts/record_node_tools.sh and the probe write them), crafted in the formats the tools
print (pciutils' lspci, the kernel's AER/Xid lines, ipmitool, stress-ng, nvidia-smi nvlink,
ethtool -i, dkms, numactl); real recordings go beside them (`h100-node-tools/`).

The layouts follow the tools' real output: `nvidia-smi -q -x` of driver 580 (DTD v12, the
`gpu_power_readings` / `clocks_event_reasons` / `sram_*`,`dram_*` layout), tab-separated
`nvidia-smi topo -m`, `dcgmi diag -j` of DCGM 3.x and 4.x, and the JSON the project's own
probe writes (burn, interconnect, memory bandwidth, system). Real recordings from an H200
go beside these, in `h200/`, and are read by the same tests.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

HERE = Path(__file__).parent

GPU_XML = """\t<gpu id="{bus}">
\t\t<product_name>NVIDIA H200</product_name>
\t\t<product_brand>NVIDIA</product_brand>
\t\t<product_architecture>Hopper</product_architecture>
\t\t<display_mode>Requested functionality has been deprecated</display_mode>
\t\t<display_attached>No</display_attached>
\t\t<display_active>Disabled</display_active>
\t\t<persistence_mode>Enabled</persistence_mode>
\t\t<addressing_mode>None</addressing_mode>
\t\t<mig_mode>
\t\t\t<current_mig>Disabled</current_mig>
\t\t\t<pending_mig>Disabled</pending_mig>
\t\t</mig_mode>
\t\t<mig_devices>
\t\t\tNone
\t\t</mig_devices>
\t\t<accounting_mode>Disabled</accounting_mode>
\t\t<accounting_mode_buffer_size>4000</accounting_mode_buffer_size>
\t\t<driver_model>
\t\t\t<current_dm>N/A</current_dm>
\t\t\t<pending_dm>N/A</pending_dm>
\t\t</driver_model>
\t\t<serial>165242350{index:04d}</serial>
\t\t<uuid>GPU-5f3c2a10-7d4e-4b8a-9c21-0a1b2c3d4e{index:02d}</uuid>
\t\t<minor_number>{index}</minor_number>
\t\t<vbios_version>96.00.AF.00.01</vbios_version>
\t\t<multigpu_board>No</multigpu_board>
\t\t<board_id>0x{busnum:x}00</board_id>
\t\t<board_part_number>692-2G525-0220-000</board_part_number>
\t\t<gpu_part_number>2335-885-A1</gpu_part_number>
\t\t<gpu_fru_part_number>N/A</gpu_fru_part_number>
\t\t<platformInfo>
\t\t\t<chassis_serial_number>N/A</chassis_serial_number>
\t\t\t<slot_number>N/A</slot_number>
\t\t\t<tray_index>N/A</tray_index>
\t\t\t<host_id>N/A</host_id>
\t\t\t<peer_type>N/A</peer_type>
\t\t\t<module_id>{module}</module_id>
\t\t\t<gpu_fabric_guid>N/A</gpu_fabric_guid>
\t\t</platformInfo>
\t\t<inforom_version>
\t\t\t<img_version>G525.0220.00.02</img_version>
\t\t\t<oem_object>2.1</oem_object>
\t\t\t<ecc_object>7.16</ecc_object>
\t\t\t<pwr_object>N/A</pwr_object>
\t\t</inforom_version>
\t\t<inforom_bbx_flush>
\t\t\t<latest_timestamp>N/A</latest_timestamp>
\t\t\t<latest_duration>N/A</latest_duration>
\t\t</inforom_bbx_flush>
\t\t<gpu_operation_mode>
\t\t\t<current_gom>N/A</current_gom>
\t\t\t<pending_gom>N/A</pending_gom>
\t\t</gpu_operation_mode>
\t\t<c2c_mode>N/A</c2c_mode>
\t\t<gpu_virtualization_mode>
\t\t\t<virtualization_mode>None</virtualization_mode>
\t\t\t<host_vgpu_mode>N/A</host_vgpu_mode>
\t\t\t<vgpu_heterogeneous_mode>N/A</vgpu_heterogeneous_mode>
\t\t</gpu_virtualization_mode>
\t\t<gpu_reset_status>
\t\t\t<reset_required>No</reset_required>
\t\t\t<drain_and_reset_recommended>No</drain_and_reset_recommended>
\t\t</gpu_reset_status>
\t\t<gpu_recovery_action>None</gpu_recovery_action>
\t\t<gsp_firmware_version>580.95.05</gsp_firmware_version>
\t\t<ibmnpu>
\t\t\t<relaxed_ordering_mode>N/A</relaxed_ordering_mode>
\t\t</ibmnpu>
\t\t<pci>
\t\t\t<pci_bus>{busnum:02X}</pci_bus>
\t\t\t<pci_device>00</pci_device>
\t\t\t<pci_domain>0000</pci_domain>
\t\t\t<pci_base_class>3</pci_base_class>
\t\t\t<pci_sub_class>2</pci_sub_class>
\t\t\t<pci_device_id>233510DE</pci_device_id>
\t\t\t<pci_bus_id>{bus}</pci_bus_id>
\t\t\t<pci_sub_system_id>18BE10DE</pci_sub_system_id>
\t\t\t<pci_gpu_link_info>
\t\t\t\t<pcie_gen>
\t\t\t\t\t<max_link_gen>5</max_link_gen>
\t\t\t\t\t<current_link_gen>1</current_link_gen>
\t\t\t\t\t<device_current_link_gen>1</device_current_link_gen>
\t\t\t\t\t<max_device_link_gen>5</max_device_link_gen>
\t\t\t\t\t<max_host_link_gen>5</max_host_link_gen>
\t\t\t\t</pcie_gen>
\t\t\t\t<link_widths>
\t\t\t\t\t<max_link_width>16x</max_link_width>
\t\t\t\t\t<current_link_width>{width}x</current_link_width>
\t\t\t\t</link_widths>
\t\t\t</pci_gpu_link_info>
\t\t\t<pci_bridge_chip>
\t\t\t\t<bridge_chip_type>N/A</bridge_chip_type>
\t\t\t\t<bridge_chip_fw>N/A</bridge_chip_fw>
\t\t\t</pci_bridge_chip>
\t\t\t<replay_counter>0</replay_counter>
\t\t\t<replay_rollover_counter>0</replay_rollover_counter>
\t\t\t<tx_util>0 KB/s</tx_util>
\t\t\t<rx_util>0 KB/s</rx_util>
\t\t\t<atomic_caps_outbound>N/A</atomic_caps_outbound>
\t\t\t<atomic_caps_inbound>N/A</atomic_caps_inbound>
\t\t</pci>
\t\t<fan_speed>N/A</fan_speed>
\t\t<performance_state>P0</performance_state>
\t\t<clocks_event_reasons>
\t\t\t<clocks_event_reason_gpu_idle>Active</clocks_event_reason_gpu_idle>
\t\t\t<clocks_event_reason_applications_clocks_setting>Not Active</clocks_event_reason_applications_clocks_setting>
\t\t\t<clocks_event_reason_sw_power_cap>Not Active</clocks_event_reason_sw_power_cap>
\t\t\t<clocks_event_reason_hw_slowdown>Not Active</clocks_event_reason_hw_slowdown>
\t\t\t<clocks_event_reason_hw_thermal_slowdown>Not Active</clocks_event_reason_hw_thermal_slowdown>
\t\t\t<clocks_event_reason_hw_power_brake_slowdown>Not Active</clocks_event_reason_hw_power_brake_slowdown>
\t\t\t<clocks_event_reason_sync_boost>Not Active</clocks_event_reason_sync_boost>
\t\t\t<clocks_event_reason_sw_thermal_slowdown>Not Active</clocks_event_reason_sw_thermal_slowdown>
\t\t\t<clocks_event_reason_display_clocks_setting>Not Active</clocks_event_reason_display_clocks_setting>
\t\t</clocks_event_reasons>
\t\t<clocks_event_reasons_counters>
\t\t\t<clocks_event_reasons_counters_sw_power_cap>0 us</clocks_event_reasons_counters_sw_power_cap>
\t\t\t<clocks_event_reasons_counters_sync_boost>0 us</clocks_event_reasons_counters_sync_boost>
\t\t\t<clocks_event_reasons_counters_sw_therm_slowdown>0 us</clocks_event_reasons_counters_sw_therm_slowdown>
\t\t\t<clocks_event_reasons_counters_hw_therm_slowdown>0 us</clocks_event_reasons_counters_hw_therm_slowdown>
\t\t\t<clocks_event_reasons_counters_hw_power_brake>0 us</clocks_event_reasons_counters_hw_power_brake>
\t\t</clocks_event_reasons_counters>
\t\t<sparse_operation_mode>N/A</sparse_operation_mode>
\t\t<fb_memory_usage>
\t\t\t<total>143771 MiB</total>
\t\t\t<reserved>552 MiB</reserved>
\t\t\t<used>1 MiB</used>
\t\t\t<free>143218 MiB</free>
\t\t</fb_memory_usage>
\t\t<bar1_memory_usage>
\t\t\t<total>262144 MiB</total>
\t\t\t<used>1 MiB</used>
\t\t\t<free>262143 MiB</free>
\t\t</bar1_memory_usage>
\t\t<cc_protected_memory_usage>
\t\t\t<total>0 MiB</total>
\t\t\t<used>0 MiB</used>
\t\t\t<free>0 MiB</free>
\t\t</cc_protected_memory_usage>
\t\t<compute_mode>Default</compute_mode>
\t\t<utilization>
\t\t\t<gpu_util>0 %</gpu_util>
\t\t\t<memory_util>0 %</memory_util>
\t\t\t<encoder_util>0 %</encoder_util>
\t\t\t<decoder_util>0 %</decoder_util>
\t\t\t<jpeg_util>0 %</jpeg_util>
\t\t\t<ofa_util>0 %</ofa_util>
\t\t</utilization>
\t\t<encoder_stats>
\t\t\t<session_count>0</session_count>
\t\t\t<average_fps>0</average_fps>
\t\t\t<average_latency>0</average_latency>
\t\t</encoder_stats>
\t\t<fbc_stats>
\t\t\t<session_count>0</session_count>
\t\t\t<average_fps>0</average_fps>
\t\t\t<average_latency>0</average_latency>
\t\t</fbc_stats>
\t\t<dram_encryption_mode>
\t\t\t<current_dram_encryption>N/A</current_dram_encryption>
\t\t\t<pending_dram_encryption>N/A</pending_dram_encryption>
\t\t</dram_encryption_mode>
\t\t<ecc_mode>
\t\t\t<current_ecc>Enabled</current_ecc>
\t\t\t<pending_ecc>Enabled</pending_ecc>
\t\t</ecc_mode>
\t\t<ecc_errors>
\t\t\t<volatile>
\t\t\t\t<sram_correctable>0</sram_correctable>
\t\t\t\t<sram_uncorrectable_parity>0</sram_uncorrectable_parity>
\t\t\t\t<sram_uncorrectable_secded>0</sram_uncorrectable_secded>
\t\t\t\t<dram_correctable>{vol_corr}</dram_correctable>
\t\t\t\t<dram_uncorrectable>{vol_unc}</dram_uncorrectable>
\t\t\t</volatile>
\t\t\t<aggregate>
\t\t\t\t<sram_correctable>0</sram_correctable>
\t\t\t\t<sram_uncorrectable_parity>0</sram_uncorrectable_parity>
\t\t\t\t<sram_uncorrectable_secded>0</sram_uncorrectable_secded>
\t\t\t\t<dram_correctable>{agg_corr}</dram_correctable>
\t\t\t\t<dram_uncorrectable>{agg_unc}</dram_uncorrectable>
\t\t\t\t<sram_threshold_exceeded>No</sram_threshold_exceeded>
\t\t\t</aggregate>
\t\t\t<aggregate_uncorrectable_sram_sources>
\t\t\t\t<sram_l2>0</sram_l2>
\t\t\t\t<sram_sm>0</sram_sm>
\t\t\t\t<sram_microcontroller>0</sram_microcontroller>
\t\t\t\t<sram_pcie>0</sram_pcie>
\t\t\t\t<sram_other>0</sram_other>
\t\t\t</aggregate_uncorrectable_sram_sources>
\t\t</ecc_errors>
\t\t<retired_pages>
\t\t\t<multiple_single_bit_retirement>
\t\t\t\t<retired_count>N/A</retired_count>
\t\t\t\t<retired_pagelist>N/A</retired_pagelist>
\t\t\t</multiple_single_bit_retirement>
\t\t\t<double_bit_retirement>
\t\t\t\t<retired_count>N/A</retired_count>
\t\t\t\t<retired_pagelist>N/A</retired_pagelist>
\t\t\t</double_bit_retirement>
\t\t\t<pending_blacklist>N/A</pending_blacklist>
\t\t\t<pending_retirement>N/A</pending_retirement>
\t\t</retired_pages>
\t\t<remapped_rows>
\t\t\t<remapped_row_corr>0</remapped_row_corr>
\t\t\t<remapped_row_unc>{remap_unc}</remapped_row_unc>
\t\t\t<remapped_row_pending>{remap_pending}</remapped_row_pending>
\t\t\t<remapped_row_failure>No</remapped_row_failure>
\t\t\t<row_remapper_histogram>
\t\t\t\t<row_remapper_histogram_max>2039 bank(s)</row_remapper_histogram_max>
\t\t\t\t<row_remapper_histogram_high>0 bank(s)</row_remapper_histogram_high>
\t\t\t\t<row_remapper_histogram_partial>0 bank(s)</row_remapper_histogram_partial>
\t\t\t\t<row_remapper_histogram_low>0 bank(s)</row_remapper_histogram_low>
\t\t\t\t<row_remapper_histogram_none>0 bank(s)</row_remapper_histogram_none>
\t\t\t</row_remapper_histogram>
\t\t</remapped_rows>
\t\t<temperature>
\t\t\t<gpu_temp>31 C</gpu_temp>
\t\t\t<gpu_temp_tlimit>56 C</gpu_temp_tlimit>
\t\t\t<gpu_temp_max_tlimit_threshold>-5 C</gpu_temp_max_tlimit_threshold>
\t\t\t<gpu_temp_slow_tlimit_threshold>-2 C</gpu_temp_slow_tlimit_threshold>
\t\t\t<gpu_temp_max_gpu_tlimit_threshold>0 C</gpu_temp_max_gpu_tlimit_threshold>
\t\t\t<gpu_target_temperature>N/A</gpu_target_temperature>
\t\t\t<memory_temp>37 C</memory_temp>
\t\t\t<gpu_temp_max_mem_tlimit_threshold>58 C</gpu_temp_max_mem_tlimit_threshold>
\t\t</temperature>
\t\t<supported_gpu_target_temp>
\t\t\t<gpu_target_temp_min>N/A</gpu_target_temp_min>
\t\t\t<gpu_target_temp_max>N/A</gpu_target_temp_max>
\t\t</supported_gpu_target_temp>
\t\t<gpu_power_readings>
\t\t\t<power_state>P0</power_state>
\t\t\t<average_power_draw>76.21 W</average_power_draw>
\t\t\t<instant_power_draw>76.87 W</instant_power_draw>
\t\t\t<current_power_limit>700.00 W</current_power_limit>
\t\t\t<requested_power_limit>700.00 W</requested_power_limit>
\t\t\t<default_power_limit>700.00 W</default_power_limit>
\t\t\t<min_power_limit>200.00 W</min_power_limit>
\t\t\t<max_power_limit>700.00 W</max_power_limit>
\t\t</gpu_power_readings>
\t\t<gpu_memory_power_readings>
\t\t\t<average_power_draw>N/A</average_power_draw>
\t\t\t<instant_power_draw>N/A</instant_power_draw>
\t\t</gpu_memory_power_readings>
\t\t<module_power_readings>
\t\t\t<power_state>P0</power_state>
\t\t\t<average_power_draw>N/A</average_power_draw>
\t\t\t<instant_power_draw>N/A</instant_power_draw>
\t\t\t<current_power_limit>N/A</current_power_limit>
\t\t\t<requested_power_limit>N/A</requested_power_limit>
\t\t\t<default_power_limit>N/A</default_power_limit>
\t\t\t<min_power_limit>N/A</min_power_limit>
\t\t\t<max_power_limit>N/A</max_power_limit>
\t\t</module_power_readings>
\t\t<power_smoothing>Disabled</power_smoothing>
\t\t<power_profiles>
\t\t\t<power_profile_requested_profiles>N/A</power_profile_requested_profiles>
\t\t\t<power_profile_enforced_profiles>N/A</power_profile_enforced_profiles>
\t\t</power_profiles>
\t\t<clocks>
\t\t\t<graphics_clock>345 MHz</graphics_clock>
\t\t\t<sm_clock>345 MHz</sm_clock>
\t\t\t<mem_clock>3201 MHz</mem_clock>
\t\t\t<video_clock>765 MHz</video_clock>
\t\t</clocks>
\t\t<applications_clocks>
\t\t\t<graphics_clock>1980 MHz</graphics_clock>
\t\t\t<mem_clock>3201 MHz</mem_clock>
\t\t</applications_clocks>
\t\t<default_applications_clocks>
\t\t\t<graphics_clock>1980 MHz</graphics_clock>
\t\t\t<mem_clock>3201 MHz</mem_clock>
\t\t</default_applications_clocks>
\t\t<deferred_clocks>
\t\t\t<mem_clock>N/A</mem_clock>
\t\t</deferred_clocks>
\t\t<max_clocks>
\t\t\t<graphics_clock>1980 MHz</graphics_clock>
\t\t\t<sm_clock>1980 MHz</sm_clock>
\t\t\t<mem_clock>3201 MHz</mem_clock>
\t\t\t<video_clock>1965 MHz</video_clock>
\t\t</max_clocks>
\t\t<max_customer_boost_clocks>
\t\t\t<graphics_clock>1980 MHz</graphics_clock>
\t\t</max_customer_boost_clocks>
\t\t<clock_policy>
\t\t\t<auto_boost>N/A</auto_boost>
\t\t\t<auto_boost_default>N/A</auto_boost_default>
\t\t</clock_policy>
\t\t<voltage>
\t\t\t<graphics_volt>675.000 mV</graphics_volt>
\t\t</voltage>
\t\t<fabric>
\t\t\t<state>Completed</state>
\t\t\t<status>Success</status>
\t\t\t<cliqueId>32766</cliqueId>
\t\t\t<clusterUuid>N/A</clusterUuid>
\t\t\t<health>
\t\t\t\t<bandwidth>Full</bandwidth>
\t\t\t\t<route_recovery_in_progress>False</route_recovery_in_progress>
\t\t\t\t<route_unhealthy>False</route_unhealthy>
\t\t\t\t<access_timeout_recovery>False</access_timeout_recovery>
\t\t\t</health>
\t\t</fabric>
\t\t<supported_clocks>
\t\t\t<supported_mem_clock>
\t\t\t\t<value>3201 MHz</value>
\t\t\t\t<supported_graphics_clock>1980 MHz</supported_graphics_clock>
\t\t\t\t<supported_graphics_clock>1965 MHz</supported_graphics_clock>
\t\t\t\t<supported_graphics_clock>345 MHz</supported_graphics_clock>
\t\t\t</supported_mem_clock>
\t\t</supported_clocks>
\t\t<processes>
\t\t</processes>
\t\t<accounted_processes>
\t\t</accounted_processes>
\t\t<capabilities>
\t\t\t<egm>disabled</egm>
\t\t</capabilities>
\t</gpu>
"""

HEADER = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
\t<timestamp>Tue Dec  2 10:14:07 2025</timestamp>
\t<driver_version>580.95.05</driver_version>
\t<cuda_version>13.0</cuda_version>
\t<attached_gpus>{n}</attached_gpus>
"""


def smi_xml(gpus: list[dict]) -> str:
    blocks = [GPU_XML.format(**{"vol_corr": 0, "vol_unc": 0, "agg_corr": 0, "agg_unc": 0,
                                "remap_unc": 0, "remap_pending": "No", "width": 16, **g})
              for g in gpus]
    return HEADER.format(n=len(gpus)) + "".join(blocks) + "</nvidia_smi_log>\n"


def topo(link: str) -> str:
    legend = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_1

"""
    return ("\tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            f"GPU0\t X \t{link}\tPXB\tNODE\t0-55,112-167\t0\t\tN/A\n"
            f"GPU1\t{link}\t X \tNODE\tPXB\t0-55,112-167\t0\t\tN/A\n"
            "NIC0\tPXB\tNODE\t X \tNODE\n"
            "NIC1\tNODE\tPXB\tNODE\t X \n" + legend)


def burn_samples(duration_s: float, interval_s: float, faulty: bool) -> list[dict]:
    rnd = random.Random(7)
    out = []
    energy = {0: 9.1e9, 1: 8.7e9}
    ecc = {0: 0.0, 1: 0.0}
    t = 0.0
    while t <= duration_s:
        for g in (0, 1):
            hot = faulty and g == 1 and t > 900
            temp = 31 + 37 * (1 - math.exp(-t / 240)) + rnd.uniform(-0.4, 0.4)
            if hot:
                temp = min(92.0, temp + (t - 900) / 20)
            power = (672 if t > 5 else 150) + rnd.uniform(-8, 8)
            clock = 1755 + rnd.uniform(-30, 30) if t > 5 else 1980
            reasons = 0x4 if t > 5 else 0
            if hot and temp > 88:
                clock, reasons, power = 810 + rnd.uniform(-20, 20), 0x44, 390 + rnd.uniform(-5, 5)
            if faulty and g == 0 and t > 2000:
                ecc[0] = 2.0
            energy[g] += power * interval_s * 1e3
            out.append({"t_s": round(t, 3), "gpu": g, "DCGM_FI_DEV_POWER_USAGE": round(power, 2),
                        "DCGM_FI_DEV_GPU_TEMP": round(temp), "DCGM_FI_DEV_MEMORY_TEMP":
                        round(temp + 6), "DCGM_FI_DEV_SM_CLOCK": round(clock),
                        "DCGM_FI_DEV_MEM_CLOCK": 3201, "DCGM_FI_DEV_GPU_UTIL": 100 if t > 2 else 0,
                        "DCGM_FI_DEV_FB_USED": 1420.0, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": reasons,
                        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": round(energy[g]),
                        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ecc[g],
                        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 0.0})
        t += interval_s
    return out


def burn(faulty: bool) -> dict:
    duration = 3650.0
    per_gpu = [{"gpu": g, "name": "NVIDIA H200", "iterations": 2_610_000 if g == 0 or not faulty
                else 1_402_000, "errors": 37 if faulty and g == 1 else 0, "checks": 52_200,
                "tflops": 786.4 if g == 0 or not faulty else 422.5, "reference_ok": True,
                "reference_max_rel_err": 0.0031} for g in (0, 1)]
    return {"result": {"duration_s": duration, "matmul_size": 8192, "dtype": "bfloat16",
                       "per_gpu": per_gpu, "started_at": 1764670447.25,
                       "ended_at": 1764670447.25 + duration, "window_s": [0.0, duration],
                       "links_read_s": 120.0},
            "xids": [{"t_s": 1432.6, "gpu": 1, "xid": 79}] if faulty else [],
            "telemetry_unavailable": "", "xid_watch": "", "unreadable_fields": {},
            "samples": burn_samples(duration, 10.0, faulty)}


def interconnect(faulty: bool) -> dict:
    p2p = [{"src": s, "dst": d, "bytes": 1 << 30, "seconds": (1 << 30) / 371.2e9,
            "gbps": 371.2, "peer_access": True} for s, d in ((0, 1), (1, 0))]
    busbw = {16: 141.0, 256: 352.7, 1024: 362.9}
    if faulty:
        busbw = {16: 11.0, 256: 38.2, 1024: 41.5}
        for r in p2p:
            r["gbps"], r["seconds"] = 24.8, (1 << 30) / 24.8e9
    allreduce = [{"ranks": 2, "bytes": m << 20, "correct": True,
                  "time_s": (m << 20) / (bw * 1e9)} for m, bw in busbw.items()]
    return {"p2p": p2p, "allreduce": allreduce}


def memory() -> dict:
    return {"per_gpu": [{"gpu": g, "bytes": 4 << 30, "seconds": 2 * (4 << 30) / 4.31e12,
                         "copy_gbps": 4310.0, "verified": True} for g in (0, 1)]}


def system(faulty: bool) -> dict:
    nic = {"mtu": 9000, "operstate": "up", "speed": "32.0 GT/s PCIe",
           "max_speed": "32.0 GT/s PCIe", "width": 16, "max_width": 16}
    return {"cpu_sockets": 2, "numa_nodes": {"node0": "0-55,112-167", "node1": "56-111,168-223"},
            "nics": [{"name": "ib0", "pci": "0000:1a:00.0", **nic},
                     {"name": "ib1", "pci": "0000:3c:00.0", **nic,
                      **({"width": 8} if faulty else {})}],
            "edac": [{"device": "mc0", "uncorrectable": 0, "correctable": 3 if faulty else 0},
                     {"device": "mc1", "uncorrectable": 0, "correctable": 0}],
            "aer": [{"device": "0000:19:00.0", "uncorrectable": 0,
                     "correctable": 500 if faulty else 0}],
            "nvme": [{"device": "nvme0", "critical_warning": 0, "media_errors": 0,
                      "percent_used": 1, "available_spare": 3 if faulty else 100,
                      "spare_threshold": 10}]}


DCGM4_PASS = {"DCGM Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [
        {"name": "software", "results": [{"entity_group": "GPU", "entity_group_id": 1,
                                          "entity_id": g, "status": "Pass"} for g in (0, 1)],
         "test_summary": {"status": "Pass"}}]},
    {"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"entity_group": "GPU", "entity_group_id": 1,
                                        "entity_id": g, "status": "Pass"} for g in (0, 1)],
         "test_summary": {"status": "Pass"}}]},
    {"category": "Integration", "tests": [
        {"name": "pcie", "results": [{"entity_group": "GPU", "entity_group_id": 1,
                                      "entity_id": g, "status": "Pass",
                                      "info": [f"GPU {g} GPU to Host bandwidth: 54.71 GB/s"]}
                                     for g in (0, 1)], "test_summary": {"status": "Pass"}}]}]},
    "entity_groups": [{"entities": [{"device_id": "2335", "entity_id": g,
                                     "serial_num": f"165242350{g:04d}"} for g in (0, 1)],
                       "entity_group": "GPU", "entity_group_id": 1}],
    "metadata": {"Driver Version Detected": "580.95.05", "version": "4.2.3"}}

DCGM3_FAIL = """Successfully ran diagnostic for group.
{
  "DCGM GPU Diagnostic" : {
    "test_categories" : [
      {
        "category" : "Deployment",
        "tests" : [
          {"name" : "Denylist", "results" : [{"gpu_ids" : "0,1", "status" : "PASS"}]},
          {"name" : "Persistence Mode", "results" : [{"gpu_ids" : "0,1", "status" : "PASS"}]}
        ]
      },
      {
        "category" : "Hardware",
        "tests" : [
          {"name" : "GPU Memory", "results" : [
            {"gpu_ids" : "0", "status" : "FAIL", "warnings" : ["GPU 0 had uncorrectable memory errors and row remappings are pending. Run a field diagnostic on the GPU."]},
            {"gpu_ids" : "1", "status" : "PASS"}
          ]}
        ]
      }
    ],
    "version" : "3.3.9"
  }
}
"""


def rec(command: str, output: str, code: int = 0) -> str:
    """A recording: `$ command`, the output, `# exit N`."""
    return f"$ {command}\n{output.rstrip()}\n# exit {code}\n"


def lspci_device(addr: str, what: str, cap: str, sta: str) -> str:
    return (f"{addr} {what}\n"
            "\tSubsystem: NVIDIA Corporation Device 1996\n"
            "\tPhysical Slot: 2\n"
            "\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping-\n"
            "\tCapabilities: [68] Express (v2) Endpoint, MSI 00\n"
            "\t\tDevCap:\tMaxPayload 256 bytes, PhantFunc 0, Latency L0s unlimited, L1 <64us\n"
            f"\t\tLnkCap:\tPort #0, {cap}, ASPM not supported\n"
            "\t\t\tClockPM+ Surprise- LLActRep- BwNot- ASPMOptComp+\n"
            "\t\tLnkCtl:\tASPM Disabled; RCB 64 bytes, Disabled- CommClk+\n"
            f"\t\tLnkSta:\t{sta}\n"
            "\t\t\tTrErr- Train- SlotClk+ DLActive- BWMgmt- ABWMgmt-\n"
            "\t\tLnkCap2: Supported Link Speeds: 2.5-32GT/s, Crosslink- Retimer+ 2Retimers+ "
            "DRS-\n"
            "\t\tLnkSta2: Current De-emphasis Level: -3.5dB, EqualizationComplete+\n"
            "\tKernel driver in use: nvidia\n\n")


def tools(faulty: bool) -> dict[str, str]:
    """The host tools' recordings of the crafted node (crafted, not recorded)."""
    gen5 = "Speed 32GT/s, Width x16"
    # at idle the driver trains a GPU's link down to 2.5GT/s (power saving, width kept); under
    # the burn it is back at 32GT/s. The faulty GPU1 sits at Gen3 x8 either way.
    idle = "Speed 2.5GT/s (downgraded), Width x16"
    gpu1_bad = "Speed 8GT/s (downgraded), Width x8 (downgraded)"

    def lspci_of(gpu0: str, gpu1: str) -> str:
        return (lspci_device("19:00.0", "3D controller: NVIDIA Corporation GH100 [H200 SXM "
                             "141GB] (rev a1)", gen5, gpu0)
                + lspci_device("1a:00.0", "Infiniband controller: Mellanox Technologies MT2910 "
                               "Family [ConnectX-7]", gen5, gen5)
                + lspci_device("3b:00.0", "3D controller: NVIDIA Corporation GH100 [H200 SXM "
                               "141GB] (rev a1)", gen5, gpu1)
                + lspci_device("3c:00.0", "Infiniband controller: Mellanox Technologies MT2910 "
                               "Family [ConnectX-7]", gen5, gen5))

    lspci = lspci_of(idle, gpu1_bad if faulty else idle)
    lspci_load = lspci_of(gen5, gpu1_bad if faulty else gen5)
    boot = ["[Sat Dec  6 03:58:02 2026] Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103)",
            "[Sat Dec  6 03:58:09 2026] nvidia: loading out-of-tree module taints kernel.",
            ("[Sat Dec  6 03:58:10 2026] nvidia-nvlink: Nvlink Core is being initialized, major "
            "device number 508"),
            ("[Sat Dec  6 03:58:11 2026] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  "
            "580.95.05  Release Build  (dvs-builder@U22-I3-AE18-23-3)"),
            "[Sat Dec  6 03:58:14 2026] mlx5_core 0000:1a:00.0: firmware version: 28.39.1002"]
    if faulty:
        for i in range(500):
            t = f"[Sat Dec  6 04:{10 + i // 60:02d}:{i % 60:02d} 2026]"
            boot += [(f"{t} pcieport 0000:17:01.0: AER: Correctable error message received from "
                     "0000:19:00.0"),
                     (f"{t} nvidia 0000:19:00.0: PCIe Bus Error: severity=Correctable, "
                     "type=Physical Layer, (Receiver ID)"),
                     (f"{t} nvidia 0000:19:00.0:   device [10de:2335] error status/mask="
                     "00000001/0000e000")]
        boot += [("[Sat Dec  6 05:02:11 2026] NVRM: Xid (PCI:0000:19:00): 63, pid=4411, "
                 "name=python3, Row Remapper: New row (0x000000000012a3f0) Marked for Remapping, "
                 "reset gpu to activate."),
                 ("[Sat Dec  6 05:02:11 2026] NVRM: Xid (PCI:0000:19:00): 64, pid=4411, "
                 "name=python3, Row Remapper: Failed to remap row")]
    nvlink_e = ""
    for g in (0, 1):
        nvlink_e += (f"GPU {g}: NVIDIA H200 (UUID: GPU-5f3c2a10-7d4e-4b8a-9c21-0a1b2c3d4e{g:02d})"
                     "\n")
        for link in range(18):
            crc = 1873 if faulty and g == 1 and link == 5 else 0
            nvlink_e += (f"\t Link {link}: Replay Errors: 0\n\t Link {link}: Recovery Errors: 0"
                         f"\n\t Link {link}: CRC Errors: {crc}\n")
    nvlink_s = "".join(
        f"GPU {g}: NVIDIA H200 (UUID: GPU-5f3c2a10-7d4e-4b8a-9c21-0a1b2c3d4e{g:02d})\n"
        + "".join(f"\t Link {k}: 26.562 GB/s\n" for k in range(18)) for g in (0, 1))
    sel = ("   1 | 12/01/2026 | 09:12:44 | Event Logging Disabled #0x07 | Log area reset/cleared "
           "| Asserted\n"
           "   2 | 12/01/2026 | 09:13:02 | Power Supply #0x50 | Presence detected | Asserted\n")
    if faulty:
        sel += ("   3 | 12/06/2026 | 04:40:19 | Memory #0x87 | Correctable ECC | DIMM B2 | "
                "Asserted\n")
    sdr = ("CPU1 Temp        | 48 degrees C      | ok\n"
           f"CPU2 Temp        | {97 if faulty else 51} degrees C      | "
           f"{'cr' if faulty else 'ok'}\n"
           "PSU1 Status      | 0x01              | ok\n"
           "FAN1             | 8400 RPM          | ok\n"
           "GPU Tray Inlet   | no reading        | ns\n")
    edac = "\n".join(f"/sys/devices/system/edac/mc/mc{m}/{k} 0" for k in ("ce_count", "ue_count")
                     for m in (0, 1)) + "\nmc\npower"
    edac_after = edac.replace("mc0/ce_count 0", "mc0/ce_count 4") if faulty else edac
    stress = ("stress-ng: info:  [4121] setting to a 10 mins, 0 secs run per stressor\n"
              "stress-ng: info:  [4121] dispatching hogs: 224 cpu, 2 vm\n"
              "stress-ng: metrc: [4121] stressor       bogo ops real time  usr time  sys time   "
              "bogo ops/s     bogo ops/s\n"
              "stress-ng: metrc: [4121] cpu            9127831    600.02 134121.11     12.81  "
              "   15212.69          68.05\n"
              "stress-ng: metrc: [4121] vm           121244218    600.01    598.20    601.42  "
              "  202068.72      101069.31\n"
              "stress-ng: info:  [4121] skipped: 0\n"
              "stress-ng: info:  [4121] passed: 226: cpu (224) vm (2)\n"
              "stress-ng: info:  [4121] failed: 0\n"
              "stress-ng: info:  [4121] metrics untrustworthy: 0\n"
              "stress-ng: info:  [4121] successful run completed in 10 mins, 0.12 secs")
    fw2 = "28.37.1014" if faulty else "28.39.1002"
    ethtool = (f"== ib0\ndriver: mlx5_core\nversion: 24.10-1.1.4\nfirmware-version: 28.39.1002 "
               "(MT_0000000838)\nexpansion-rom-version: \nbus-info: 0000:1a:00.0\n"
               "supports-statistics: yes\n"
               f"== ib1\ndriver: mlx5_core\nversion: 24.10-1.1.4\nfirmware-version: {fw2} "
               "(MT_0000000838)\nexpansion-rom-version: \nbus-info: 0000:3c:00.0\n"
               "supports-statistics: yes\n")
    lsmod = ("nvidia_uvm           4956160  0\nnvidia_drm            122880  0\n"
             "nvidia_modeset       1724416  1 nvidia_drm\nnvidia              14376960  2 "
             "nvidia_uvm,nvidia_modeset\n" + ("nouveau              3096576  0\n" if faulty
                                              else "")
             + "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build"
             "  (dvs-builder@U22-I3-AE18-23-3)  Thu Sep 18 20:18:14 UTC 2025\n"
             "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)")
    ctk_info = "\n".join(
        f"Device Index:   {g}\nDevice Minor:   {g}\nModel:          NVIDIA H200\nBrand:    "
        f"      Nvidia\nGPU UUID:       GPU-5f3c2a10-7d4e-4b8a-9c21-0a1b2c3d4e{g:02d}\n"
        f"Bus Location:   00000000:{'19' if g == 0 else '3b'}:00.0\nArchitecture:   9.0\n"
        for g in (0, 1))
    numactl = ("available: 2 nodes (0-1)\nnode 0 cpus: 0-55,112-167\nnode 0 size: 1031711 MB\n"
               "node 0 free: 1001523 MB\nnode 1 cpus: 56-111,168-223\nnode 1 size: 1032185 MB\n"
               "node 1 free: 1012211 MB\nnode distances:\nnode   0   1 \n  0:  10  21 \n"
               "  1:  21  10 ")
    edac_cmd = ('for f in /sys/devices/system/edac/mc/mc*/ce_count /sys/devices/system/edac/mc/mc*'
                '/ue_count; do [ -f "$f" ] && echo "$f $(cat $f)"; done; ls /sys/devices/system/'
                'edac 2>&1')
    return {
        "uname": rec("uname -r", "6.8.0-49-generic"),
        "dmesg": rec("dmesg -T", "\n".join(boot)),
        "lspci-vvv": rec("lspci -vvv", lspci),
        "lspci-vvv-load": rec("lspci -vvv", lspci_load),
        "numactl-hardware": rec("numactl --hardware", numactl),
        "ipmitool-sel": rec("ipmitool sel elist", sel),
        "ipmitool-sdr": rec("ipmitool sdr", sdr),
        "nvidia-smi-nvlink-e": rec("nvidia-smi nvlink -e", nvlink_e),
        "nvidia-smi-nvlink-s": rec("nvidia-smi nvlink -s", nvlink_s),
        "nvidia-ctk": rec("nvidia-ctk --version", "NVIDIA Container Toolkit CLI version 1.17.8\n"
                          "commit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d"),
        "nvidia-container-cli": rec("nvidia-container-cli info", "NVRM version:   580.95.05\n"
                                    "CUDA version:   13.0\n\n" + ctk_info),
        "lsmod-nouveau": rec('lsmod | grep -E "^(nouveau|nvidia)" ; cat /proc/driver/nvidia/'
                             "version", lsmod),
        "dkms": rec("dkms status", "nvidia/580.95.05, 6.8.0-49-generic, x86_64: installed"),
        "ethtool-i": rec("for n in $(ls /sys/class/net | grep -v ^lo); do echo \"== $n\"; "
                         "ethtool -i $n; done", ethtool),
        "edac-before": rec(edac_cmd, edac),
        "stress-ng": rec("stress-ng --cpu 0 --vm 2 --vm-bytes 25% --timeout 600s "
                         "--metrics-brief", stress),
        "edac-after": rec(edac_cmd, edac_after),
    }


def write(name: str, files: dict[str, str | dict | list]) -> None:
    d = HERE / name
    d.mkdir(exist_ok=True)
    for fname, data in files.items():
        compact = fname == "burn.json"  # as the probe writes it: samples are many
        (d / fname).write_text(data if isinstance(data, str) else json.dumps(
            data, indent=None if compact else 1, separators=(",", ":") if compact else None))


def main() -> None:
    gpus = [{"index": 0, "bus": "00000000:19:00.0", "busnum": 0x19, "module": 2},
            {"index": 1, "bus": "00000000:3B:00.0", "busnum": 0x3B, "module": 4}]
    write("crafted-h200x2-healthy", {
        "nvidia-smi-q.xml": smi_xml(gpus), "nvidia-smi-topo-m.txt": topo("NV18"),
        "dcgmi-diag.json": json.dumps(DCGM4_PASS, indent="\t"),
        "nvml.json": {"nvlinks_active": {"0": 18, "1": 18}, "error": ""},
        "system.json": system(False), "burn.json": burn(False),
        "interconnect.json": interconnect(False), "memory-bandwidth.json": memory(),
        **{f"{k}.txt": v for k, v in tools(False).items()}})
    bad = [{**gpus[0], "agg_unc": 2, "vol_unc": 2, "agg_corr": 14, "vol_corr": 14,
            "remap_unc": 1, "remap_pending": "Yes"}, {**gpus[1], "width": 8}]
    write("crafted-h200x2-faulty", {
        "nvidia-smi-q.xml": smi_xml(bad), "nvidia-smi-topo-m.txt": topo("SYS"),
        "dcgmi-diag.json": DCGM3_FAIL,
        "nvml.json": {"nvlinks_active": {}, "error": "no active NVLink reported by NVML"},
        "system.json": system(True), "burn.json": burn(True),
        "interconnect.json": interconnect(True), "memory-bandwidth.json": memory(),
        **{f"{k}.txt": v for k, v in tools(True).items()}})


if __name__ == "__main__":
    main()
