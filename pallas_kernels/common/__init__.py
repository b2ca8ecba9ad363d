"""Pieces shared by the op families: validation, chunking, varlen layout, state scan, dispatch."""
