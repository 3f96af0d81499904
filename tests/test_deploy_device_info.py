"""A device describes itself: /proc/cpuinfo and hardware capabilities -> an LLVM target string."""
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import wait_until
from kernelrpc.runtime import device_info

RPI4_64 = """\
processor	: 0
BogoMIPS	: 108.00
Features	: fp asimd evtstrm crc32 cpuid
CPU implementer	: 0x41
CPU architecture: 8
CPU variant	: 0x0
CPU part	: 0xd08
CPU revision	: 3

Hardware	: BCM2835
Revision	: c03111
Model		: Raspberry Pi 4 Model B Rev 1.1
"""
RPI5 = RPI4_64.replace("fp asimd evtstrm crc32 cpuid", "fp asimd evtstrm aes pmull sha1 sha2 crc32 "
                       "atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp").replace(
    "0xd08", "0xd0b").replace("Raspberry Pi 4 Model B Rev 1.1", "Raspberry Pi 5 Model B Rev 1.0")
RPI4_32 = """\
processor	: 0
model name	: ARMv7 Processor rev 3 (v7l)
BogoMIPS	: 108.00
Features	: half thumb fastmult vfp edsp neon vfpv3 tls vfpv4 idiva idivt vfpd32 lpae evtstrm crc32
CPU implementer	: 0x41
CPU architecture: 7
CPU variant	: 0x0
CPU part	: 0xd08
CPU revision	: 3
"""
NO_NEON_V7 = """\
processor	: 0
model name	: ARMv7 Processor rev 1 (v7l)
Features	: half thumb fastmult vfp edsp thumbee vfpv3 vfpv3d16 tls idiva idivt
CPU implementer	: 0x56
CPU part	: 0x584
"""
RPI_ZERO = """\
processor	: 0
model name	: ARMv6-compatible processor rev 7 (v6l)
Features	: half thumb fastmult vfp edsp java tls
CPU implementer	: 0x41
CPU architecture: 7
CPU part	: 0xb76
Model		: Raspberry Pi Zero W Rev 1.1
"""
VISIONFIVE2 = """\
processor	: 0
hart		: 1
isa		: rv64imafdc_zicntr_zicsr_zifencei_zihpm_zba_zbb
mmu		: sv39
uarch		: sifive,u74-mc
"""
X86 = "processor\t: 0\nmodel name\t: Some x86 CPU\nflags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma\n"

CASES = [
    ("aarch64", RPI4_64, "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon,+crc"),
    ("aarch64", RPI5, "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76 "
                      "-mattr=+neon,+crc,+lse,+aes,+sha2,+rdm,+fullfp16,+dotprod,+rcpc"),
    ("armv7l", RPI4_32, "llvm -mtriple=armv7-linux-gnueabihf -mcpu=cortex-a72 -mattr=+neon,+vfp4"),
    ("armv7l", NO_NEON_V7, "llvm -mtriple=armv7-linux-gnueabihf -mattr=+vfp3d16,-neon"),
    ("armv6l", RPI_ZERO, "llvm -mtriple=armv6-linux-gnueabihf -mcpu=arm1176jzf-s -mattr=+vfp2"),
    ("riscv64", VISIONFIVE2, "llvm -mtriple=riscv64-linux-gnu -mcpu=generic-rv64 "
                             "-mattr=+m,+a,+f,+d,+c,+zba,+zbb"),
    ("x86_64", X86, "llvm -mtriple=x86_64-linux-gnu -mattr=+avx,+avx2,+fma,+sse4.1,+sse4.2,+ssse3"),
]


@pytest.mark.parametrize("machine,cpuinfo,target", CASES, ids=["rpi4", "rpi5", "rpi4-32bit", "armv7-no-neon", "rpi-zero",
                                                               "visionfive2", "x86"])
def test_board_cpuinfo_gives_its_target(tmp_path, machine, cpuinfo, target):
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    info = device_info.describe(machine=machine, cpuinfo_path=str(path), hwcaps=(0, 0))
    assert info["target"] == target
    assert info["machine"] == machine and "cpuinfo_foreign" not in info
    json.dumps(info)


def test_hwcaps_win_over_a_foreign_cpuinfo(tmp_path):
    """Under qemu-user /proc/cpuinfo is the host's; the emulated CPU's AT_HWCAP bits count."""
    path = tmp_path / "cpuinfo"
    path.write_text(X86)
    fp_asimd_crc32 = 1 << 0 | 1 << 1 | 1 << 7
    info = device_info.describe(machine="aarch64", cpuinfo_path=str(path), hwcaps=(fp_asimd_crc32, 0))
    assert info["cpuinfo_foreign"] is True and info["cpu_model"] == ""
    assert info["features"] == ["asimd", "crc32", "fp"]
    assert info["target"] == "llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+crc"
    imafdc = sum(1 << (ord(c) - ord("a")) for c in "imafdc")
    riscv = device_info.describe(machine="riscv64", cpuinfo_path=str(path), hwcaps=(imafdc, 0))
    assert riscv["target"].endswith("-mattr=+m,+a,+f,+d,+c")


def test_unknown_machine_and_missing_cpuinfo(tmp_path):
    info = device_info.describe(machine="s390x", cpuinfo_path=str(tmp_path / "absent"))
    assert info["target"] == "llvm" and info["features"] == []
    aarch64 = device_info.describe(machine="aarch64", cpuinfo_path=str(tmp_path / "absent"), hwcaps=(0, 0))
    assert aarch64["target"] == "llvm -mtriple=aarch64-linux-gnu -mattr=+neon"


def test_this_host_describes_itself():
    import os

    info = device_info.describe()
    assert info["machine"] == os.uname().machine
    assert info["target"].startswith("llvm")
    assert len(json.dumps(info)) < 4096     # fits easily in a tracker's UPDATE_INFO


LLVM_CHECK = textwrap.dedent("""
    import sys
    from kernelrpc.compiler import Target
    from kernelrpc.native.llvm import ensure_llvm
    llvm = ensure_llvm()
    for text in sys.argv[1:]:
        t = Target(text)
        llvm.Target.from_triple(t.triple).create_target_machine(cpu=t.cpu, features=t.features)
        print(t)
""")


def _documented_targets() -> list[str]:
    docs = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
    return re.findall(r"`(llvm -mtriple=[^`]+)`", docs.read_text())


def _every_table_entry() -> list[str]:
    """A target per CPU name device_info can report, and one per family with all its features."""
    targets = [f"llvm -mtriple=armv7-linux-gnueabihf -mcpu={cpu}" for cpu in device_info._ARM_PARTS.values()]
    targets += [f"llvm -mtriple=aarch64-linux-gnu -mcpu={cpu}" for part, cpu in device_info._ARM_PARTS.items()
                if part >= 0xd00]                                   # ARMv8 and later: 64-bit cores
    for triple, table in (("aarch64-linux-gnu", device_info._AARCH64_LLVM.values()),
                          ("x86_64-linux-gnu", device_info._X86_LLVM.values()),
                          ("riscv64-linux-gnu", [*device_info._RISCV_Z, *"mafdcv"])):
        targets.append(f"llvm -mtriple={triple} -mattr=" + ",".join(sorted({f"+{f}" for f in table})))
    return targets


def test_llvm_knows_every_cpu_and_feature_named():
    """LLVM only warns (on stderr) about an unknown -mcpu or -mattr name; there must be none:
    not in device_info's tables, not in what the sample boards report, not in docs/deploy.md."""
    documented = _documented_targets()
    assert len(documented) >= 10
    targets = [target for _, _, target in CASES] + documented + _every_table_entry()
    proc = subprocess.run([sys.executable, "-c", LLVM_CHECK, *targets], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "not a recognized" not in proc.stderr, proc.stderr
    assert len(proc.stdout.splitlines()) == len(targets)


def test_server_reports_its_device_to_the_tracker_and_the_session(start_service):
    from kernelrpc import rpc

    tracker = start_service("kernelrpc.tracker", ["--port", "0"])
    server = start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{tracker.port}",
                                                "--key", "host"])
    server.wait_for_line("registered key host")
    query = subprocess.run([sys.executable, "-m", "kernelrpc.query_rpc_tracker", "--port", str(tracker.port),
                            "--json"], capture_output=True, text=True, timeout=30)
    (entry,) = json.loads(query.stdout)["summary"]["server_info"]
    assert entry["device"] == device_info.describe()
    text = subprocess.run([sys.executable, "-m", "kernelrpc.query_rpc_tracker", "--port", str(tracker.port)],
                          capture_output=True, text=True, timeout=30).stdout
    assert "host" in text and "device" not in text           # TVM's text summary is unchanged
    with rpc.connect_tracker("127.0.0.1", tracker.port).request("host", session_timeout=30) as remote:
        assert remote.target() == device_info.describe()["target"]
        assert remote.device_info()["machine"] == entry["device"]["machine"]
    server.wait_for_line("session from .* finished")
    after = wait_until(lambda: (info := _server_info(tracker.port)).get("session") == "idle" and info,
                       timeout=30, what="the server reported idle again")
    assert after["device"] == entry["device"]       # later UPDATE_INFOs carry no "device": it stays


def _server_info(port: int) -> dict:
    from kernelrpc.rpc.tracker_client import connect_tracker

    with connect_tracker("127.0.0.1", port) as session:
        (entry,) = session.summary()["server_info"]
    return entry
