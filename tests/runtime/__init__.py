"""mt_runtime: translator, search, shortlist, package checks and limits, `pipeline translate`, JS client."""
