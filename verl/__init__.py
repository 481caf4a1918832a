"""verl package."""
