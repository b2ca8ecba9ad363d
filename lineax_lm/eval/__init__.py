"""Evaluation: recall benchmarks, language metrics, efficiency accounting and reports.

  scoring.py         jitted per-token scorer, pair log-likelihoods, rolling windows, greedy generation
  mqar.py            MQAR accuracy grids (Zoology metric) and the hand-set induction-head oracle
  recall.py          needle-in-a-haystack tasks (RULER NIAH family) and their solver
  ruler.py           variable tracking, common / frequent words; task registry and evaluation loop
  language.py        perplexity and bits per byte on held-out text
  lm_eval_adapter.py lm-eval's model "lineax"; `python -m lineax_lm.eval.lm_eval --model lineax --model_args path=DIR`
  efficiency.py      token-mixer FLOPs, cache bytes, measured tokens/s
  sweep.py           MQAR sweeps over mixers x ratios x widths x learning rates
  report.py          markdown / CSV / JSON tables and PNG plots
  loading.py         model + config from a training checkpoint
  python -m lineax_lm.eval --workdir DIR [--tasks ...]   (see __main__.py)
"""
