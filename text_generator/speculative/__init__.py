"""Speculative decoding over forward_tensor: draft, verify in one pass, keep what the target agrees with.

adaptive.py    AdaptiveSpeculation: per-request draft lengths in the engine (stop, probe, grow back)
tree.py        DraftTree (a chain or a tree of drafted tokens) and the step's flat TreeBatch
drafters.py    Drafter protocol; NgramDrafter (prompt lookup), DraftModelDrafter (a small model)
eagle3.py      Eagle3Drafter (an EAGLE-3 head over the target's hidden states)
verify.py      greedy and rejection-sampling verification of a tree against the target's logits
decoder.py     SpeculativeDecoder (the loop for a caller that owns its requests); K/V compaction
engine_step.py the engine's speculative step (LLMEngine(..., speculative=drafter))
hidden_feed.py the target's hidden states from the engine's forwards to an EAGLE-3 drafter
"""

from text_generator.speculative.adaptive import AdaptiveSpeculation
from text_generator.speculative.decoder import (SpecStats, SpeculativeDecoder, commit_accepted,
                                                compact_accepted_kv)
from text_generator.speculative.drafters import DraftModelDrafter, Drafter, NgramDrafter
from text_generator.speculative.eagle3 import Eagle3Drafter
from text_generator.speculative.tree import DraftTree, TreeBatch, build_tree_batch
from text_generator.speculative.verify import TreeSampling, Verdict, target_probs, verify

__all__ = [
    "AdaptiveSpeculation", "DraftModelDrafter", "DraftTree", "Drafter", "Eagle3Drafter", "NgramDrafter", "TreeSampling", "SpecStats",
    "SpeculativeDecoder", "TreeBatch", "Verdict", "build_tree_batch", "commit_accepted",
    "compact_accepted_kv", "target_probs", "verify",
]
