"""`tunesmith eval`: loss/perplexity, generated predictions with BLEU/ROUGE, and
multiple-choice benchmarks (MMLU / C-Eval / CMMLU layouts)."""
