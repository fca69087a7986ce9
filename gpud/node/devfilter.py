"""Device isolation on cgroup v2: an eBPF device program attached to a task's cgroup.

cgroup v2 has no devices controller; systemd (DeviceAllow=) and Slurm's
cgroup/v2 plugin attach a ``BPF_PROG_TYPE_CGROUP_DEVICE`` program instead,
which the kernel asks on every open or mknod of a device by a process in the
group (and its children). This module builds such a program from a small
rule, loads it with the ``bpf`` system call and attaches it with
``BPF_F_ALLOW_MULTI``, so the programs of the groups above still apply too.

The rule: for each character-device major listed, only the listed minors
may be used (an empty list: none); every other device is left as the
groups above allow it. The program stays attached until the group is
removed.
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Mapping

# The bpf system call's number per architecture, and the commands and constants it takes (linux/bpf.h).
_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}
BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2
BPF_DEVCG_DEV_CHAR = 2

# Instruction opcodes used (class | operation | source).
_LDX_W = 0x61       # dst = *(u32 *)(src + off)
_AND_K = 0x57       # dst &= imm
_MOV_K = 0xB7       # dst = imm
_JA = 0x05          # goto +off
_JEQ_K = 0x15       # if dst == imm goto +off
_JNE_K = 0x55       # if dst != imm goto +off
_EXIT = 0x95


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("regs", ctypes.c_uint8), ("off", ctypes.c_int16), ("imm", ctypes.c_int32)]


class _LoadAttr(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32), ("insns", ctypes.c_uint64),
                ("license", ctypes.c_uint64), ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32), ("prog_flags", ctypes.c_uint32),
                ("pad", ctypes.c_uint8 * 96)]


class _AttachAttr(ctypes.Structure):
    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_bpf_fd", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32), ("pad", ctypes.c_uint8 * 112)]


def program(allowed: Mapping[int, tuple[int, ...]]) -> list[tuple[int, int, int, int, int]]:
    """The program's instructions as (code, dst, src, off, imm); ``off`` may be a label: "allow" or "deny".

    r1 points at ``struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32 minor;}``;
    the low 16 bits of access_type are the device type. The program returns 1 to allow, 0 to deny.
    """
    code: list[tuple[int, int, int, int | str, int]] = [
        (_LDX_W, 2, 1, 0, 0), (_AND_K, 2, 0, 0, 0xFFFF), (_JNE_K, 2, 0, "allow", BPF_DEVCG_DEV_CHAR),
        (_LDX_W, 3, 1, 4, 0), (_LDX_W, 4, 1, 8, 0)]
    for major, minors in sorted(allowed.items()):
        code.append((_JNE_K, 3, 0, len(minors) + 1, major))  # not this major: over its minors and the deny
        code.extend((_JEQ_K, 4, 0, "allow", minor) for minor in minors)
        code.append((_JA, 0, 0, "deny", 0))
    allow = len(code)
    code += [(_MOV_K, 0, 0, 0, 1), (_EXIT, 0, 0, 0, 0)]
    deny = len(code)
    if allowed:  # the verifier refuses code no path reaches
        code += [(_MOV_K, 0, 0, 0, 0), (_EXIT, 0, 0, 0, 0)]
    resolved = []
    for pc, (op, dst, src, off, imm) in enumerate(code):
        if isinstance(off, str):
            off = (allow if off == "allow" else deny) - pc - 1
        resolved.append((op, dst, src, off, imm))
    return resolved


def _bpf(command: int, attr: ctypes.Structure) -> int:
    number = _BPF_SYSCALL.get(platform.machine())
    if number is None:
        raise OSError(f"no bpf system call known on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(number, command, ctypes.byref(attr), ctypes.sizeof(attr))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf: {os.strerror(err)}")
    return result


def _load(allowed: Mapping[int, tuple[int, ...]]) -> int:
    code = program(allowed)
    insns = (_Insn * len(code))(*(_Insn(op, dst | (src << 4), off, imm) for op, dst, src, off, imm in code))
    license = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = _LoadAttr(prog_type=BPF_PROG_TYPE_CGROUP_DEVICE, insn_cnt=len(code),
                     insns=ctypes.addressof(insns), license=ctypes.addressof(license),
                     log_level=1, log_size=len(log), log_buf=ctypes.addressof(log))
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except OSError as exc:
        detail = log.value.decode(errors="replace").strip()
        raise OSError(exc.errno, f"{exc.strerror}{': ' + detail if detail else ''}") from None


def restrict(group: str, allowed: Mapping[int, tuple[int, ...]]) -> None:
    """Let the processes of cgroup v2 directory ``group`` use, of each listed char major, only the listed minors.

    Raises OSError when the kernel refuses (no bpf, not allowed, a group
    above attached a program that may not be combined with others).
    """
    prog = _load(allowed)
    try:
        target = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _bpf(BPF_PROG_ATTACH, _AttachAttr(target_fd=target, attach_bpf_fd=prog,
                                               attach_type=BPF_CGROUP_DEVICE, attach_flags=BPF_F_ALLOW_MULTI))
        finally:
            os.close(target)
    finally:
        os.close(prog)  # the attachment keeps the program alive


_usable: bool | None = None


def usable() -> bool:
    """True when this host loads device programs (checked once per process by loading one)."""
    global _usable
    if _usable is None:
        try:
            os.close(_load({}))
            _usable = True
        except OSError:
            _usable = False
    return _usable
