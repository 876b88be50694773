"""Block KV-cache managers (prefix-caching block pool) and trace-hash to engine-block mapping."""

from mocker.kv.manager import BlockKvManager, engine_block_keys

__all__ = ["BlockKvManager", "engine_block_keys"]
