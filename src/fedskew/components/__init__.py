"""Pieces that methods compose: local training with loss terms, aggregators, client selectors."""
