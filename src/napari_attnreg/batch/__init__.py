"""Batches of image files: collected inputs, runs through the pipeline service, summary."""
