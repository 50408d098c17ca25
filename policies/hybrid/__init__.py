"""KV-group managers of a hybrid model's allocator (vLLM's hybrid KV-cache manager): one manager per
KV group, each of one layer kind, all drawing blocks of one page size from one
:class:`~policies.hybrid.block_pool.SharedBlockPool`.

* ``full.py``: full attention keeps a block for every token (vLLM ``FullAttentionManager``).
* ``sliding_window.py``: a sliding-window group releases the blocks whose tokens fell out of the
  window (``SlidingWindowManager.remove_skipped_blocks``).
* ``chunked_local.py``: a chunked-local group releases the blocks before the current chunk
  (``ChunkedLocalAttentionManager``).
* ``mamba.py``: a Mamba / linear-attention group keeps one block, its state, per request
  (``MambaManager`` without prefix caching; a prefix-caching pool refuses it).
* ``prefix_pool.py``: with prefix caching, the pool's blocks keep identities (vLLM ``BlockPool``: cached
  blocks by hash and group, LRU free queue); ``block_tables.py``: a group's block ids per sequence.

The KV coordinator (``sim/kv/``) holds the groups; these managers never see each other.
"""
