"""`mt-runtime serve`."""
