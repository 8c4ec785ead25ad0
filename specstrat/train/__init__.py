"""Train an EAGLE-3-style draft head for any Hugging Face causal LM on a CPU budget.

:func:`train_head` generates the target's own responses to prompts (the license-clean
:func:`default_prompts` pool, or :func:`read_prompts` of a JSONL file) through specstrat's
engine, capturing the fused layers' hidden states and the LM head's input (the target's logits
on a reduced draft vocabulary are recomputed from it) while it generates
(:func:`generate_captured`), and trains an :class:`Eagle3Head` with training-time test;
:func:`evaluate` measures its chained agreement with the target; :func:`save_head` and
:func:`load_head` keep it in one safetensors file bound to the target's weights; a run writes a
:class:`Checkpoint` after each epoch and resumes from one (:func:`read_checkpoint`);
:func:`attach_head` attaches a saved head to a loaded model so the engine's EAGLE drafters run it.

:func:`train_draft_lm` distils a :class:`DraftLM` (a few of the target's own layers over a draft
vocabulary) on the same data path, for STANDALONE; :func:`save_draft_lm`, :func:`load_draft_lm`
and :func:`attach_draft` keep and attach it as a head is kept and attached.
:func:`train_block_lm` trains a :class:`BlockLM` (a draft LM that reads placeholders, so one
forward proposes a block) for DFLASH and DSPARK; :func:`load_block_lm` and :func:`attach_block`
keep and attach it.
"""

from specstrat.train._ttt import TTT_DECAY
from specstrat.train.agreement import Agreement, chained_conditional, evaluate
from specstrat.train.artifact import (
    FORMAT,
    HeadMismatch,
    TrainedHead,
    head_metadata,
    load_head,
    save_head,
    target_name,
    target_sha256,
)
from specstrat.train.attach import (
    SHIPPED_HEADS,
    Attachers,
    HeadAttacher,
    attach_head,
    chained,
    head_for,
    shipped_head,
)
from specstrat.train.block_lm import (
    BLOCK_LM_FORMAT,
    BlockLM,
    BlockVocabLM,
    PlaceholderEmbedding,
    block_batch,
    default_block_layers,
)
from specstrat.train.block_lm_loop import block_agreement, train_block_lm
from specstrat.train.capture import (
    CapturedData,
    CapturedSequence,
    Generation,
    capture,
    capture_sequences,
    check_layers,
    check_lm_head,
    default_layers,
    draft_vocab,
    raw_model,
    token_counts,
)
from specstrat.train.checkpoint import (
    CHECKPOINT_FORMAT,
    MAY_DIFFER,
    Checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from specstrat.train.draft_attach import (
    SHIPPED_BLOCKS,
    SHIPPED_DRAFTS,
    BlockAttacher,
    DraftAttacher,
    attach_block,
    attach_draft,
    attach_files,
    block_for,
    draft_for,
    reads_block,
    reads_draft_lm,
    shipped_draft,
    trained_files,
)
from specstrat.train.draft_lm import (
    DraftLM,
    DraftVocabLM,
    check_draft_layers,
    default_draft_layers,
)
from specstrat.train.draft_lm_file import (
    DRAFT_LM_FORMAT,
    TrainedDraftLM,
    block_lm_metadata,
    draft_lm_metadata,
    load_block_lm,
    load_draft_lm,
    save_draft_lm,
)
from specstrat.train.draft_lm_loop import draft_agreement, train_draft_lm
from specstrat.train.eagle3 import (
    Eagle3Config,
    Eagle3ContextDraftHead,
    Eagle3DraftHead,
    Eagle3Head,
)
from specstrat.train.generation import (
    GenerationCapturer,
    fitting_prompts,
    generate,
    generate_captured,
)
from specstrat.train.head_config import INITS, KINDS, HeadConfig
from specstrat.train.head_init import start_from_target
from specstrat.train.loop import train_head
from specstrat.train.prompt_documents import (
    SOURCE_MODULES,
    code_prompts,
    document_prompts,
    documents,
    rag_prompts,
)
from specstrat.train.prompt_kinds import CHAT_TOPICS, chat_prompts, math_prompts, passage_prompts
from specstrat.train.prompts import (
    STDLIB_MODULES,
    default_prompts,
    interleave,
    read_prompts,
    stdlib_prompts,
)
from specstrat.train.self_written import (
    WritingAsk,
    clean_document,
    clean_request,
    self_written_prompts,
    writing_asks,
)

__all__ = [
    "BLOCK_LM_FORMAT",
    "CHAT_TOPICS",
    "CHECKPOINT_FORMAT",
    "DRAFT_LM_FORMAT",
    "FORMAT",
    "INITS",
    "KINDS",
    "MAY_DIFFER",
    "SHIPPED_BLOCKS",
    "SHIPPED_DRAFTS",
    "SHIPPED_HEADS",
    "SOURCE_MODULES",
    "STDLIB_MODULES",
    "TTT_DECAY",
    "Agreement",
    "Attachers",
    "BlockAttacher",
    "BlockLM",
    "BlockVocabLM",
    "CapturedData",
    "CapturedSequence",
    "Checkpoint",
    "DraftAttacher",
    "DraftLM",
    "DraftVocabLM",
    "Eagle3Config",
    "Eagle3ContextDraftHead",
    "Eagle3DraftHead",
    "Eagle3Head",
    "Generation",
    "GenerationCapturer",
    "HeadAttacher",
    "HeadConfig",
    "HeadMismatch",
    "PlaceholderEmbedding",
    "TrainedDraftLM",
    "TrainedHead",
    "WritingAsk",
    "attach_block",
    "attach_draft",
    "attach_files",
    "attach_head",
    "block_agreement",
    "block_batch",
    "block_for",
    "block_lm_metadata",
    "capture",
    "capture_sequences",
    "chained",
    "chained_conditional",
    "chat_prompts",
    "check_draft_layers",
    "check_layers",
    "check_lm_head",
    "clean_document",
    "clean_request",
    "code_prompts",
    "default_block_layers",
    "default_draft_layers",
    "default_layers",
    "default_prompts",
    "document_prompts",
    "documents",
    "draft_agreement",
    "draft_for",
    "draft_lm_metadata",
    "draft_vocab",
    "evaluate",
    "fitting_prompts",
    "generate",
    "generate_captured",
    "head_for",
    "head_metadata",
    "interleave",
    "load_block_lm",
    "load_draft_lm",
    "load_head",
    "math_prompts",
    "passage_prompts",
    "rag_prompts",
    "raw_model",
    "read_checkpoint",
    "read_prompts",
    "reads_block",
    "reads_draft_lm",
    "save_checkpoint",
    "save_draft_lm",
    "save_head",
    "self_written_prompts",
    "shipped_draft",
    "shipped_head",
    "start_from_target",
    "stdlib_prompts",
    "target_name",
    "target_sha256",
    "token_counts",
    "train_block_lm",
    "train_draft_lm",
    "train_head",
    "trained_files",
    "writing_asks",
]
