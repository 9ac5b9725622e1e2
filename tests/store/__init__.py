"""The store and runs: ids, caching, verification, locks, gc, kills and resumes."""
