"""Input pipelines (grain): MQAR, local text / jsonl / parquet and TFDS sources, held-out splits, tokenizers, packing,
synthetic recall rows mixed into text (`data.recall_mix`, lineax_lm.data.recall_mix).

  from lineax_lm.data import default_data_config, make_dataset
  it = make_dataset(config.data, seed=0)      # batches of [global_batch // process_count, seq_len]
"""
from lineax_lm.data.mqar import MQARSource, mqar_example
from lineax_lm.data.packing import pack, segment_ids_to_cu_seqlens
from lineax_lm.data.pipeline import (build_dataset, data_vocab_size, default_data_config,
                                     make_dataset, make_tokenizer)
from lineax_lm.data.splits import SplitSource, heldout_indices
from lineax_lm.data.text import (JsonlSource, ParquetSource, TextFileSource, tfds_text_source,
                                 tokenize)
from lineax_lm.data.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer
