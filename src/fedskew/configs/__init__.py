"""Configs shipped with fedskew (``fedskew run default``)."""
