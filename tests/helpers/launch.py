"""`accelerate launch` of CPU processes for the multi-process tests.

Run as a script (``python launch.py SOCKET ACCELERATE-ARGS``) it is ``accelerate launch`` whose workers torchrun's
agent starts by forking the suite's zygote (tests/helpers/zygote.py) listening on SOCKET instead of starting fresh
interpreters: the same agent, rendezvous, environment, process groups and exit codes, without each worker's imports.
"""

from __future__ import annotations

import sys

from lanpo.engine.vllm_cpu import free_port  # an unused port the OS picks: each launch rendezvous on its own


def accelerate_launch(processes: int, *mode: str, zygote=None) -> list[str]:
    """The command that starts ``processes`` processes under ``accelerate launch``, before the script and its
    arguments. ``mode``: the launch mode's flags; by default ``--multi_gpu``, which starts them through torchrun
    (gloo on a machine without GPUs; ``--cpu`` would start a single process). ``zygote``: the workers are forked
    from it (see the module's doc)."""
    launcher = (
        [sys.executable, __file__, zygote.address] if zygote else [sys.executable, "-m", "accelerate.commands.launch"]
    )
    return [
        *launcher, *(mode or ("--multi_gpu",)),
        "--main_process_port", str(free_port()), "--num_processes", str(processes), "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
    ]  # fmt: skip


def launch_from_zygote(address: str, argv: list[str]) -> None:
    """``accelerate launch ARGV``, torchrun's workers forked from the zygote at ``address``."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler
    from zygote import Zygote

    zygote = Zygote.attach(address)
    subprocess_handler.Popen = lambda args, **kwargs: zygote.popen(list(args), **kwargs)
    from accelerate.commands.launch import main

    sys.argv = ["accelerate launch", *argv]
    main()


if __name__ == "__main__":
    launch_from_zygote(sys.argv[1], sys.argv[2:])
