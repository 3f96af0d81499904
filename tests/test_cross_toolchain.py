"""Targets, toolchains and load-time checks for cross-built modules, without an emulator.

TVM target strings, the riscv64 ABI defaults, which toolchain links which triple, what a
missing toolchain says, the ``fcompile=`` hook (TVM's own ``cc`` helpers included), the
C runtime compiled per target, and ``load_module`` refusing files for another machine.
"""
from __future__ import annotations

import re
import struct
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, te
from kernelrpc.compiler.build import link_module
from kernelrpc.compiler.codegen import compile_ir
from kernelrpc.compiler.codegen.runtime_ir import RUNTIME_SOURCE
from kernelrpc.compiler.target import Target, TargetError, TargetOptionIgnored
from kernelrpc.deploy import toolchain
from kernelrpc.deploy.toolchain import ToolchainError, compiled_object, find_toolchain
from kernelrpc.errors import ModuleError
from kernelrpc.runtime import compat, load_module

ARM_NO_NEON = "llvm -mtriple=armv7-linux-gnueabihf -mattr=+vfp3d16,-neon"
#: Tests that link for another architecture with zig (the cross extra).
needs_zig = pytest.mark.skipif(not toolchain.zig_installed(),
                               reason="needs the cross extra: pip install '.[cross]'")


def _double(n=64, vector=True, parallel=False):
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    s = te.create_schedule(B.op)
    outer, inner = s[B].split(B.op.axis[0], factor=8)
    if vector:
        s[B].vectorize(inner)
    if parallel:
        s[B].parallel(outer)
    return s, [A, B]


# ---------------------------------------------------------------------- target strings

def test_tvm_target_strings_are_accepted_and_recorded():
    text = ("llvm -device=arm_cpu -mtriple=aarch64-linux-gnu -mattr=+neon -num-cores=4 "
            "-keys=arm_cpu,cpu -model=bcm2711 -libs=cblas -opt-level=2")
    with pytest.warns(TargetOptionIgnored) as caught:
        target = Target(text)
    ignored = sorted(re.search(r"-([a-z-]+)=", str(w.message)).group(1) for w in caught)
    assert ignored == ["device", "libs", "num-cores"]     # -keys/-model are labels only
    assert (target.triple, target.features, target.opt_level) == ("aarch64-linux-gnu", "+neon", 2)
    record = target.to_dict()
    assert record["labels"] == {"device": "arm_cpu", "keys": "arm_cpu,cpu", "model": "bcm2711",
                                "libs": "cblas", "num-cores": "4"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TargetOptionIgnored)
        assert Target(str(target)) == target
    assert Target(target, host="llvm").to_dict()["host"] == str(Target("llvm"))


def test_tvm_dict_and_json_targets():
    """TVM 0.27 spells targets as JSON/dicts; those work as they are."""
    doc = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72",
           "mattr": ["+neon"], "keys": ["arm_cpu", "cpu"], "opt-level": 3,
           "feature.has_asimd": True, "tag": "", "host": {"kind": "llvm"}}
    target = Target(doc)
    assert (target.triple, target.cpu, target.features, target.opt_level) == (
        "aarch64-linux-gnu", "cortex-a72", "+neon", 3)
    assert target.to_dict()["labels"] == {"keys": "arm_cpu,cpu"}
    assert target.to_dict()["host"] == str(Target("llvm"))
    import json
    assert Target(json.dumps(doc)) == target
    with pytest.raises(TargetError, match="kind 'llvm'"):
        Target({"kind": "cuda"})
    with pytest.raises(TargetError, match="unknown target option 'thing'"):
        Target({"kind": "llvm", "thing": 1})


@pytest.mark.tvm
def test_a_tvm_target_object_is_accepted():
    tvm = pytest.importorskip("tvm", reason="apache-tvm is not installed")
    with pytest.warns(TargetOptionIgnored, match="num-cores"):
        target = Target(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                                           "mattr": ["+neon"], "num-cores": 4},
                                          host={"kind": "llvm"}))
    assert (target.triple, target.features) == ("aarch64-linux-gnu", "+neon")
    assert target.to_dict()["labels"]["num-cores"] == "4" and target.to_dict()["host"]


def test_opt_level_of_the_target_is_the_build_default():
    s, args = _double()
    o0 = kernelrpc.build(s, args, target="llvm -opt-level=0", name="dbl")
    o3 = kernelrpc.build(s, args, target="llvm", name="dbl")
    assert "call i32 @dbl.impl" in o0.get_source("ll-opt")          # O0: nothing inlined
    assert "call i32 @dbl.impl" not in o3.get_source("ll-opt")


def test_riscv64_defaults_to_rv64gc_and_lp64d():
    target = Target("llvm -mtriple=riscv64-linux-gnu")
    assert (target.cpu, target.features, target.abi) == ("generic-rv64", "+m,+a,+f,+d,+c", "lp64d")
    assert Target("llvm -mtriple=riscv64-linux-gnu -mattr=+m,+a,+f").abi == "lp64f"
    assert Target("llvm -mtriple=riscv64-linux-gnu -mattr=+m,+a,+f,+d -mabi=lp64").abi == "lp64"
    obj = compile_ir(["define void @f() { ret void }"], target).object_code
    assert struct.unpack_from("<I", obj, 48)[0] & 0x6 == 0x4      # e_flags: double-float ABI


@pytest.mark.parametrize("text,message", [
    ("llvm -mtriple=armv7-linux-gnueabihf -mfloat-abi=soft", "contradicts the triple"),
    ("llvm -mtriple=armv7-linux-gnueabi -mfloat-abi=hard", "contradicts the triple"),
    ("llvm -mfloat-abi=fancy", "must be hard, soft or softfp"),
    ("llvm -opt-level=9", "must be 0, 1, 2 or 3"),
])
def test_contradictory_target_options(text, message):
    with pytest.raises(TargetError, match=message):
        Target(text)


def test_32bit_targets_use_32bit_size_t_and_pointer_slots():
    n = 40_000                      # the intermediate goes to the heap: the pool's alloc(size_t)
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((n,), lambda i: B[i] * B[n - 1 - i], name="C")
    s = te.create_schedule(C.op)
    arm = kernelrpc.build(s, [A, C], target=ARM_NO_NEON, name="f")
    assert "declare noalias ptr @__kernelrpc_workspace_alloc(i32)" in arm.get_source()
    assert re.search(r"load ptr, ptr %\S+, align 4", arm.get_source())
    host = kernelrpc.build(s, [A, C], name="f")
    assert "declare noalias ptr @__kernelrpc_workspace_alloc(i64)" in host.get_source()


def test_the_vfp3d16_target_emits_no_neon_and_the_neon_target_does():
    s, args = _double(256)
    plain = kernelrpc.build(s, args, target=ARM_NO_NEON, name="dbl").get_source("asm")
    neon = kernelrpc.build(s, args, target="llvm -mtriple=armv7-linux-gnueabihf -mattr=+neon",
                           name="dbl").get_source("asm")
    simd = re.compile(r"\bq\d+\b|vld1|vst1")
    assert not simd.search(plain) and simd.search(neon)


# ---------------------------------------------------------------------- toolchains

def test_host_target_links_with_the_host_cc():
    chain = find_toolchain(Target())
    assert chain.argv == tuple(toolchain.find_host_cc()) and chain.libc == "glibc"


@pytest.mark.cross
@pytest.mark.parametrize("text,zig_target,floor", [
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", "aarch64-linux-gnu.2.17", "2.17"),
    (ARM_NO_NEON, "arm-linux-gnueabihf.2.17", "2.17"),
    ("llvm -mtriple=riscv64-linux-gnu", "riscv64-linux-gnu.2.27", "2.27"),
])
@needs_zig
def test_cross_targets_link_with_zig_pinned_to_an_old_glibc(text, zig_target, floor,
                                                            monkeypatch):
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)   # no cross gcc here
    chain = find_toolchain(Target(text))
    assert chain.name == "zig cc" and chain.argv[-1] == zig_target
    assert chain.libc == f"glibc>={floor}"


@pytest.mark.cross
@needs_zig
def test_the_arm_runtime_is_compiled_for_the_triples_baseline(monkeypatch):
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)
    v6 = find_toolchain(Target("llvm -mtriple=armv6-linux-gnueabihf"))
    v7 = find_toolchain(Target("llvm -mtriple=armv7-linux-gnueabihf -mattr=+neon"))
    assert v6.runtime_flags == ("-mcpu=arm1176jzf_s",)
    assert v7.runtime_flags == ("-mcpu=generic+v7a+vfp3d16-neon",)      # no NEON: any armhf


def test_a_cross_gcc_on_path_is_preferred(tmp_path, monkeypatch):
    gcc = tmp_path / "aarch64-linux-gnu-gcc"
    gcc.write_text("#!/bin/sh\nexit 1\n")
    gcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    chain = find_toolchain(Target("llvm -mtriple=aarch64-linux-gnu"))
    assert chain.name == "aarch64-linux-gnu-gcc" and chain.argv == (str(gcc),)


def test_a_missing_cross_toolchain_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain, "zig_installed", lambda: False)
    monkeypatch.setenv("PATH", str(tmp_path))
    s, args = _double()
    module = kernelrpc.build(s, args, target="llvm -mtriple=aarch64-linux-gnu", name="dbl")
    with pytest.raises(ToolchainError) as info:
        module.export_library(tmp_path / "dbl.so")
    message = str(info.value)
    assert "pip install ziglang" in message
    assert "aarch64-linux-gnu-gcc" in message and "gcc-aarch64-linux-gnu" in message
    # TVM's hook still works then: fcompile gets the runtime as C source to compile
    seen = []
    module.export_library(tmp_path / "dbl.so", fcompile=lambda out, objs: seen.append(objs))
    assert seen[0][0].endswith(".o") and seen[0][-1] == str(RUNTIME_SOURCE)


def test_soft_float_arm_and_other_oses_have_no_toolchain():
    for text in ("llvm -mtriple=armv7-linux-gnueabi", "llvm -mtriple=aarch64-apple-darwin"):
        with pytest.raises(ToolchainError, match="fcompile="):
            find_toolchain(Target(text))
    with pytest.raises(ToolchainError, match="riscv64 Linux C libraries are lp64d"):
        find_toolchain(Target("llvm -mtriple=riscv64-linux-gnu -mattr=+m,+a,+c"))


def test_runtime_object_is_compiled_once_per_toolchain(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELRPC_CACHE_DIR", str(tmp_path))
    chain = find_toolchain(Target())
    first = compiled_object(chain, RUNTIME_SOURCE)
    assert first.parent == tmp_path / "objects" and first.read_bytes()[:4] == b"\x7fELF"
    stamp = first.stat().st_mtime_ns
    assert compiled_object(chain, RUNTIME_SOURCE) == first and first.stat().st_mtime_ns == stamp
    other = toolchain.Toolchain(chain.name, chain.argv, runtime_flags=("-O1",))
    assert compiled_object(other, RUNTIME_SOURCE) != first


def test_a_cached_object_is_compiled_again_when_its_source_or_a_header_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELRPC_CACHE_DIR", str(tmp_path / "cache"))
    chain = find_toolchain(Target())
    (tmp_path / "my dir").mkdir()
    header = tmp_path / "my dir" / "value.h"
    source = tmp_path / "my dir" / "value.c"
    header.write_text("#define VALUE 1\n")
    source.write_text('#include "value.h"\nint value(void) { return VALUE; }\n')

    def compiled():
        path = compiled_object(chain, source)
        return path, path.stat().st_mtime_ns, path.read_bytes()

    path, stamp, first = compiled()
    assert compiled()[1] == stamp                                # unchanged: the cached object
    header.write_text("#define VALUE 2\n")
    _, stamp2, second = compiled()
    assert stamp2 != stamp and second != first                   # the header changed
    source.write_text('#include "value.h"\nint value(void) { return VALUE + 1; }\n')
    _, stamp3, third = compiled()
    assert stamp3 != stamp2 and third != second                  # the source changed
    path.write_bytes(b"damaged")
    assert compiled()[2] == third                                # a damaged entry is rebuilt


def test_make_dependencies_are_parsed_with_escaped_spaces():
    rule = "/tmp/x.o: /a\\ b/x.c \\\n /a\\ b/h.h /c/$$d.h\n"
    assert toolchain._make_dependencies(rule) == [Path("/a b/x.c"), Path("/a b/h.h"), Path("/c/$d.h")]


def test_compile_errors_in_the_runtime_are_reported(tmp_path):
    bad = tmp_path / "broken.c"
    bad.write_text("this is not C\n")
    with pytest.raises(ToolchainError, match="compiling broken.c failed"):
        find_toolchain(Target()).compile_c(bad, tmp_path / "broken.o")


@pytest.mark.tvm
def test_tvm_create_shared_as_fcompile(tmp_path):
    cc = pytest.importorskip("tvm.support.cc", reason="apache-tvm is not installed")
    s, args = _double(parallel=True)
    module = kernelrpc.build(s, args, name="dbl")
    path = module.export_library(tmp_path / "dbl.so", fcompile=cc.create_shared)
    loaded = load_module(path)
    assert loaded.target["toolchain"] == "fcompile"
    a = nd.array(np.arange(64, dtype=np.float32))
    b = nd.empty((64,), "float32")
    loaded["dbl"](a, b)
    np.testing.assert_array_equal(b.numpy(), np.arange(64) * 2.0)


@pytest.mark.cross
@pytest.mark.tvm
@needs_zig
def test_tvm_cross_compiler_compiles_the_runtime_source(tmp_path, monkeypatch):
    """With no kernelrpc toolchain, TVM's ``cross_compiler`` gets module_runtime.c and
    compiles it for the target itself; the result is a complete aarch64 module."""
    cc = pytest.importorskip("tvm.support.cc", reason="apache-tvm is not installed")
    monkeypatch.setattr(toolchain, "zig_installed", lambda: False)
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)
    s, args = _double(parallel=True)
    module = kernelrpc.build(s, args, target="llvm -mtriple=aarch64-linux-gnu", name="dbl")
    zig = tmp_path / "aarch64-zig-cc"     # TVM runs one program: a wrapper around zig cc
    zig.write_text(f'#!/bin/sh\nexec {sys.executable} -m ziglang cc '
                   f'-target aarch64-linux-gnu.2.17 "$@"\n')
    zig.chmod(0o755)
    fcompile = cc.cross_compiler(str(zig), options=["-O2", "-lpthread"])
    path = module.export_library(tmp_path / "dbl.so", fcompile=fcompile)
    with open(path, "rb") as f:
        info = compat.read_elf(f)
    assert (info.machine, info.bits, info.elf_type) == (183, 64, 3)
    with pytest.raises(compat.WrongArchitectureError, match="built for aarch64-linux-gnu"):
        load_module(path)


# ---------------------------------------------------------------------- load-time checks

@pytest.mark.cross
@needs_zig
def test_load_module_refuses_a_module_for_another_architecture(tmp_path):
    s, args = _double()
    for text, arch in (("llvm -mtriple=aarch64-linux-gnu", "aarch64"),
                       (ARM_NO_NEON, "armv7"), ("llvm -mtriple=riscv64-linux-gnu", "riscv64")):
        path = kernelrpc.build(s, args, target=text, name="dbl").export_library(
            tmp_path / f"{arch}.so")
        with pytest.raises(compat.WrongArchitectureError) as info:
            load_module(path)
        assert isinstance(info.value, ModuleError)
        assert f"built for {Target(text).triple}" in str(info.value)
        assert "this device is x86_64" in str(info.value) or compat.this_process().machine != 62


def test_load_module_refuses_cpu_features_this_cpu_lacks(tmp_path):
    features = compat.cpu_features()
    if features is None or compat.this_process().machine != 62:
        pytest.skip("needs an x86-64 host whose /proc/cpuinfo lists its flags")
    lacking = next((f for f in ("avx512f", "avx512fp16", "amx-tile", "avx2", "fma")
                    if not features.intersection(compat._FEATURE_NAMES["x86_64"][f])), None)
    if lacking is None:
        pytest.skip("this CPU has every feature the test could ask for")
    s, args = _double()
    module = kernelrpc.build(s, args, target=f"llvm -mcpu=x86-64 -mattr=+{lacking}", name="dbl")
    path = module.export_library(tmp_path / "f.so")
    with pytest.raises(compat.MissingCPUFeaturesError,
                       match=rf"needs CPU features \+{lacking} that this device lacks"):
        load_module(path)


def test_load_module_refuses_a_newer_glibc_floor(tmp_path, monkeypatch):
    s, args = _double()
    module = kernelrpc.build(s, args, name="dbl")
    target = module.target
    metadata = dict(module.metadata)
    path = tmp_path / "new.so"
    link_module(path, module._compiled.object_code, metadata, target)
    load_module(path)                                    # the host's own glibc: fine
    newer = toolchain.Toolchain("cc", tuple(toolchain.find_host_cc()), libc="glibc>=99.0")
    monkeypatch.setattr(toolchain, "find_toolchain", lambda t: newer)
    link_module(tmp_path / "newer.so", module._compiled.object_code, metadata, target)
    with pytest.raises(compat.LibcTooOldError, match=r"needs glibc>=99.0; this device has glibc"):
        load_module(tmp_path / "newer.so")


def test_elf_reader_survives_truncated_and_hostile_headers(tmp_path):
    s, args = _double()
    good = kernelrpc.build(s, args, name="dbl").export_library(tmp_path / "good.so").read_bytes()
    for cut in (3, 16, 40, 63, 64, 200):
        (tmp_path / "cut.so").write_bytes(good[:cut])
        with pytest.raises(ModuleError, match="cannot load"):
            load_module(tmp_path / "cut.so")
    hostile = bytearray(good)
    struct.pack_into("<Q", hostile, 0x28, 1 << 62)                       # e_shoff
    struct.pack_into("<HHH", hostile, 0x3A, 64, 0xFFFF, 0xFFFE)          # shentsize..shstrndx
    (tmp_path / "hostile.so").write_bytes(bytes(hostile))
    with open(tmp_path / "hostile.so", "rb") as f:
        assert compat.read_elf(f, with_sections=True).sections == ()


@pytest.mark.cross
@needs_zig
def test_a_device_server_refuses_a_module_for_another_board(start_service, tmp_path):
    """Uploaded to this (x86-64) server, an aarch64 module fails at load with the typed
    error's message instead of "cannot open shared object file", and the session goes on."""
    from kernelrpc import rpc

    if compat.this_process().machine != 62:
        pytest.skip("the message checked names an x86-64 device")
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev"])
    s, args = _double()
    path = kernelrpc.build(s, args, target="llvm -mtriple=aarch64-linux-gnu",
                           name="dbl").export_library(tmp_path / "dbl.so")
    with rpc.connect(server.host, server.port, key="dev") as session:
        session.upload(str(path), "dbl.so")
        with pytest.raises(kernelrpc.RemoteError,
                           match=r"WrongArchitectureError: dbl.so was built for "
                                 r"aarch64-linux-gnu .*; this device is x86_64"):
            session.load_module("dbl.so")
        assert session.get_function("testing.echo")(7) == 7
