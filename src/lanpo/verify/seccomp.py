"""A seccomp filter for the sandbox: no kernel keyring can be reached from model code.

Keyrings are the kernel's own store of secrets, kept per uid and per session: two runs under one uid could pass
values through them (a key written by one rollout, read by the next), outside every namespace bubblewrap makes.
The filter answers ``add_key``, ``keyctl`` and ``request_key`` with ``EPERM`` for every ABI the machine can run
(x86-64, its i386 and x32 entry points, AArch64); every other system call is allowed. bubblewrap installs it
(``--seccomp FD``) just before it starts the runner, so every process of the run inherits it and none can lift it.

The program is classic BPF, built here without libseccomp (a few instructions, tested by running it).
"""

from __future__ import annotations

import errno
import struct

# BPF opcodes (linux/filter.h) and seccomp's return values (linux/seccomp.h)
LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
JUMP_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JUMP_AT_LEAST = 0x35  # BPF_JMP | BPF_JGE | BPF_K
RETURN = 0x06  # BPF_RET | BPF_K
ALLOW = 0x7FFF0000
DENY = 0x00050000 | errno.EPERM  # SECCOMP_RET_ERRNO | EPERM
NR_OFFSET, ARCH_OFFSET = 0, 4  # struct seccomp_data: int nr; __u32 arch; ...
X32_BIT = 0x40000000  # x32 system calls are x86-64's numbers with this bit set

# (audit architecture, add_key, request_key, keyctl, whether x32 calls enter through it)
KEYRING_CALLS = (
    (0xC000003E, (248, 249, 250), True),  # x86-64
    (0x40000003, (286, 287, 288), False),  # i386, also reachable from x86-64 (int 0x80)
    (0xC00000B7, (217, 218, 219), False),  # AArch64
)


def _instruction(code: int, jump_true: int = 0, jump_false: int = 0, k: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jump_true, jump_false, k)


def keyring_filter() -> bytes:
    """The filter program, as ``struct sock_filter`` entries (what ``bwrap --seccomp`` reads)."""
    program = [_instruction(LOAD_WORD, k=ARCH_OFFSET)]
    for arch, numbers, x32 in KEYRING_CALLS:
        block = [(LOAD_WORD, None, NR_OFFSET)]
        if x32:
            block.append((JUMP_AT_LEAST, "deny", X32_BIT))  # every x32 call: keyrings and the rest of its ABI
        block += [(JUMP_EQUAL, "deny", number) for number in numbers]
        block += [(RETURN, None, ALLOW), (RETURN, None, DENY)]
        deny = len(block) - 1
        program.append(_instruction(JUMP_EQUAL, 0, len(block), arch))  # not this architecture: skip its block
        for index, (code, target, k) in enumerate(block):
            jump = deny - index - 1 if target == "deny" else 0
            program.append(_instruction(code, jump, 0, k))
    program.append(_instruction(RETURN, k=ALLOW))  # an architecture of none of the above
    return b"".join(program)
