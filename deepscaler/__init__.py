"""deepscaler package."""
