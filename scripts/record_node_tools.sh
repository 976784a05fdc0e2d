#!/usr/bin/env bash
# Record what a GPU node's own tools print, one file per command, for node acceptance to parse
# and for the CPU suite to replay (tests/data/acceptance/). Read-only except the short stress
# runs; nothing here changes the node's configuration.
#
#   bash scripts/record_node_tools.sh OUT_DIR [STRESS_SECONDS] [LOAD_SECONDS]
#
# Each OUT_DIR/<name>.txt starts with the command ("$ ...") and ends with "# exit N"; a tool
# that is not installed records exit 127, which acceptance reads as "not checked".
# The PCIe links are read twice: at idle (lspci-vvv, pci-sysfs-links) and while every GPU runs
# bf16 matmuls for LOAD_SECONDS (lspci-vvv-load, pci-sysfs-links-load, nvidia-smi-query-load;
# python3 with PyTorch and CUDA, as the node probe's burn): an idle GPU trains its link down to
# save power, so its speed is judged under load. No PyTorch: the load reads record why.
set -u
out=${1:?usage: record_node_tools.sh OUT_DIR [STRESS_SECONDS] [LOAD_SECONDS]}
stress_s=${2:-30}
load_s=${3:-20}
mkdir -p "$out"

rec() {  # rec NAME TIMEOUT_S CMD... -> OUT/NAME.txt
  local name=$1 limit=$2; shift 2
  {
    printf '$ %s\n' "$*"
    timeout "$limit" bash -c "$*" 2>&1
    printf '# exit %s\n' "$?"
  } > "$out/$name.txt"
}

rec uname 10 'uname -a'
rec os-release 10 'cat /etc/os-release'
rec lscpu 10 'lscpu'
rec numactl-hardware 10 'numactl --hardware'
rec numa-sysfs 10 'for n in /sys/devices/system/node/node*; do echo "$n cpulist=$(cat $n/cpulist) mem=$(grep MemTotal $n/meminfo)"; done'
rec meminfo 10 'cat /proc/meminfo'
rec dmesg 30 'dmesg -T'
rec journal-kernel 30 'journalctl -k -b --no-pager | tail -n 2000'
rec lspci-vvv 60 'lspci -vvv'
rec lspci-nvidia-links 30 'for d in $(lspci -D -d 10de: | cut -d" " -f1); do echo "== $d"; lspci -vvv -s $d | grep -E "LnkCap:|LnkSta:"; done'
rec pci-sysfs-links 30 'for d in /sys/bus/pci/devices/*; do v=$(cat $d/vendor 2>/dev/null); c=$(cat $d/class 2>/dev/null); case "$v:$c" in 0x10de:*|*:0x0200*|*:0x0207*|*:0x0108*) echo "$(basename $d) vendor=$v class=$c cur=$(cat $d/current_link_speed 2>/dev/null)/x$(cat $d/current_link_width 2>/dev/null) max=$(cat $d/max_link_speed 2>/dev/null)/x$(cat $d/max_link_width 2>/dev/null)";; esac; done'
rec aer-counters 30 'for f in /sys/bus/pci/devices/*/aer_dev_correctable /sys/bus/pci/devices/*/aer_dev_fatal /sys/bus/pci/devices/*/aer_dev_nonfatal; do [ -f "$f" ] && { echo "== $f"; cat "$f"; }; done; ls /sys/bus/pci/devices | head -3'
rec edac-before 10 'for f in /sys/devices/system/edac/mc/mc*/ce_count /sys/devices/system/edac/mc/mc*/ue_count; do [ -f "$f" ] && echo "$f $(cat $f)"; done; ls /sys/devices/system/edac 2>&1'
rec nvidia-smi 30 'nvidia-smi'
rec nvidia-smi-q 60 'nvidia-smi -q'
rec nvidia-smi-q-xml 60 'nvidia-smi -q -x'
rec nvidia-smi-ecc 30 'nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER'
rec nvidia-smi-query 30 'nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,temperature.gpu,power.draw,power.limit,clocks.sm,clocks.max.sm,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,retired_pages.single_bit_ecc.count,retired_pages.double_bit.count --format=csv'
rec nvidia-smi-topo-m 30 'nvidia-smi topo -m'
rec nvidia-smi-nvlink-s 30 'nvidia-smi nvlink -s'
rec nvidia-smi-nvlink-e 30 'nvidia-smi nvlink -e'
rec nvidia-smi-nvlink-status 30 'nvidia-smi nvlink --status'
rec nvidia-container-cli 30 'nvidia-container-cli info'
rec nvidia-ctk 30 'nvidia-ctk --version'
rec lsmod-nouveau 10 'lsmod | grep -E "^(nouveau|nvidia)" ; cat /proc/driver/nvidia/version'
rec dkms 10 'dkms status'
rec ip-link 10 'ip -d link show'
rec nic-mtu 10 'for n in /sys/class/net/*; do echo "$(basename $n) mtu=$(cat $n/mtu) state=$(cat $n/operstate)"; done'
rec ethtool-i 30 'for n in $(ls /sys/class/net | grep -v ^lo); do echo "== $n"; ethtool -i $n; done'
rec ibstat 10 'ibstat'
rec nvme-list 30 'nvme list'
rec nvme-smart-log 30 'for d in /dev/nvme[0-9]; do [ -e "$d" ] && { echo "== $d"; nvme smart-log "$d"; }; done; ls /dev/nvme* 2>&1'
rec smartctl 30 'smartctl -a /dev/nvme0'
rec lsblk 10 'lsblk -o NAME,SIZE,TYPE,MODEL,ROTA,MOUNTPOINT'
rec ipmitool-sel 30 'ipmitool sel elist'
rec ipmitool-sdr 60 'ipmitool sdr'
rec mcelog 30 'mcelog --client; ras-mc-ctl --summary'
rec dcgmi-discovery 30 'dcgmi discovery -l'
rec dcgmi-diag-r3 300 'dcgmi diag -r 3 -j'
rec stress-ng 120 "stress-ng --cpu 0 --vm 2 --vm-bytes 25% --timeout ${stress_s}s --metrics-brief"
rec edac-after 10 'for f in /sys/devices/system/edac/mc/mc*/ce_count /sys/devices/system/edac/mc/mc*/ue_count; do [ -f "$f" ] && echo "$f $(cat $f)"; done; ls /sys/devices/system/edac 2>&1'
# The links again under load: matmuls on every GPU in the background, read once they run.
load_py='import sys, time, torch
n = torch.cuda.device_count()
assert n, "no CUDA device"
xs = [torch.randn(8192, 8192, device=f"cuda:{g}", dtype=torch.bfloat16) for g in range(n)]
print(f"loading {n} GPU(s)", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for x in xs:
        x @ x
    torch.cuda.synchronize()'
python3 -c "$load_py" "$load_s" > "$out/.load.log" 2>&1 &
load_pid=$!
for _ in $(seq 60); do grep -q loading "$out/.load.log" 2>/dev/null && break; kill -0 $load_pid 2>/dev/null || break; sleep 0.5; done
sleep 3
if kill -0 $load_pid 2>/dev/null; then
  rec lspci-vvv-load 60 'lspci -vvv'
  rec pci-sysfs-links-load 30 'for d in /sys/bus/pci/devices/*; do v=$(cat $d/vendor 2>/dev/null); c=$(cat $d/class 2>/dev/null); case "$v:$c" in 0x10de:*|*:0x0200*|*:0x0207*|*:0x0108*) echo "$(basename $d) vendor=$v class=$c cur=$(cat $d/current_link_speed 2>/dev/null)/x$(cat $d/current_link_width 2>/dev/null) max=$(cat $d/max_link_speed 2>/dev/null)/x$(cat $d/max_link_width 2>/dev/null)";; esac; done'
  rec nvidia-smi-query-load 30 'nvidia-smi --query-gpu=index,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,utilization.gpu,power.draw,clocks.sm --format=csv'
  wait $load_pid
else
  printf '$ python3 -c <bf16 matmuls on every GPU>\n%s\n# exit 1\n' "$(tail -n 5 "$out/.load.log")" > "$out/load-failed.txt"
fi
rm -f "$out/.load.log"
rec which-tools 10 'for t in nvidia-smi dcgmi ipmitool stress-ng lspci nvme smartctl ethtool numactl mcelog ras-mc-ctl nvidia-container-cli nvidia-ctk dkms ibstat; do printf "%s: %s\n" $t "$(command -v $t || echo absent)"; done'
ls -la "$out"
