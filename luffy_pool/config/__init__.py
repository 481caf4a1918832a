"""Config of a run: typed sections declared once, the checker derived from them, Hydra composition."""
