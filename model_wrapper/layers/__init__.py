"""Layers of the shared decoder, one small file per kind."""
