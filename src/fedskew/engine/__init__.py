"""Engines that run an algorithm: the in-process simulator (and, optionally, Flower)."""
