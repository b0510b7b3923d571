"""Matplotlib on its file-only Agg backend, set up once for every plot the package writes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plt"]
