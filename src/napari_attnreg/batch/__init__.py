"""Batches of image files, each image run through the pipeline service (not a second engine).

- :mod:`.items`: inputs (files, folders, globs) and collision-free output names.
- :mod:`.run`: :func:`~.run.run_batch` and :func:`~.run.process_item`, one service Job per
  plane, outputs written atomically.
- :mod:`.resume`: records that let a rerun skip exactly the complete, unchanged outputs.
- :mod:`.summary`: ``summary.csv`` rows and the merged file.
- :mod:`.figure`: the PNG figure of a result.
- :mod:`.distributed`: the same per-image function as Dask tasks.
"""
