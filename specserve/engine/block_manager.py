"""Paged KV block allocator with reference counts and prefix caching by chained block hashes.

Pure Python. Blocks are shared by the target's and the drafter's caches (same block table), so a prefix-cache
hit reuses both. A freed block keeps its hash until it is reallocated, so later requests can still hit it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from specserve.engine.request import Request


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] = field(default_factory=tuple)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # free blocks in eviction order (least recently freed first); values unused
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        # per request: hash of each full block already registered
        self.req_hashes: dict[str, list[int]] = {}
        self.drop_last_cached_block = (
            False  # EAGLE: drafter KV of a block's last slot depends on the next token
        )
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ---------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---------------------------------------------------------------- prefix cache
    @staticmethod
    def _hash(prev: int | None, tokens: tuple[int, ...]) -> int:
        return hash((prev, tokens))

    def match_prefix(self, req: Request) -> list[int]:
        """Cached blocks for the longest prefix of req.token_ids, leaving at least one token to compute."""
        if not self.enable_prefix_caching or req.params.prompt_logprobs is not None:
            return []  # as vLLM: a request for prompt logprobs computes its whole prompt
        bs = self.block_size
        max_blocks = (req.num_tokens - 1) // bs
        hits: list[int] = []
        prev: int | None = None
        for i in range(max_blocks):
            tokens = tuple(req.token_ids[i * bs : (i + 1) * bs])
            h = self._hash(prev, tokens)
            bid = self.hash_to_block.get(h)
            if bid is None or self.blocks[bid].token_ids != tokens:
                break
            hits.append(bid)
            prev = h
        if self.drop_last_cached_block and hits:
            hits.pop()
        return hits

    def allocate_prefix(self, req: Request, hits: list[int]) -> None:
        for bid in hits:
            b = self.blocks[bid]
            if b.ref_count == 0:
                self.free.pop(bid, None)
            b.ref_count += 1
        req.block_table = list(hits)
        req.num_computed_tokens = len(hits) * self.block_size
        req.num_cached_tokens = req.num_computed_tokens
        if self.enable_prefix_caching:
            self.prefix_queries += req.num_tokens
            self.prefix_hits += req.num_computed_tokens
        self.req_hashes[req.request_id] = [self.blocks[b].block_hash for b in hits]  # type: ignore[misc]

    def cache_full_blocks(self, req: Request) -> None:
        """Register blocks whose every position has computed KV (positions < num_computed_tokens)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        hashes = self.req_hashes.setdefault(req.request_id, [])
        # never past the known tokens: with async scheduling a computed position may hold a token not yet seen
        num_full = min(min(req.num_computed_tokens, req.num_tokens) // bs, len(req.block_table))
        prev = hashes[-1] if hashes else None
        for i in range(len(hashes), num_full):
            tokens = tuple(req.token_ids[i * bs : (i + 1) * bs])
            h = self._hash(prev, tokens)
            bid = req.block_table[i]
            blk = self.blocks[bid]
            if h not in self.hash_to_block:
                if blk.block_hash is not None and self.hash_to_block.get(blk.block_hash) == bid:
                    del self.hash_to_block[blk.block_hash]
                blk.block_hash, blk.token_ids = h, tokens
                self.hash_to_block[h] = bid
            hashes.append(h)
            prev = h

    # ---------------------------------------------------------------- allocation
    def can_allocate(self, req: Request, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) - len(req.block_table) <= len(self.free)

    def allocate(self, req: Request, num_tokens: int) -> bool:
        """Grow req's block table to cover num_tokens positions. False (and no change) if out of blocks."""
        need = self.blocks_needed(num_tokens) - len(req.block_table)
        if need <= 0:
            return True
        if need > len(self.free):
            return False
        for _ in range(need):
            bid, _ = self.free.popitem(last=False)
            blk = self.blocks[bid]
            if blk.block_hash is not None:
                if self.hash_to_block.get(blk.block_hash) == bid:
                    del self.hash_to_block[blk.block_hash]
                blk.block_hash, blk.token_ids = None, ()
            blk.ref_count = 1
            req.block_table.append(bid)
        return True

    def free_request(self, req: Request) -> None:
        # free in reverse so the tail of a sequence is evicted before its (more shareable) head
        for bid in reversed(req.block_table):
            blk = self.blocks[bid]
            blk.ref_count -= 1
            if blk.ref_count == 0:
                self.free[bid] = None
        req.block_table = []
        self.req_hashes.pop(req.request_id, None)

    def reset_prefix_cache(self) -> None:
        for bid in self.free:
            blk = self.blocks[bid]
            blk.block_hash, blk.token_ids = None, ()
        self.hash_to_block = {h: b for h, b in self.hash_to_block.items() if self.blocks[b].ref_count > 0}
