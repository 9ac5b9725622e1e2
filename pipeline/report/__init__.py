"""The report's rows and plot."""
