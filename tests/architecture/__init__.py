"""The house's rules read from the code: layering, the stage contract."""
