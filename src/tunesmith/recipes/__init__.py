"""Recipes: composition only, readable top to bottom."""
