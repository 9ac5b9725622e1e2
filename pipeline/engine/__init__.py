"""The machinery: the recipe schema and its loader, the graph of nodes a recipe plans, the runner
that builds them, the artifact store, code digests and the lock file, a stage's context, errors,
the machine and worker processes. Knows no stage: the registry (pipeline/stages) is handed to
it."""
