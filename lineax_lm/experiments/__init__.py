"""Experiments that join the library's parts: the hybrid-ratio study (`grid`, its `sizes`), its
offline corpus (`corpus`) and the lm-eval task preset (`lm_tasks`). docs/hybrid_study.md."""
