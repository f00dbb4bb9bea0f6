"""Evaluation: next-token losses, KL and distillation of language models (`lm`), task metrics (`metrics`)."""
