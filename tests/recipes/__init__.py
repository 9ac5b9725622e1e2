"""Recipes: schema, one line per problem, bounds, fuzzing."""
