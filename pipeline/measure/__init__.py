"""Measuring translators: opening any model as one, BLEU and chrF, timing, and the fresh
processes that time them."""
