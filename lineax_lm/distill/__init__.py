"""Linearization: distil a Transformer teacher into linear and hybrid students.

Teacher loading lives in `lineax_lm.distill.checkpoints` (GGUF files and Hugging Face safetensors
directories -> float32 numpy parameters with Hugging Face names, a LlamaConfig dict and a tokenizer).
"""
