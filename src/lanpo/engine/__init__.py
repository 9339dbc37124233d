"""Models and generation: loading (GGUF included), batched generation on HF or vLLM, vLLM on CPU."""
