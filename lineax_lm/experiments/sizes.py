"""The hybrid-ratio study's grid and sizes: which cells there are, and each cell's training config.

Cells: the six linear mixers of the study (HGRN, HGRN-2, RetNet, GLA, DeltaNet, Gated DeltaNet) at
linear:attention ratios 24:1, 12:1, 6:1, 3:1 and pure, plus the Transformer (31 cells). Attention
layers are placed by `spread_attention_layers` (the ratio's share of attention at the depth), so at
the study's depth of 24 layers the four hybrid ratios are four different models: 1, 2, 3 and 6
attention layers (effective 23:1, 11:1, 7:1, 3:1; the periodic placement gives 24:1 and 12:1 one
layer each).

Recipes at the `small` size (docs/hybrid_study.md says which claim each choice could flip):
  small              the papers' recipe: attention layers without short convolutions (each linear
                     mixer with its own fla layer's: DeltaNet and Gated DeltaNet convolve q, k, v;
                     HGRN, HGRN-2, GLA and RetNet do not), text only, recall scored zero-shot.
  small_recall       `small` with half the training rows synthetic MQAR rows of loss weight 8
                     (recall trained, reported apart from `small`).
  small_conv_recall  `small_recall` with short convolutions on the attention layers' q, k and v:
                     the ablation the committed results/hybrid_small_conv_recall cells ran.
Each is 24 layers of width 256 (4 attention heads of 64; each mixer's heads and expansions as at
340M, widths scaled by 256 / 1024), byte tokenizer (vocabulary 259), 1,024-byte rows, 16 rows a
step, 31.5M tokens (1,920 steps), lr 2e-3, on the SmolLM2 teacher samples shipped in
corpora/smollm2_samples (6.25 MB of text: about 1.6M SmolLM2 tokens, so a BPE tokenizer would see
it twenty times in this budget; the byte level keeps it near five passes). The recall rows, where a
recipe has them: MQAR rows of eight packed examples, 64 x 4 and 64 x 8 twice each, 128 x 16 twice,
256 x 16 and 256 x 32 (length x key-value pairs), each queried value of loss weight 8, so 15.7M
tokens of text. On one H200 (results/hybrid_small_conv_recall) 26 of the 31 conv-recall cells
learnt MQAR from those rows (training loss below 2.0 by step 600-1,400); pure HGRN, HGRN-2,
RetNet and GLA and HGRN 24:1 never did.
Seeds: `small` and `small_recall` train Gated DeltaNet, HGRN-2, RetNet, GLA and the Transformer
at seeds 0, 1 and 2 (`SEEDED_MIXERS`), HGRN and DeltaNet at seed 0; a cell of seed s > 0 is
"<cell>_s<s>". RULER-style tasks are scored as RULER scores them (greedy generation,
string_match_all) at lengths inside the 1,024-token training rows.

Sizes:
  tiny   the test's: 2 layers of width 32, 8 rows of 64 tokens, 6 steps, the reference op backend, two
         cells (Gated DeltaNet 3:1 and the Transformer), a corpus sampled from the random tiny teacher,
         a quarter of the rows synthetic recall rows (MQAR rows of two packed examples, 32 x 4
         and 32 x 8, weight 8).
  340m   the papers' 340M presets (lineax_lm.models.presets: 24 layers, width 1024, vocabulary
         32,000), 20B tokens, 2,048-token rows x 256 rows a step (0.5M tokens), lr 3e-4 cosine to 10%,
         AdamW (b2 0.95, weight decay 0.1), bf16, on a corpus you name (fineweb-edu).
  1.3b   the 1.3B presets (width 2048), 100B tokens, otherwise as 340m (lr 2e-4).
  medium the hybrid study's first medium step, a pilot of three cells (Gated DeltaNet 3:1, Gated
         DeltaNet pure, the Transformer; seed 0) in the papers' recipe (text only, attention without
         short convolutions): 24 layers of width 512 (8 attention heads of 64; each mixer's heads
         and expansions as at 340M with widths scaled by 512 / 1024: Gated DeltaNet 2 heads of
         128), tied embeddings, the SmolLM2 teacher's BPE tokenizer (vocabulary 49,152, the
         corpus's tokenizer/): 107.0-107.1M parameters a cell, 25.2M of them the embedding.
         2,048-token rows x 48 a step (98,304 tokens; four micro-steps of 12 rows), 1,024 steps:
         100.7M tokens. AdamW lr 1e-3, cosine to 10% after 32 warmup steps: `small`'s 2e-3 at
         width 256 halved for twice the width (Adam's stable rate falls about as 1 / width; the
         papers' 3e-4 at width 1,024 sits a little below that line), and a run of 1,024 steps
         needs the rate high early (`small`: recall formed only while it was). A checkpoint every
         256 steps (25.2M tokens), all kept; the needle curve (scoring.score_needle_curve) scores
         each. Scores: held-out perplexity and bits per byte (64 documents), the needle tasks
         niah_single / multikey / multivalue / multiquery at 512, 1,024 and 2,048 tokens (inside
         the rows), 50 examples each, generated and scored as RULER does; no MQAR (its keys and
         values are ids 0-255, bytes only to the byte tokenizer). The corpus, sampled from the
         teacher on the GPU into <out>/corpus (launch/medium_pilot_h200.sh's first stage, `python
         -m lineax_lm.experiments.corpus --size medium`): 64 shards of 1,024 samples of at most 512
         teacher tokens (about 390 on average, as in the shipped corpus: about 25M tokens), each
         shard's samples joined into documents of at least 2,048 tokens (packed rows restart
         positions at every document: unjoined ~400-token samples would leave the positions the
         needles at 1,024 and 2,048 tokens sit at untrained), and 256 held-out samples of their
         own seed (about 48 documents): 100.7M tokens are about four passes, about what repeated
         data costs little at (Muennighoff et al., 2023, "Scaling Data-Constrained Language
         Models": up to four epochs nearly as good as unique data).
  medium_slice  the ratio slice at the medium size: Gated DeltaNet and HGRN-2 at every ratio and
         the Transformer (11 cells; the pilot's three among them, on the same budget, so a run in
         the pilot's folder reuses them). The grid runs it only where the pilot passed the slice
         gate (claims.slice_gate: the Transformer's niah_single at 1,024 tokens reaches 0.3).
"""
from __future__ import annotations

import dataclasses

import ml_collections

from lineax_lm.models.placement import effective_ratio
from lineax_lm.models.presets import MIXER_SIZES, model_config
from lineax_lm.train.config import lm_config

MIXERS = ("hgrn", "hgrn2", "retention", "gla", "deltanet", "gated_deltanet")
LABELS = {"hgrn": "HGRN", "hgrn2": "HGRN-2", "retention": "RetNet", "gla": "GLA",
          "deltanet": "DeltaNet", "gated_deltanet": "Gated DeltaNet", "transformer": "Transformer"}
RATIOS = ("24:1", "12:1", "6:1", "3:1", "pure")
TRANSFORMER = ("transformer", "transformer")
# Size.tokenizer of a size whose corpus brings its own: the teacher's tokenizer.json that
# lineax_lm.experiments.corpus writes into <corpus>/tokenizer (cells.corpus_data names it).
CORPUS_TOKENIZER = "corpus"
SMOLLM2_VOCAB = 49152                 # the SmolLM2 teacher's BPE vocabulary
# The mixers a seeded recipe trains at every seed (the rest at seed 0 only): the study's two
# recommended hybrids (HGRN-2, Gated DeltaNet), the two it ranks apart (RetNet, GLA), the baseline.
SEEDED_MIXERS = ("gated_deltanet", "hgrn2", "retention", "gla", "transformer")


@dataclasses.dataclass(frozen=True)
class Size:
  """One size of the study: model, data and budget, and how each cell is evaluated."""
  name: str
  num_layers: int
  hidden: int
  heads: int
  seq_len: int
  batch: int
  tokens: int
  lr: float
  grad_accum: int = 1                  # micro-steps a step's rows are split into (one at a time)
  preset_scale: str | None = None      # "340m" / "1.3b": the presets; None: the widths here
  tokenizer: str = "byte"              # "byte", CORPUS_TOKENIZER, or "" (the data config names it)
  vocab_size: int = 259                # the model's: the byte tokenizer's 259, a BPE's vocabulary
  tie_embeddings: bool = False
  backend: str = "auto"
  # short convolutions on the attention layers' q, k and v (as every linear mixer here has on its
  # own): at a few million tokens plain attention forms no previous-token head, so it cannot look
  # a key up, while a convolution hands it the previous token (the quickstart's finding)
  attn_short_conv: bool = False
  cells: tuple = ()                    # () : every mixer x ratio and the Transformer
  seeds: tuple = (0,)                  # SEEDED_MIXERS' cells at each; every other cell at seed 0
  corpus: str = ""                     # the grid's default corpus: a folder of corpora/; "": none
  # The make_corpus arguments (lineax_lm.experiments.corpus) of a corpus sampled from a teacher
  # into <out>/corpus, then the grid's default corpus; None: `corpus` above.
  sampled_corpus: dict | None = None
  # data.recall_mix (lineax_lm.data.recall_mix): the share of training rows that are synthetic
  # in-context retrieval rows, their kinds and the key-value pairs of an MQAR row; 0: text only
  recall_fraction: float = 0.0
  recall_kinds: str = "mqar,kv_text"
  recall_mqar_kv_pairs: int = 32
  recall_mqar_loss_weight: int = 1
  recall_mqar_shapes: str = ""         # "": one example of recall_mqar_kv_pairs a row
  # evaluation
  ppl_documents: int = 64              # held-out documents scored
  ruler_tasks: tuple = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery",
                        "vt", "cwe", "fwe")
  ruler_lengths: tuple = (1024, 2048, 4096)
  ruler_examples: int = 8
  ruler_mode: str = "generate"         # RULER's scoring (lineax_lm.eval.ruler)
  mqar: tuple = ((512, 16), (512, 64))  # (sequence length, key-value pairs), on a test seed
  mqar_examples: int = 64
  eval_batch: int = 8
  eval_length: int | None = 8192       # every scored row padded to this (one compile); None: buckets
  efficiency_lengths: tuple = (4096, 32768)
  # A checkpoint every this many training tokens, every one kept, and the needle tasks (the
  # niah_* of ruler_tasks) scored at each (the needle curve, scoring.score_needle_curve); 0: the
  # checkpoints of a plain cell, only the final one kept.
  checkpoint_tokens: int = 0
  # The slice gate (claims.slice_gate): claims.md reports it where `reports_gate`; a size that
  # `needs_gate` runs only where the gate passes on the cells already in its --out (the pilot's).
  reports_gate: bool = False
  needs_gate: bool = False


_SMALL = dict(num_layers=24, hidden=256, heads=4, seq_len=1024, batch=16, tokens=1920 * 16 * 1024,
              lr=2e-3, corpus="smollm2_samples", mqar=((128, 16), (512, 16), (512, 64)))
# Half the rows synthetic recall rows, each packing eight MQAR examples, most of them short and
# easy (what forms the lookup first; 104 queries of weight 8: about a text row's 1,024 tokens);
# 1,920 steps: a 24-layer model's MQAR loss drops only after 650-950 steps while the learning rate
# is still high (the Transformer last); 640 or 1,280 steps of cosine decay left the Transformer at
# chance (docs/hybrid_study.md).
_RECALL_ROWS = dict(recall_fraction=0.5, recall_kinds="mqar", recall_mqar_loss_weight=8,
                    recall_mqar_shapes="64x4,64x4,64x8,64x8,128x16,128x16,256x16,256x32")

# The medium pilot and its ratio slice: one budget, so the slice's run in the pilot's
# --out reuses the pilot's three cells. 48 rows of 2,048 tokens a step, 1,024 steps (100.7M
# tokens), a kept checkpoint every 256 steps (25.2M tokens: the needle curve's marks). A step's
# rows go through in four micro-steps of 12: attention over packed rows takes a dense mask, so
# XLA's kernel (not cuDNN's flash one) keeps every layer's float32 probabilities for the backward
# pass, 48 x 8 heads x 2,048^2 x 4 bytes = 6 GiB a layer at 48 rows, 1.5 GiB at 12 (the small
# grid's Transformer peaks 6.6 GiB above its pure Gated DeltaNet on the H200: 24 x 16 x 4 x
# 1,024^2 x 4 bytes is 6 GiB).
_MEDIUM_STEP_TOKENS = 48 * 2048
_MEDIUM = dict(
    num_layers=24, hidden=512, heads=8, seq_len=2048, batch=48, tokens=1024 * _MEDIUM_STEP_TOKENS,
    lr=1e-3, grad_accum=4, tokenizer=CORPUS_TOKENIZER, vocab_size=SMOLLM2_VOCAB,
    tie_embeddings=True,
    sampled_corpus=dict(teacher="smollm2", shards=64, docs_per_shard=1024, heldout_docs=256,
                        max_new_tokens=512, batch_size=512, join_tokens=2048),
    checkpoint_tokens=256 * _MEDIUM_STEP_TOKENS, ppl_documents=64,
    ruler_tasks=("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery"),
    ruler_lengths=(512, 1024, 2048), ruler_examples=50, mqar=(), eval_batch=16, eval_length=2048,
    reports_gate=True)

SIZES = {
    "tiny": Size("tiny", num_layers=2, hidden=32, heads=2, seq_len=64, batch=8, tokens=6 * 8 * 64,
                 lr=3e-3, backend="reference",
                 sampled_corpus=dict(teacher="tiny", shards=1, docs_per_shard=16, heldout_docs=16,
                                     max_new_tokens=48, batch_size=16, min_chars=1),
                 cells=(("gated_deltanet", "3:1"), TRANSFORMER),
                 ppl_documents=4, ruler_tasks=("niah_single", "fwe"), ruler_lengths=(384,),
                 ruler_examples=2, mqar=((64, 4),), mqar_examples=8, eval_batch=4, eval_length=512,
                 efficiency_lengths=(256,), recall_fraction=0.25, recall_mqar_shapes="32x4,32x8",
                 recall_mqar_loss_weight=8),
    # The papers' recipe: attention without short convolutions, text only; RULER-style tasks
    # generated and scored as RULER does, at lengths inside the training rows.
    "small": Size("small", seeds=(0, 1, 2), **_SMALL, ruler_lengths=(512, 1024), ruler_examples=16),
    "small_recall": Size("small_recall", seeds=(0, 1, 2), **_SMALL, **_RECALL_ROWS,
                         ruler_lengths=(512, 1024), ruler_examples=16),
    # The committed ablation (results/hybrid_small_conv_recall): short convolutions on attention,
    # recall rows, RULER-style scored teacher-forced at 1-4k bytes.
    "small_conv_recall": Size("small_conv_recall", attn_short_conv=True, **_SMALL, **_RECALL_ROWS,
                              ruler_mode="teacher_forced"),
    "340m": Size("340m", num_layers=24, hidden=1024, heads=16, seq_len=2048, batch=256,
                 tokens=20_000_000_000, lr=3e-4, preset_scale="340m", tokenizer="",
                 ppl_documents=2000, ruler_examples=50, mqar_examples=256, eval_batch=16,
                 eval_length=None),
    "1.3b": Size("1.3b", num_layers=24, hidden=2048, heads=16, seq_len=2048, batch=256,
                 tokens=100_000_000_000, lr=2e-4, preset_scale="1.3b", tokenizer="",
                 ppl_documents=2000, ruler_examples=50, mqar_examples=256, eval_batch=16,
                 eval_length=None),
    "medium": Size("medium", cells=(("gated_deltanet", "3:1"), ("gated_deltanet", "pure"),
                                    TRANSFORMER), **_MEDIUM),
    "medium_slice": Size("medium_slice", cells=tuple(
        (m, r) for m in ("gated_deltanet", "hgrn2") for r in RATIOS) + (TRANSFORMER,),
        needs_gate=True, **_MEDIUM),
}


def get_size(name: str) -> Size:
  if name not in SIZES:
    raise ValueError(f"`size` must be one of {sorted(SIZES)}; got {name!r}")
  return SIZES[name]


def all_cells(size: Size) -> list[tuple[str, str, int]]:
  """(mixer, ratio, seed) of every cell of the size in the grid's order (a cell's seeds together),
  the Transformer last."""
  cells = list(size.cells) or [(m, r) for m in MIXERS for r in RATIOS] + [TRANSFORMER]
  return [(m, r, s) for m, r in cells for s in (size.seeds if m in SEEDED_MIXERS else size.seeds[:1])]


def cell_name(mixer: str, ratio: str, seed: int = 0) -> str:
  """"gla_6-1", "hgrn2_pure", "transformer", "gla_6-1_s2" (seed 2): a folder name."""
  name = "transformer" if mixer == "transformer" else f"{mixer}_{ratio.replace(':', '-')}"
  return f"{name}_s{seed}" if seed else name


def cell_flag(mixer: str, ratio: str, seed: int = 0) -> str:
  """The `--only` item that names exactly one cell ("gla:6:1@2", "transformer")."""
  item = mixer if mixer == "transformer" else f"{mixer}:{ratio}"
  return f"{item}@{seed}"


def parse_cells(only: str, size: Size) -> list[tuple[str, str, int]]:
  """`--only` "mixer[:ratio][@seed],..." ("gla:6:1,hgrn:pure,transformer@1"; a bare mixer: all
  its ratios; no seed: all its seeds) -> the cells of the size it names, in grid order."""
  cells = all_cells(size)
  if not only:
    return cells
  wanted = set()
  for item in filter(None, (s.strip() for s in only.split(","))):
    spec, at, seed = item.partition("@")
    mixer, _, ratio = spec.partition(":")
    if at and not seed.isdigit():
      raise ValueError(f"`--only`: {item!r}: the seed after '@' must be an integer")
    match = [c for c in cells if c[0] == mixer and (not ratio or c[1] == ratio)
             and (not at or c[2] == int(seed))]
    if not match:
      raise ValueError(f"`--only`: {item!r} names no cell of size {size.name!r}; cells are "
                       f"{', '.join(cell_flag(*c) for c in cells)}")
    wanted.update(match)
  return [c for c in cells if c in wanted]


def small_mixer_cfg(mixer: str, hidden: int) -> dict:
  """The 340M preset's options of `mixer` with its absolute widths (head_dim, HGRN-2's expand
  ratio) scaled by hidden / 1024, so heads and expansions stay those of the papers' models."""
  opts = dict(MIXER_SIZES[mixer]["340m"][0])
  scale = hidden / 1024
  for key in ("head_dim", "expand_ratio"):
    if key in opts:
      opts[key] = max(8, int(opts[key] * scale))
  return opts


def small_mlp_hidden(mixer: str, hidden: int) -> int | None:
  width = MIXER_SIZES[mixer]["340m"][1]
  return None if width is None else max(128, int(width * hidden / 1024) // 128 * 128)


def cell_config(size: Size, mixer: str, ratio: str, accelerator: bool = True,
                seed: int = 0) -> ml_collections.ConfigDict:
  """The training config of one cell (lineax_lm.train.config.lm_config); data paths are left to
  the caller (`--config.data.paths=...` or the grid's corpus). `seed` seeds the initialisation and
  the data order."""
  transformer = mixer == "transformer"
  c = lm_config(tokens=size.tokens)
  c.seed = seed
  if size.preset_scale:
    c.model.preset = f"transformer_{size.preset_scale}" if transformer else f"{mixer}_{size.preset_scale}"
    if not transformer:
      c.model.attn_ratio = ratio
  else:
    c.model = ml_collections.ConfigDict(dict(
        preset="", attn_placement="spread", vocab_size=size.vocab_size, num_layers=size.num_layers,
        hidden=size.hidden, heads=size.heads, mixer="gated_deltanet" if transformer else mixer,
        attn_ratio="transformer" if transformer else ratio,
        attn_layers=ml_collections.config_dict.placeholder(tuple),
        mixer_cfg=ml_collections.ConfigDict({} if transformer else small_mixer_cfg(mixer, size.hidden)),
        linear_mlp_hidden=ml_collections.config_dict.placeholder(int) if transformer
        else small_mlp_hidden(mixer, size.hidden), tie_embeddings=size.tie_embeddings,
        scan_layers=False,
        attn_short_conv=size.attn_short_conv))
  c.model.backend = size.backend
  c.model.dtype = "bfloat16" if accelerator else "float32"
  c.data.update(dict(seq_len=size.seq_len, global_batch_size=size.batch))
  c.data.recall_mix.update(dict(fraction=size.recall_fraction, kinds=size.recall_kinds,
                                mqar_kv_pairs=size.recall_mqar_kv_pairs,
                                mqar_loss_weight=size.recall_mqar_loss_weight,
                                mqar_shapes=size.recall_mqar_shapes))
  if size.tokenizer and size.tokenizer != CORPUS_TOKENIZER:  # the corpus's: cells.corpus_data
    c.data.tokenizer = size.tokenizer
  c.train.lr = size.lr
  c.train.grad_accum = size.grad_accum
  c.train.update(dict(keep_checkpoints=1, async_checkpointing=accelerator,
                      log_every=max(1, size.tokens // (size.batch * size.seq_len) // 8)))
  steps = c.train.get_ref("steps")
  c.train.checkpoint_every = (steps + 1) // 2
  if size.checkpoint_tokens:          # the needle curve's marks, every one kept
    c.train.checkpoint_every = size.checkpoint_tokens // (
        c.data.get_ref("global_batch_size") * c.data.get_ref("seq_len"))
    c.train.keep_checkpoints = 0
  c.eval.steps = 0                    # held-out perplexity is scored after training
  if size.name == "tiny":
    c.data.update(dict(num_threads=1, prefetch_buffer_size=2))
    c.train.warmup_steps = 1
    c.train.checkpoint_every = steps     # the final step only
  return c


def placement(config) -> dict:
  """{"attn_layers", "attention_share", "effective_ratio"} of a cell's model."""
  m = model_config(config.model)
  layers = m.attention_indices
  return dict(attn_layers=list(layers), attention_share=len(layers) / m.num_layers,
              effective_ratio=effective_ratio(m.num_layers, layers))


def label(mixer: str) -> str:
  return LABELS.get(mixer, mixer)


def cell_label(mixer: str, ratio: str, seed: int = 0) -> str:
  """"Gated DeltaNet 3:1", "Transformer", "GLA 6:1, seed 2": a cell in a table or a legend."""
  name = label(mixer) if mixer == "transformer" else f"{label(mixer)} {ratio}"
  return f"{name}, seed {seed}" if seed else name


