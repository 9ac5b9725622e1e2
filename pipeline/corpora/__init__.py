"""Parallel corpora on disk: the data artifact's split files, a user's own files, the encoded
(memory-mapped) training corpus, and what a student learns from (references or the teacher's
translations)."""
