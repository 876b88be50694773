"""mocker: simulated LLM inference engines (vLLM, SGLang, TensorRT-LLM schedulers with KV-cache state).

One core, several drivers: the scheduler and KV code take ``now_ms`` as an argument and never read a
clock. The virtual-time fleet (offline replay) and the live worker server (wall clock) drive it.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
