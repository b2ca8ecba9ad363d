"""Language metrics: perplexity and bits per byte on held-out documents of any text source of the
data stack (`lineax_lm.data`: text files, jsonl, prepared TFDS datasets).

Every document is scored on its own (as lm-eval's loglikelihood_rolling does): its ids are predicted
from a bos prefix in rolling windows of at most `max_len` tokens with maximal context, so each token
is predicted exactly once. With N the summed negative log-likelihood (nats) of the document tokens
(eos not counted), T their number and U the UTF-8 bytes of the documents:

  perplexity = exp(N / T)      bits per token = N / (T ln 2)      bits per byte = N / (U ln 2)

Bits per byte compares models with different tokenizers.

Held-out data: `heldout_documents` takes a source and keeps a deterministic fraction of its documents
(a hash of the index, so the split does not depend on the source order or size); training on the
complement is the caller's business (the training pipeline reads every document of its source, so
point `paths` / `tfds_split` at data the run did not train on, e.g. a TFDS "validation" split).
"""
from __future__ import annotations

import math
from typing import Sequence

from lineax_lm.data.pipeline import make_source
from lineax_lm.data.splits import heldout_indices
from lineax_lm.eval.scoring import as_scorer, rolling_windows, score_pairs


def heldout_documents(data_config, *, fraction: float = 1.0, max_documents: int | None = None,
                      salt: int = 0) -> list[str]:
  """Documents (str) of the text source a data config section names (source "text" / "jsonl" /
  "tfds"; set its paths or tfds_split to the held-out data), the `fraction` kept by
  `heldout_indices`, at most `max_documents`."""
  if data_config.source == "mqar":
    raise ValueError("perplexity needs a text source (`data.source` text / jsonl / tfds); this data "
                     "config reads MQAR")
  src = make_source(data_config, seed=0)
  idx = heldout_indices(len(src), fraction, salt)[:max_documents]
  return [src[i] for i in idx]


def perplexity(model, tokenizer, documents: Sequence[str], *, max_len: int = 2048,
               batch_size: int = 8) -> dict:
  """{"nll", "tokens", "bytes", "documents", "perplexity", "bits_per_token", "bits_per_byte"} of
  `model` (HybridLM / Scorer / callable) over `documents`, each scored from bos in rolling windows."""
  scorer = as_scorer(model, batch_size)
  pairs, nbytes, ntok = [], 0, 0
  for doc in documents:
    ids = list(tokenizer.encode(doc))
    if not ids:
      continue
    pairs.extend(rolling_windows(ids, tokenizer.bos_id, max_len))
    ntok += len(ids)
    nbytes += len(doc.encode("utf-8"))
  if not ntok:
    raise ValueError("`documents` hold no token to score")
  nll = -sum(ll for ll, _ in score_pairs(scorer, pairs, max_len))
  return dict(nll=nll, tokens=ntok, bytes=nbytes, documents=len(documents),
              perplexity=math.exp(nll / ntok), bits_per_token=nll / ntok / math.log(2),
              bits_per_byte=nll / nbytes / math.log(2))
